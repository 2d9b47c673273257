"""Packed rows over wide buckets: each epoch's rows cut on the examples' exact lengths.

The reused sorted cut budgets a bucket's members at its longest: room left empty in a packed row
(``bucket_width=64``: rows 82 % full, not 92 %). So with ``layout="packed"`` and ``bucket_width >
1`` rows are cut each epoch on exact lengths (:func:`packed_cut`), their count varying by a few.

Example:
    >>> config = PlanConfig(max_tokens=10, layout="packed", bucket_width=8)
    >>> rows = packed_cut(exact_groups(np.arange(5), np.array([6, 3, 4, 1, 5])), config)
    >>> rows.sizes.tolist(), rows.total.tolist()
    ([2, 3], [9, 10])
"""

from __future__ import annotations

import numpy as np

from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups, round_down

__all__ = ["cuts_each_epoch", "exact_groups", "packed_cut"]


def cuts_each_epoch(config: PlanConfig) -> bool:
    """Whether the planner cuts this epoch's rows on exact lengths (:func:`packed_cut`)."""
    return config.layout == "packed" and config.bucket_width > 1


def exact_groups(order: np.ndarray, key: np.ndarray) -> SortedGroups:
    """The epoch's ``order`` with every example a group of its own, at its exact length.

    Unsorted within buckets: only the packed cost (summed lengths, not the first's) may cut them.
    """
    n = int(order.shape[0])
    return SortedGroups(
        ids=order, starts=np.arange(n + 1, dtype=np.int64), longest=key[order].astype(np.int64)
    )


def packed_cut(groups: SortedGroups, config: PlanConfig) -> SortedCut:
    """Cut ``groups`` (from :func:`exact_groups`) greedily into rows that fit the budget.

    A row ``[a, e)`` fits when its real tokens, rounded up to ``pad_to_multiple_of``, are at most
    ``max_tokens`` (at most ``max_tokens`` rounded down to that multiple), and it holds at most
    ``max_examples`` examples, rounded down to ``batch_size_multiple`` as every cut does.
    """
    n = groups.size
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return SortedCut.from_micro_batches(groups, empty, empty, config)
    p = config.pad_to_multiple_of
    room = (int(config.max_tokens) // p) * p
    cum = np.concatenate(([0], np.cumsum(groups.longest, dtype=np.int64)))
    ends = np.searchsorted(cum, cum[:-1] + room, side="right") - 1
    cap = min(config.max_examples or n, n)
    size = np.minimum(ends - np.arange(n), cap)
    size = np.maximum(round_down(size, config.batch_size_multiple), 1)
    starts, a = [], 0
    while a < n:
        starts.append(a)
        a += int(size[a])
    first = np.asarray(starts, dtype=np.int64)
    return SortedCut.from_micro_batches(groups, first, np.diff(np.append(first, n)), config)
