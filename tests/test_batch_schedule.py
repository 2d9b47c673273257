"""The batch-size schedule (issue 32): its forms, and the planner's steps against the schedule.

Every expectation comes from the test's own arithmetic (:mod:`tests.batch_schedule_oracle`):
the thresholds of each written form, the clock of every step (planning tokens trained before
it), every micro-batch's cost and every rank's budget. Resume, refusals and the DataModule are
in ``test_batch_schedule_resume.py``.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from lightning_varbatch import PlanConfig
from lightning_varbatch.planner import EpochPlanner
from lightning_varbatch.planner.batch_schedule import BatchSchedule
from tests.batch_schedule_oracle import (
    Scenario,
    assert_on_schedule,
    check_plan,
    planning_key,
    ramp,
    rank_budgets,
    scenarios,
    thresholds,
)

QUICK = settings(
    max_examples=20,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
SOAK = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _schedule(spec: object, max_tokens: int = 64) -> BatchSchedule | None:
    text = PlanConfig(max_tokens, batch_schedule=spec).batch_schedule
    return None if text is None else BatchSchedule.parse(text)


# -- the written forms -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "tokens", "fractions"),
    [
        ("0:0.25 2M:0.5 8M:1", (0, 2_000_000, 8_000_000), (0.25, 0.5, 1.0)),
        ("0:0.1 1.5K:0.2 3k:1", (0, 1_500, 3_000), (0.1, 0.2, 1.0)),
        ("0:0.5 1B:1", (0, 10**9), (0.5, 1.0)),
        ("0:0.5 1G:1", (0, 10**9), (0.5, 1.0)),
        ("0:0.5 2T:1", (0, 2 * 10**12), (0.5, 1.0)),
        ("0:0.5 1e3:0.75 2500:1.0", (0, 1_000, 2_500), (0.5, 0.75, 1.0)),
        ("  0:0.5   300:0.5  900:1 ", (0, 900), (0.5, 1.0)),  # an unchanged fraction: no level
    ],
)
def test_thresholds_text_gives_the_thresholds_of_its_arithmetic(
    text: str, tokens: tuple[int, ...], fractions: tuple[float, ...]
) -> None:
    schedule = _schedule(text)
    assert schedule is not None
    assert (schedule.tokens, schedule.fractions) == (tokens, fractions)
    assert schedule.full_from == tokens[-1]


def test_every_form_of_one_schedule_is_one_setting() -> None:
    forms = [
        "0:0.25 2M:0.5 8M:1",
        [(0, 0.25), (2_000_000, 0.5), (8_000_000, 1)],
        [(0, 0.25), ("2M", 0.5), ("8M", 1.0)],
        {0: 0.25, "2M": 0.5, 8e6: 1},
        ((0, 0.25), [2_000_000, 0.5], (8_000_000, 1)),
    ]
    texts = {PlanConfig(64, batch_schedule=f).batch_schedule for f in forms}
    assert len(texts) == 1
    # the canonical text is itself a form, and gives the same schedule
    (text,) = texts
    assert PlanConfig(64, batch_schedule=text).batch_schedule == text


@pytest.mark.parametrize("full", ["0:1", "0:1.0", [(0, 1)], {0: 1}, "ramp:1:5M", "ramp:0.5:0"])
def test_a_schedule_that_is_always_full_is_no_schedule(full: object) -> None:
    assert PlanConfig(64, batch_schedule=full).batch_schedule is None


def test_fraction_at_is_the_step_function_of_the_thresholds() -> None:
    schedule = _schedule("0:0.25 2M:0.5 8M:1")
    assert schedule is not None
    expected = {
        -5: 0.25,
        0: 0.25,
        1_999_999: 0.25,
        2_000_000: 0.5,
        7_999_999.5: 0.5,
        8_000_000: 1.0,
        10**15: 1.0,
    }
    assert {t: schedule.fraction_at(t) for t in expected} == expected


@pytest.mark.parametrize(("start", "tokens"), [(0.25, 1_000), (0.5, 3_000), (0.1, 8_000_000)])
def test_a_ramp_holds_levels_within_one_percent_below_the_line(start: float, tokens: int) -> None:
    """At every token the level is at most the linear ramp and at least 1 % below it."""
    schedule = _schedule(f"ramp:{start}:{tokens}")
    assert schedule is not None
    line = ramp(start, tokens)
    if tokens <= 10_000:
        points = np.arange(0, tokens + 50)
    else:
        points = np.random.default_rng(0).integers(0, tokens + 50, 20_000)
    levels = np.array([schedule.fraction_at(int(t)) for t in points])
    exact = np.array([line.at(int(t)) for t in points])
    assert (levels <= exact + 1e-12).all(), "a level above the ramp: a step larger than scheduled"
    # (levels are written to 6 digits: 1 % up to that rounding)
    assert (levels * 1.01 >= exact - 1e-6).all(), "a level more than 1 % below the ramp"
    assert schedule.fractions[0] == start and schedule.full_from == tokens
    assert (np.diff(schedule.fractions) > 0).all() and (np.diff(schedule.tokens) > 0).all()
    # no more levels than 1 % steps from start to 1 need
    assert schedule.num_levels <= math.ceil(math.log(1 / start) / math.log(1.01)) + 1


@pytest.mark.parametrize("tokens", [50, 200, 700])
def test_a_short_ramp_is_a_schedule(tokens: int) -> None:
    """A ramp over fewer tokens than it has 1 % levels holds a level per token instead.

    Found by this suite: ``ramp:0.1:700`` was refused with "thresholds must increase" (two
    levels rounded to the same token), though the ramp is valid.
    """
    schedule = _schedule(f"ramp:0.1:{tokens}")
    assert schedule is not None
    line = ramp(0.1, tokens)
    for t in range(tokens + 2):
        assert line.at(t) / 1.01 - 1e-6 <= schedule.fraction_at(t) <= line.at(t) + 1e-12


def _gentle(tokens: float) -> float:
    """A schedule written as a function: 0.2 rising to 1 at 4000 tokens."""
    return min(1.0, 0.2 + 0.8 * tokens / 4000)


def test_a_callable_is_read_into_levels_of_its_own_values() -> None:
    schedule = _schedule(_gentle, max_tokens=64)
    assert schedule is not None
    tokens, fractions = schedule.tokens, schedule.fractions
    assert tokens[0] == 0 and fractions[0] == pytest.approx(0.2)
    # each level is the callable's value at its start; levels at least 1 % apart
    for t, f in zip(tokens, fractions, strict=True):
        assert f == pytest.approx(_gentle(t))
    ratios = np.asarray(fractions[1:-1]) / np.asarray(fractions[:-2])
    assert (ratios >= 1.01 - 1e-12).all()
    # the full step from where the callable reaches 1, no later than max_tokens doubled past it
    assert 4_000 <= schedule.full_from <= 64 * 2**6
    for t in range(0, 4_200, 7):  # never above the callable; at most 2 % below this gentle one
        assert _gentle(t) / 1.02 <= schedule.fraction_at(t) <= _gentle(t) + 1e-12


# -- the plan against the schedule ------------------------------------------------------------


def _plan_and_check(case: Scenario) -> None:
    config = PlanConfig(case.max_tokens, batch_schedule=case.schedule, **case.settings)
    try:
        plan = EpochPlanner(case.lengths, config).plan(case.epoch, case.world, case.acc)
    except ValueError as error:  # too few micro-batches for the ranks, as without a schedule
        assert "More ranks than batches" in str(error)
        return
    key = planning_key(case.lengths)
    epoch_tokens = int(key.sum())
    budgets = case.budgets
    lanes = len(set(budgets)) > 1  # equal shares plan as one budget
    if lanes:
        assert plan.rank_budget is not None and plan.rank_budget.tolist() == budgets
    found = check_plan(
        plan, case.lengths, case.layout, budgets, case.reference, case.epoch * epoch_tokens
    )
    counts, n = found.counts, key.size
    missing, repeated = int((counts == 0).sum()), int(np.maximum(counts - 1, 0).sum())
    tail = case.settings["tail"]
    if tail == "drop":
        assert repeated == 0 and plan.num_duplicated == 0, "tail='drop' repeated examples"
        assert missing == plan.num_dropped
    else:
        assert missing == 0 and plan.num_dropped == 0, f"tail={tail!r} lost examples"
        assert repeated == plan.num_duplicated
    if tail == "spread" and repeated:
        # only where a part of the epoch has fewer examples than a step has micro-batches:
        # the epoch's last step, under a schedule that outlasts the epoch
        last = plan.ids_of_micro_batches(plan.assign[-1].reshape(-1))
        again = np.flatnonzero(counts > 1)
        assert np.isin(again, last).all(), "tail='spread' repeated examples before its last step"
        assert np.unique(last).size < case.world * case.acc
        assert found.clocks[-2] < case.reference.full_from
    assert_on_schedule(found, case.reference, budgets, case.acc, int(key.max()))
    if found.clocks[0] >= case.reference.full_from:
        assert (found.fractions == 1.0).all()
    # determinism: another planner of the same settings plans the same steps
    again = EpochPlanner(case.lengths, config).plan(case.epoch, case.world, case.acc)
    assert np.array_equal(again.order, plan.order) and np.array_equal(again.assign, plan.assign)
    assert np.array_equal(again.step_fraction, plan.step_fraction)
    assert counts.size == n


@QUICK
@given(scenarios(max_examples=160))
def test_every_step_holds_its_fraction_of_every_budget(case: Scenario) -> None:
    _plan_and_check(case)


@pytest.mark.slow
@SOAK
@given(scenarios(max_examples=600))
def test_every_step_holds_its_fraction_of_every_budget_soak(case: Scenario) -> None:
    _plan_and_check(case)


def test_a_lane_planned_level_smaller_than_a_step_is_carried_not_repeated() -> None:
    """Minimal form of what the property test found with ``rank_shares``.

    A level of the schedule holding fewer examples than the step has micro-batches is left to
    the next level with equal budgets; with per-rank budgets (lanes) it was planned as a step
    that runs the one example on both ranks: a repeat under ``tail="spread"`` and even
    ``tail="drop"`` (counted in ``num_duplicated``).
    """
    lengths = np.full(40, 10)
    for tail in ("spread", "drop"):
        for shares in (None, (1.0, 0.5)):
            config = PlanConfig(
                40, batch_schedule="0:0.5 5:0.75 200:1", rank_shares=shares, tail=tail
            )
            plan = EpochPlanner(lengths, config).plan(0, 2, 1)
            counts = np.bincount(plan.example_ids(), minlength=40)
            assert counts.max() == 1, f"tail={tail!r}, rank_shares={shares}: repeated"


# -- how full the scheduled steps are -------------------------------------------------------

_LENGTHS = np.clip(np.random.default_rng(0).lognormal(3.0, 0.6, 4000).astype(int), 2, 120)
_FULL = int(_LENGTHS.sum()) // 3  # the schedule reaches 1 a third into the epoch


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize(
    ("schedule", "reference"),
    [
        (
            f"0:0.25 {_FULL // 2}:0.5 {_FULL}:1",
            thresholds((0, 0.25), (_FULL // 2, 0.5), (_FULL, 1)),
        ),
        (f"ramp:0.25:{_FULL}", ramp(0.25, _FULL)),
    ],
    ids=["thresholds", "ramp"],
)
@pytest.mark.parametrize(
    ("world", "acc", "shares"), [(1, 1, None), (2, 2, None), (2, 1, (1.0, 0.6))]
)
def test_scheduled_steps_are_as_full_as_the_planner_makes_small_steps(
    layout: str,
    schedule: str,
    reference: object,
    world: int,
    acc: int,
    shares: tuple[float, ...] | None,
) -> None:
    """The mean fill (cost over budget) of the steps below 1 is at most 3 % below that of a
    plan without a schedule at the schedule's smallest budget (its worst granularity).

    A single step's fill varies as a full step's does; the mean over many must not: a level
    planned in part-empty steps wastes the steps the schedule is meant to save.
    """
    config = PlanConfig(1024, batch_schedule=schedule, layout=layout, rank_shares=shares)
    plan = EpochPlanner(_LENGTHS, config).plan(0, world, acc)
    found = check_plan(plan, _LENGTHS, layout, rank_budgets(1024, world, shares), reference, 0)  # type: ignore[arg-type]
    smallest = PlanConfig(256, layout=layout, rank_shares=shares)  # 0.25 of every budget
    plain = EpochPlanner(_LENGTHS, smallest).plan(0, world, acc)
    small = check_plan(
        plain, _LENGTHS, layout, rank_budgets(256, world, shares), thresholds((0, 1)), 0
    )
    scheduled = found.fractions < 1
    part, full, floor = found.fill[scheduled], found.fill[~scheduled][1:-1], small.fill[:-1]
    assert part.size >= 10 and full.size >= 10
    print(
        f"{layout} {world}x{acc} shares={shares}: {part.size} scheduled steps, fill mean "
        f"{part.mean():.3f} (min {part.min():.3f}); {full.size} full steps, mean "
        f"{full.mean():.3f}; without a schedule at 0.25 of the budgets {floor.mean():.3f}"
    )
    assert part.mean() >= floor.mean() - 0.03, (
        f"scheduled steps are {part.mean():.3f} full on average ({part.size} steps), steps "
        f"planned at the smallest budget {floor.mean():.3f}, full steps {full.mean():.3f}"
    )


def test_the_step_where_the_schedule_reaches_one_repeats_nothing() -> None:
    """Found by the lifecycle soak: the examples left when the schedule reaches 1 (16 here,
    each about a micro-batch, for steps of 6 micro-batches) were planned as whole steps that
    needed 18 micro-batches, so ``tail="spread"`` repeated 2 examples mid-epoch."""
    lengths = np.array(
        "2 2 2 2 4 4 4 5 5 6 8 10 10 11 11 11 11 12 12 13 13 14 14 14 14 15 16 16 17 17 17 18 "
        "18 19 19 19 20 20 20 21 21 21 22 24 24 25 25 26 28 28 29 29 29 30 30 30 32 35 37 38 "
        "38 44 45 47 48 12 23 32 33 33 33 33 34 36 36 36 38 39 40 40 41 42 42 42 42 42 44 44 "
        "45 45 46 46 47 47 47 48 48".split(),
        dtype=np.int64,
    )
    config = PlanConfig(
        67,
        layout="packed",
        pad_to_multiple_of=4,
        bucket_width=4,
        batch_schedule="0:0.8 1360:0.9 3735:1",
    )
    planner = EpochPlanner(lengths, config)
    assert int(lengths.sum()) < 3735 < 2 * int(lengths.sum())  # the schedule ends in epoch 1
    for epoch in (0, 1):
        counts = np.bincount(planner.plan(epoch, 3, 2).example_ids(), minlength=lengths.size)
        assert counts.min() == counts.max() == 1, f"epoch {epoch}: {np.flatnonzero(counts > 1)}"
