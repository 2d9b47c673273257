"""The planner's one binary search against brute force, on random monotone predicates."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.search import largest_true, smallest_true
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sorted_cut import full_batch_sizes


def brute_largest(edge: int, lo: int, hi: int) -> int:
    """Largest x in [lo, hi] with x <= edge, else lo (ok(lo) is assumed)."""
    return max([x for x in range(lo, hi + 1) if x <= edge], default=lo)


def brute_smallest(edge: int, lo: int, hi: int) -> int:
    """Smallest x in [lo, hi] with x >= edge, else hi (ok(hi) is assumed)."""
    return min([x for x in range(lo, hi + 1) if x >= edge], default=hi) if lo < hi else lo


@pytest.mark.parametrize("seed", range(20))
def test_vectorised_searches_equal_brute_force_per_element(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    lo = rng.integers(-5, 30, n)
    hi = lo + rng.integers(-3, 60, n)  # some empty or reversed ranges
    edge = rng.integers(-10, 100, n)  # the predicate's edge, possibly outside the range
    calls: list[np.ndarray] = []

    def below(x: np.ndarray) -> np.ndarray:
        calls.append(x.copy())
        return x <= edge

    got = largest_true(below, lo, hi)
    assert got.tolist() == [brute_largest(*t) for t in zip(edge, lo, hi, strict=True)]
    assert all(c.shape == (n,) and c.dtype == np.int64 for c in calls)
    got = smallest_true(lambda x: x >= edge, lo, hi)
    assert got.tolist() == [brute_smallest(*t) for t in zip(edge, lo, hi, strict=True)]


@pytest.mark.parametrize("seed", range(10))
def test_one_search_equals_each_search_alone(seed: int) -> None:
    """A search's answer does not depend on the other searches of the array."""
    rng = np.random.default_rng(100 + seed)
    edge = rng.integers(0, 500, 25)
    together = largest_true(lambda x: x * x <= edge * 7, 1, 400)
    alone = [int(largest_true(lambda x, e=e: x * x <= e * 7, 1, 400)) for e in edge]
    assert together.tolist() == alone
    together = smallest_true(lambda x: x * 3 >= edge, 1, 120)
    alone = [int(smallest_true(lambda x, e=e: x * 3 >= e, 1, 120)) for e in edge]
    assert together.tolist() == alone


def test_scalars_give_zero_dimensional_answers_and_empty_arrays_work() -> None:
    assert largest_true(lambda x: x <= 3, 0, 10).shape == ()
    assert int(largest_true(lambda x: x <= 3, 0, 10)) == 3
    assert int(smallest_true(lambda x: x >= 3, 0, 10)) == 3
    empty = np.zeros(0, dtype=np.int64)
    assert largest_true(lambda x: x <= 3, empty, 5).tolist() == []


@pytest.mark.parametrize("cost", ["padded", "quadratic", "sum"])
@pytest.mark.parametrize("pad", [1, 8])
def test_full_batch_sizes_are_the_largest_counts_that_fit(cost: str, pad: int) -> None:
    """The layout's per-length counts, checked one count at a time against the cost model."""
    config = PlanConfig(max_tokens=700, cost=cost, pad_to_multiple_of=pad)
    longest = np.array([1, 2, 3, 7, 30, 100, 333, 699], dtype=np.int64)
    got = full_batch_sizes(longest, 500, config)
    padded = -(-longest // pad) * pad
    for length, p, count in zip(longest, padded, got, strict=True):
        fits = [
            k
            for k in range(1, 501)
            if checked_cost(config.cost_fn, np.array([k]), np.array([p]), np.array([k * length]))[0]
            <= config.max_tokens
        ]
        assert count == max(fits, default=1)
