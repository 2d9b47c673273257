"""Both callbacks in real 2-process runs (gloo on CPU): DDP and DeepSpeed ZeRO 2.

Each scenario runs ``tests/scripts/callbacks_train.py`` once per rank (4 optimizer steps,
``accumulate_grad_batches=2``, SGD lr=0.5 with ExponentialLR(0.8), a chainable scheduler into
which a leaked factor would compound, sqrt LR scaling). ``ddp-hf``: the same sequences as a
Hugging Face dataset (``--source hf``), read through the library's loader and collate, whose
batches carry the counts the callbacks read (``keys`` mode).
"""

from __future__ import annotations

import math
from typing import Any

import pytest

from tests.launch import launch
from tests.scripts.strategy_common import ACCUMULATE, MAX_TOKENS

WORLD_SIZE = 2
STEPS = 4
LR = 0.5
SCENARIOS = [
    pytest.param("ddp", "fn", "list", id="ddp"),
    pytest.param("deepspeed_varbatch", "keys", "list", id="deepspeed_varbatch"),
    pytest.param("ddp", "keys", "hf", id="ddp-hf"),
]


def schedule(step: int) -> float:
    return 0.8**step


@pytest.mark.multiprocess
@pytest.mark.parametrize(("strategy", "mode", "source"), SCENARIOS)
def test_global_counts_and_identical_scaled_lr(
    strategy: str, mode: str, source: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    out = tmp_path_factory.mktemp(f"{strategy}-{mode}-{source}")
    extra: tuple[str, ...] = ()
    if source != "list":
        import datasets  # noqa: F401  (the hf extra is part of the test install)

        extra = ("--source", source)
    records = launch("callbacks_train.py", WORLD_SIZE, out, strategy, mode, *extra, timeout=150.0)
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
    assert all(m["step_ntokens"] == totals[m["step"]] for r in records for m in r["micro_batches"])

    logged: dict[int, dict[str, float]] = {}
    for step, metrics in records[0]["logged"]:
        logged.setdefault(step, {}).update(metrics)
    assert records[1]["logged"] == []  # only rank 0 logs
    for k in range(STEPS):
        m = logged[k]
        assert m["train/batch/tokens"] == totals[k]
        assert m["train/batch/examples"] == examples[k]
        assert m["train/imbalance"] == pytest.approx(max(per_step[k]) / (totals[k] / WORLD_SIZE))
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
