"""The sorted cut: micro-batches as contiguous slices of the examples sorted by length.

Cutting the length-sorted examples greedily pads least; the cut depends only on the lengths, so it
is made once and reused each epoch (equal lengths reshuffled), per group of equal length.

Example:
    >>> groups = SortedGroups.build(np.array([2, 9, 9, 4, 2], dtype=np.uint16), None, 1)
    >>> lay = SortedCut.build(groups, PlanConfig(max_tokens=18))
    >>> lay.sizes.tolist(), lay.cost.tolist()
    ([2, 3], [18.0, 12.0])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.flops import work
from lightning_varbatch.planner.pair_order import order_within
from lightning_varbatch.planner.search import largest_true
from lightning_varbatch.planner.settings import PlanConfig


@dataclass(frozen=True)
class SortedGroups:
    """Example ids sorted by decreasing length, cut into groups of equal bucket.

    Attributes:
        ids: example ids, longest first (int32 when they fit).
        starts: ``(G + 1,)`` start position of each group, then the total count.
        longest: ``(G,)`` the longest length in each group.
        cells: ``(C + 1,)`` starts of the runs an epoch shuffles within, if finer than the groups
            (two-sided pairs, :func:`~.pair_order.order_within`); ``None``: the groups.
    """

    ids: np.ndarray
    starts: np.ndarray
    longest: np.ndarray
    cells: np.ndarray | None = None

    @property
    def size(self) -> int:
        """Number of examples."""
        return int(self.ids.shape[0])

    @property
    def shuffle_starts(self) -> np.ndarray:
        """Starts of the runs an epoch shuffles within: the cells, else the groups."""
        return self.starts if self.cells is None else self.cells

    @classmethod
    def build(
        cls,
        key: np.ndarray,
        subset: np.ndarray | None,
        bucket_width: int,
        shape_lengths: np.ndarray | None = None,
        diff: np.ndarray | None = None,
        relative_width: float = 0.0,
    ) -> SortedGroups:
        """Sort ``key`` (or its ``subset`` of ids) by decreasing bucket, stably.

        A stable counting sort in cache-sized chunks (extra memory: the 4-byte ids plus a chunk).
        ``shape_lengths`` (the shape budget's, ascending) are the buckets: an example goes to the
        shortest that holds it. With ``diff`` (pairs' source minus target) each bucket is ordered
        by ``source - target`` in cells; with ``relative_width`` too, the ``bucket_width`` buckets
        are joined into geometric ones about that fraction wide (:mod:`~.pair_buckets`).
        """
        if relative_width > 0 and key.size and (subset is None or subset.size):
            groups = cls._build_relative(key, subset, bucket_width, relative_width)
        else:
            groups = cls._build(key, subset, bucket_width, shape_lengths)
        if diff is None:
            return groups
        ids, cells = order_within(groups.ids, groups.starts, diff)
        return cls(ids=ids, starts=groups.starts, longest=groups.longest, cells=cells)

    @classmethod
    def _build(
        cls,
        key: np.ndarray,
        subset: np.ndarray | None,
        bucket_width: int,
        shape_lengths: np.ndarray | None,
    ) -> SortedGroups:
        """:meth:`build` by bucket alone."""
        k = key if subset is None else key[subset]
        if k.size == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls(
                ids=empty.astype(np.int32), starts=np.zeros(1, dtype=np.int64), longest=empty
            )
        if shape_lengths is not None:
            return cls._build_shaped(k, subset, shape_lengths, key.shape[0])
        if int(k.max()) // bucket_width >= _DENSE_BUCKETS and k.max() > 8 * k.size:
            return cls._build_sparse(k, subset, bucket_width, key.shape[0])
        counts = np.bincount(k)
        top = counts.size - 1
        id_dtype = np.int32 if key.shape[0] < 2**31 else np.int64
        ids = _counting_sort_desc(k, top // bucket_width, bucket_width, id_dtype)
        if subset is not None:
            ids = subset[ids].astype(id_dtype)
        nb = top // bucket_width + 1
        flat = np.zeros(nb * bucket_width, dtype=np.int64)
        flat[: counts.size] = counts
        per_bucket = flat.reshape(nb, bucket_width)
        sizes = per_bucket.sum(axis=1)
        offset = np.where(per_bucket > 0, np.arange(bucket_width), -1).max(axis=1)
        longest = np.arange(nb, dtype=np.int64) * bucket_width + offset
        nonempty = np.flatnonzero(sizes)[::-1]  # longest bucket first
        starts = np.concatenate(([0], np.cumsum(sizes[nonempty]))).astype(np.int64)
        return cls(ids=ids, starts=starts, longest=longest[nonempty])

    @classmethod
    def _build_relative(
        cls, key: np.ndarray, subset: np.ndarray | None, bucket_width: int, width: float
    ) -> SortedGroups:
        """:meth:`build` into buckets ``⌊log(b + 1) / log(1 + width)⌋``, priced at the longest."""
        k = key if subset is None else key[subset]
        dense = int(k.max()) < _DENSE_BUCKETS  # then one lookup per length, not a log each
        # every length's bucket (or every example's), never decreasing in the length
        values = np.arange(int(k.max()) + 1) if dense else k.astype(np.int64)
        of_value = np.floor(np.log1p(values // bucket_width) / np.log1p(width)).astype(np.int64)
        bucket = of_value[k] if dense else of_value
        top = int(of_value.max())
        id_dtype = np.int32 if key.shape[0] < 2**31 else np.int64
        ids = np.argsort((top - bucket).astype(np.uint16), kind="stable").astype(id_dtype)
        if subset is not None:
            ids = subset[ids].astype(id_dtype)
        sizes = np.bincount(bucket, minlength=top + 1)
        longest = np.zeros(top + 1, dtype=np.int64)
        if dense:
            present = np.flatnonzero(np.bincount(k))  # ascending: a bucket's last is longest
            longest[of_value[present]] = present
        else:
            np.maximum.at(longest, bucket, values)
        nonempty = np.flatnonzero(sizes)[::-1]  # the longest bucket first
        starts = np.concatenate(([0], np.cumsum(sizes[nonempty]))).astype(np.int64)
        return cls(ids=ids, starts=starts, longest=longest[nonempty])

    @classmethod
    def _build_shaped(
        cls, k: np.ndarray, subset: np.ndarray | None, lengths: np.ndarray, num_ids: int
    ) -> SortedGroups:
        """:meth:`build` with the shape budget's lengths as the buckets."""
        shape = np.searchsorted(lengths, k, side="left")
        if int(shape.max()) >= lengths.size:
            raise ValueError(
                f"An example of length {int(k.max())} is longer than the longest shape "
                f"({int(lengths[-1])}): the shape lengths must be chosen from these lengths."
            )
        id_dtype = np.int32 if num_ids < 2**31 else np.int64
        ids = _counting_sort_desc(shape, lengths.size - 1, 1, id_dtype)
        if subset is not None:
            ids = subset[ids].astype(id_dtype)
        sizes = np.bincount(shape, minlength=lengths.size)
        nonempty = np.flatnonzero(sizes)[::-1]  # longest shape first
        starts = np.concatenate(([0], np.cumsum(sizes[nonempty]))).astype(np.int64)
        return cls(ids=ids, starts=starts, longest=lengths[nonempty].astype(np.int64))

    @classmethod
    def _build_sparse(
        cls, k: np.ndarray, subset: np.ndarray | None, bucket_width: int, num_ids: int
    ) -> SortedGroups:
        """:meth:`build` for very long lengths: the distinct buckets renumbered densely first."""
        k64 = k.astype(np.int64)
        buckets, dense = np.unique(k64 // bucket_width, return_inverse=True)
        dense = dense.reshape(-1)
        rank = (buckets.size - 1 - dense).astype(np.int64)  # 0 = the longest bucket
        id_dtype = np.int32 if num_ids < 2**31 else np.int64
        ids = np.argsort(rank, kind="stable").astype(id_dtype)
        if subset is not None:
            ids = subset[ids].astype(id_dtype)
        sizes = np.bincount(rank, minlength=buckets.size)
        longest = np.zeros(buckets.size, dtype=np.int64)
        np.maximum.at(longest, rank, k64)
        starts = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        return cls(ids=ids, starts=starts, longest=longest)

    def prefix(self, pos: np.ndarray, power: int = 1) -> np.ndarray:
        """Sum of the lengths (``power`` 2: squares) over ``[0, pos)``; wide buckets: a bound."""
        sizes = np.diff(self.starts)
        value = self.longest.astype(np.int64) ** power
        cum = np.concatenate(([0], np.cumsum(sizes * value)))
        g = np.clip(np.searchsorted(self.starts, pos, side="right") - 1, 0, len(self.longest) - 1)
        return cum[g] + (pos - self.starts[g]) * value[g]

    def suffix(self, start: int) -> SortedGroups:
        """The sorted order from position ``start`` on (positions renumbered from 0)."""
        g0 = int(self.group_of(np.array([start]))[0])
        starts = np.concatenate(([0], self.starts[g0 + 1 :] - start)).astype(np.int64)
        cells = None
        if self.cells is not None:
            c0 = int(np.searchsorted(self.cells, start, side="right")) - 1
            cells = np.concatenate(([0], self.cells[c0 + 1 :] - start)).astype(np.int64)
        return SortedGroups(
            ids=self.ids[start:], starts=starts, longest=self.longest[g0:], cells=cells
        )

    def group_of(self, pos: np.ndarray) -> np.ndarray:
        """Group index of each position."""
        return np.searchsorted(self.starts, pos, side="right") - 1


_SORT_CHUNK = 1 << 16
#: Above this many possible buckets, :meth:`SortedGroups.build` sorts the distinct ones (< 2**31).
_DENSE_BUCKETS = 1 << 22


def _counting_sort_desc(
    k: np.ndarray, top_bucket: int, bucket_width: int, id_dtype: type[np.integer]
) -> np.ndarray:
    """Positions of ``k`` sorted by decreasing ``k // bucket_width``, stable (ties keep order)."""
    nb = top_bucket + 1
    bucket_counts = np.bincount(k // bucket_width if bucket_width > 1 else k, minlength=nb)
    # bucket v goes after every bucket above it: its first slot is the count of those
    fill = np.cumsum(bucket_counts[::-1])[::-1] - bucket_counts
    ids = np.empty(k.size, dtype=id_dtype)
    for lo in range(0, k.size, _SORT_CHUNK):
        chunk = k[lo : lo + _SORT_CHUNK]
        if bucket_width > 1:
            chunk = chunk // bucket_width
        order = np.argsort(top_bucket - chunk, kind="stable")  # uint16 -> radix sort
        ranked = chunk[order]
        cnt = np.bincount(chunk, minlength=nb)
        first = np.cumsum(cnt[::-1])[::-1] - cnt  # where each bucket starts in this chunk
        ids[fill[ranked] + (np.arange(chunk.size) - first[ranked])] = order + lo
        fill += cnt
    return ids


def round_down(n: np.ndarray, multiple: int) -> np.ndarray:
    """Sizes rounded down to ``multiple`` (``batch_size_multiple``) where they reach it."""
    if multiple == 1:
        return n
    return np.where(n >= multiple, n - n % multiple, n)


@dataclass(frozen=True)
class SortedCut:
    """Micro-batches as slices ``[start, start + size)`` of :attr:`SortedGroups.ids`.

    Attributes:
        starts: ``(m,)`` first position of each micro-batch, ascending, covering all.
        sizes: ``(m,)`` examples per micro-batch.
        cost: ``(m,)`` cost of each micro-batch (an upper bound for buckets wider than 1).
        total: ``(m,)`` summed planning lengths of each micro-batch (exact for bucket width 1).
        work: ``(m,)`` what ranks are balanced by: the cost, or a packed row's compute.
    """

    starts: np.ndarray
    sizes: np.ndarray
    cost: np.ndarray
    total: np.ndarray
    work: np.ndarray

    @property
    def num_micro_batches(self) -> int:
        """Number of micro-batches."""
        return int(self.starts.shape[0])

    @classmethod
    def from_micro_batches(
        cls, groups: SortedGroups, starts: np.ndarray, sizes: np.ndarray, config: PlanConfig
    ) -> SortedCut:
        """Compute costs of given micro-batches and check them against the budget."""
        if starts.size == 0:
            zero = np.zeros(0)
            return cls(starts, sizes, cost=zero, total=zero.astype(np.int64), work=zero)
        p = config.pad_to_multiple_of
        longest = groups.longest[groups.group_of(starts)]
        total = groups.prefix(starts + sizes) - groups.prefix(starts)
        cost = checked_cost(config.cost_fn, sizes, -(-longest // p) * p, total)
        over = np.flatnonzero(cost > config.max_tokens)
        if over.size:
            j = int(over[0])
            raise SettingValueError(
                f"The cost model gave a micro-batch of {int(sizes[j])} examples cost "
                f"{cost[j]:g} > max_tokens={config.max_tokens} although smaller batches fit: "
                "a custom cost= must be non-decreasing in num_examples, longest and total.",
                setting="cost",
                value=config.cost,
            )
        load = cost
        if config.layout == "packed":
            squares = groups.prefix(starts + sizes, 2) - groups.prefix(starts, 2)
            load = work(total, squares, config.flop_attention)
        return cls(starts=starts, sizes=sizes, cost=cost, total=total, work=load)

    @classmethod
    def build(cls, groups: SortedGroups, config: PlanConfig) -> SortedCut:
        """Cut the sorted order greedily into micro-batches that fit the budget."""
        n = groups.size
        if n == 0:
            empty = np.zeros(0, dtype=np.int64)
            return cls.from_micro_batches(groups, empty, empty, config)
        cap = min(config.max_examples or n, n)
        full = full_batch_sizes(groups.longest, cap, config)
        price_only_by_count = config.cost in ("padded", "quadratic")
        starts_parts: list[np.ndarray] = []
        sizes_parts: list[np.ndarray] = []
        pos, g = 0, 0
        while pos < n:
            while groups.starts[g + 1] <= pos:
                g += 1
            end, nf = int(groups.starts[g + 1]), int(full[g])
            k = (end - pos) // nf
            if k:
                starts_parts.append(pos + nf * np.arange(k, dtype=np.int64))
                sizes_parts.append(np.full(k, nf, dtype=np.int64))
                pos += k * nf
            if pos >= end:
                continue
            # A micro-batch straddling into shorter groups: longest is this group's.
            hi = min(n - pos, nf if price_only_by_count else cap)
            size = _largest_fitting(groups, pos, end - pos, hi, int(groups.longest[g]), config)
            starts_parts.append(np.array([pos], dtype=np.int64))
            sizes_parts.append(np.array([size], dtype=np.int64))
            pos += size
        return cls.from_micro_batches(
            groups, np.concatenate(starts_parts), np.concatenate(sizes_parts), config
        )


def full_batch_sizes(longest: np.ndarray, cap: int, config: PlanConfig) -> np.ndarray:
    """Largest count of examples of each length (at most ``cap``) that fits, by bisection."""
    p = config.pad_to_multiple_of
    padded = -(-longest // p) * p
    fits = largest_true(
        lambda k: checked_cost(config.cost_fn, k, padded, k * longest) <= config.max_tokens,
        np.ones_like(longest),
        cap,
    )
    return round_down(fits, config.batch_size_multiple)


def _largest_fitting(
    groups: SortedGroups, pos: int, lo: int, hi: int, longest: int, config: PlanConfig
) -> int:
    """Largest ``size`` in ``[lo, hi]`` whose micro-batch starting at ``pos`` fits the budget."""
    p = config.pad_to_multiple_of
    padded = np.array([-(-longest // p) * p])
    base = groups.prefix(np.array([pos]))

    def fits(size: np.ndarray) -> np.ndarray:
        total = groups.prefix(pos + size.reshape(1)) - base
        return config.cost_fn(size.reshape(1), padded, total)[0] <= config.max_tokens

    size = largest_true(fits, max(lo, 1), hi)
    return int(round_down(size.reshape(1), config.batch_size_multiple)[0])
