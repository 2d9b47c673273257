"""Rank lanes: a plan whose ranks carry different budgets (shares or memory differ).

Rank ``r``'s micro-batches each fit its budget ``b_r`` and carry ``b_r / Σ b`` of the work, in equal
counts: the sorted positions are dealt to one *lane* per rank by budget (:func:`lane_of_positions`),
each lane cut at its budget (:func:`lane_cuts`), the counts evened by the tail policy; step ``s``
gives rank ``r`` its lane's ``s``-th slice (:func:`lane_plan`).

Example:
    >>> from lightning_varbatch.planner.epoch_planner import EpochPlanner
    >>> planner = EpochPlanner(np.full(300, 10), PlanConfig(max_tokens=100))
    >>> plan = planner.plan(0, world_size=2, rank_budgets=(100, 50))
    >>> [int(plan.micro_batch_cost[plan.rank_micro_batches(r)].max()) for r in (0, 1)]
    [100, 50]
    >>> [int(plan.micro_batch_size[plan.rank_micro_batches(r)].sum()) for r in (0, 1)]
    [200, 100]
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lightning_varbatch.planner.packed_rows import cuts_each_epoch, exact_groups, packed_cut
from lightning_varbatch.planner.rank_shares import apportion
from lightning_varbatch.planner.settings import PlanConfig, TailPolicy
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups
from lightning_varbatch.planner.tail import split_micro_batches, too_few_message

__all__ = ["Lane", "LanePlan", "lane_config", "lane_cuts", "lane_of_positions", "lane_plan"]

#: The golden ratio's fractional part: ``frac(i·φ)`` is the most evenly spread sequence.
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def lane_of_positions(size: int, budgets: Sequence[float]) -> np.ndarray:
    """The lane of each of ``size`` sorted positions: ``b_r / Σ b`` of them to lane ``r``.

    Example:
        >>> np.bincount(lane_of_positions(1000, (2, 1))).tolist()
        [667, 333]
    """
    weights = np.asarray(budgets, dtype=np.float64)
    edges = np.cumsum(weights / weights.sum())[:-1]
    phase = (np.arange(size, dtype=np.float64) * _PHI) % 1.0
    return np.searchsorted(edges, phase, side="right").astype(np.int64)


@dataclass(frozen=True)
class LanePlan:
    """An epoch's micro-batches cut in lanes, and each lane's run of them.

    Attributes:
        order: example ids, lane after lane (each lane longest first).
        cut: the micro-batches of all lanes, as slices of ``order`` (ids are global).
        runs: ``(world, T)`` ids: lane ``r``'s run with the tail's repeats, ``T`` a multiple of acc.
        num_dropped: examples left out by ``tail="drop"``.
        num_duplicated: examples repeated to fill the lanes.
    """

    order: np.ndarray
    cut: SortedCut
    runs: np.ndarray
    num_dropped: int
    num_duplicated: int

    def steps(self, acc: int) -> np.ndarray:
        """``(steps, world, acc)``: step ``s`` gives rank ``r`` its lane's ``s``-th slice."""
        world, total = self.runs.shape
        return self.runs.reshape(world, total // acc, acc).transpose(1, 0, 2).copy()


def _lane_groups(groups: SortedGroups, positions: np.ndarray) -> SortedGroups:
    """The lane's part of ``groups``, with positions (not ids) as its ids."""
    group = groups.group_of(positions)
    counts = np.bincount(group, minlength=groups.longest.shape[0])
    nonempty = np.flatnonzero(counts)
    starts = np.concatenate(([0], np.cumsum(counts[nonempty]))).astype(np.int64)
    return SortedGroups(ids=positions, starts=starts, longest=groups.longest[nonempty])


def lane_config(config: PlanConfig, budget: int) -> PlanConfig:
    """``config`` with one budget of ``budget`` and no per-rank settings or schedule (a cut)."""
    with warnings.catch_warnings():  # the settings' warnings were given once, for the config
        warnings.simplefilter("ignore")
        return dataclasses.replace(
            config,
            max_tokens=int(budget),
            rank_shares=None,
            rank_max_tokens=None,
            batch_schedule=None,
        )


def _to_count(m: int, target: int, rng: np.random.Generator) -> np.ndarray:
    """``target`` of ``m`` micro-batch ids, sorted: random ones dropped or repeated."""
    seq = np.arange(m, dtype=np.int64)
    if m == target:
        return seq
    if m > target:
        return np.sort(rng.choice(m, size=target, replace=False))
    extra = rng.choice(m, size=target - m, replace=target - m > m)
    return np.sort(np.concatenate((seq, extra)))


def _spaced(positions: np.ndarray, k: int) -> np.ndarray:
    """``k`` evenly spaced entries of ``positions`` (every ``ceil(n / k)``-th, else spread)."""
    picks = positions[:: max(1, -(-positions.size // k))][:k]
    if picks.size < k:  # e.g. 3 of 5 by every second: spread the k over the n instead
        picks = positions[(np.arange(k) * positions.size) // k]
    return picks


def _lane_positions(size: int, weights: Sequence[float]) -> list[np.ndarray]:
    """Each lane's sorted positions: exactly its largest-remainder share of ``size``.

    A few positions of the golden-ratio interleave move from lanes over their share to lanes
    under it. Every lane gets at least one position (a repeat when too few examples).
    """
    world = len(weights)
    lane = lane_of_positions(size, weights)
    quota = apportion(size, np.asarray(weights, dtype=np.float64) / float(sum(weights)))
    if quota.min() == 0:  # too few examples for the shares: every lane gets what it can
        quota = np.full(world, size // world) + (np.arange(world) < size % world)
    surplus = np.bincount(lane, minlength=world) - quota
    if surplus.any():  # move evenly spaced positions of the lanes over quota
        movers = np.concatenate(
            [_spaced(np.flatnonzero(lane == r), k) for r, k in enumerate(surplus.tolist()) if k > 0]
        )
        lane[np.sort(movers)] = np.repeat(np.arange(world), np.maximum(-surplus, 0))
    out = [np.flatnonzero(lane == r) for r in range(world)]
    return [p if p.size or size == 0 else np.array([r % size]) for r, p in enumerate(out)]


class Lane(NamedTuple):
    """One rank's lane, cut: its sorted positions, their groups, the cut and its settings."""

    positions: np.ndarray
    groups: SortedGroups
    cut: SortedCut
    config: PlanConfig


def lane_cuts(
    groups: SortedGroups,
    order: np.ndarray,
    key: np.ndarray,
    budgets: Sequence[int],
    config: PlanConfig,
    acc: int = 1,
) -> list[Lane]:
    """Deal the sorted positions (``groups``) to the ranks' lanes, cut each at its budget.

    ``order`` (this epoch's ids at those positions) and ``key`` (planning lengths) are read only
    for packed rows cut on exact lengths; each lane's count is made a multiple of ``acc``.
    """

    def cut(lanes_positions: Sequence[np.ndarray]) -> list[Lane]:
        lanes = []
        for r, positions in enumerate(lanes_positions):
            cfg = lane_config(config, budgets[r])
            if cuts_each_epoch(config):
                lane_groups = exact_groups(order[positions], key)
                lane_cut = packed_cut(lane_groups, cfg)
            else:
                lane_groups = _lane_groups(groups, positions)
                lane_cut = SortedCut.build(lane_groups, cfg)
            lanes.append(Lane(positions, lane_groups, lane_cut, cfg))
        return lanes

    def short(lanes: list[Lane]) -> tuple[np.ndarray, np.ndarray, int]:
        """Each lane's examples, micro-batches, and the count every lane must reach."""
        sizes = np.array([lane.positions.size for lane in lanes])
        counts = np.array([max(lane.cut.num_micro_batches, 1) for lane in lanes])
        return sizes, counts, -(-int(counts.max()) // acc) * acc

    lanes = cut(_lane_positions(groups.size, budgets))
    sizes, counts, target = short(lanes)
    if sizes.min() >= target:
        return lanes
    # Lanes short of examples for the others' micro-batch count (budgets filled coarsely): size the
    # lanes by examples per micro-batch, evening the counts, then move the shortest examples of
    # lanes with spare to those short, so none repeats one while the data has enough; with too few
    # (an epoch's small rest) spares still move, neediest first: lanes repeat only what none spares.
    lanes = cut(_lane_positions(groups.size, sizes / counts))
    for _ in range(len(lanes)):
        sizes, counts, target = short(lanes)
        need, spare = np.maximum(target - sizes, 0), np.maximum(sizes - target, 0)
        give = _take(spare, need)
        if not give.any():
            break
        need = _take(need, give)  # all of it, or what the spare lanes can give
        positions = [lane.positions for lane in lanes]
        moved = np.concatenate(
            [positions[r][positions[r].size - k :] for r, k in enumerate(give.tolist())]
        )
        for r, k in enumerate(give.tolist()):
            positions[r] = positions[r][: positions[r].size - k]
        ends = np.cumsum(need)
        for r in np.flatnonzero(need).tolist():
            positions[r] = np.sort(
                np.concatenate((positions[r], moved[ends[r] - need[r] : ends[r]]))
            )
        lanes = cut(positions)
    return lanes


def _take(spare: np.ndarray, need: np.ndarray) -> np.ndarray:
    """How many each lane gives: ``min(need.sum(), spare.sum())``, the most spare first."""
    give = np.zeros_like(spare)
    left = int(need.sum())
    for r in np.argsort(-spare, kind="stable").tolist():
        give[r] = min(int(spare[r]), left)
        left -= int(give[r])
    return give


def lane_plan(
    lanes: Sequence[Lane],
    order: np.ndarray,
    config: PlanConfig,
    acc: int,
    tail: TailPolicy,
    rng: np.random.Generator,
    replanned: bool = False,
) -> LanePlan:
    """The epoch's runs of the lanes (:func:`lane_cuts`): equal counts, ids from ``order``.

    ``tail``: the policy in force (:func:`~.tail.effective_tail`); for an epoch's rest
    (``replanned``), ``"drop"`` drops all micro-batches (counted) when a lane lacks a step's worth.

    Raises:
        ValueError: ``tail="drop"`` when a whole epoch's lane has too few micro-batches for a step.
    """
    world = len(lanes)
    counts = [lane.cut.num_micro_batches for lane in lanes]
    if tail == "drop":
        shared = np.concatenate([lane.positions for lane in lanes])
        # Fewer examples than lanes: a lane was given one of another's; "drop" never repeats.
        target = 0 if np.unique(shared).size < shared.size else min(counts) // acc * acc
        if target == 0 and not replanned:
            raise ValueError(too_few_message(min(counts), "micro-batches", world, acc, config))
    else:
        target = max(-(-max(counts) // acc) * acc, acc)
    runs = np.empty((world, target), dtype=np.int64)
    parts: list[SortedCut] = []
    offset, pos = 0, 0
    orders = [order[lane.positions] for lane in lanes]
    for r, (lane, lane_ids) in enumerate(zip(lanes, orders, strict=True)):
        cut = lane.cut
        if tail == "spread" and cut.num_micro_batches < target:
            cut = split_micro_batches(cut, lane.groups, target, lane.config)
        ids = _to_count(cut.num_micro_batches, target, rng)
        if config.layout == "packed":  # steps of neighbouring compute, as dealing does
            ids = ids[np.argsort(-cut.work[ids], kind="stable")]
        runs[r] = ids + offset
        parts.append(dataclasses.replace(cut, starts=cut.starts + pos))
        offset += cut.num_micro_batches
        pos += lane_ids.shape[0]
    merged = SortedCut(
        starts=np.concatenate([p.starts for p in parts]),
        sizes=np.concatenate([p.sizes for p in parts]),
        cost=np.concatenate([p.cost for p in parts]),
        total=np.concatenate([p.total for p in parts]),
        work=np.concatenate([p.work for p in parts]),
    )
    order_out = np.concatenate(orders)
    # what runs, counted per example (a lane beyond the examples repeats one; the tail
    # policy drops or repeats micro-batches): dropped never run, repeats run again
    mbs = runs.reshape(-1)
    sizes = merged.sizes[mbs]
    ran = np.repeat(merged.starts[mbs] - (np.cumsum(sizes) - sizes), sizes) + np.arange(sizes.sum())
    times = np.bincount(order_out[ran], minlength=int(order.max(initial=-1)) + 1)[order]
    dropped, duplicated = int((times == 0).sum()), int(np.maximum(times - 1, 0).sum())
    return LanePlan(order_out, merged, runs, dropped, duplicated)
