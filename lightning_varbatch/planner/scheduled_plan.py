"""An epoch under the batch-size schedule: its early steps re-planned at smaller budgets.

The epoch is planned as without a schedule, then walked in step order with the schedule's
clock (tokens trained before the epoch, plus those of the steps before). The examples of the
steps that start before the schedule reaches 1 are split by level, each example at the level
of the clock at its position, and each level's examples are planned again at its fraction of
every rank's budget: whole steps only, what is left joins the next level. The rest of the
level that reaches 1 is one step at the full budgets (the tail policy ``"spread"``: the
epoch's one step with fewer tokens than its schedule), or, when the schedule outlasts the
epoch, the epoch's tail under its own policy. The steps after are the plan's own. Every
example is planned once, as in the plan without a schedule; each step carries its fraction
(``plan.step_fraction``).

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> cfg = PlanConfig(max_tokens=64, batch_schedule="0:0.5 300:1")
    >>> plan = EpochPlanner(np.full(100, 8), cfg).plan(0)
    >>> half = plan.step_fraction == 0.5
    >>> int(half.sum()), int(plan.step_tokens[half].max()), int(plan.step_tokens.max())
    (10, 32, 64)
    >>> sorted(plan.example_ids().tolist()) == list(range(100))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.batch_schedule import BatchSchedule
from lightning_varbatch.planner.epoch_plan import EpochPlan

__all__ = ["PlanPart", "join_plans", "scaled_budgets", "schedule_counts", "schedule_epoch"]

#: ``(ids, fraction, tail, stage)`` -> the plan of ``ids`` at ``fraction`` of every budget.
PlanPart = Callable[[np.ndarray, float, str | None, int], EpochPlan]


def scaled_budgets(budgets: tuple[int, ...], fraction: float, longest: int) -> tuple[int, ...]:
    """Every rank's budget at ``fraction``; refused when one cannot hold the longest example.

    Example:
        >>> scaled_budgets((64, 32), 0.5, 10)
        (32, 16)
    """
    scaled = tuple(int(b * fraction) for b in budgets)
    if min(scaled) < longest:
        r = int(np.argmin(scaled))
        need = longest / budgets[r]
        raise SettingValueError(
            f"batch_schedule: at fraction {fraction:g} rank {r}'s micro-batch budget is "
            f"{scaled[r]} tokens, below the longest example's cost {longest}: start the "
            f"schedule at a fraction of at least {need:.3g}, or raise max_tokens.",
            setting="batch_schedule",
            value=fraction,
        )
    return scaled


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
        per_rank = np.floor(fraction[:, None] * full[None, :]).astype(np.int64)
        budget = per_rank.sum(axis=1) * plan.accumulate_grad_batches
        cost = np.ceil(plan.micro_batch_cost[plan.assign].sum(axis=(1, 2))).astype(np.int64)
        cached = (budget, cost)
        object.__setattr__(plan, "_schedule_counts", cached)
    return cached


def _step_tokens(plan: EpochPlan, key: np.ndarray, steps: int) -> np.ndarray:
    """Planning tokens of the plan's first ``steps`` steps."""
    mbs = plan.assign[:steps].reshape(-1)
    positions, firsts = plan.positions(mbs)
    if positions.size == 0:
        return np.zeros(steps, dtype=np.int64)
    per_mb = np.add.reduceat(key[plan.order[positions]].astype(np.int64), firsts)
    return np.asarray(per_mb.reshape(steps, -1).sum(axis=1))


def _region(plan: EpochPlan, key: np.ndarray, clock: int, until: int) -> int:
    """How many of the plan's first steps start before the clock reaches ``until``."""
    steps = plan.num_steps
    guess = max(1, int(np.ceil((until - clock) / max(1.0, _mean_step(plan, key)))))
    while True:
        take = min(steps, 2 * guess + 8)
        starts = clock + np.concatenate(([0], np.cumsum(_step_tokens(plan, key, take))))
        k = int(np.searchsorted(starts[:take], until, side="left"))
        if k < take or take == steps:
            return k
        guess *= 4


def _mean_step(plan: EpochPlan, key: np.ndarray) -> float:
    sample = min(plan.num_steps, 64)
    return float(_step_tokens(plan, key, sample).mean()) if sample else 1.0


def schedule_epoch(
    plan: EpochPlan,
    schedule: BatchSchedule,
    clock: int,
    key: np.ndarray,
    plan_part: PlanPart,
    tail: str,
) -> EpochPlan:
    """``plan`` with the steps before the schedule reaches 1 re-planned at their fractions.

    Args:
        plan: the epoch (or the rest of one) planned without the schedule.
        schedule: the schedule.
        clock: tokens trained before the plan's first step.
        key: every example's planning length.
        plan_part: plans given ids at a fraction of every budget under a tail policy.
        tail: the epoch's tail policy (for a schedule that outlasts the epoch).
    """
    if plan.num_steps == 0 or clock >= schedule.full_from:
        return plan
    k = _region(plan, key, clock, schedule.full_from)
    region = plan.ids_of_micro_batches(plan.assign[:k].reshape(-1))
    tokens = key[region].astype(np.int64)
    at = clock + np.cumsum(tokens) - tokens  # the clock at each example's start
    level = np.searchsorted(np.asarray(schedule.tokens), at, side="right") - 1
    last = k == plan.num_steps  # the schedule outlasts the epoch: its tail is the epoch's
    parts: list[tuple[EpochPlan, float]] = []
    carry = region[:0]
    marks = np.zeros(key.shape[0], dtype=bool)  # the ids of one part, to find what is left
    for stage in np.unique(level).tolist():
        pool = np.concatenate((carry, region[level == stage]))
        fraction = schedule.fractions[stage]
        if fraction == 1.0:
            carry = pool
            break
        final = last and stage == int(level[-1])
        part = plan_part(pool, fraction, tail if final else "drop", stage)
        parts.append((part, fraction))
        done = part.example_ids()
        marks[done] = True
        carry = pool[:0] if final else pool[~marks[pool]]
        marks[done] = False
    if carry.size:  # the level that reaches 1: one spread step, or the epoch's tail
        if not last and carry.size < plan.world_size * plan.accumulate_grad_batches:
            step = plan.ids_of_micro_batches(plan.assign[k].reshape(-1))
            carry, region, k = np.concatenate((carry, step)), np.concatenate((region, step)), k + 1
        parts.append((plan_part(carry, 1.0, tail if last else "spread", -1), 1.0))
    replanned = np.concatenate([p.example_ids() for p, _ in parts]) if parts else region
    before = np.bincount(region, minlength=key.shape[0])
    after = np.bincount(replanned, minlength=key.shape[0])
    lost, extra = int(((before > 0) & (after == 0)).sum()), int(((after > 0) & (before == 0)).sum())
    if extra or (lost and not (last and tail == "drop")):  # an internal invariant
        raise AssertionError(f"the schedule's re-plan lost {lost} examples, added {extra}")
    dropped = plan.num_dropped + lost
    duplicated = (
        plan.num_duplicated
        - int(np.maximum(before - 1, 0).sum())
        + int(np.maximum(after - 1, 0).sum())
    )
    parts.append((_steps_from(plan, k), 1.0))
    joined = join_plans([p for p, _ in parts], plan, (dropped, duplicated))
    fractions = np.concatenate([np.full(p.num_steps, f) for p, f in parts])
    return replace(joined, step_fraction=fractions)


def _steps_from(plan: EpochPlan, k: int) -> EpochPlan:
    return replace(plan, assign=plan.assign[k:])


def join_plans(parts: list[EpochPlan], template: EpochPlan, counts: tuple[int, int]) -> EpochPlan:
    """The steps of ``parts``, one after the other, as one plan (only the micro-batches used).

    ``template``: the plan whose epoch, shape and budgets the result keeps; ``counts``: its
    ``(num_dropped, num_duplicated)``.
    """
    orders, starts, used_all, assigns = [], [], [], []
    offset_order = offset_mb = 0
    for part in parts:
        used = part.assign.reshape(-1)
        positions, firsts = part.positions(used)
        orders.append(part.order[positions])
        starts.append(firsts[: used.size] + offset_order)  # an empty part has firsts [0]
        used_all.append((part, used))
        assigns.append((offset_mb + np.arange(used.size)).reshape(part.assign.shape))
        offset_order += positions.size
        offset_mb += used.size

    def take(name: str) -> np.ndarray | None:
        values = [getattr(p, name) for p, _ in used_all]
        if any(v is None for v in values):
            return None
        return np.concatenate([v[u] for v, (_, u) in zip(values, used_all, strict=True)])

    return replace(
        template,
        order=np.concatenate(orders),
        micro_batch_start=np.concatenate(starts).astype(np.int64),
        micro_batch_size=take("micro_batch_size"),  # type: ignore[arg-type]
        micro_batch_cost=take("micro_batch_cost"),  # type: ignore[arg-type]
        micro_batch_work=take("micro_batch_work"),
        micro_batch_shape=take("micro_batch_shape"),
        micro_batch_dataset=take("micro_batch_dataset"),
        _exact_tokens=take("_exact_tokens"),
        assign=np.concatenate(assigns).astype(template.assign.dtype),
        num_dropped=counts[0],
        num_duplicated=counts[1],
    )
