"""The lower bound on pair padding: valid against the exact optimum, exact where it should be."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.planning.pair_bound import lower_bound, one_sided_bound, priced_cost
from benchmarks.planning.pair_reference import greedy_cut, lexicographic, optimum
from benchmarks.planning.pair_shapes import DISTRIBUTIONS, pairs_of


def _priced_cost_by_positions(values: np.ndarray, budget: int, price: float) -> float:
    """The same dynamic program over every start position (no run structure), for checking."""
    v = np.sort(values)[::-1]
    best = [0.0] + [np.inf] * len(v)
    for i in range(1, len(v) + 1):
        for j in range(i):
            if (i - j) * v[j] <= budget:
                best[i] = min(best[i], best[j] + (i - j) * v[j] + price)
    return best[-1]


def test_the_run_dynamic_program_equals_the_one_over_every_position() -> None:
    rng = np.random.default_rng(3)
    prices = np.array([0.0, 1.0, 7.5, 40.0, 300.0])
    for trial in range(150):
        budget = int(rng.integers(8, 200))
        high = budget if trial % 2 else max(2, budget // 6)
        values = rng.integers(1, high + 1, int(rng.integers(1, 40)))
        fast = priced_cost(values, budget, prices)
        slow = [_priced_cost_by_positions(values, budget, p) for p in prices]
        assert fast == pytest.approx(slow)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_the_bound_never_exceeds_the_exact_optimum_of_tiny_inputs(dist: str) -> None:
    rng = np.random.default_rng(DISTRIBUTIONS.index(dist))
    pool = pairs_of(dist, 2_000, 5)
    checked = 0
    while checked < 60:
        pairs = pool[rng.choice(len(pool), int(rng.integers(2, 9)), replace=False)]
        budget = int(pairs.max() * rng.uniform(1.0, 4.0))
        cut = greedy_cut(lexicographic(pairs, ("max", "source", "target")), pairs, budget)
        most = max(1, len(cut) - int(rng.integers(0, 2)))
        try:
            best = optimum(pairs, budget, most)
        except ValueError:
            continue
        assert int(pairs.sum()) <= lower_bound(pairs, budget, most) <= best
        checked += 1


def test_the_bound_is_at_least_the_real_tokens_at_realistic_size() -> None:
    pairs = pairs_of("weak", 3_000, 0)
    for budget in (512, 4096):
        most = len(greedy_cut(lexicographic(pairs, ("max",)), pairs, budget))
        assert lower_bound(pairs, budget, most) >= int(pairs.sum())
        assert lower_bound(pairs, budget, most) >= lower_bound(pairs, budget, most + 10)


@pytest.mark.parametrize(("long", "short", "length"), [(3, 5, 8), (1, 7, 20), (4, 4, 3)])
def test_one_micro_batch_of_two_lengths_pads_everything_to_the_longest(
    long: int, short: int, length: int
) -> None:
    # one micro-batch holds all: (long + short) pairs, each side padded to `length`
    pairs = np.array([[length, length]] * long + [[1, 1]] * short)
    budget = (long + short) * length
    closed_form = (long + short) * 2 * length
    assert lower_bound(pairs, budget, 1) == closed_form == optimum(pairs, budget, 1)
    # with two micro-batches each length has its own: no padding at all
    assert lower_bound(pairs, budget, 2) == int(pairs.sum())


def test_one_sided_bound_of_one_group_is_its_size_times_its_longest() -> None:
    assert one_sided_bound(np.array([9, 3, 3, 1]), budget=36, most=1) == pytest.approx(36.0)


def test_a_length_over_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="exceeds the budget"):
        priced_cost(np.array([5, 9]), 8, np.array([0.0]))
