"""TokenThroughputMonitor logs ``train/schedule/...`` when batches carry a batch schedule's counts.

Hand-built batches with ``keys.STEP_BUDGET`` / ``keys.STEP_COST`` (exact logged values), then a
token-budget sampler with ``batch_schedule`` whose plan the logged values must match.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import Trainer

from lightning_varbatch import TokenBudgetBatchSampler, keys
from lightning_varbatch.callbacks import TokenThroughputMonitor
from lightning_varbatch.planner.scheduled_plan import schedule_counts
from tests.callbacks._common import Module, RecordingLogger, Tokens, fit, micro_batches

SCHEDULE_KEYS = (
    "train/schedule/budget_tokens",
    "train/schedule/cost_tokens",
    "train/schedule/fill",
)


def scheduled(steps: list[list[int]], budgets: list[int], costs: list[int]) -> list[dict[str, Any]]:
    """:func:`micro_batches` with every micro-batch of step ``k`` carrying its budget and cost."""
    batches = micro_batches(steps)
    per_step = [k for k, step in enumerate(steps) for _ in step]
    for batch, k in zip(batches, per_step, strict=True):
        batch[keys.STEP_BUDGET] = torch.tensor(budgets[k])
        batch[keys.STEP_COST] = torch.tensor(costs[k])
    return batches


def schedule_series(logger: RecordingLogger) -> dict[int, dict[str, float]]:
    return {
        step: {k: m[k] for k in SCHEDULE_KEYS} for step, m in logger.calls if SCHEDULE_KEYS[0] in m
    }


def test_every_step_logs_its_budget_cost_and_fill_with_accumulation() -> None:
    steps = [[30, 20], [60, 40], [10, 15]]
    budgets, costs = [72, 96, 192], [60, 90, 150]
    monitor = TokenThroughputMonitor(log_every_n_steps=1)
    _, logger = fit(Module(scheduled(steps, budgets, costs)), [monitor], max_steps=3, accumulate=2)
    assert schedule_series(logger) == {
        0: {SCHEDULE_KEYS[0]: 72.0, SCHEDULE_KEYS[1]: 60.0, SCHEDULE_KEYS[2]: 60 / 72},
        1: {SCHEDULE_KEYS[0]: 96.0, SCHEDULE_KEYS[1]: 90.0, SCHEDULE_KEYS[2]: 90 / 96},
        2: {SCHEDULE_KEYS[0]: 192.0, SCHEDULE_KEYS[1]: 150.0, SCHEDULE_KEYS[2]: 150 / 192},
    }
    # logged with the window's other metrics, at the same step index
    assert {s for s, m in logger.calls if "train/batch/tokens" in m} == {0, 1, 2}


def test_a_window_logs_the_means_per_step_and_the_fill_of_its_sums() -> None:
    # Two steps per window: the fill is sum(cost) / sum(budget) (0.6), not the mean of the
    # steps' fills (0.75).
    steps = [[50], [100], [25], [200]]
    budgets, costs = [40, 160, 200, 200], [40, 80, 100, 200]
    monitor = TokenThroughputMonitor(log_every_n_steps=2)
    _, logger = fit(Module(scheduled(steps, budgets, costs)), [monitor], max_steps=4)
    assert schedule_series(logger) == {
        1: {SCHEDULE_KEYS[0]: 100.0, SCHEDULE_KEYS[1]: 60.0, SCHEDULE_KEYS[2]: 120 / 200},
        3: {SCHEDULE_KEYS[0]: 200.0, SCHEDULE_KEYS[1]: 150.0, SCHEDULE_KEYS[2]: 300 / 400},
    }


def test_no_schedule_keys_without_a_schedule() -> None:
    _, logger = fit(Module(micro_batches([[50], [100]])), [TokenThroughputMonitor()], max_steps=2)
    assert logger.calls and not any(
        k.startswith("train/schedule/") for _, m in logger.calls for k in m
    )


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (torch.tensor(-1), ValueError, r"batch\['step_cost'\].*finite numbers >= 0"),
        (torch.tensor(float("nan")), ValueError, r"batch\['step_cost'\]"),
        (torch.tensor([1, 2]), TypeError, r"batch\['step_cost'\] must be a number"),
    ],
)
def test_a_bad_count_names_the_batch_entry(value: torch.Tensor, error: type, match: str) -> None:
    batches = scheduled([[5]], [10], [5])
    batches[0][keys.STEP_COST] = value
    with pytest.raises(error, match=match):
        fit(Module(batches), [TokenThroughputMonitor()], max_steps=1)


def test_the_logged_schedule_is_the_plans() -> None:
    # A real plan under "0:0.25 600:0.5 1500:1": the logged budget and cost of every step are
    # the plan's (keys.STEP_BUDGET = accumulation x floor(fraction x max_tokens) on one rank).
    lengths = np.random.default_rng(0).integers(2, 17, 300)
    docs = [{"tokens": list(range(1, int(n) + 1))} for n in lengths]
    sampler = TokenBudgetBatchSampler(
        lengths,
        64,
        rank=0,
        world_size=1,
        accumulate_grad_batches=2,
        batch_schedule="0:0.25 600:0.5 1500:1",
    )
    plan = sampler.plan
    counts = schedule_counts(plan, sampler.planner)
    assert counts is not None and plan.step_fraction is not None
    steps = plan.num_steps
    logger = RecordingLogger()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=steps,
        accumulate_grad_batches=2,
        callbacks=[TokenThroughputMonitor(log_every_n_steps=1)],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tokens(sampler, docs))
    logged = schedule_series(logger)
    assert sorted(logged) == list(range(steps))
    fractions = plan.step_fraction.tolist()
    assert {0.25, 0.5, 1.0} <= set(fractions)  # the stages change within the epoch
    for k in range(steps):
        budget = 2 * int(fractions[k] * 64)
        assert counts[0][k] == budget
        assert logged[k][SCHEDULE_KEYS[0]] == budget
        assert logged[k][SCHEDULE_KEYS[1]] == counts[1][k] <= budget
        assert logged[k][SCHEDULE_KEYS[2]] == counts[1][k] / budget
