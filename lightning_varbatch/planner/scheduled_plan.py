"""An epoch under the batch-size schedule: its early steps re-planned at smaller budgets.

The epoch is planned as without a schedule, then walked in step order with the schedule's clock
(tokens trained before the epoch, plus those of the steps before). The examples of steps starting
before the schedule reaches 1 are split by the clock's level at their position, and each level's are
planned again at its fraction of every rank's budget, whole steps only: a partial step's examples,
and those of a step filled far below the levels' median (a cut's remainder), join the next level, at
most one step's worth (a level may begin about a step before its threshold). The level reaching 1
holds one step at full budgets (tail policy ``"spread"``: with the plan's next step when too few for
a step; the epoch's one step with fewer tokens than scheduled), or, when the schedule outlasts the
epoch, the epoch's tail under its own policy. Later steps are the plan's own. Every example is
planned once, as without a schedule; each step carries its fraction (``plan.step_fraction``).

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> cfg = PlanConfig(max_tokens=64, batch_schedule="0:0.5 300:1")
    >>> plan = EpochPlanner(np.full(100, 8), cfg).plan(0)
    >>> half = plan.step_fraction == 0.5
    >>> int(half.sum()), int(plan.step_tokens[half].max()), int(plan.step_tokens.max())
    (9, 32, 64)
    >>> sorted(plan.example_ids().tolist()) == list(range(100))
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.batch_schedule import BatchSchedule
from lightning_varbatch.planner.epoch_plan import EpochPlan

__all__ = [
    "PlanPart",
    "fraction_budgets",
    "join_plans",
    "least_budget",
    "schedule_counts",
    "schedule_epoch",
    "step_budgets",
]

#: A level's step filled below this fraction of the levels' median fill joins the next level (a
#: cut's remainder: with one micro-batch per step it would run nearly empty).
UNDERFILLED = 0.9
#: ``(ids, fraction, tail, stage)`` -> the plan of ``ids`` at ``fraction`` of every budget.
PlanPart = Callable[[np.ndarray, float, str | None, int], EpochPlan]
#: A level's examples are planned in at most this many passes (:func:`_whole_steps`).
_PASSES = 4


def fraction_budgets(budgets: tuple[int, ...], fraction: float, longest: int) -> tuple[int, ...]:
    """Every rank's budget at ``fraction``; refused when one cannot hold the longest example.

    Raises:
        SettingValueError: naming ``batch_schedule``, the rank and the least first fraction
            that works (and the rank's share or memory budget when the ranks' budgets differ).

    Example:
        >>> fraction_budgets((64, 32), 0.5, 10)
        (32, 16)
    """
    scaled = tuple(int(b) for b in step_budgets(budgets, np.array([fraction]), 1, per_rank=True)[0])
    if min(scaled) < longest:
        r = int(np.argmin(scaled))
        need = math.ceil(longest / budgets[r] * 10_000) / 10_000
        other = "" if len(set(budgets)) == 1 else f", raise rank {r}'s entry of rank_shares"
        raise SettingValueError(
            f"batch_schedule: at fraction {fraction:g} rank {r}'s micro-batch budget is "
            f"{scaled[r]} tokens, below the longest example's cost {longest}: start the "
            f"schedule at a fraction of at least {need:g}{other}, or raise max_tokens.",
            setting="batch_schedule",
            value=fraction,
        )
    return scaled


def least_budget(longest: int, fraction: float) -> int:
    """The least budget whose ``fraction`` holds the longest example's cost ``longest``.

    Example:
        >>> least_budget(10, 0.3)
        34
    """
    budget = math.ceil(longest / fraction)
    while math.floor(fraction * budget) < longest:  # float64 as step_budgets computes it
        budget += 1
    return budget


def step_budgets(
    budgets: npt.ArrayLike, fractions: np.ndarray, acc: int, *, per_rank: bool = False
) -> np.ndarray:
    """The token budget of steps at ``fractions``: ``acc × Σ_r ⌊fraction × budgets[r]⌋``.

    ``per_rank``: each rank's ``⌊fraction × budgets[r]⌋`` instead, ``(steps, ranks)``.

    Example:
        >>> step_budgets([64, 32], np.array([0.5, 1.0]), 2).tolist()
        [96, 192]
    """
    full = np.asarray(budgets, dtype=np.float64)
    ranks = np.floor(np.multiply.outer(fractions, full)).astype(np.int64)
    return ranks if per_rank else ranks.sum(axis=1) * acc


def schedule_counts(plan: EpochPlan, planner: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """Each step's token budget under the schedule and its planned cost (``None``: none).

    ``planner``: the plan's planner (its ``config``); computed once per plan.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner([4] * 8, PlanConfig(8, batch_schedule="0:0.5 16:1"))
        >>> [c.tolist() for c in schedule_counts(planner.plan(0, 2), planner)]
        [[8, 8, 16], [8, 8, 16]]
    """
    config = getattr(planner, "config", None)
    if config is None or getattr(config, "batch_schedule", None) is None:
        return None
    cached = plan.__dict__.get("_schedule_counts")
    if cached is None:
        full = (
            np.full(plan.world_size, config.max_tokens)
            if plan.rank_budget is None
            else plan.rank_budget
        )
        fraction = np.ones(plan.num_steps) if plan.step_fraction is None else plan.step_fraction
        budget = step_budgets(full, fraction, plan.accumulate_grad_batches)
        cost = np.ceil(plan.micro_batch_cost[plan.assign].sum(axis=(1, 2))).astype(np.int64)
        cached = (budget, cost)
        object.__setattr__(plan, "_schedule_counts", cached)
    return cached


def _region(plan: EpochPlan, key: np.ndarray, clock: int, until: int) -> tuple[int, np.ndarray]:
    """The plan's first steps that start before the clock reaches ``until``: count and ids.

    The ids: those steps' examples in run order; steps are read a few at a time from a guess.
    """
    steps = plan.num_steps
    mean_cost = float(plan.micro_batch_cost[plan.assign].sum()) / steps
    guess = max(1, int(np.ceil((until - clock) / max(1.0, mean_cost))))
    while True:
        take = min(steps, 2 * guess + 8)
        ids = plan.ids_of_micro_batches(plan.assign[:take].reshape(-1))
        ends = np.cumsum(plan.step_examples[:take])  # each step's end in ``ids``
        tokens = np.cumsum(key[ids], dtype=np.int64)
        starts = clock + np.concatenate(([0], tokens[ends[:-1] - 1]))  # each step's clock
        k = int(np.searchsorted(starts, until, side="left"))
        if k < take or take == steps:
            return k, ids[: int(ends[k - 1]) if k else 0]
        guess *= 4


def schedule_epoch(
    plan: EpochPlan,
    schedule: BatchSchedule,
    clock: int,
    key: np.ndarray,
    plan_part: PlanPart,
    tail: str,
    budgets: tuple[int, ...],
) -> EpochPlan:
    """``plan`` with the steps before the schedule reaches 1 re-planned at their fractions.

    Args:
        plan: the epoch (or the rest of one) planned without the schedule.
        schedule: the schedule.
        clock: tokens trained before the plan's first step.
        key: every example's planning length.
        plan_part: plans given ids at a fraction of every budget under a tail policy.
        tail: the epoch's tail policy (for a schedule that outlasts the epoch).
        budgets: every rank's full micro-batch budget.
    """
    if plan.num_steps == 0 or clock >= schedule.full_from:
        return plan
    acc = plan.accumulate_grad_batches
    schedule = schedule.levels_for(acc * sum(budgets))
    k, region = _region(plan, key, clock, schedule.full_from)
    tokens = key[region].astype(np.int64)
    at = clock + np.cumsum(tokens) - tokens  # the clock at each example's start (increasing)
    bounds = np.searchsorted(at, np.asarray(schedule.tokens[1:]), side="left").tolist()
    starts = [0, *bounds]
    stages = [i for i in range(len(starts)) if [*bounds, region.size][i] > starts[i]]
    last = k == plan.num_steps  # the schedule outlasts the epoch: its tail is the epoch's
    parts: list[tuple[EpochPlan, float]] = []
    carry = region[:0]
    marks = np.zeros(key.shape[0], dtype=bool)  # the ids of one part, to find what is left
    fills: list[np.ndarray] = []  # the levels' step fills so far (cost / budget)
    for stage in stages:
        end = bounds[stage] if stage < len(bounds) else region.size
        pool = np.concatenate((carry, region[starts[stage] : end]))
        fraction = schedule.fractions[stage]
        if fraction == 1.0:
            carry = pool
            break
        final = last and stage == stages[-1]
        budget = int(step_budgets(budgets, np.array([fraction]), acc)[0])
        if final:
            part = plan_part(pool, fraction, tail, stage)
        else:  # whole steps; a remainder (and an under-filled step) waits for the next level
            part = _whole_steps(pool, fraction, stage, plan_part, key, budget)
            if part.num_steps:
                part = _without_underfilled(part, pool, key, fills, budget)
        parts.append((part, fraction))
        done = part.example_ids()
        marks[done] = True
        carry = pool[:0] if final else pool[~marks[pool]]
        marks[done] = False
    after = [(_steps_from(plan, k), 1.0)]  # the plan's own steps
    if carry.size and last:  # the schedule outlasts the epoch: the epoch's tail
        if carry.size < plan.world_size * acc and parts and parts[-1][0].num_steps:
            before, fraction = parts[-1]  # too few for a step: with the level's last one
            step = before.ids_of_micro_batches(before.assign[-1].reshape(-1))
            parts[-1] = (replace(before, assign=before.assign[:-1]), fraction)
            carry = np.concatenate((carry, step))
        parts.append((plan_part(carry, 1.0, tail, -1), 1.0))
    elif carry.size and tail == "spread":  # with the epoch's partial step: it keeps one
        kept = plan.assign[k:]
        merged, js = _with_smallest_steps(plan, kept, carry, plan_part)
        region = np.concatenate((region, plan.ids_of_micro_batches(kept[js].reshape(-1))))
        rest = np.ones(kept.shape[0], dtype=bool)
        rest[js] = False
        at = int(js.min())  # the merged steps run where the first of them ran
        after = [(replace(plan, assign=kept[:at][rest[:at]]), 1.0), (merged, 1.0)]
        after.append((replace(plan, assign=kept[at:][rest[at:]]), 1.0))
    elif carry.size:  # a partial step under the epoch's policy: dropped or padded, counted
        parts.append((plan_part(carry, 1.0, tail, -1), 1.0))
    new = [p for p, _ in parts] + [p for p, _ in after if p.order is not plan.order]
    replanned = np.concatenate([p.example_ids() for p in new]) if new else region
    marks[region] = True
    distinct = int(np.count_nonzero(marks))
    extra = int((~marks[replanned]).sum())
    marks[region] = False
    marks[replanned] = True
    lost = distinct - (int(np.count_nonzero(marks)) - extra)
    if extra or (lost and tail != "drop"):  # an internal invariant
        raise AssertionError(f"the schedule's re-plan lost {lost} examples, added {extra}")
    dropped = plan.num_dropped + lost
    duplicated = plan.num_duplicated - (region.size - distinct) + (replanned.size - distinct + lost)
    parts.extend(after)
    joined = join_plans([p for p, _ in parts], plan, (dropped, duplicated))
    fractions = np.concatenate([np.full(p.num_steps, f) for p, f in parts])
    return replace(joined, step_fraction=fractions)


def _whole_steps(
    pool: np.ndarray, fraction: float, stage: int, plan_part: PlanPart, key: np.ndarray, step: int
) -> EpochPlan:
    """``pool`` planned in whole steps at ``fraction``, leaving at most a step's worth over.

    One ``tail="drop"`` pass leaves a cut's remainder; per-rank budgets leave one per lane, often
    many steps' worth (micro-batches dropped to equal the lanes' counts). The rest is re-planned
    at ``fraction`` while over a step (``step`` tokens), up to :data:`_PASSES` passes.
    """
    part = plan_part(pool, fraction, "drop", stage)
    taken = np.zeros(key.shape[0], dtype=bool)
    for again in range(1, _PASSES):
        taken[part.example_ids()] = True
        left = pool[~taken[pool]]
        taken[part.example_ids()] = False
        if int(key[left].sum(dtype=np.int64)) <= step:
            break
        more = plan_part(left, fraction, "drop", stage + 100_000 * again)
        if more.num_steps == 0:
            break
        part = join_plans([part, more], part, (more.num_dropped, 0))
    return part


def _with_smallest_steps(
    plan: EpochPlan, kept: np.ndarray, carry: np.ndarray, plan_part: PlanPart
) -> tuple[EpochPlan, np.ndarray]:
    """``carry`` planned at the full budget with the plan's smallest step (its partial one).

    A part that few examples cannot spread over whole steps would repeat some (each example
    a micro-batch, say): then with another small step, or with more of them (up to four),
    whichever first repeats nothing. Returns the part and the steps of ``kept`` it took.
    """
    smallest = np.argsort(plan.micro_batch_cost[kept].sum(axis=(1, 2)), kind="stable")[:4]
    tries = [smallest[i : i + 1] for i in range(smallest.size)]
    tries += [smallest[:n] for n in range(2, smallest.size + 1)]
    best: tuple[EpochPlan, np.ndarray] | None = None
    for js in tries:
        ids = np.concatenate((carry, plan.ids_of_micro_batches(kept[js].reshape(-1))))
        part = plan_part(ids, 1.0, "spread", -1)
        if part.num_duplicated == 0:
            return part, js
        best = best or (part, js)
    assert best is not None
    return best


def _without_underfilled(
    part: EpochPlan, pool: np.ndarray, key: np.ndarray, fills: list[np.ndarray], step: int
) -> EpochPlan:
    """``part`` without its under-filled steps, at most one step's worth (``step``).

    Under-filled: below :data:`UNDERFILLED` of the median fill of the levels' steps so far
    (``fills``, this part's appended); they and the left-overs wait for the next level.
    """
    cost = part.micro_batch_cost[part.assign].sum(axis=(1, 2))
    fills.append(cost / step)
    floor = UNDERFILLED * float(np.median(np.concatenate(fills))) * step
    room = (
        step - int(key[pool].sum(dtype=np.int64)) + int(key[part.example_ids()].sum(dtype=np.int64))
    )
    under = np.flatnonzero(cost < floor)
    under = under[np.argsort(cost[under], kind="stable")]
    waiting = under[np.cumsum(cost[under]) <= room]
    if waiting.size == 0:
        return part
    keep = np.ones(part.num_steps, dtype=bool)
    keep[waiting] = False
    return replace(part, assign=part.assign[keep])


def _steps_from(plan: EpochPlan, k: int) -> EpochPlan:
    return replace(plan, assign=plan.assign[k:])


def join_plans(parts: list[EpochPlan], template: EpochPlan, counts: tuple[int, int]) -> EpochPlan:
    """The steps of ``parts``, one after the other, as one plan.

    Parts' micro-batches are kept whole and concatenated; those no step runs (a part's drops, the
    template's re-planned steps) stay out of ``assign``, as in a ``tail="drop"`` plan.
    ``template``: the plan giving epoch, shape and budgets; ``counts``: its dropped, duplicated.
    """
    starts, assigns, whole = [], [], []
    offsets: dict[int, tuple[int, int]] = {}  # parts cut from one plan share its arrays
    offset_order = offset_mb = 0
    for part in parts:
        if id(part.order) not in offsets:
            offsets[id(part.order)] = (offset_order, offset_mb)
            whole.append(part)
            starts.append(part.micro_batch_start.astype(np.int64) + offset_order)
            offset_order += part.order.size
            offset_mb += part.micro_batch_start.size
        assigns.append(part.assign.astype(np.int64) + offsets[id(part.order)][1])

    def cat(name: str) -> np.ndarray | None:
        values = [getattr(p, name) for p in whole]
        return None if any(v is None for v in values) else np.concatenate(values)

    return replace(
        template,
        order=np.concatenate([p.order for p in whole]),
        micro_batch_start=np.concatenate(starts),
        micro_batch_size=cat("micro_batch_size"),  # type: ignore[arg-type]
        micro_batch_cost=cat("micro_batch_cost"),  # type: ignore[arg-type]
        micro_batch_work=cat("micro_batch_work"),
        micro_batch_shape=cat("micro_batch_shape"),
        micro_batch_dataset=cat("micro_batch_dataset"),
        _exact_tokens=cat("_exact_tokens"),
        assign=np.concatenate(assigns).astype(template.assign.dtype),
        num_dropped=counts[0],
        num_duplicated=counts[1],
    )
