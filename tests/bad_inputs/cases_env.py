"""Environment variables the launcher sets, and process-group faults.

``env`` of a case is applied with pytest's monkeypatch (``RANK``, ``WORLD_SIZE`` and
``LOCAL_RANK`` are unset first for every case).

Example:
    >>> len(CASES) > 15
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import TokenBudgetBatchSampler, TokenBudgetDataModule
from lightning_varbatch.errors import SettingValueError
from tests.bad_inputs.case import Case, accepted, error

RANKS = "lightning_varbatch/data/micro_batch.py"
SAMPLER = "lightning_varbatch/data/sampler.py"
L = np.array([3, 5, 2, 7, 4, 6, 1, 8])


def _from_env(tmp: Path) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(L, 16)


def _dm_from_env(tmp: Path) -> Any:
    data = [{"tokens": [1] * int(n)} for n in L]
    return TokenBudgetDataModule(data, L, 16).train_dataloader()


def _dm_val_one_example(tmp: Path) -> Any:
    data = [{"tokens": [1] * int(n)} for n in L]
    dm = TokenBudgetDataModule(data, L, 16, val_dataset=data[:1], val_lengths=L[:1])
    return dm.val_dataloader()


def _dm_too_few_for_ranks(tmp: Path) -> Any:
    return len(_dm_from_env(tmp))  # Lightning sizes the epoch right after building the loader


def _expect_rank(rank: int, world: int) -> Any:
    def run(tmp: Path) -> None:
        sampler = _from_env(tmp)
        assert (sampler.rank, sampler.world_size) == (rank, world), (
            f"got rank {sampler.rank} of {sampler.world_size}, expected {rank} of {world}"
        )

    return run


def _explicit(tmp: Path) -> None:
    sampler = TokenBudgetBatchSampler(L, 16, rank=1, world_size=2)
    assert (sampler.rank, sampler.world_size) == (1, 2)


def _process_group(tmp: Path, rank: int, world_size: int) -> None:
    """A real (1-process, gloo) process group, and a sampler built for another topology."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'pg'}", rank=0, world_size=1)
    try:
        sampler = TokenBudgetBatchSampler(L, 16, rank=rank, world_size=world_size)
        list(sampler)
    finally:
        dist.destroy_process_group()


def _pg_wrong_world(tmp: Path) -> None:
    _process_group(tmp, 0, 2)


def _pg_inferred(tmp: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp / 'pg'}", rank=0, world_size=1)
    try:
        sampler = TokenBudgetBatchSampler(L, 16)
        assert sorted(i for b in sampler for i in b) == list(range(len(L)))
    finally:
        dist.destroy_process_group()


def _env_case(
    id: str,
    words: str,
    env: dict[str, str | None],
    *match: Any,
    raises: type[BaseException],
    dm: bool = False,
) -> Case:
    return error(
        id,
        "environment",
        words,
        _dm_from_env if dm else _from_env,
        *match,
        raises=raises,
        env=env,
        fix_in=RANKS,
    )


CASES: list[Case] = [
    _env_case(
        "env-rank-str",
        "RANK=abc",
        {"RANK": "abc", "WORLD_SIZE": "2"},
        "RANK",
        "abc",
        raises=ValueError,
    ),
    _env_case(
        "env-rank-negative",
        "RANK=-1",
        {"RANK": "-1", "WORLD_SIZE": "2"},
        "RANK",
        "-1",
        raises=ValueError,
    ),
    _env_case(
        "env-rank-float",
        "RANK=1.0",
        {"RANK": "1.0", "WORLD_SIZE": "2"},
        "RANK",
        "1.0",
        raises=ValueError,
    ),
    _env_case(
        "env-rank-equals-world",
        "RANK=2, WORLD_SIZE=2",
        {"RANK": "2", "WORLD_SIZE": "2"},
        "RANK",
        "WORLD_SIZE",
        "2",
        raises=ValueError,
    ),
    _env_case(
        "env-rank-without-world",
        "RANK=1 and no WORLD_SIZE",
        {"RANK": "1"},
        "RANK",
        "WORLD_SIZE",
        raises=ValueError,
    ),
    _env_case(
        "env-world-zero", "WORLD_SIZE=0", {"WORLD_SIZE": "0"}, "WORLD_SIZE", "0", raises=ValueError
    ),
    _env_case(
        "env-world-negative",
        "WORLD_SIZE=-2",
        {"WORLD_SIZE": "-2"},
        "WORLD_SIZE",
        "-2",
        raises=ValueError,
    ),
    _env_case(
        "env-world-str",
        "WORLD_SIZE=two",
        {"WORLD_SIZE": "two"},
        "WORLD_SIZE",
        "two",
        raises=ValueError,
    ),
    _env_case(
        "env-local-rank-str",
        "LOCAL_RANK=x",
        {"LOCAL_RANK": "x"},
        "LOCAL_RANK",
        "x",
        raises=ValueError,
    ),
    _env_case(
        "env-local-rank-negative",
        "LOCAL_RANK=-1",
        {"LOCAL_RANK": "-1"},
        "LOCAL_RANK",
        "-1",
        raises=ValueError,
    ),
    _env_case(
        "env-dm-rank-str",
        "RANK=abc when a DataModule builds its loader outside a Trainer",
        {"RANK": "abc", "WORLD_SIZE": "2"},
        "RANK",
        "abc",
        dm=True,
        raises=ValueError,
    ),
    _env_case(
        "env-dm-world-zero",
        "WORLD_SIZE=0 when a DataModule builds its loader",
        {"WORLD_SIZE": "0"},
        "WORLD_SIZE",
        "0",
        dm=True,
        raises=ValueError,
    ),
    error(
        "env-dm-val-fewer-than-ranks",
        "environment",
        "a validation set of 1 example under RANK=0, WORLD_SIZE=2",
        _dm_val_one_example,
        "val_dataset",
        "1",
        "2",
        env={"RANK": "0", "WORLD_SIZE": "2"},
        fix_in="lightning_varbatch/data/datamodule.py",
        raises=SettingValueError,
        setting="val_dataset",
    ),
    error(
        "env-dm-train-fewer-than-ranks",
        "environment",
        "8 training examples of 3 micro-batches under RANK=0, WORLD_SIZE=16 (tail='spread')",
        _dm_too_few_for_ranks,
        "world_size",
        "16",
        "8",
        env={"RANK": "0", "WORLD_SIZE": "16"},
        fix_in="lightning_varbatch/planner/epoch_planner.py",
        raises=ValueError,
    ),
    accepted(
        "env-spaces",
        "environment",
        "RANK=' 1 ', WORLD_SIZE='2 '",
        _expect_rank(1, 2),
        env={"RANK": " 1 ", "WORLD_SIZE": "2 "},
        fix_in=RANKS,
    ),
    accepted(
        "env-empty",
        "environment",
        "RANK='' and WORLD_SIZE='' (treated as unset)",
        _expect_rank(0, 1),
        env={"RANK": "", "WORLD_SIZE": ""},
        fix_in=RANKS,
    ),
    accepted(
        "env-good",
        "environment",
        "RANK=3, WORLD_SIZE=4",
        _expect_rank(3, 4),
        env={"RANK": "3", "WORLD_SIZE": "4"},
        fix_in=RANKS,
    ),
    accepted(
        "env-ignored-when-explicit",
        "environment",
        "RANK=abc but rank=1, world_size=2 passed explicitly",
        _explicit,
        env={"RANK": "abc", "WORLD_SIZE": "zero"},
        fix_in=RANKS,
    ),
    error(
        "pg-world-mismatch",
        "multi-process",
        "sampler built for world_size=2 inside a 1-process torch.distributed group",
        _pg_wrong_world,
        "world_size",
        "2",
        "1",
        raises=RuntimeError,
        fix_in=SAMPLER,
    ),
    accepted(
        "pg-inferred",
        "multi-process",
        "sampler without rank/world_size inside a 1-process group",
        _pg_inferred,
        env={"RANK": "5", "WORLD_SIZE": "8"},
        fix_in=SAMPLER,
    ),
]
