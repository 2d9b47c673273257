"""The batch-size schedule's bounds with per-rank budgets, its levels' fill, and its refusals.

Issue 38: with ``rank_shares`` the schedule went to full steps about 11 steps before its
threshold (each lane of a level left its own remainder, all of it handed to the next level);
the last scaled level kept under-filled steps; a first fraction too small for the longest
example was refused only when the first epoch was planned; shares a run set were refused only
at the next epoch. Every expectation is the test's own arithmetic (the clock from the ids).
"""

from __future__ import annotations

import numpy as np
import pytest

import lightning_varbatch as lib
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner import EpochPlanner, PlanConfig, schedule_counts, wmt_like_lengths

PAIRS = np.random.default_rng(0).integers(1, 49, size=(1200, 2))


def _first_full_step(samplers: list[lib.TokenBudgetBatchSampler], key: np.ndarray) -> tuple:
    """The clock (planning tokens of every rank before it) at the first full step."""
    runs = [list(s) for s in samplers]
    full, clock = sum(samplers[0].rank_budgets), 0
    for j in range(len(runs[0])):
        if runs[0][j].step_budget == full:
            return clock, full
        clock += sum(int(key[list(run[j])].sum()) for run in runs)
    raise AssertionError("no full step in the epoch")


@pytest.mark.parametrize("cost", ["sum", "padded"])
@pytest.mark.parametrize("shares", [None, (1.0, 0.692, 0.849)])
def test_the_full_step_starts_within_a_step_of_its_threshold_with_or_without_shares(
    cost: str, shares: tuple[float, ...] | None
) -> None:
    """The issue's case: 11.1 full steps early with shares (11.7 padded); now under one."""
    samplers = [
        lib.TokenBudgetBatchSampler(
            PAIRS,
            84,
            rank=r,
            world_size=3,
            cost=cost,
            rank_shares=shares,
            batch_schedule="0:0.896 30000:1",
        )
        for r in range(3)
    ]
    clock, full = _first_full_step(samplers, PAIRS.max(axis=1))
    assert 30_000 - full <= clock <= 30_000 + full, (clock, full)


def test_a_schedule_that_outlasts_the_epoch_keeps_the_bound_in_the_next_epoch() -> None:
    key = PAIRS.max(axis=1)
    threshold = int(key.sum()) + 5_000  # 5K tokens into epoch 1
    samplers = [
        lib.TokenBudgetBatchSampler(
            PAIRS,
            96,
            rank=r,
            world_size=2,
            rank_shares=(0.97, 0.589),
            batch_schedule=f"0:0.9 {threshold}:1",
            epoch=1,
        )
        for r in range(2)
    ]
    clock, full = _first_full_step(samplers, key)
    assert abs(int(key.sum()) + clock - threshold) <= full


@pytest.mark.parametrize(("world", "acc"), [(1, 1), (2, 1), (2, 2)])
def test_the_last_scaled_level_sends_its_under_filled_steps_on_as_the_others_do(
    world: int, acc: int
) -> None:
    """The issue's case: the 0.5 level (the last before 1) kept steps filled to 0.68 on one
    rank and 0.518 on two; the 0.25 level, which sent them on, none below 0.83."""
    lengths = wmt_like_lengths(200_000, seed=0)
    planner = EpochPlanner(lengths, PlanConfig(4096, batch_schedule="0:0.25 1M:0.5 3M:1"))
    plan = planner.plan(0, world, acc)
    counts = schedule_counts(plan, planner)
    assert counts is not None and plan.step_fraction is not None
    budget, cost = counts
    fill = cost / budget
    for fraction in (0.25, 0.5):
        assert fill[plan.step_fraction == fraction].min() >= 0.83, fraction
    assert sorted(plan.example_ids().tolist()) == list(range(len(lengths)))


def test_a_first_fraction_too_small_is_refused_when_the_sampler_is_built() -> None:
    lengths = np.array([3, 5, 12] * 10)
    with pytest.raises(SettingValueError, match=r"at least 0\.1875") as caught:
        lib.TokenBudgetBatchSampler(lengths, 64, rank=0, world_size=2, batch_schedule="0:0.1 1K:1")
    assert caught.value.setting == "batch_schedule"
    lib.TokenBudgetBatchSampler(lengths, 64, rank=0, world_size=2, batch_schedule="0:0.1875 1K:1")


def test_shares_a_run_sets_are_raised_to_hold_the_longest_example_at_the_first_fraction() -> None:
    """Shares too small for the schedule's first fraction were refused at the next epoch."""
    lengths = np.random.default_rng(1).integers(1, 49, 400)
    sampler = lib.TokenBudgetBatchSampler(
        lengths, 96, rank=0, world_size=2, batch_schedule="0:0.6 100K:1"
    )
    sampler.set_rank_shares([1.0, 0.2])  # rank 1: 19 tokens, 11 at 0.6; the longest is 48
    list(sampler)
    sampler.set_epoch(1)
    budgets = sampler.rank_budgets
    longest = int(lengths.max())
    assert budgets[0] == 96 and int(0.6 * budgets[1]) >= longest > int(0.6 * (budgets[1] - 1))
    assert sampler.plan.step_fraction is not None and (sampler.plan.step_fraction == 0.6).all()
