"""The planner's one binary search: per element, the edge of a monotone predicate.

Every "how many fit" question of the planner bisects a monotone integer predicate, for one integer
or an array of searches at once: ``ok`` maps an ``int64`` array of candidates to booleans.
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

    ``ok``: true up to some ``x``, false after; ``ok(lo)`` assumed, not asked; ``lo >= hi``: ``lo``.

    Returns:
        An ``int64`` array of the broadcast shape of ``lo`` and ``hi`` (0-d for integers).

    Example:
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
    without being asked (pass one past the range to mean "none"). ``lo >= hi`` answers ``lo``.

    Returns:
        An ``int64`` array of the broadcast shape of ``lo`` and ``hi`` (0-d for integers).

    Example:
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
