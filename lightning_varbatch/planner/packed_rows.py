"""Packed rows over wide buckets: each epoch's rows cut on the examples' exact lengths.

With ``layout="packed"`` a micro-batch is one row of whole examples whose real tokens fit
``max_tokens``; padding does not exist, so the sort only serves to give steps rows of similar
compute. The padded layout's cut (:mod:`lightning_varbatch.planner.sorted_cut`) is made once
on the sorted order and reused every epoch while examples of one bucket are reshuffled, so it
must budget every member of a bucket at the bucket's longest length. For padded batches that
is the padding the bucket costs anyway; for a packed row it is room left empty: with
``bucket_width=64`` a 5-token example took 63 tokens of the budget and rows were filled to
82 % instead of 92 % (lognormal lengths, ``max_tokens=4096``; more with shorter examples).

So with ``layout="packed"`` and ``bucket_width > 1`` the rows are cut each epoch, after the
shuffle within buckets, on the exact lengths in that epoch's order (:func:`packed_cut`): one
greedy walk over the cumulative lengths, vectorised except for one step per row. The plan
stays a pure function of ``(lengths, settings, seed, epoch)``, so every guarantee holds as
before: no row over the budget, equal counts (the tail policy runs on this cut), balance
(steps of neighbouring compute, dealt by FLOPs), exact and elastic resume (a re-plan repeats
the same shuffle and cut). The number of rows may differ by a few from epoch to epoch.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner.settings import PlanConfig
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
    """Whether the planner cuts this epoch's rows on exact lengths (:func:`packed_cut`).

    Example:
        >>> cuts_each_epoch(PlanConfig(max_tokens=64, layout="packed", bucket_width=8))
        True
    """
    return config.layout == "packed" and config.bucket_width > 1


def exact_groups(order: np.ndarray, key: np.ndarray) -> SortedGroups:
    """The epoch's ``order`` with every example a group of its own, at its exact length.

    The lengths are no longer sorted within a bucket; only the packed cost (which reads the
    summed lengths, not the first example's) may be cut on these groups.
    """
    n = int(order.shape[0])
    return SortedGroups(
        ids=order, starts=np.arange(n + 1, dtype=np.int64), longest=key[order].astype(np.int64)
    )


def packed_cut(groups: SortedGroups, config: PlanConfig) -> SortedCut:
    """Cut ``groups`` (from :func:`exact_groups`) greedily into rows that fit the budget.

    A row ``[a, e)`` fits when its real tokens, rounded up to ``pad_to_multiple_of``, are at
    most ``max_tokens``: when they are at most ``max_tokens`` rounded down to that multiple.
    Each row also holds at most ``max_examples`` examples, rounded down to
    ``batch_size_multiple`` as every cut does.
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
