"""The planner's one binary search: per element, the edge of a monotone predicate.

Every "how many fit" question of the planner is a bisection over integers: the most examples
of a length that fit the budget (:func:`~lightning_varbatch.planner.sorted_cut.full_batch_sizes`),
the largest micro-batch that still fits from a given position, the longest single example a
budget holds, the fewest examples that reach a cost (the tail's even cuts). They all search a
predicate that is true up to an edge and false after it (or the reverse), so one vectorised
helper answers them, for one integer or for an array of independent searches at once.

``ok`` is called with an ``int64`` array of candidates (one per search, the shape of the
broadcast bounds) and returns a boolean array of that shape. Every search runs until its own
bounds meet; a search that is done keeps its answer while the others go on (its candidate is
then its answer, and what ``ok`` says about it is ignored), so the result of each search does
not depend on the others in the array.

Example:
    >>> import numpy as np
    >>> largest_true(lambda x: x * x <= 50, 0, 100).item()
    7
    >>> largest_true(lambda x: x * np.array([1, 2, 3]) <= 12, 1, 10).tolist()
    [10, 6, 4]
    >>> smallest_true(lambda x: x * x >= 50, 0, 100).item()
    8
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

__all__ = ["largest_true", "smallest_true"]

Predicate = Callable[[np.ndarray], "np.ndarray | np.bool_ | bool"]


def _bounds(lo: npt.ArrayLike, hi: npt.ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    low, high = np.broadcast_arrays(np.asarray(lo, dtype=np.int64), np.asarray(hi, dtype=np.int64))
    return low.copy(), high.copy()


def largest_true(ok: Predicate, lo: npt.ArrayLike, hi: npt.ArrayLike) -> np.ndarray:
    """Per search, the largest ``x`` in ``[lo, hi]`` with ``ok(x)``; ``lo`` when there is none.

    ``ok`` must be true up to some ``x`` and false after it; ``ok(lo)`` is taken as true
    without being asked (so a search whose ``ok(lo)`` is false answers ``lo``, as a caller that
    starts from a known fit expects). Bounds with ``lo >= hi`` answer ``lo`` at once.

    Args:
        ok: the predicate, vectorised over an ``int64`` array of candidates.
        lo: the lower bound(s), an integer or an array.
        hi: the upper bound(s), broadcast with ``lo``.

    Returns:
        An ``int64`` array of the broadcast shape of ``lo`` and ``hi`` (0-d for integers).

    Example:
        >>> import numpy as np
        >>> budget = np.array([10, 3, 0])
        >>> largest_true(lambda x: 2 * x <= budget, 0, 8).tolist()  # most pairs in a budget
        [5, 1, 0]
    """
    low, high = _bounds(lo, hi)
    active = low < high
    while active.any():
        mid = np.where(active, (low + high + 1) // 2, low)
        good = np.asarray(ok(mid), dtype=bool)
        low = np.where(active & good, mid, low)
        high = np.where(active & ~good, mid - 1, high)
        active = low < high
    return low


def smallest_true(ok: Predicate, lo: npt.ArrayLike, hi: npt.ArrayLike) -> np.ndarray:
    """Per search, the smallest ``x`` in ``[lo, hi]`` with ``ok(x)``; ``hi`` when there is none.

    ``ok`` must be false up to some ``x`` and true from it on; ``ok(hi)`` is taken as true
    without being asked (pass one past the range to mean "none": the answer is then that
    value). Bounds with ``lo >= hi`` answer ``lo`` at once.

    Args:
        ok: the predicate, vectorised over an ``int64`` array of candidates.
        lo: the lower bound(s), an integer or an array.
        hi: the upper bound(s), broadcast with ``lo``.

    Returns:
        An ``int64`` array of the broadcast shape of ``lo`` and ``hi`` (0-d for integers).

    Example:
        >>> import numpy as np
        >>> need = np.array([7, 1, 100])
        >>> smallest_true(lambda x: 2 * x >= need, 1, 11).tolist()  # 11: none reaches it
        [4, 1, 11]
    """
    low, high = _bounds(lo, hi)
    active = low < high
    while active.any():
        mid = np.where(active, (low + high) // 2, low)
        good = np.asarray(ok(mid), dtype=bool)
        high = np.where(active & good, mid, high)
        low = np.where(active & ~good, mid + 1, low)
        active = low < high
    return low
