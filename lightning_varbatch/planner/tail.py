"""The tail of an epoch: its last optimizer step cut into even micro-batches.

The greedy cut of :mod:`lightning_varbatch.planner.layout` fills micro-batches up to the
budget, so the last optimizer step would hold whatever is left (13 equal examples, 4 to a
budget, cut as ``[4, 4, 4, 1]``). :func:`even_cuts` re-cuts the examples of that step into exactly
``world_size * accumulate_grad_batches`` contiguous micro-batches whose largest cost is as
small as possible and, under that, whose smallest cost is as large as possible (``[4, 3, 3,
3]``).

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> from lightning_varbatch.planner.layout import SortedGroups
    >>> groups = SortedGroups.build(np.full(13, 10, dtype=np.uint16), None, 1)
    >>> np.diff(even_cuts(groups, 4, PlanConfig(max_tokens=40))).tolist()
    [3, 3, 3, 4]
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.settings import PlanConfig

if TYPE_CHECKING:
    from lightning_varbatch.planner.layout import SortedGroups

__all__ = ["even_cuts"]


class _TailCut:
    """Scalar queries on the tail's sorted order: how far a micro-batch may reach.

    Positions are those of ``sub`` (0 ..  ``n``); a micro-batch ``[a, e)`` costs
    ``cost(e - a, padded length at a, summed lengths)``. Built-in costs get fast paths: the
    count-priced ones (``padded``, ``quadratic``) through a per-group table of how many
    examples fit, ``sum`` through a search in the cumulative lengths; a custom cost falls
    back to a bisection over sizes.
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
            lo = np.zeros(self.padded.size, dtype=np.int64)
            hi = np.full(self.padded.size, self.cap, dtype=np.int64)
            while (lo < hi).any():
                mid = (lo + hi + 1) // 2
                ok = checked_cost(self.cost_fn, mid, self.padded, mid * self.padded) <= budget
                lo, hi = np.where(ok, mid, lo), np.where(ok, hi, mid - 1)
            self._fit[budget] = lo.tolist()
        return self._fit[budget]

    def need(self, low: float) -> list[int]:
        """Per group: the fewest examples of its padded length costing >= ``low``.

        ``cap + 1`` stands for "no micro-batch reaches ``low``".
        """
        if low not in self._need:
            lo = np.ones(self.padded.size, dtype=np.int64)
            hi = np.full(self.padded.size, self.cap + 1, dtype=np.int64)
            while (lo < hi).any():
                mid = (lo + hi) // 2
                ok = checked_cost(self.cost_fn, mid, self.padded, mid * self.padded) >= low
                lo, hi = np.where(ok, lo, mid + 1), np.where(ok, mid, hi)
            self._need[low] = lo.tolist()
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
        lo, hi = 1, room
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cost(a, mid) >= low:
                hi = mid
            else:
                lo = mid + 1
        return a + lo

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
        lo, hi = 0, most
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if ok(mid):
                lo = mid
            else:
                hi = mid - 1
        return lo


#: Halvings of the last unit of budget for fractional cost models (2**-24: below any cost
#: difference that matters, and few enough walks).
_REFINE_STEPS = 24


def even_cuts(sub: SortedGroups, parts: int, config: PlanConfig) -> np.ndarray:
    """Cut ``sub``'s sorted order into exactly ``parts`` contiguous, even micro-batches.

    First the smallest integer budget ``B`` whose greedy cut needs at most ``parts``
    micro-batches (the min-max cut; greedy is optimal for contiguous cuts under a cost that
    grows with the micro-batch). Then, under ``B``, the largest ``L`` for which a cut with
    every micro-batch's cost in ``[L, B]`` is found: each boundary is put as early as lets its
    micro-batch reach ``L`` while the rest still fits ``parts`` micro-batches of at most ``B``
    (those earliest positions come from a greedy cut backwards). With equal lengths the sizes
    are ``floor(n / parts)`` and ``ceil(n / parts)``. The work is a few walks over ``parts``
    boundaries. ``batch_size_multiple`` is not applied to these micro-batches.

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
    while lo_b < hi_b:
        mid_b = (lo_b + hi_b) // 2
        if greedy_fits(mid_b):
            hi_b = mid_b
        else:
            lo_b = mid_b + 1
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
        raise ValueError(
            "The cost model gave a larger micro-batch a smaller cost: a custom cost= must be "
            "non-decreasing in num_examples, longest and total."
        )
    lo_l, hi_l = 0, int(budget)
    while lo_l < hi_l:
        mid_l = (lo_l + hi_l + 1) // 2
        cuts = walk(mid_l)
        if cuts is None:
            hi_l = mid_l - 1
        else:
            lo_l, best = mid_l, cuts
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
