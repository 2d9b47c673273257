"""Rank lanes: a plan whose ranks carry different budgets (shares or memory differ).

With one budget for every rank, the sorted order is cut once and each step's micro-batches are
dealt to the least-loaded rank (:mod:`lightning_varbatch.planner.dealing`). With a budget per
rank (:func:`~lightning_varbatch.planner.rank_shares.rank_budgets`), rank ``r``'s micro-batches
must each fit ``b_r`` and together carry ``b_r / Σ b`` of the work, while every rank still runs
the same number of micro-batches. This module plans that as *lanes*:

1. Every position of the sorted order (longest first) goes to one lane, ``b_r / Σ b`` of the
   positions to lane ``r``, interleaved with a golden-ratio sequence (``frac(i·φ)``): every run
   of consecutive positions, so every length range, is split between the lanes in proportion to
   their budgets, within a few examples.
2. Each lane is cut greedily at its own budget (the same cut as the one-budget plan, so each of
   its micro-batches fits ``b_r``). A lane of a smaller budget has fewer examples, so the lanes'
   micro-batch counts come out nearly equal. Where whole examples fill a budget coarsely (one
   or two examples a micro-batch) a lane may have fewer examples than another has
   micro-batches; the lanes are then cut again with sizes in proportion to each lane's
   examples per micro-batch, which makes the counts equal (nothing repeated).
3. The tail policy makes them exactly equal, a multiple of ``accumulate_grad_batches``:
   ``"spread"`` and ``"pad"`` bring every lane up to the largest count (``"spread"`` splits a
   lane's largest micro-batches, ``"pad"`` repeats random ones), ``"drop"`` takes every lane
   down to the smallest (random micro-batches, counted).
4. Step ``s`` gives rank ``r`` the ``s``-th ``accumulate_grad_batches`` micro-batches of lane
   ``r``: the lanes are in length order, so a step's ranks run micro-batches of similar lengths.
   The steps are then shuffled (and ordered by the length warm-up) as in the one-budget plan.

Everything else (the epoch's shuffle within buckets, the warm-up, resume by excluding consumed
examples) is the one planner's; lanes only replace the cut and the dealing.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner.epoch_planner import EpochPlanner
    >>> from lightning_varbatch.planner.settings import PlanConfig
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.packed_rows import cuts_each_epoch, exact_groups, packed_cut
from lightning_varbatch.planner.rank_shares import apportion
from lightning_varbatch.planner.settings import PlanConfig, TailPolicy
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups
from lightning_varbatch.planner.tail import split_micro_batches, too_few_message

__all__ = [
    "Lane",
    "LanePlan",
    "check_budgets_hold",
    "lane_budgets",
    "lane_config",
    "lane_cuts",
    "lane_of_positions",
    "lane_plan",
    "single_example_cost",
    "uniform",
]

#: The golden ratio's fractional part: ``frac(i·φ)`` is the most evenly spread sequence.
_PHI = (math.sqrt(5.0) - 1.0) / 2.0


def uniform(budgets: Sequence[int] | None, max_tokens: int) -> bool:
    """Whether ``budgets`` plan as one budget of ``max_tokens`` (no lanes needed).

    Example:
        >>> uniform(None, 64), uniform((64, 64), 64), uniform((64, 32), 64)
        (True, True, False)
    """
    return budgets is None or all(int(b) == int(max_tokens) for b in budgets)


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


def single_example_cost(prepared: PreparedLengths, config: PlanConfig) -> int:
    """The cost of a micro-batch holding only the longest planned example.

    Example:
        >>> from lightning_varbatch.planner.lengths import prepare_lengths
        >>> config = PlanConfig(max_tokens=64, pad_to_multiple_of=8)
        >>> single_example_cost(prepare_lengths([3, 13, 5], config), config)
        16
    """
    key = prepared.key if prepared.kept is None else prepared.key[prepared.kept]
    if key.size == 0:
        return 0
    longest = np.array([int(key.max())], dtype=np.int64)
    p = config.pad_to_multiple_of
    cost = checked_cost(config.cost_fn, np.ones(1, dtype=np.int64), -(-longest // p) * p, longest)
    return math.ceil(float(cost[0]))


def lane_budgets(
    config: PlanConfig,
    world: int,
    given: Sequence[int] | None,
    longest_cost: Callable[[], int],
) -> tuple[int, ...] | None:
    """The ranks' budgets a plan is cut to, ``None`` when they are ``max_tokens`` on every rank.

    Args:
        config: the planner settings.
        world: the number of ranks.
        given: the budgets asked for (``None``: the config's, ``PlanConfig.rank_budgets``).
        longest_cost: the cost of the longest example alone (called only when needed).

    Raises:
        SettingValueError: for budgets of another length than ``world``, outside
            ``[1, max_tokens]``, or below the longest example (naming the rank).

    Example:
        >>> lane_budgets(PlanConfig(max_tokens=64), 2, (64, 32), lambda: 10)
        (64, 32)
        >>> lane_budgets(PlanConfig(max_tokens=64), 2, None, lambda: 10) is None
        True
    """
    budgets = config.rank_budgets(world) if given is None else tuple(int(b) for b in given)
    if budgets is not None and len(budgets) != world:
        raise SettingValueError(
            f"rank_budgets has {len(budgets)} entries but world_size={world}: give one "
            "budget per rank.",
            setting="rank_budgets",
            value=budgets,
        )
    if uniform(budgets, config.max_tokens):
        return None
    assert budgets is not None
    if max(budgets) > config.max_tokens or min(budgets) < 1:
        raise SettingValueError(
            f"rank_budgets={budgets} must each be in [1, max_tokens={config.max_tokens}].",
            setting="rank_budgets",
            value=budgets,
        )
    check_budgets_hold(budgets, longest_cost(), config)
    return budgets


def check_budgets_hold(budgets: Sequence[int], longest_cost: int, config: PlanConfig) -> None:
    """Refuse budgets of which one cannot hold the longest example, naming the rank.

    Raises:
        SettingValueError: (``.setting``: ``"rank_shares"`` when shares are set, else
            ``"rank_max_tokens"``) for the first rank whose budget is too small.

    Example:
        >>> check_budgets_hold((64, 32), 30, PlanConfig(max_tokens=64))  # both hold 30
    """
    for rank, budget in enumerate(budgets):
        if budget >= longest_cost:
            continue
        setting = "rank_shares" if config.rank_shares is not None else "rank_max_tokens"
        fix = f"raise rank {rank}'s entry of {setting}"
        memory = config.rank_max_tokens
        if memory is not None and len(memory) == len(budgets):
            speed = np.asarray(config.rank_shares or [1.0] * len(memory), dtype=np.float64)
            limit = int(np.argmin(np.asarray(memory) / (speed / speed.max())))
            if memory[limit] < longest_cost or config.rank_shares is None:
                # every budget is scaled so that this rank's fit its memory: raising another
                # rank's entry changes nothing
                setting = "rank_max_tokens"
                fix = (
                    f"raise rank_max_tokens[{limit}]={memory[limit]} (rank {limit}'s memory "
                    "sets every rank's budget)"
                )
                if config.rank_shares is not None:
                    fix += f" or rank {rank}'s entry of rank_shares"
        raise SettingValueError(
            f"Rank {rank}'s micro-batch budget is {budget} tokens (from rank_shares="
            f"{config.rank_shares}, rank_max_tokens={config.rank_max_tokens}, max_tokens="
            f"{config.max_tokens}), which cannot hold the longest example (cost "
            f"{longest_cost}): {fix}, or shorten the longest examples (oversize='truncate' or "
            "'skip' with a lower max_tokens).",
            setting=setting,
            value=getattr(config, setting),
        )


@dataclass(frozen=True)
class LanePlan:
    """An epoch's micro-batches cut in lanes, and each lane's run of them.

    Attributes:
        order: example ids, lane after lane (each lane longest first).
        cut: the micro-batches of all lanes, as slices of ``order`` (ids are global).
        runs: ``(world, T)`` micro-batch ids: lane ``r``'s run, in length order, with the
            tail policy's repeats; ``T`` is a multiple of ``accumulate_grad_batches``.
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
    """``config`` with one budget of ``budget`` and no per-rank settings (a lane's cut)."""
    with warnings.catch_warnings():  # the settings' warnings were given once, for the config
        warnings.simplefilter("ignore")
        return dataclasses.replace(
            config, max_tokens=int(budget), rank_shares=None, rank_max_tokens=None
        )


def _to_count(
    m: int, target: int, sizes: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, int, int]:
    """``target`` of ``m`` micro-batch ids, sorted: random repeats or drops (and their sizes)."""
    seq = np.arange(m, dtype=np.int64)
    if m == target:
        return seq, 0, 0
    if m > target:
        keep = np.sort(rng.choice(m, size=target, replace=False))
        gone = np.setdiff1d(seq, keep)
        return keep, int(sizes[gone].sum()), 0
    extra = rng.choice(m, size=target - m, replace=target - m > m)
    return np.sort(np.concatenate((seq, extra))), 0, int(sizes[extra].sum())


def _lane_positions(size: int, weights: Sequence[float]) -> list[np.ndarray]:
    """Each lane's sorted positions: exactly its largest-remainder share of ``size``.

    The golden-ratio interleave (:func:`lane_of_positions`) spreads the lanes over every length
    range; a few positions then move from lanes over their share to lanes under it, so the
    counts are exact. Every lane gets at least one position (a repeat when too few examples).
    """
    world = len(weights)
    lane = lane_of_positions(size, weights)
    quota = apportion(size, np.asarray(weights, dtype=np.float64) / float(sum(weights)))
    if quota.min() == 0:  # too few examples for the shares: every lane gets what it can
        quota = np.full(world, size // world) + (np.arange(world) < size % world)
    surplus = np.bincount(lane, minlength=world) - quota
    if surplus.any():  # move evenly spaced positions of the lanes over quota
        movers = np.concatenate(
            [
                np.flatnonzero(lane == r)[:: max(1, -(-int(np.sum(lane == r)) // int(k)))][:k]
                for r, k in enumerate(surplus.tolist())
                if k > 0
            ]
        )
        lane[np.sort(movers)] = np.repeat(np.arange(world), np.maximum(-surplus, 0))
    out = [np.flatnonzero(lane == r) for r in range(world)]
    return [p if p.size or size == 0 else np.array([r % size]) for r, p in enumerate(out)]


class Lane(NamedTuple):
    """One rank's lane, cut: its sorted positions, their groups, the cut and its settings.

    For packed rows cut on exact lengths (``cuts_each_epoch``) the groups and the cut are the
    epoch's; otherwise they depend only on the lengths and the budgets, and are reused.
    """

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
    """Deal the sorted positions to the ranks' lanes and cut each lane at its budget.

    Args:
        groups: the sorted order of the planned examples (positions; cuts read only lengths).
        order: this epoch's example ids at those positions (read only for packed rows cut on
            exact lengths).
        key: every example's planning length (for those packed rows).
        budgets: one budget per rank.
        config: the planner settings.
        acc: micro-batches per rank per step (each lane's count becomes a multiple of it).
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
    # A lane has fewer examples than the others have micro-batches (whole examples fill the
    # budgets coarsely): size the lanes by their examples per micro-batch, which evens the
    # counts, then move the shortest examples of lanes with more than they need to lanes
    # with fewer, so that no lane repeats an example while the data has enough.
    lanes = cut(_lane_positions(groups.size, sizes / counts))
    for _ in range(len(lanes)):
        sizes, counts, target = short(lanes)
        need, spare = np.maximum(target - sizes, 0), np.maximum(sizes - target, 0)
        if not need.any() or spare.sum() < need.sum():
            break
        positions = [lane.positions for lane in lanes]
        moved = np.concatenate(
            [positions[r][positions[r].size - k :] for r, k in enumerate(_take(spare, need))]
        )
        for r, k in enumerate(_take(spare, need).tolist()):
            positions[r] = positions[r][: positions[r].size - k]
        ends = np.cumsum(need)
        for r in np.flatnonzero(need).tolist():
            positions[r] = np.sort(
                np.concatenate((positions[r], moved[ends[r] - need[r] : ends[r]]))
            )
        lanes = cut(positions)
    return lanes


def _take(spare: np.ndarray, need: np.ndarray) -> np.ndarray:
    """How many examples each lane gives: ``need.sum()`` in all, from the most spare first."""
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

    Args:
        lanes: the lanes, one per rank.
        order: this epoch's example ids at the sorted positions (shuffled within buckets).
        config: the planner settings.
        acc: micro-batches per rank per step.
        tail: the tail policy in force (:func:`~lightning_varbatch.planner.tail.effective_tail`).
        rng: the epoch's generator.
        replanned: the rest of an epoch: ``tail="drop"`` drops every micro-batch when some
            lane has fewer than one step needs (counted), instead of refusing.

    Returns:
        The lanes' micro-batches and runs.

    Raises:
        ValueError: ``tail="drop"`` when some lane of a whole epoch has fewer micro-batches
            than one step needs.
    """
    world = len(lanes)
    # a lane beyond the examples holds a repeated one (fewer examples than ranks)
    repeated = sum(lane.positions.size for lane in lanes) - order.shape[0]
    counts = [lane.cut.num_micro_batches for lane in lanes]
    if tail == "drop":
        target = min(counts) // acc * acc
        if target == 0 and not replanned:
            raise ValueError(too_few_message(min(counts), "micro-batches", world, acc, config))
    else:
        target = max(-(-max(counts) // acc) * acc, acc)
    runs = np.empty((world, target), dtype=np.int64)
    parts: list[SortedCut] = []
    dropped, duplicated, offset, pos = 0, repeated, 0, 0
    orders = [order[lane.positions] for lane in lanes]
    for r, (lane, lane_ids) in enumerate(zip(lanes, orders, strict=True)):
        cut = lane.cut
        if tail == "spread" and cut.num_micro_batches < target:
            cut = split_micro_batches(cut, lane.groups, target, lane.config)
        ids, gone, extra = _to_count(cut.num_micro_batches, target, cut.sizes, rng)
        if config.layout == "packed":  # steps of neighbouring compute, as dealing does
            ids = ids[np.argsort(-cut.work[ids], kind="stable")]
        runs[r] = ids + offset
        dropped, duplicated = dropped + gone, duplicated + extra
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
    return LanePlan(order_out, merged, runs, dropped, duplicated)
