"""The pair order: (source, target) pairs alike on both sides, together.

The collate pads each side of a pair to its own longest: ``n`` pairs cost ``n * longest source + n *
longest target`` slots. The planner cuts the examples sorted by ``max(source, target)`` (fairseq's
rule: a budget on each side); within a planning length, ordering by ``source - target`` puts pairs
that pad alike together. The direction alternates between planning lengths (source-longer pairs of
one meet those of the next), so a micro-batch straddling two lengths stays alike.

The budget on each side (``n * max(longest source, longest target) <= max_tokens``) and every
guarantee are those of ``pair_order="max"``; planning lengths may be joined into geometric buckets
a few percent wide where that pads less (:mod:`~.pair_buckets`: at most 1 % more micro-batches).
Ranks are balanced by both sides' padded slots (:func:`pair_slots`). Each epoch shuffles pairs
within cells of about :data:`MIN_CELL` alike pairs (``docs/planning.md``, "Pairs").

Example:
    >>> diff = np.array([-5, 7, 0, 4, -6])  # source - target of five pairs of one length
    >>> ids, cells = order_within(np.arange(5), np.array([0, 5]), diff)
    >>> ids.tolist(), cells.tolist()
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
    ids: np.ndarray, starts: np.ndarray, diff: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """``ids`` reordered within each group by ``source - target``, and the cells that remain.

    Args:
        ids: example ids sorted by group (``SortedGroups.ids``).
        starts: ``(G + 1,)`` start of each group, then the count.
        diff: every example's ``source - target`` as planned (``PreparedLengths.diff``).

    Returns:
        ``ids``, reordered in place, and ``(C + 1,)`` starts of the cells the epoch shuffles within
        (runs of equal group and ``source - target``, joined to about :data:`MIN_CELL`).
    """
    if ids.size == 0:
        return ids, np.zeros(1, dtype=np.int64)
    span = int(np.abs(diff).max())
    if starts.size > _LOOP_GROUPS:  # many groups (very long lengths): one sort of both keys
        group = np.repeat(np.arange(starts.size - 1, dtype=np.int64), np.diff(starts))
        mine = diff[ids].astype(np.int64)
        signed = np.where(group % 2 == 0, mine, -mine)
        order = np.argsort(group * (2 * span + 1) + signed, kind="stable")
        signed = signed[order]
        ids[:] = ids[order]
        return ids, _cells(np.flatnonzero(signed[1:] != signed[:-1]) + 1, starts)
    runs = []  # one group at a time: temporaries of one group's size
    short = diff.dtype == np.int16
    for g, (a, b) in enumerate(itertools.pairwise(starts.tolist())):
        members = ids[a:b]
        if short:  # int16 -> uint16 keeping the order (flip the sign bit): a radix sort
            keys = diff[members].view(np.uint16) ^ np.uint16(0x8000)
            if g % 2:  # the direction alternates
                np.invert(keys, out=keys)
        else:
            keys = diff[members].astype(np.int64) * (1 if g % 2 == 0 else -1)
        local = np.argsort(keys, kind="stable")
        members[:] = members[local]
        keys = keys[local]
        runs.append(np.flatnonzero(keys[1:] != keys[:-1]) + (a + 1))
    return ids, _cells(np.concatenate(runs), starts)


#: Above this many groups :func:`order_within` sorts once instead of group by group.
_LOOP_GROUPS = 4096
#: The pairs a cell holds on average (at most one cell per this many pairs of a group): runs of
#: equal ``source - target`` are joined up to it, so an epoch's shuffle changes micro-batches about
#: as much as under ``"max"`` (20k WMT-like pairs, 512-4096 tokens: 3-5 % of micro-batches repeat
#: between epochs, 2-3 % under ``"max"``, single runs 19-22 %) for 0.1-0.3 points more padding.
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
    order: np.ndarray, starts: np.ndarray, sizes: np.ndarray, key: np.ndarray, diff: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Every micro-batch's longest source and longest target (0 for an empty one), int64.

    ``key``: every pair's ``max(source, target)``; ``diff``: its ``source - target``.

    Example:
        >>> key, diff = np.array([9, 9, 9]), np.array([-5, 7, -6])  # (4, 9), (9, 2), (3, 9)
        >>> src, tgt = longest_sides(np.array([0, 2, 1]), np.array([0, 2]), np.array([2, 1]),
        ...                          key, diff)
        >>> src.tolist(), tgt.tolist()
        ([4, 9], [9, 2])
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    src = np.zeros(sizes.shape[0], dtype=np.int64)
    tgt = np.zeros(sizes.shape[0], dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    nonempty = np.flatnonzero(sizes)
    # micro-batches a chunk of positions at a time: bounded temporaries for millions of pairs
    bounds = np.searchsorted(offsets[nonempty], np.arange(0, int(sizes.sum()), _CHUNK))
    starts = np.asarray(starts, dtype=np.int64)
    contiguous = np.array_equal(starts[nonempty], offsets[nonempty])  # the usual cut
    for m0, m1 in itertools.pairwise([*bounds.tolist(), nonempty.size]):
        mbs = nonempty[m0:m1]
        if mbs.size == 0:
            continue
        n = sizes[mbs]
        local = np.cumsum(n) - n
        if contiguous:
            members = order[starts[mbs[0]] : starts[mbs[-1]] + n[-1]]
        else:  # micro-batches may overlap (repeats) or skip positions
            positions = np.repeat(starts[mbs] - local, n)
            members = order[positions + np.arange(int(n.sum()))]
        k = key[members]
        if diff.dtype == np.int16 and k.dtype == np.uint16:
            k = k.view(np.int16)  # lengths under 2**15 (diff fits int16): no widening
        d = diff[members]
        side = np.minimum(d, 0)
        side += k  # the source: key + min(d, 0)
        src[mbs] = np.maximum.reduceat(side, local)
        np.maximum(d, 0, out=side)
        np.subtract(k, side, out=side)  # the target: key - max(d, 0)
        tgt[mbs] = np.maximum.reduceat(side, local)
    return src, tgt


#: Positions :func:`longest_sides` reads at a time.
_CHUNK = 1 << 18


def pair_slots(
    order: np.ndarray, starts: np.ndarray, sizes: np.ndarray, pairs: np.ndarray, multiple: int
) -> np.ndarray:
    """Padded slots of both tensors of every micro-batch: ``n * (longest src + longest tgt)``.

    Each side padded to ``multiple``: what a pair costs an encoder-decoder, and what ranks balance.

    Args:
        order: the plan's example ids in sorted position.
        starts: ``(m,)`` first position of each micro-batch.
        sizes: ``(m,)`` examples of each micro-batch.
        pairs: ``(num_examples, 2)`` (source, target) lengths.
        multiple: ``pad_to_multiple_of``.

    Example:
        >>> pairs = np.array([[4, 9], [9, 2], [3, 9]])
        >>> pair_slots(np.array([0, 2, 1]), np.array([0, 2]), np.array([2, 1]), pairs, 1)
        array([26., 11.])
    """
    pairs = np.asarray(pairs, dtype=np.int64)
    key, diff = pairs.max(axis=1), pairs[:, 0] - pairs[:, 1]
    return _slots(sizes, *longest_sides(order, starts, sizes, key, diff), multiple)


def _slots(sizes: np.ndarray, src: np.ndarray, tgt: np.ndarray, multiple: int) -> np.ndarray:
    padded = -(-src // multiple) * multiple - (-tgt // multiple) * multiple
    return (np.asarray(sizes, dtype=np.int64) * padded).astype(np.float64)


def with_pair_work(cut: _Cut, order: np.ndarray, prepared: Any, config: Any) -> _Cut:
    """``cut`` (a ``SortedCut``) with both sides' padded slots as its work (two-sided pairs).

    ``prepared``: the ``PreparedLengths`` (single lengths or ``pair_order="max"``: ``cut`` itself).
    The plan records the work as ``micro_batch_work``; the cost is recomputed from each
    micro-batch's own longest pair (a wide bucket was cut at its longest: a bound).
    """
    if prepared.diff is None or config.pair_order != "two_sided":
        return cut
    src, tgt = longest_sides(order, cut.starts, cut.sizes, prepared.key, prepared.diff)
    p = config.pad_to_multiple_of
    longest = -(-np.maximum(src, tgt) // p) * p
    cost = np.minimum(checked_cost(config.cost_fn, cut.sizes, longest, cut.total), cut.cost)
    return dataclasses.replace(cut, work=_slots(cut.sizes, src, tgt, p), cost=cost)
