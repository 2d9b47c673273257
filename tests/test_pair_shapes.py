"""The pair-shapes benchmark: its distributions, its reference orders and its verdicts."""

from __future__ import annotations

import numpy as np
import pytest

from benchmarks.planning.pair_reference import greedy_cut, lexicographic, padded_slots
from benchmarks.planning.pair_shapes import DISTRIBUTIONS, main, pairs_of, verdict


@pytest.mark.parametrize(("name", "low", "high"), [("correlated", 0.95, 0.99), ("weak", 0.7, 0.8)])
def test_the_distributions_have_the_correlation_they_are_named_for(
    name: str, low: float, high: float
) -> None:
    pairs = pairs_of(name, 20_000, 0)
    assert low <= np.corrcoef(pairs[:, 0], pairs[:, 1])[0, 1] <= high
    assert pairs.min() >= 1 and pairs.dtype == np.int64


def test_a_reference_order_is_cut_within_the_budget_on_each_side_and_keeps_every_pair() -> None:
    pairs = pairs_of("long_tail", 3_000, 1)
    for keys in (("max", "source", "target"), ("source", "target"), ("target", "source")):
        batches = greedy_cut(lexicographic(pairs, keys), pairs, 4096)
        assert sorted(np.concatenate(batches).tolist()) == list(range(len(pairs)))
        assert all(len(b) * int(pairs[b].max()) <= 4096 for b in batches)
        assert padded_slots(batches, pairs) >= int(pairs.sum())


def test_the_verdict_names_an_order_that_pads_less_and_its_extra_micro_batches() -> None:
    ours_best = [
        {
            "ours": (100, 10),
            "max": (120, 10),
            "max, source, target": (101, 10),
            "source, target": (130, 10),
            "target, source": (140, 10),
        }
    ] * 3
    assert verdict(ours_best)[0] == "ours"
    worse = [{**ours_best[0], "source, target": (90, 12)}] * 2 + ours_best[:1]
    said, ratio, best = verdict(worse)
    assert said == "less: source, target (2/3 seeds at 1.200x the micro-batches)"
    assert best == "source, target" and ratio == pytest.approx(100 / 90)


def test_the_quick_run_prints_every_distribution(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--quick"]) == 0
    out = capsys.readouterr().out
    assert all(f"\n{name}:" in out for name in DISTRIBUTIONS)
    assert "of the bound" in out and "exceeded the optimum 0 times" in out
    assert "result file" not in out  # --quick never replaces the committed result
