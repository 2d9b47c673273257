"""The batch-size schedule's oracle: the tests' own arithmetic, never the library's.

A step's clock is the planning tokens trained before it (``max(source, target)`` for pairs):
``epoch × (planning tokens of every example)`` plus those of the epoch's earlier steps, as the
test counts them from the ids. A micro-batch's cost and every rank's budget are computed here
from the lengths and the settings. :func:`scenarios` draws planner runs under a schedule.

Example:
    >>> thresholds((0, 0.25), (100, 0.5), (300, 1.0)).at(150)
    0.5
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from hypothesis import strategies as st

from lightning_varbatch.planner import EpochPlan
from lightning_varbatch.planner.batch_schedule import MIN_LEVEL_STEPS

__all__ = [
    "Reference",
    "Scenario",
    "StepCheck",
    "assert_on_schedule",
    "behind_allowed",
    "check_plan",
    "micro_batch_cost",
    "planning_key",
    "ramp",
    "rank_budgets",
    "scenarios",
    "step_capacity",
    "thresholds",
]


@dataclass(frozen=True)
class Reference:
    """A schedule as the test wrote it: thresholds, or the exact linear ramp.

    Attributes:
        tokens: thresholds: ``fractions[i]`` from ``tokens[i]`` tokens on (a ramp: its end).
        fractions: the thresholds' fractions (a ramp: its start, then 1).
        ramp: whether it is the linear ramp from ``fractions[0]`` to 1 over ``tokens[-1]``.
    """

    tokens: tuple[int, ...]
    fractions: tuple[float, ...]
    ramp: bool = False

    def at(self, clock: float) -> float:
        """The schedule's fraction once ``clock`` tokens were trained."""
        if self.ramp:
            start, end = self.fractions[0], self.tokens[-1]
            return min(1.0, start + (1 - start) * max(clock, 0) / end)
        return self.fractions[max(bisect.bisect_right(self.tokens, clock) - 1, 0)]

    def reached(self, fraction: float) -> int:
        """The first whole clock at which the schedule holds at least ``fraction``."""
        if self.ramp:
            start, end = self.fractions[0], self.tokens[-1]
            return max(0, math.ceil((fraction - start) / (1 - start) * end - 1e-9))
        return next(t for t, f in zip(self.tokens, self.fractions, strict=True) if f >= fraction)

    @property
    def full_from(self) -> int:
        return self.tokens[-1]


def thresholds(*points: tuple[int, float]) -> Reference:
    """A reference schedule from ``(tokens, fraction)`` points."""
    return Reference(tuple(int(t) for t, _ in points), tuple(float(f) for _, f in points))


def ramp(start: float, tokens: int) -> Reference:
    """The linear ramp from ``start`` to 1 over ``tokens`` (exact, not in levels)."""
    return Reference((0, int(tokens)), (float(start), 1.0), ramp=True)


def planning_key(lengths: np.ndarray) -> np.ndarray:
    """Every example's planning length: the length, or ``max(source, target)``."""
    return (lengths.max(axis=1) if lengths.ndim == 2 else lengths).astype(np.int64)


def rank_budgets(
    max_tokens: int,
    world: int,
    shares: tuple[float, ...] | None = None,
    memory: tuple[int, ...] | None = None,
) -> list[int]:
    """Every rank's full micro-batch budget: the largest scale of the relative shares that keeps
    every rank within its memory budget (``max_tokens`` without one)."""
    limit = [float(m) for m in memory] if memory is not None else [float(max_tokens)] * world
    speed = [1.0] * world if shares is None else [s / max(shares) for s in shares]
    scale = min(m / v for m, v in zip(limit, speed, strict=True))
    return [int(min(math.floor(scale * v + 1e-9), m)) for v, m in zip(speed, limit, strict=True)]


def step_capacity(fraction: float, budgets: list[int], acc: int) -> int:
    """The most tokens a step at ``fraction`` holds: every micro-batch at its rank's budget."""
    return acc * sum(math.floor(fraction * b) for b in budgets)


def micro_batch_cost(key: np.ndarray, layout: str) -> int:
    """The cost of one micro-batch of planning lengths ``key`` (default cost models)."""
    if layout == "packed":
        return int(key.sum())
    return int(key.size * key.max())


@dataclass(frozen=True)
class StepCheck:
    """What the oracle found for one plan (returned for reports and further asserts)."""

    counts: np.ndarray  # runs of each example
    clocks: np.ndarray  # each step's clock (tokens trained before it), and the epoch's end
    fractions: np.ndarray  # each step's fraction (the plan's)
    fill: np.ndarray  # each step's cost over its budget
    lag: np.ndarray  # tokens by which each step runs ahead of its schedule (0: on time)


def check_plan(
    plan: EpochPlan,
    lengths: np.ndarray,
    layout: str,
    budgets: list[int],
    schedule: Reference,
    start: int,
) -> StepCheck:
    """Assert every micro-batch within ``floor(fraction × budget)`` of its rank; measure the rest.

    Args:
        plan: the plan (of an epoch, or the rest of one).
        lengths: the lengths the plan was made from.
        layout: ``"padded"`` or ``"packed"``.
        budgets: every rank's full budget (:func:`rank_budgets`).
        schedule: the schedule as the test wrote it.
        start: the clock at the plan's first step.
    """
    key = planning_key(lengths)
    fractions = np.ones(plan.num_steps) if plan.step_fraction is None else plan.step_fraction
    assert fractions.shape == (plan.num_steps,)
    counts = np.zeros(key.size, dtype=np.int64)
    clocks = [start]
    fill, lag = [], []
    for step in range(plan.num_steps):
        f = float(fractions[step])
        cost = capacity = tokens = 0
        for rank in range(plan.world_size):
            limit = math.floor(f * budgets[rank])
            for mb in plan.assign[step, rank]:
                ids = plan.micro_batch_ids(int(mb))
                assert ids.size > 0, f"step {step}: an empty micro-batch on rank {rank}"
                c = micro_batch_cost(key[ids], layout)
                assert c <= limit, (
                    f"step {step} (fraction {f:g}): rank {rank} runs cost {c} over "
                    f"floor({f:g} * {budgets[rank]}) = {limit}"
                )
                np.add.at(counts, ids, 1)
                cost += c
                capacity += limit
                tokens += int(key[ids].sum())
        fill.append(cost / capacity)
        lag.append(max(0, schedule.reached(f) - clocks[-1]))
        clocks.append(clocks[-1] + tokens)
    return StepCheck(counts, np.asarray(clocks), fractions, np.asarray(fill), np.asarray(lag))


def behind_allowed(f: float, schedule: Reference, budgets: list[int], acc: int) -> int:
    """Tokens a ramp's step at ``f`` may run behind it: a ramp is planned in levels merged to
    span at least ``MIN_LEVEL_STEPS`` full steps at their fraction, plus one 1 % level."""
    if not schedule.ramp:
        return 0
    width = schedule.reached(min(1.0, f * 1.0101)) - schedule.reached(f) + 1
    return MIN_LEVEL_STEPS * math.ceil(f * acc * sum(budgets)) + width


def assert_on_schedule(
    found: StepCheck,
    schedule: Reference,
    budgets: list[int],
    acc: int,
    longest: int,
) -> None:
    """Every step at its schedule's fraction, within what planning in whole steps allows.

    An example's level is the schedule's at the clock where the example starts in the plan
    without a schedule, and a level is re-planned as a whole: its steps run in another order,
    so a step may start up to the ``longest`` example's tokens after its examples' level ended
    (never more than a level, 1 %, below the schedule at ``clock - longest``; a ramp's levels
    are merged to span a few steps, ``docs/batch-schedule.md``: by as much more). What a level
    leaves over (whole steps only) joins the next one, so a step may also run ahead of its
    schedule: by less than two steps at its fraction, with per-rank budgets (``lanes``) too.
    """
    behind = []
    for s, (f, c) in enumerate(zip(found.fractions.tolist(), found.clocks.tolist(), strict=False)):
        at = c - longest - behind_allowed(f, schedule, budgets, acc)
        if f * 1.01 < schedule.at(at) - 1e-6:
            behind.append((s, f, c, schedule.at(at)))
    assert not behind, (
        f"steps smaller than their schedule (step, fraction, clock, schedule): {behind}"
    )
    for s, f in enumerate(found.fractions.tolist()):
        allowed = 2 * step_capacity(f, budgets, acc)
        assert found.lag[s] <= allowed, (
            f"step {s} at fraction {f:g} starts {found.lag[s]} tokens before the schedule "
            f"reaches it (more than two of its steps, {allowed} tokens)"
        )


@dataclass(frozen=True)
class Scenario:
    """One planner run under a schedule."""

    lengths: np.ndarray
    layout: str
    settings: dict[str, Any]  # PlanConfig settings but max_tokens and the schedule
    max_tokens: int
    schedule: Any  # as given to the library
    reference: Reference
    world: int
    acc: int
    epoch: int

    @property
    def budgets(self) -> list[int]:
        return rank_budgets(self.max_tokens, self.world, self.settings.get("rank_shares"))


@st.composite
def scenarios(draw: st.DrawFn, max_examples: int = 300) -> Scenario:
    """Lengths × layout × tail × topology × shares × epoch × schedule (thresholds or ramp)."""
    n = draw(st.integers(30, max_examples))
    layout = draw(st.sampled_from(["padded", "packed"]))
    pairs = layout == "padded" and draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    single = np.clip(rng.lognormal(2.8, 0.7, n).astype(np.int64), 1, 80)
    lengths = single
    if pairs:
        lengths = np.stack([single, np.clip(single + rng.integers(-6, 7, n), 1, 80)], 1)
    world, acc = draw(st.integers(1, 4)), draw(st.integers(1, 3))
    shares = None
    if world > 1 and draw(st.booleans()):
        shares = tuple(round(draw(st.floats(0.4, 1.0)), 2) for _ in range(world))
    first = draw(st.sampled_from([0.1, 0.25, 0.3, 0.5, 0.8]))
    longest = int(planning_key(lengths).max())
    smallest = min(shares) / max(shares) if shares else 1.0
    least = math.ceil((longest + 2) / (first * smallest)) + 3  # the first fraction holds it
    max_tokens = draw(st.integers(least, 3 * least))
    epoch_tokens = int(planning_key(lengths).sum())
    span = draw(st.floats(0.05, 2.5))  # where the schedule reaches 1, in epochs
    full = max(2, int(span * epoch_tokens))
    if full >= 1000 and draw(st.booleans()):  # shorter ramps: test_a_short_ramp_...
        schedule: Any = f"ramp:{first}:{full}"
        reference = ramp(first, full)
    else:
        middle = sorted(draw(st.lists(st.floats(0.05, 0.95), max_size=2, unique=True)))
        points = [(0, first)]
        for i, where in enumerate(middle):
            points.append((int(where * full), first + (1 - first) * (i + 1) / (len(middle) + 1)))
        points.append((full, 1.0))
        points = [p for i, p in enumerate(points) if i == 0 or p[0] > points[i - 1][0]]
        kind = draw(st.sampled_from(["text", "pairs", "dict"]))
        if kind == "text":
            schedule = " ".join(f"{t}:{f!r}" for t, f in points)
        elif kind == "pairs":
            schedule = points
        else:
            schedule = dict(points)
        reference = thresholds(*points)
    settings: dict[str, Any] = {
        "seed": seed,
        "tail": draw(st.sampled_from(["spread", "spread", "drop", "pad"])),
        "layout": layout,
        "rank_shares": shares,
    }
    return Scenario(
        lengths,
        layout,
        settings,
        max_tokens,
        schedule,
        reference,
        world,
        acc,
        draw(st.integers(0, 2)),
    )
