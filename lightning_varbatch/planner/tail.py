"""The tail policy: how an epoch's micro-batches become whole optimizer steps.

A step needs a multiple of ``world_size * accumulate_grad_batches`` micro-batches; this module
alone decides what happens to the remainder (``PlanConfig.tail``, ``docs/planning.md``):
:func:`effective_tail` (the policy in force), :func:`tail_cut` (``"spread"``'s even re-cut of
the last step) and :func:`select_micro_batches` (random drops or repeats, counted).

Example:
    >>> config = PlanConfig(max_tokens=40)
    >>> groups = SortedGroups.build(np.full(13, 10, dtype=np.uint16), None, 1)
    >>> greedy = SortedCut.build(groups, config)
    >>> greedy.sizes.tolist(), tail_cut(greedy, groups, "spread", 4, config).sizes.tolist()
    ([4, 4, 4, 1], [3, 3, 3, 4])
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.search import largest_true, smallest_true
from lightning_varbatch.planner.settings import PlanConfig, TailPolicy
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups

__all__ = [
    "MicroBatchSelection",
    "effective_tail",
    "even_cuts",
    "select_micro_batches",
    "split_micro_batches",
    "spread_tail",
    "tail_cut",
    "too_few_message",
]


def too_few_message(count: int, what: str, world: int, acc: int, config: PlanConfig) -> str:
    """The error message for data too small to give every rank a micro-batch per step."""
    return (
        f"More ranks than batches: the data gives only {count} {what} but "
        f"world_size={world} x accumulate_grad_batches={acc} = {world * acc} micro-batches "
        f"are needed per optimizer step (max_tokens={config.max_tokens}, "
        f"tail={config.tail!r}). Lower max_tokens, world_size or "
        "accumulate_grad_batches, use more data, or set tail='pad'."
    )


def effective_tail(
    config: PlanConfig,
    available: int,
    world: int,
    acc: int,
    *,
    replanned: bool,
    policy: TailPolicy | None = None,
) -> TailPolicy:
    """The tail policy that applies to ``available`` examples planned for ``world x acc``.

    ``config.tail`` (or ``policy``, for a part of an epoch). A ``replanned`` rest with fewer
    examples than a step has micro-batches stays ``"spread"``: one example per micro-batch, the
    fewest repeats (counted) filling the empty slots of a whole step.

    Raises:
        ValueError: ``tail="spread"`` for a whole epoch of fewer examples than a step's batches.

    Example:
        >>> effective_tail(PlanConfig(max_tokens=8, tail="drop"), 10, 2, 1, replanned=True)
        'drop'
        >>> effective_tail(PlanConfig(max_tokens=8), 1, 2, 1, replanned=True)
        'spread'
    """
    tail = config.tail if policy is None else policy
    if tail == "spread" and available < world * acc and not replanned:
        raise ValueError(too_few_message(available, "examples", world, acc, config))
    return tail


def tail_cut(
    cut: SortedCut, groups: SortedGroups, tail: TailPolicy, multiple: int, config: PlanConfig
) -> SortedCut:
    """``cut`` (the greedy cut) with its tail re-cut for ``"spread"`` (:func:`spread_tail`)."""
    if tail != "spread":
        return cut
    return spread_tail(cut, groups, multiple, config)


def spread_tail(
    cut: SortedCut, groups: SortedGroups, multiple: int, config: PlanConfig
) -> SortedCut:
    """Re-cut the last optimizer step into exactly ``multiple`` even micro-batches.

    The last step's examples (one more step's too, when they are fewer than ``multiple``) are re-cut
    by :func:`even_cuts`; with too few examples overall :func:`split_micro_batches` takes over.
    """
    m, n = cut.num_micro_batches, groups.size
    if m == 0:
        return cut
    r = m % multiple
    take = min(m, r if r else multiple)
    target = multiple
    while n - int(cut.starts[m - take]) < target and take < m:
        take, target = min(m, take + multiple), target + multiple
    start = int(cut.starts[m - take])
    if n - start < target:
        return split_micro_batches(cut, groups, multiple, config)  # too few examples: pad later
    cuts = even_cuts(groups.suffix(start), target, config)
    starts = np.concatenate((cut.starts[: m - take], cuts[:-1] + start))
    sizes = np.concatenate((cut.sizes[: m - take], np.diff(cuts)))
    return SortedCut.from_micro_batches(groups, starts, sizes, config)


def split_micro_batches(
    cut: SortedCut, groups: SortedGroups, multiple: int, config: PlanConfig
) -> SortedCut:
    """Split the largest micro-batches until the micro-batch count is a multiple of ``multiple``.

    Pieces are adjacent subsets of a micro-batch, so fit the budget and land in the same step.
    With too few examples it splits as far as it can; :func:`select_micro_batches` pads the rest.
    """
    m = cut.num_micro_batches
    extra = min(-m % multiple, groups.size - m)
    if extra == 0:
        return cut
    pieces = np.ones(m, dtype=np.int64)
    while extra > 0:
        cand = np.flatnonzero(pieces < cut.sizes)
        piece = cut.sizes[cand] / pieces[cand]
        take = cand[np.argsort(-piece, kind="stable")[:extra]]
        pieces[take] += 1
        extra -= take.size
    micro_batch = np.repeat(np.arange(m), pieces)
    first = np.repeat(np.cumsum(pieces) - pieces, pieces)
    i = np.arange(micro_batch.size) - first
    lo = cut.starts[micro_batch] + (i * cut.sizes[micro_batch]) // pieces[micro_batch]
    hi = cut.starts[micro_batch] + ((i + 1) * cut.sizes[micro_batch]) // pieces[micro_batch]
    return SortedCut.from_micro_batches(groups, lo, hi - lo, config)


class MicroBatchSelection(NamedTuple):
    """The micro-batches of a run, in cut order, and what the tail policy did.

    Attributes:
        micro-batches: micro-batch ids, a multiple of ``world * acc`` of them (repeats adjacent).
        num_dropped: examples left out by ``tail="drop"``.
        num_duplicated: examples repeated to fill the last step.
    """

    micro_batches: np.ndarray
    num_dropped: int
    num_duplicated: int


def select_micro_batches(
    cut: SortedCut,
    tail: TailPolicy,
    world: int,
    acc: int,
    rng: np.random.Generator,
    config: PlanConfig,
    replanned: bool = False,
) -> MicroBatchSelection:
    """Make the micro-batch count a multiple of ``world * acc``: drop or repeat random ones.

    ``"drop"`` leaves out ``m % (world * acc)`` random micro-batches (all of a ``replanned`` rest
    under one step); else random ones repeat, each next to its original. A multiple draws nothing.

    Raises:
        ValueError: ``"drop"`` with fewer micro-batches than one step needs in a whole epoch.
    """
    multiple = world * acc
    m = cut.num_micro_batches
    seq = np.arange(m, dtype=np.int64)
    r = m % multiple
    if tail == "drop" and r:
        if m < multiple and replanned:
            return MicroBatchSelection(seq[:0], int(cut.sizes.sum()), 0)
        if m < multiple:
            raise ValueError(too_few_message(m, "micro-batches", world, acc, config))
        gone = rng.choice(m, size=r, replace=False)
        return MicroBatchSelection(np.delete(seq, gone), int(cut.sizes[gone].sum()), 0)
    if r:  # "pad", or "spread" with too few examples left to split (counted)
        extra = multiple - r
        dup = rng.choice(m, size=extra, replace=extra > m)
        seq = np.sort(np.concatenate([seq, dup]), kind="stable")  # duplicates sit adjacent
        return MicroBatchSelection(seq, 0, int(cut.sizes[dup].sum()))
    return MicroBatchSelection(seq, 0, 0)


class _TailCut:
    """Scalar queries on the tail's sorted order: how far a micro-batch may reach.

    A micro-batch ``[a, e)`` of ``sub``'s positions costs ``cost(e - a, padded length at a,
    summed lengths)``. Built-in costs take fast paths (a per-group table of how many fit, a
    search in the cumulative lengths); a custom cost falls back to a bisection over sizes.
    """

    def __init__(self, sub: SortedGroups, config: PlanConfig) -> None:
        self.config = config
        self.cost_fn = config.cost_fn
        self.n = sub.size
        self.cap = min(config.max_examples or self.n, self.n)
        p = config.pad_to_multiple_of
        self.group_start = sub.starts.tolist()
        self.padded = (-(-sub.longest // p) * p).astype(np.int64)
        self.by_count = config.cost in ("padded", "quadratic")
        self.cum = np.concatenate(([0], np.cumsum(np.repeat(sub.longest, np.diff(sub.starts)))))
        self._fit: dict[float, list[int]] = {}
        self._need: dict[float, list[int]] = {}

    def group(self, a: int) -> int:
        return bisect.bisect_right(self.group_start, a) - 1

    def cost(self, a: int, size: int) -> float:
        total = self.cum[a + size] - self.cum[a]
        pl = self.padded[self.group(a)]
        one = np.ones(1, dtype=np.int64)
        return float(checked_cost(self.cost_fn, one * size, one * pl, one * total)[0])

    def fit(self, budget: float) -> list[int]:
        """Per group: the most examples (<= cap) of its padded length within ``budget``."""
        if budget not in self._fit:
            most = largest_true(
                lambda k: checked_cost(self.cost_fn, k, self.padded, k * self.padded) <= budget,
                np.zeros(self.padded.size, dtype=np.int64),
                self.cap,
            )
            self._fit[budget] = most.tolist()
        return self._fit[budget]

    def need(self, low: float) -> list[int]:
        """Per group: the fewest examples of its padded length costing >= ``low`` (or cap + 1)."""
        if low not in self._need:
            fewest = smallest_true(
                lambda k: checked_cost(self.cost_fn, k, self.padded, k * self.padded) >= low,
                np.ones(self.padded.size, dtype=np.int64),
                self.cap + 1,
            )
            self._need[low] = fewest.tolist()
        return self._need[low]

    def end_within(self, a: int, budget: float) -> int:
        """The furthest end ``e`` of a micro-batch ``[a, e)`` costing at most ``budget``."""
        room = min(self.cap, self.n - a)
        if self.by_count:
            return a + min(self.fit(budget)[self.group(a)], room)
        if self.config.cost == "sum":
            key = self.cum[a] + np.int64(math.floor(budget))  # an int key: no float copy
            e = int(np.searchsorted(self.cum, key, side="right")) - 1
            return min(e, a + room)
        return a + self._largest(lambda s: self.cost(a, s) <= budget, room)

    def end_reaching(self, a: int, low: float) -> int:
        """The nearest end ``e`` with cost of ``[a, e)`` >= ``low`` (``n + 1`` when none)."""
        room = min(self.cap, self.n - a)
        if self.by_count:
            need = self.need(low)[self.group(a)]
            return a + need if need <= room else self.n + 1
        if self.config.cost == "sum":
            e = int(np.searchsorted(self.cum, self.cum[a] + np.int64(math.ceil(low))))
            return e if e - a <= room else self.n + 1
        if self.cost(a, room) < low:
            return self.n + 1
        return a + int(smallest_true(lambda s: self.cost(a, int(s)) >= low, 1, room))

    def start_within(self, b: int, budget: float) -> int:
        """The earliest start ``a`` of a micro-batch ``[a, b)`` costing at most ``budget``."""
        most = min(self.cap, b)
        if self.by_count:
            fit = self.fit(budget)
            return b - self._largest(lambda s: s <= fit[self.group(b - s)], most)
        if self.config.cost == "sum":
            key = self.cum[b] - np.int64(math.floor(budget))
            return max(int(np.searchsorted(self.cum, key, side="left")), b - most)
        return b - self._largest(lambda s: self.cost(b - s, s) <= budget, most)

    @staticmethod
    def _largest(ok: Callable[[int], bool], most: int) -> int:
        """Largest ``s`` in ``[0, most]`` with ``ok(s)`` (``ok`` monotone, ``ok(0)`` assumed)."""
        return int(largest_true(lambda s: ok(int(s)), 0, most))


#: Halvings of the last budget unit for fractional costs (2**-24: below any difference that counts).
_REFINE_STEPS = 24


def even_cuts(sub: SortedGroups, parts: int, config: PlanConfig) -> np.ndarray:
    """Cut ``sub``'s sorted order into exactly ``parts`` contiguous, even micro-batches.

    First the smallest budget ``B`` whose greedy cut needs at most ``parts`` micro-batches (the
    min-max cut), then the largest floor ``L`` for which a cut with every cost in ``[L, B]`` exists
    (each boundary as early as lets its micro-batch reach ``L``). With equal lengths the sizes are
    ``floor(n / parts)`` and ``ceil(n / parts)``. ``batch_size_multiple`` is not applied here.

    Returns:
        ``(parts + 1,)`` boundaries: 0, ..., ``sub.size``.
    """
    cut = _TailCut(sub, config)
    n = cut.n

    def greedy_fits(budget: float) -> bool:
        c = 0
        for _ in range(parts):
            c = cut.end_within(c, budget)
            if c >= n:
                return True
        return False

    single = max(cut.cost(int(a), 1) for a in sub.starts[:-1].tolist())
    lo_b, hi_b = max(1, int(np.ceil(single))), int(config.max_tokens)
    # the smallest integer budget whose greedy cut needs at most ``parts`` micro-batches
    hi_b = int(smallest_true(lambda b: greedy_fits(int(b)), min(lo_b, hi_b), hi_b))
    budget = float(hi_b)
    integral = config.cost in ("padded", "sum")  # integer costs: the integer search is exact
    if not integral:  # fractional costs (quadratic, custom): refine within (B - 1, B]
        below = float(hi_b - 1)
        for _ in range(_REFINE_STEPS):
            mid_f = (below + budget) / 2
            if greedy_fits(mid_f):
                budget = mid_f
            else:
                below = mid_f
    earliest = [0] * (parts + 1)
    earliest[parts] = n
    for k in range(parts - 1, 0, -1):
        earliest[k] = max(cut.start_within(earliest[k + 1], budget), k)

    def walk(low: float) -> list[int] | None:
        c, cuts = 0, [0]
        for k in range(1, parts):
            b = max(earliest[k], c + 1)
            if low > 0:
                b = max(b, cut.end_reaching(c, low))
            if b > n - (parts - k) or b > cut.end_within(c, budget):
                return None
            cuts.append(b)
            c = b
        if cut.end_within(c, budget) < n or (low > 0 and cut.cost(c, n - c) < low):
            return None
        return [*cuts, n]

    best = walk(0)
    if best is None:  # only a cost that shrinks as a micro-batch grows gets here
        raise SettingValueError(
            "The cost model gave a larger micro-batch a smaller cost: a custom cost= must be "
            "non-decreasing in num_examples, longest and total.",
            setting="cost",
            value=config.cost,
        )
    # the largest integer floor L that every micro-batch of a cut can reach under ``budget``
    lo_l = int(largest_true(lambda low: walk(int(low)) is not None, 0, int(budget)))
    best = walk(lo_l) or best
    if not integral:
        low, above = float(lo_l), float(lo_l + 1)
        for _ in range(_REFINE_STEPS):
            mid_f = (low + above) / 2
            cuts = walk(mid_f)
            if cuts is None:
                above = mid_f
            else:
                low, best = mid_f, cuts
    return np.asarray(best, dtype=np.int64)
