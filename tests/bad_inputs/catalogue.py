"""Every case of every area, in table order.

Example:
    >>> len(CASES) >= 150
    True
"""

from __future__ import annotations

from tests.bad_inputs import (
    cases_batch_schedule,
    cases_callbacks,
    cases_cli,
    cases_collate,
    cases_datamodule,
    cases_env,
    cases_examples,
    cases_hf,
    cases_length_warmup,
    cases_loops,
    cases_memory,
    cases_mixing,
    cases_pairing,
    cases_planner,
    cases_rank_shares,
    cases_sampler,
    cases_shard_files,
    cases_streaming,
    cases_tokenizers,
)
from tests.bad_inputs.case import AREAS, Case

CASES: list[Case] = sorted(
    [
        *cases_planner.CASES,
        *cases_length_warmup.CASES,
        *cases_rank_shares.CASES,
        *cases_batch_schedule.CASES,
        *cases_sampler.CASES,
        *cases_collate.CASES,
        *cases_pairing.CASES,
        *cases_hf.CASES,
        *cases_tokenizers.CASES,
        *cases_streaming.CASES,
        *cases_shard_files.CASES,
        *cases_datamodule.CASES,
        *cases_mixing.CASES,
        *cases_cli.CASES,
        *cases_examples.CASES,
        *cases_callbacks.CASES,
        *cases_loops.CASES,
        *cases_memory.CASES,
        *cases_env.CASES,
    ],
    key=lambda c: AREAS.index(c.area),
)
