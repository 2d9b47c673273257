"""BatchSizeLRScaler in one process: exact LRs against a hand computation, no compounding."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_varbatch.callbacks.lr_scaling import BatchSizeLRRule
from lightning_varbatch.callbacks.throughput import TokenThroughputMeter
from lightning_varbatch.callbacks.trainer_adapters import BatchSizeLRScaler
from lightning_varbatch.callbacks.trainer_adapters import TokenThroughputMonitor as Monitor
from tests.callbacks._common import BASE_LR, Module, fit, micro_batches, scale, warmup

REFERENCE = 100.0
# Token counts of each micro-batch, per optimizer step.
STEPS_1 = [[50], [100], [25], [200], [100], [64]]
STEPS_2 = [[30, 20], [60, 40], [10, 15], [150, 50], [50, 50], [32, 32]]


@pytest.mark.parametrize("rule", ["linear", "sqrt"])
@pytest.mark.parametrize("steps", [STEPS_1, STEPS_2], ids=["acc1", "acc2"])
def test_lr_is_scheduler_lr_times_factor_without_compounding(
    rule: str, steps: list[list[int]]
) -> None:
    accumulate = len(steps[0])
    module = Module(micro_batches(steps))
    scaler = BatchSizeLRScaler(rule=rule, reference=REFERENCE)  # type: ignore[arg-type]
    _, logger = fit(module, [scaler], max_steps=len(steps), accumulate=accumulate)

    ratios = [sum(s) / REFERENCE for s in steps]
    expected = [BASE_LR * warmup(k) * scale(rule, r) for k, r in enumerate(ratios)]
    assert module.step_lrs == pytest.approx(expected, rel=1e-12)
    # Between steps the optimizer holds the unscaled scheduler value: nothing compounds.
    ends = module.end_lrs[accumulate - 1 :: accumulate]
    assert ends == pytest.approx([BASE_LR * warmup(k + 1) for k in range(len(steps))], rel=1e-12)
    assert logger.series("train/lr_scale") == pytest.approx(
        {k: scale(rule, r) for k, r in enumerate(ratios)}, rel=1e-12
    )
    assert logger.series("train/lr_ratio") == pytest.approx(dict(enumerate(ratios)))
    assert scaler.steps == len(steps)


def test_tokens_fn_on_any_loader_and_clamp() -> None:
    steps = STEPS_2
    batches = [(b["x"], int(b["ntokens"])) for b in micro_batches(steps)]
    module = Module(batches)
    scaler = BatchSizeLRScaler(
        reference=REFERENCE, tokens_fn=lambda b: b[1], min_scale=0.3, max_scale=1.5
    )
    fit(module, [scaler], max_steps=len(steps), accumulate=2)
    factors = [min(1.5, max(0.3, sum(s) / REFERENCE)) for s in steps]
    expected = [BASE_LR * warmup(k) * f for k, f in enumerate(factors)]
    assert module.step_lrs == pytest.approx(expected, rel=1e-12)


def test_default_reference_from_max_tokens_and_examples() -> None:
    steps = STEPS_1[:2]
    module = Module(micro_batches(steps))
    by_examples = BatchSizeLRScaler(by="examples", reference=4, rule="linear")
    fit(module, [by_examples], max_steps=2)
    assert module.step_lrs == pytest.approx([BASE_LR * warmup(k) * 2 / 4 for k in range(2)])

    module = Module(micro_batches(steps))
    by_budget = BatchSizeLRScaler(max_tokens=200)
    fit(module, [by_budget], max_steps=2)
    assert by_budget.reference == 200.0
    assert module.step_lrs == pytest.approx(
        [BASE_LR * warmup(k) * sum(s) / 200 for k, s in enumerate(steps)]
    )


def test_unreadable_batch_names_the_argument() -> None:
    module = Module([(torch.ones(2, 3),)] * 2)
    with pytest.raises(TypeError, match="tokens_fn"):
        fit(module, [BatchSizeLRScaler(reference=1.0)], max_steps=1)
    module = Module([(torch.ones(2, 3),)] * 2)
    with pytest.raises(ValueError, match="reference="):
        fit(module, [BatchSizeLRScaler(by="examples", examples_fn=lambda b: 2)], max_steps=1)


@pytest.mark.parametrize(
    "kwargs",
    [{"rule": "cubic"}, {"by": "bytes"}, {"reference": 0}, {"min_scale": 2, "max_scale": 1}],
)
def test_bad_arguments(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        BatchSizeLRScaler(**kwargs)  # type: ignore[arg-type]


def test_resume_keeps_scaling_state(tmp_path: Path) -> None:
    # Equal steps: Lightning replays a non-stateful loader from an epoch's start on resume, so
    # only then is the data of the resumed steps the same as in the uninterrupted run.
    steps = [[30, 20], [30, 20]]
    whole = Module(micro_batches(steps))
    fit(whole, [BatchSizeLRScaler(reference=REFERENCE)], max_steps=4, accumulate=2)

    first = Module(micro_batches(steps))
    scaler = BatchSizeLRScaler(reference=REFERENCE)
    trainer, _ = fit(first, [scaler], max_steps=2, accumulate=2)
    ckpt = tmp_path / "half.ckpt"
    trainer.save_checkpoint(ckpt)
    assert torch.load(ckpt, weights_only=False)["callbacks"]["BatchSizeLRScaler"]["steps"] == 2
    saved = torch.load(ckpt, weights_only=False)
    # The checkpoint holds the unscaled lr (the scaling is undone before anything saves).
    assert saved["optimizer_states"][0]["param_groups"][0]["lr"] == pytest.approx(
        BASE_LR * warmup(2)
    )

    second = Module(micro_batches(steps))
    resumed = BatchSizeLRScaler(reference=REFERENCE)
    fit(second, [resumed], max_steps=4, accumulate=2, ckpt_path=str(ckpt))
    assert first.step_lrs + second.step_lrs == pytest.approx(whole.step_lrs, rel=1e-12)
    assert resumed.steps == 4
    assert resumed.last_scale == pytest.approx(0.5)
    with pytest.raises(ValueError, match="keys"):
        resumed.load_state_dict({"steps": 1})


def test_the_callbacks_are_the_rules_with_hooks_no_second_copy() -> None:
    """The Trainer callbacks add Lightning's hooks only: every rule and state is the rule's."""
    for callback, rule in ((BatchSizeLRScaler, BatchSizeLRRule), (Monitor, TokenThroughputMeter)):
        assert issubclass(callback, rule)
        own = {n for n in vars(callback) if not n.startswith("__")}
        assert all(n.startswith("on_") or n == "teardown" for n in own), own
        assert callback().state_dict() == rule().state_dict()
