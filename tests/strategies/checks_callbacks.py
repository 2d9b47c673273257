"""Checks of the ``callbacks_*`` phases: both callbacks in real 2-process runs.

Each phase runs ``tests/scripts/callbacks_train.py`` (4 optimizer steps,
``accumulate_grad_batches=2``, SGD lr=0.5 with ExponentialLR(0.8), a chainable scheduler into
which a leaked factor would compound, sqrt LR scaling): ``callbacks_fn`` (DDP) counts through
``tokens_fn``/``examples_fn``, ``callbacks_keys`` (DeepSpeed, the registered name
``deepspeed_varbatch``) through the batch keys, ``callbacks_keys_hf`` (DDP) the same sequences
as a Hugging Face dataset, read through the library's loader and collate, whose batches carry
the counts the callbacks read.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar

import pytest

from tests.scripts.strategy_common import ACCUMULATE, MAX_TOKENS
from tests.strategies.runs import WORLD_SIZE, Launch, Run, kind_of

STEPS = 4
LR = 0.5


def schedule(step: int) -> float:
    return 0.8**step


class Callbacks:
    """The checks of a launch's ``callbacks_*`` phases."""

    LAUNCH: ClassVar[Launch]

    def test_global_counts_and_identical_scaled_lr(self, run: Run, callbacks_phase: str) -> None:
        records = run.phase(callbacks_phase)
        source = "hf" if kind_of(callbacks_phase).endswith("_hf") else "list"
        assert [r["rank"] for r in records] == list(range(WORLD_SIZE))
        assert [r["global_step"] for r in records] == [STEPS] * WORLD_SIZE
        if source == "hf":  # the counts below came from Arrow reads of the Hugging Face dataset
            for r in records:
                assert r["loader"]["part_types"] == ["datasets.Dataset"], r["loader"]
                assert {m["collated_from"] for m in r["micro_batches"]} == {"ColumnarItems"}

        # What every rank really processed, per optimizer step.
        per_step: dict[int, list[int]] = {k: [0] * WORLD_SIZE for k in range(STEPS)}
        examples: dict[int, int] = dict.fromkeys(range(STEPS), 0)
        for r in records:
            for m in r["micro_batches"]:
                assert m["global_step"] == m["step"]  # Lightning's step index = the plan's
                per_step[m["step"]][r["rank"]] += m["ntokens"]
                examples[m["step"]] += m["nexamples"]
        totals = {k: sum(v) for k, v in per_step.items()}
        assert all(
            m["step_ntokens"] == totals[m["step"]] for r in records for m in r["micro_batches"]
        )

        logged: dict[int, dict[str, float]] = {}
        for step, metrics in records[0]["logged"]:
            logged.setdefault(step, {}).update(metrics)
        assert records[1]["logged"] == []  # only rank 0 logs
        for k in range(STEPS):
            m = logged[k]
            assert m["train/batch/tokens"] == totals[k]
            assert m["train/batch/examples"] == examples[k]
            assert m["train/imbalance"] == pytest.approx(
                max(per_step[k]) / (totals[k] / WORLD_SIZE)
            )
            assert m["train/device/tokens_per_sec"] == pytest.approx(
                m["train/tokens_per_sec"] / WORLD_SIZE
            )
            assert m["train/step_time_imbalance"] >= 1.0

        # The scaled lr took effect in the real optimizer step, once per step, same on every rank.
        reference = MAX_TOKENS * WORLD_SIZE * ACCUMULATE
        assert [r["reference"] for r in records] == [reference] * WORLD_SIZE
        expected = [LR * schedule(k) * math.sqrt(totals[k] / reference) for k in range(STEPS)]
        for r in records:
            assert r["scaler_steps"] == STEPS
            # The scheduler's own state is the unscaled schedule.
            assert r["final_lr"] == pytest.approx(LR * schedule(STEPS), rel=1e-12)
            assert r["step_lrs"] == pytest.approx(expected, rel=1e-12)
        assert records[0]["step_lrs"] == records[1]["step_lrs"]
        scales: list[Any] = [logged[k]["train/lr_scale"] for k in range(STEPS)]
        assert scales == pytest.approx([math.sqrt(totals[k] / reference) for k in range(STEPS)])
