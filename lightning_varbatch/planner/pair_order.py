"""The pair order: (source, target) pairs alike on both sides, together.

The collate pads each side of a pair to its own longest, so a micro-batch of ``n`` pairs
costs ``n * longest source + n * longest target`` slots. The planner cuts the examples sorted
by ``max(source, target)`` (fairseq's rule: a budget on each side); within one planning length
the pairs differ in which side is the longer and by how much, and ordering them there by
``source - target`` puts pairs that pad alike next to each other. The direction alternates
from one planning length to the next (source-longer pairs of one length meet the
source-longer pairs of the next), so a micro-batch that straddles two lengths stays alike too.

The budget on each side (``n * max(longest source, longest target) <= max_tokens``) and every
guarantee are those of ``pair_order="max"``; the planning lengths may be joined into geometric
buckets a few percent wide where that pads less (:mod:`~lightning_varbatch.planner.
pair_buckets`: at most 1 % more micro-batches). Ranks are balanced by both sides' padded slots
(:func:`pair_slots`). Each epoch shuffles pairs within cells of about :data:`MIN_CELL`
alike pairs (``docs/planning.md``, "Pairs").

Example:
    >>> import numpy as np
    >>> sides = np.array([[4, 9], [9, 2], [9, 9], [9, 5], [3, 9]]).T  # sources, then targets
    >>> ids, cells = order_within(np.arange(5), np.array([0, 5]), sides)
    >>> ids.tolist(), cells.tolist()  # source - target: -6, -5, 0, 4, 7
    ([4, 0, 2, 3, 1], [0, 5])
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Literal, TypeAlias, TypeVar

import numpy as np

from lightning_varbatch.planner.costs import checked_cost

PairOrder: TypeAlias = Literal["two_sided", "max"]
PAIR_ORDERS: tuple[str, ...] = ("two_sided", "max")
_Cut = TypeVar("_Cut", bound=Any)

__all__ = [
    "PAIR_ORDERS",
    "PairOrder",
    "longest_sides",
    "order_within",
    "pair_slots",
    "with_pair_work",
]


def order_within(
    ids: np.ndarray, starts: np.ndarray, sides: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` reordered within each group by ``source - target``, and the cells that remain.

    Args:
        ids: example ids sorted by group (``SortedGroups.ids``).
        starts: ``(G + 1,)`` start of each group, then the count.
        sides: ``(2, num_examples)``: every example's source, then target length as planned.

    Returns:
        ``ids``, reordered in place, and ``(C + 1,)`` starts of the cells (runs of equal group
        and ``source - target``, joined to about :data:`MIN_CELL`), which the epoch's
        shuffle mixes within.
    """
    if ids.size == 0:
        return ids, np.zeros(1, dtype=np.int64)
    span = int(sides.max())  # |source - target| < the longest length
    if starts.size > _LOOP_GROUPS:  # many groups (very long lengths): one sort of both keys
        group = np.repeat(np.arange(starts.size - 1, dtype=np.int64), np.diff(starts))
        diff = sides[0][ids].astype(np.int64) - sides[1][ids]
        signed = np.where(group % 2 == 0, diff, -diff)
        order = np.argsort(group * (2 * span + 1) + signed, kind="stable")
        signed = signed[order]
        ids[:] = ids[order]
        return ids, _cells(np.flatnonzero(signed[1:] != signed[:-1]) + 1, starts)
    runs = []  # one group at a time: temporaries of one group's size
    for g, (a, b) in enumerate(itertools.pairwise(starts.tolist())):
        members = ids[a:b]
        signed = sides[0][members].astype(np.int32) - sides[1][members]
        if g % 2:  # the direction alternates
            np.negative(signed, out=signed)
        keys = (signed + span).astype(np.uint16) if 2 * span < 1 << 16 else signed
        local = np.argsort(keys, kind="stable")  # 16-bit keys: a radix sort
        members[:] = members[local]
        signed = signed[local]
        runs.append(np.flatnonzero(signed[1:] != signed[:-1]) + (a + 1))
    return ids, _cells(np.concatenate(runs), starts)


#: Above this many groups :func:`order_within` sorts once instead of group by group.
_LOOP_GROUPS = 4096
#: The pairs a cell holds on average (at most one cell per this many pairs of a group): runs
#: of equal ``source - target`` are joined up to it, so that an epoch's shuffle changes micro-batches' members
#: about as much as under ``"max"`` (on 20k WMT-like pairs at 512-4096 tokens, 3-5 % of
#: micro-batches repeat between epochs, 2-3 % under ``"max"``; single runs: 19-22 %) for
#: 0.1-0.3 points more padding than single runs.
MIN_CELL = 8


def _cells(runs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Starts of the cells (and the count at the end).

    A cell is a run of equal ``source - target`` within a group (``runs``: where one starts
    inside a group), joined so that a group of ``n`` pairs has at most ``n // MIN_CELL + 1``
    cells: each starts at the first run at or after a multiple of :data:`MIN_CELL`.
    """
    edges = np.union1d(runs, starts)
    sizes = np.diff(starts)
    per_group = sizes // MIN_CELL + 1
    first = np.repeat(starts[:-1], per_group)
    step = np.arange(int(per_group.sum())) - np.repeat(np.cumsum(per_group) - per_group, per_group)
    targets = first + MIN_CELL * step  # a cell starts at the first edge at or after each
    chosen = edges[np.minimum(np.searchsorted(edges, targets), edges.size - 1)]
    return np.union1d(chosen, starts).astype(np.int64)


def longest_sides(
    order: np.ndarray, starts: np.ndarray, sizes: np.ndarray, sides: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every micro-batch's longest source and longest target (0 for an empty one), int64.

    Example:
        >>> sides = np.array([[4, 9, 3], [9, 2, 9]])
        >>> src, tgt = longest_sides(np.array([0, 2, 1]), np.array([0, 2]), np.array([2, 1]), sides)
        >>> src.tolist(), tgt.tolist()
        ([4, 9], [9, 2])
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if not (sizes > 0).any():
        return np.zeros(sizes.shape[0], np.int64), np.zeros(sizes.shape[0], np.int64)
    offsets = np.cumsum(sizes) - sizes
    members = order
    if not np.array_equal(starts, offsets) or offsets[-1] + sizes[-1] != order.size:
        positions = np.repeat(np.asarray(starts, dtype=np.int64) - offsets, sizes)
        members = order[positions + np.arange(int(sizes.sum()))]  # micro-batches may overlap
    first = np.minimum(offsets, members.size - 1)
    src = np.maximum.reduceat(sides[0][members], first).astype(np.int64)
    tgt = np.maximum.reduceat(sides[1][members], first).astype(np.int64)
    src[sizes == 0] = tgt[sizes == 0] = 0
    return src, tgt


def pair_slots(
    order: np.ndarray, starts: np.ndarray, sizes: np.ndarray, sides: np.ndarray, multiple: int
) -> np.ndarray:
    """Padded slots of both tensors of every micro-batch: ``n * (longest src + longest tgt)``.

    Each side is padded to ``multiple`` (``pad_to_multiple_of``); what a pair micro-batch
    costs an encoder-decoder, and what ranks are balanced by.

    Args:
        order: the plan's example ids in sorted position.
        starts: ``(m,)`` first position of each micro-batch.
        sizes: ``(m,)`` examples of each micro-batch.
        sides: ``(2, num_examples)`` source, then target lengths.
        multiple: ``pad_to_multiple_of``.

    Example:
        >>> sides = np.array([[4, 9, 3], [9, 2, 9]])
        >>> pair_slots(np.array([0, 2, 1]), np.array([0, 2]), np.array([2, 1]), sides, 1)
        array([26., 11.])
    """
    src, tgt = longest_sides(order, starts, sizes, sides)
    padded = -(-src // multiple) * multiple - (-tgt // multiple) * multiple
    return (np.asarray(sizes, dtype=np.int64) * padded).astype(np.float64)


def with_pair_work(cut: _Cut, order: np.ndarray, sides: np.ndarray | None, config: Any) -> _Cut:
    """``cut`` (a ``SortedCut``) with both sides' padded slots as its work (two-sided pairs).

    ``sides``: ``PreparedLengths.sides`` (``None``, or ``pair_order="max"``: ``cut`` itself).
    The planner then forms steps by this work and records it as ``micro_batch_work``; the
    cost is recomputed from the micro-batches' own longest pair (a bucket wider than one
    length was cut at its longest: a bound).
    """
    if sides is None or config.pair_order != "two_sided":
        return cut
    src, tgt = longest_sides(order, cut.starts, cut.sizes, sides)
    p = config.pad_to_multiple_of
    slots = (cut.sizes * (-(-src // p) * p - (-tgt // p) * p)).astype(np.float64)
    longest = -(-np.maximum(src, tgt) // p) * p
    cost = np.minimum(checked_cost(config.cost_fn, cut.sizes, longest, cut.total), cut.cost)
    return dataclasses.replace(cut, work=slots, cost=cost)
