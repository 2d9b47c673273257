"""A proven lower bound on the padded slots of (source, target) pairs at realistic size.

The problem (issue 39): partition pairs into at most ``most`` micro-batches, a micro-batch of
``n`` pairs valid when ``n · max(longest source, longest target) <= budget``, at the least
*slots* ``Σ n · (longest source + longest target)`` (both padded tensors). Without the limit
on micro-batches no padding is needed (each exact (source, target) cell its own micro-batch),
and a linear relaxation with fractional micro-batches falls to the same real-token count; the
bound keeps the micro-batches integral in one dimension at a time.

**One dimension.** For values ``v`` (one per pair) the least ``Σ n · max v`` over partitions
into at most ``most`` groups with ``n · max v <= budget`` is reached by *contiguous runs of
the sorted values*: take a group holding the largest value, of size ``n1``, and swap its other
members for the ``n1`` largest values outside it; its maximum is unchanged, every other
group receives a value no larger than the one it gave, and no size changes, so no cost rises
and no group leaves the budget; repeat on the rest. The count limit is priced out (a
Lagrangian price ``λ`` per group): for every ``λ >= 0``, ``min over partitions of (Σ n · max v
+ λ · groups) - λ · most`` is at most the optimum with ``most`` groups, and the inner minimum
is a dynamic program over the sorted values (:func:`priced_cost`), evaluated for a grid of
prices at once (:func:`one_sided_bound` keeps the best).

**Two dimensions.** Any valid plan's slots split two ways, each part a one-dimensional problem
the same plan is feasible for (every group's ``n · max <= n · max(source, target) <=
budget``):

* ``longest source + longest target = max(S, T) + min(S, T)``, and ``min(S, T) >=`` the
  micro-batch's largest ``min(source, target)``: slots ``>=`` bound(max) + bound(min);
* slots ``=`` ``Σ n · S + Σ n · T`` ``>=`` bound(source) + bound(target).

:func:`lower_bound` is the larger, rounded up (slots are integers). Both are tight in one
dimension and blind to the coupling of the two: the padding of the other side within a
micro-batch whose pairs share their longer length is not seen (``tests/test_pair_bound.py``;
the distance to the exact optimum of small inputs is in ``benchmarks/results/pair_shapes.json``).

Example:
    >>> import numpy as np
    >>> pairs = np.array([[8, 8], [8, 8], [1, 1], [1, 1]])
    >>> lower_bound(pairs, budget=32, most=1)  # one micro-batch of 4 pairs, padded to 8 + 8
    64
    >>> lower_bound(pairs, budget=32, most=2)  # each length its own micro-batch: no padding
    36
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["lower_bound", "one_sided_bound", "priced_cost"]


def priced_cost(values: np.ndarray, budget: int, prices: np.ndarray) -> np.ndarray:
    """``min over partitions of Σ (n · max v + price)`` with ``n · max v <= budget``, per price.

    Contiguous runs of the values sorted longest first are optimal (module docstring), so
    ``best[i] = price + min over j of best[j] + (i - j) · v[j]`` over the first ``i`` values.
    Within a run of equal values ``v`` (positions ``a..b``), ``best[i] - i · v`` never
    decreases (by induction: the part from earlier runs, ``min best[j] + (i - j) · v[j] - i ·
    v`` with ``v[j] > v``, never decreases in ``i``, and ``price >= 0``), so the best start of a
    group inside a run is the leftmost one the budget allows, ``max(a, i - budget // v)``: per
    run, one candidate from each earlier run still in reach and a chain of steps of
    ``budget // v`` within it, all vectorised over the positions and the prices.

    Args:
        values: one positive length per pair, each at most ``budget``.
        budget: the token budget of a group (``n · max v <= budget``).
        prices: non-negative prices per group, shape ``(P,)``.

    Returns:
        The priced minimum for each price, shape ``(P,)``.

    Raises:
        ValueError: when a value exceeds the budget.
    """
    v = np.sort(np.asarray(values, dtype=np.int64))[::-1]
    price = np.asarray(prices, dtype=np.float64)
    n = len(v)
    starts = np.flatnonzero(np.r_[True, v[1:] != v[:-1]]) if n else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], n].astype(np.int64)
    run_value = v[starts]
    cap = budget // run_value
    if n and cap.min() < 1:
        raise ValueError(f"a length of {int(v[0])} exceeds the budget {budget}")
    reach = ends - 1 + cap  # a group starting in run q can end at any position <= reach[q]
    best = np.empty((n + 1, len(price)))
    best[0] = 0.0
    first = 0
    for r in range(len(starts)):
        a, b, val, step = int(starts[r]), int(ends[r]), int(run_value[r]), int(cap[r])
        pos = np.arange(a + 1, b + 1)
        rest = np.full((b - a, len(price)), np.inf)  # groups starting in earlier runs
        while reach[first] < a + 1:
            first += 1
        for q in range(first, r):
            upto = min(int(reach[q]), b) - a
            i = pos[:upto]
            j = np.maximum(starts[q], i - cap[q])
            np.minimum(rest[:upto], best[j] + ((i - j) * run_value[q])[:, None], out=rest[:upto])
        rest -= (pos * val)[:, None]
        for s in range(0, b - a, step):  # groups starting in this run: steps of budget // v
            e = min(s + step, b - a)
            if s == 0:
                inside = (best[a] - a * val)[None, :]
            else:
                back = pos[s - step : e - step]
                inside = best[back] - (back * val)[:, None]
            best[pos[s:e]] = np.minimum(rest[s:e], inside) + price + (pos[s:e] * val)[:, None]
    return best[n]


def one_sided_bound(values: np.ndarray, budget: int, most: int, points: int = 24) -> float:
    """A lower bound on ``min Σ n · max v`` over partitions into ``<= most`` groups in budget.

    The Lagrangian dual ``max over price >= 0 of priced_cost(price) - price · most`` on a
    geometric grid of prices, refined once around the best; every price gives a valid bound,
    the grid only decides how close to the dual's maximum it gets. Price 0 gives ``Σ v``.

    Example:
        >>> one_sided_bound(np.array([4, 4, 2, 2]), budget=16, most=1)
        16.0
    """
    grid = np.r_[0.0, np.geomspace(4e-5 * budget, 4.0 * budget, points - 1)]
    dual = priced_cost(values, budget, grid) - grid * most
    k = int(dual.argmax())
    fine = np.linspace(grid[max(k - 1, 0)], grid[min(k + 1, len(grid) - 1)], points)
    return float(max(dual.max(), (priced_cost(values, budget, fine) - fine * most).max()))


def lower_bound(pairs: np.ndarray, budget: int, most: int) -> int:
    """A lower bound on the padded slots of any plan of ``pairs`` in ``<= most`` micro-batches.

    The larger of bound(max) + bound(min) and bound(source) + bound(target) (module
    docstring), rounded up; never below the real tokens ``Σ (source + target)``.

    Args:
        pairs: ``(n, 2)`` int (source, target) lengths, each at most ``budget``.
        budget: tokens per micro-batch on each side.
        most: the most micro-batches a plan may use (e.g. as many as the plan compared).
    """
    pairs = np.asarray(pairs, dtype=np.int64)
    source, target = pairs[:, 0], pairs[:, 1]
    by_max = one_sided_bound(np.maximum(source, target), budget, most) + one_sided_bound(
        np.minimum(source, target), budget, most
    )
    by_side = one_sided_bound(source, budget, most) + one_sided_bound(target, budget, most)
    real = int(pairs.sum())
    return max(real, math.ceil(max(by_max, by_side) - 1e-6 * max(1, real)))
