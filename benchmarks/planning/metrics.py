"""Plan-quality figures of one epoch of micro-batches, whatever made them.

Padding efficiency, budget fill, per-step imbalance and coverage come from the library's own
:func:`lightning_varbatch.planner.diagnostics.diagnose`: one definition, the one ``python -m
lightning_varbatch.plan`` prints. A baseline's batches (index lists, with the
rank and step each one runs in) are turned into :class:`EpochPlan` views over the same lengths
(:func:`as_plans`), so that ``diagnose`` reads them like one of ours. Only what the library does
not compute is computed here: the share of micro-batches over the budget, the per-rank
counts, and how much batch order and composition change between two epochs.

One choice of the benchmark's: imbalance is averaged over the steps in which *every* rank has a
micro-batch. A plan with unequal counts (``greedy sorted``) has a last step that some ranks do
not run; under DDP that step hangs instead of running unevenly, so it is left out: the
imbalance is ``diagnose``'s of the full steps, the other figures ``diagnose``'s of every batch.
Plans with equal counts (ours, and every other baseline) are diagnosed as they are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from lightning_varbatch import EpochPlan, EpochPlanner, PlanConfig
from lightning_varbatch.planner import PlanDiagnostics, diagnose
from lightning_varbatch.planner.costs import resolve_cost

QUAD_COEF = 1 / 64
"""``c`` of the quadratic load ``n*L + c*n*L**2`` (the library's default ``quadratic_coef``)."""


@dataclass
class Batches:
    """Every rank's micro-batches of one epoch: batch ``b`` is ``pool[start[b]:start[b]+size[b]]``.

    ``slot`` names the batch in a layout that is fixed across epochs (``None`` when there is
    none); it is what the batch-order comparison compares.
    """

    pool: np.ndarray
    start: np.ndarray
    size: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    slot: np.ndarray | None = None


@dataclass
class Quality:
    """Plan-quality numbers of one epoch (see :mod:`benchmarks.planning.epoch`'s docstring)."""

    pad_eff: float
    fill: float
    max_cost: float
    over: float
    imb_lin: float
    imb_quad: float
    full_steps: int
    steps: int
    count_min: int
    count_max: int
    coverage: float
    dup: int
    d_order: float | None = None
    d_comp: float | None = None
    pad_both: float | None = None


# -- building Batches ----------------------------------------------------------------------------


def plan_batches(plan: EpochPlan) -> Batches:
    """One of our plans as :class:`Batches` (tile ids as slots: the layout is fixed)."""
    s, w, a = plan.assign.shape
    tiles = plan.assign.reshape(-1)
    return Batches(
        pool=plan.order,
        start=plan.micro_batch_start[tiles],
        size=plan.micro_batch_size[tiles],
        rank=np.tile(np.repeat(np.arange(w), a), s),
        step=np.repeat(np.arange(s), w * a),
        slot=tiles,
    )


def batches_from_ranks(per_rank: list[list[np.ndarray]]) -> Batches:
    """Rank ``r``'s ``j``-th batch runs in step ``j`` (what DDP does with equal counts)."""
    pool: list[np.ndarray] = []
    rank: list[int] = []
    step: list[int] = []
    for r, batches in enumerate(per_rank):
        for j, ids in enumerate(batches):
            pool.append(ids)
            rank.append(r)
            step.append(j)
    size = np.array([b.size for b in pool], dtype=np.int64)
    return Batches(
        pool=np.concatenate(pool) if pool else np.zeros(0, dtype=np.int64),
        start=np.cumsum(size) - size,
        size=size,
        rank=np.asarray(rank, dtype=np.int64),
        step=np.asarray(step, dtype=np.int64),
    )


def _members(b: Batches) -> tuple[np.ndarray, np.ndarray]:
    """Example ids of all batches, batch after batch, and each batch's offset in them."""
    size = b.size.astype(np.int64)
    offs = np.cumsum(size) - size
    pos = np.repeat(b.start.astype(np.int64) - offs, size)
    pos += np.arange(pos.size, dtype=np.int64)
    return b.pool[pos], offs


def batches_from_steps(steps: list[list[np.ndarray]]) -> Batches:
    """``steps[j][r]``: the micro-batch rank ``r`` runs in step ``j`` (every rank in every step)."""
    return batches_from_ranks([list(col) for col in zip(*steps, strict=True)])


def pair_padding_efficiency(b: Batches, pairs: np.ndarray) -> float:
    """Both padded tensors' efficiency: real source + target tokens over ``Σ n · (longest
    source + longest target)``, what a collate padding each side to its own longest allocates.

    Example:
        >>> pairs = np.array([[4, 1], [2, 3]])
        >>> b = batches_from_ranks([[np.array([0, 1])]])
        >>> pair_padding_efficiency(b, pairs)  # 10 real tokens in 2 * (4 + 3) slots
        0.7142857142857143
    """
    ids, offs = _members(b)
    if ids.size == 0:
        return math.nan
    full = b.size > 0
    src = pairs[ids, 0].astype(np.int64)
    tgt = pairs[ids, 1].astype(np.int64)
    at = offs[full]
    longest = np.maximum.reduceat(src, at) + np.maximum.reduceat(tgt, at)
    return float((src.sum() + tgt.sum()) / (b.size[full].astype(np.int64) * longest).sum())


# -- Batches as EpochPlans, for the library's diagnostics -----------------------------------------


@dataclass
class AsPlans:
    """A baseline's batches as what :func:`diagnose` reads.

    ``every_batch``: one rank running every batch once (padding, fill, cost, coverage).
    ``full_steps``: the steps in which every rank runs a micro-batch, each rank's batches in
    their place (imbalance). ``count_min``/``count_max``: micro-batches per rank.
    """

    planner: EpochPlanner
    every_batch: EpochPlan
    full_steps: EpochPlan
    steps: int
    count_min: int
    count_max: int


def as_plans(
    b: Batches, key: np.ndarray, max_tokens: int, world: int, cost: str = "padded"
) -> AsPlans:
    """A planner over ``key`` and :class:`EpochPlan` views of the batches ``b`` (tile i: batch i).

    Each tile's cost is the library's cost model (``cost``) of the batch.

    Raises:
        ValueError: when ranks run different numbers of batches within a step that all run.
    """
    config = PlanConfig(max_tokens=max_tokens, cost=cost, quadratic_coef=QUAD_COEF)
    planner = EpochPlanner(key, config)  # validates the lengths; nothing is sorted here
    start = b.start.astype(np.int64)
    size = b.size.astype(np.int64)
    ids, offs = _members(b)
    keys = planner.prepared.key[ids]
    at = np.minimum(offs, max(keys.size - 1, 0))
    nonempty = size > 0
    longest = np.where(nonempty, np.maximum.reduceat(keys, at), 0) if keys.size else size
    total = np.where(nonempty, np.add.reduceat(keys, at, dtype=np.int64), 0) if keys.size else size
    micro_batch_cost = resolve_cost(config.cost, quadratic_coef=config.quadratic_coef)(
        size, longest.astype(np.int64), total
    )
    every_batch = EpochPlan(
        epoch=0,
        world_size=1,
        accumulate_grad_batches=1,
        order=np.asarray(b.pool, dtype=np.int64),
        micro_batch_start=start,
        micro_batch_size=size,
        micro_batch_cost=micro_batch_cost,
        assign=np.arange(size.size).reshape(-1, 1, 1),
    )
    steps = int(b.step.max()) + 1 if b.step.size else 0
    cell = b.step.astype(np.int64) * world + b.rank
    counts = np.bincount(cell, minlength=steps * world).reshape(steps, world)
    full = (counts > 0).all(axis=1)
    acc = int(counts[full].max(initial=1))
    if (counts[full] != acc).any():
        raise ValueError("ranks run different numbers of micro-batches within one step")
    in_full = full[b.step]
    by_cell = np.flatnonzero(in_full)[np.argsort(cell[in_full], kind="stable")]
    full_steps = replace(
        every_batch,
        world_size=world,
        accumulate_grad_batches=acc,
        assign=by_cell.reshape(-1, world, acc),
    )
    per_rank = np.bincount(b.rank, minlength=world)
    return AsPlans(
        planner, every_batch, full_steps, steps, int(per_rank.min()), int(per_rank.max())
    )


# -- the figures ---------------------------------------------------------------------------------


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (wrapping uint64 arithmetic)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _set_hashes(b: Batches) -> np.ndarray:
    """Order-independent hash of each batch's example set."""
    ids, offs = _members(b)
    h = np.add.reduceat(_mix(ids), offs)
    return h ^ _mix(b.size)


def _first_rank0(b: Batches) -> np.ndarray:
    """Index of rank 0's first micro-batch of every step, in step order."""
    idx = np.flatnonzero(b.rank == 0)
    _, first = np.unique(b.step[idx], return_index=True)
    return idx[first]


def epoch_change(b0: Batches, b1: Batches) -> tuple[float, float]:
    """(d-order, d-comp) between two epochs."""
    h0, h1 = _set_hashes(b0), _set_hashes(b1)
    f0, f1 = _first_rank0(b0), _first_rank0(b1)
    m = min(f0.size, f1.size)
    if b0.slot is not None and b1.slot is not None:
        id0, id1 = b0.slot[f0[:m]], b1.slot[f1[:m]]
    else:
        id0, id1 = h0[f0[:m]], h1[f1[:m]]
    d_order = float(np.mean(id0 != id1)) if m else 0.0
    d_comp = float(np.mean(np.isin(h1, h0, invert=True)))
    return d_order, d_comp


def _quality(
    every: PlanDiagnostics,
    steps: PlanDiagnostics,
    cost: np.ndarray,
    num_steps: int,
    counts: tuple[int, int],
    examples_run: int,
) -> Quality:
    """:class:`Quality` from the diagnostics of every batch and of the steps every rank runs."""
    distinct = round(every.coverage * every.num_planned)
    none = steps.num_steps == 0
    return Quality(
        pad_eff=every.padding_efficiency,
        fill=every.budget_fill,
        max_cost=float(cost.max() / every.max_tokens),
        over=float(np.mean(cost > every.max_tokens)),
        imb_lin=math.nan if none else steps.imbalance_linear_mean,
        imb_quad=math.nan if none else steps.imbalance_quadratic_mean,
        full_steps=steps.num_steps,
        steps=num_steps,
        count_min=counts[0],
        count_max=counts[1],
        coverage=every.coverage,
        dup=examples_run - distinct,
    )


def plan_quality(
    planner: EpochPlanner,
    plan: EpochPlan,
    *,
    other_epoch: Batches | None = None,
    pairs: np.ndarray | None = None,
) -> Quality:
    """The figures of one of our plans (d-order/d-comp against ``other_epoch`` if given;
    ``pad_both``, :func:`pair_padding_efficiency`, when ``pairs`` are given)."""
    diag = diagnose(planner, plan)  # equal counts by construction: every step is full
    run = plan.assign.reshape(-1)
    per_rank = plan.num_micro_batches_per_rank
    q = _quality(
        diag,
        diag,
        plan.micro_batch_cost[run],
        plan.num_steps,
        (per_rank, per_rank),
        int(plan.micro_batch_size[run].sum()),
    )
    if other_epoch is not None:
        q.d_order, q.d_comp = epoch_change(plan_batches(plan), other_epoch)
    if pairs is not None and pairs.ndim == 2:
        q.pad_both = pair_padding_efficiency(plan_batches(plan), pairs)
    return q


def quality(
    b: Batches,
    key: np.ndarray,
    max_tokens: int,
    world: int,
    *,
    cost: str = "padded",
    other_epoch: Batches | None = None,
    pairs: np.ndarray | None = None,
) -> Quality:
    """The figures of a baseline's batches over ``key`` (``cost``: the library's cost model;
    ``pad_both``, :func:`pair_padding_efficiency`, when ``pairs`` are given)."""
    p = as_plans(b, key, max_tokens, world, cost)
    q = _quality(
        diagnose(p.planner, p.every_batch),
        diagnose(p.planner, p.full_steps),
        p.every_batch.micro_batch_cost,
        p.steps,
        (p.count_min, p.count_max),
        int(b.size.sum()),
    )
    if other_epoch is not None:
        q.d_order, q.d_comp = epoch_change(b, other_epoch)
    if pairs is not None and pairs.ndim == 2:
        q.pad_both = pair_padding_efficiency(b, pairs)
    return q
