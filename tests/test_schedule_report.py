"""The batch-schedule report: every figure recomputed here from the plan, step by step."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from lightning_varbatch.planner import EpochPlanner, PlanConfig
from lightning_varbatch.planner.batch_schedule import BatchSchedule
from lightning_varbatch.planner.schedule_report import (
    ScheduleReport,
    ScheduleStage,
    schedule_report,
)


def _pairs(n: int = 6000, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    source = rng.integers(3, 120, n)
    return np.stack([source, np.maximum(1, source + rng.integers(-10, 11, n))], axis=1)


def _steps(plan, lengths: np.ndarray, max_tokens: int) -> dict[str, np.ndarray]:
    """Per step, by looping over the plan's steps: what the report must summarise."""
    key, target = lengths.max(axis=1), lengths[:, 1]
    fraction = np.ones(plan.num_steps) if plan.step_fraction is None else plan.step_fraction
    rows: dict[str, list[float]] = {"planning": [], "loss": [], "examples": [], "fill": []}
    for step in range(plan.num_steps):
        ids = plan.ids_of_micro_batches(plan.assign[step].reshape(-1))
        budget = plan.world_size * int(fraction[step] * max_tokens) * plan.accumulate_grad_batches
        cost = float(np.ceil(plan.micro_batch_cost[plan.assign[step]].sum()))
        rows["planning"].append(int(key[ids].sum()))
        rows["loss"].append(int(target[ids].sum()))
        rows["examples"].append(ids.size)
        rows["fill"].append(cost / budget)
    return {name: np.asarray(values) for name, values in rows.items()} | {"fraction": fraction}


def test_every_figure_of_a_threshold_schedule_matches_the_plan() -> None:
    lengths, budget = _pairs(), 1024
    config = PlanConfig(max_tokens=budget, batch_schedule="0:0.25 40K:0.5 120K:1")
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world_size=2, accumulate_grad_batches=2)
    report = schedule_report(planner, plan)
    assert report is not None and report.schedule == "0:0.25 40000:0.5 120000:1.0"
    steps = _steps(plan, lengths, budget)
    clock = np.cumsum(steps["planning"]) - steps["planning"]
    assert [r.label for r in report.rows] == ["0.25", "0.5", "1 (full)"]
    assert sum(r.num_steps for r in report.rows) == plan.num_steps
    for row, fraction in zip(report.rows, (0.25, 0.5, 1.0), strict=True):
        mask = steps["fraction"] == fraction
        first = int(np.flatnonzero(mask)[0])
        assert (row.fraction_min, row.fraction_max, row.levels) == (fraction, fraction, 1)
        assert (row.first_step, row.num_steps) == (first, int(mask.sum()))
        assert row.start_tokens == clock[first]
        assert row.micro_batches == 2  # the accumulation never changes
        assert row.budget_min == row.budget_max == int(fraction * budget)
        assert row.step_budget == 2 * 2 * int(fraction * budget)
        assert row.tokens_per_step == pytest.approx(steps["planning"][mask].mean())
        assert row.min_tokens == steps["planning"][mask].min()
        assert row.loss_tokens_per_step == pytest.approx(steps["loss"][mask].mean())
        assert row.min_loss_tokens == steps["loss"][mask].min()
        assert row.examples_per_step == pytest.approx(steps["examples"][mask].mean())
        assert row.fill == pytest.approx(steps["fill"][mask].mean())
        assert row.min_fill == pytest.approx(steps["fill"][mask].min())
        assert 0 < row.min_fill <= row.fill <= 1
    # the schedule's steps are in order: each stage starts where the one before ended
    ends = [r.first_step + r.num_steps for r in report.rows]
    assert [r.first_step for r in report.rows[1:]] == ends[:-1]


def test_a_ramp_is_grouped_into_at_most_rows_rows_of_consecutive_levels() -> None:
    lengths = _pairs()
    config = PlanConfig(max_tokens=1024, batch_schedule="ramp:0.25:150K")
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world_size=2)
    assert plan.step_fraction is not None
    used = sorted(set(plan.step_fraction.tolist()))
    assert len(used) > 8  # more levels than rows: grouped
    for rows in (2, 4, 8):
        report = schedule_report(planner, plan, rows=rows)
        assert report is not None and len(report.rows) <= rows
        assert report.rows[-1].label == "1 (full)" and report.rows[-1].levels == 1
        assert sum(r.levels for r in report.rows) == len(used)
        assert sum(r.num_steps for r in report.rows) == plan.num_steps
        bounds = [(r.fraction_min, r.fraction_max) for r in report.rows]
        assert all(a[1] < b[0] for a, b in itertools.pairwise(bounds))
        steps = _steps(plan, lengths, 1024)
        for row in report.rows:
            mask = (steps["fraction"] >= row.fraction_min) & (steps["fraction"] <= row.fraction_max)
            assert row.num_steps == mask.sum()
            assert row.budget_min == int(row.fraction_min * 1024)
            assert row.budget_max == int(row.fraction_max * 1024)
            assert row.fill == pytest.approx(steps["fill"][mask].mean())
    short = schedule_report(planner, plan).format().splitlines()[0]  # type: ignore[union-attr]
    levels = BatchSchedule.parse(config.batch_schedule).num_levels  # type: ignore[arg-type]
    assert short == f"batch schedule   {levels} levels, 0.25 at 0 to 1 at 150,000 tokens"


def test_rank_budgets_show_as_a_range_and_a_later_epoch_is_one_full_row() -> None:
    lengths = _pairs()
    config = PlanConfig(max_tokens=1024, batch_schedule="0:0.5 50K:1", rank_shares=[1.0, 0.5])
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world_size=2)
    report = schedule_report(planner, plan)
    assert report is not None and plan.rank_budget is not None
    full = plan.rank_budget.tolist()
    assert [(r.budget_min, r.budget_max) for r in report.rows] == [
        (int(0.5 * min(full)), int(0.5 * max(full))),
        (min(full), max(full)),
    ]
    assert f"{min(full)}-{max(full)}" in report.format()
    later = schedule_report(planner, planner.plan(1, world_size=2))
    assert later is not None and [r.label for r in later.rows] == ["1 (full)"]
    assert later.start_tokens == later.rows[0].start_tokens == planner.epoch_tokens
    assert later.rows[0].num_steps == planner.plan(1, world_size=2).num_steps
    given = schedule_report(planner, plan, clock=1234)
    assert given is not None and given.rows[0].start_tokens == 1234


def test_no_schedule_no_report_and_plain_values() -> None:
    lengths = _pairs(2000)
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=1024))
    assert schedule_report(planner, planner.plan(0, 2)) is None
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=1024, batch_schedule="0:0.5 20K:1"))
    plan = planner.plan(0, 2)
    with pytest.raises(ValueError, match="rows must be at least 2"):
        schedule_report(planner, plan, rows=1)
    report = schedule_report(planner, plan)
    assert isinstance(report, ScheduleReport)
    plain = json.loads(json.dumps(report.to_dict()))
    assert plain["schedule"] == "0:0.5 20000:1.0" and plain["start_tokens"] == 0
    assert [s["label"] for s in plain["stages"]] == [r.label for r in report.rows]
    assert ScheduleStage(**plain["stages"][0]) == report.rows[0]
    lines = report.format().splitlines()
    assert len(lines) == 2 + len(report.rows) and lines[0].endswith("0:0.5 20000:1.0")
