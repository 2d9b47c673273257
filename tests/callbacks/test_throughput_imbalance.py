"""``train/step_time_imbalance`` under real DDP (2 gloo processes) with one rank twice as slow.

``tests/scripts/compute_imbalance.py`` trains 8 steps on equal micro-batches, rank 1's forward
sleeping twice as long as rank 0's. Whole micro-batches (``on_train_batch_start`` to
``on_train_batch_end``, what the monitor timed before) last equally long on both ranks: the fast
one waits for the slow one in the backward's gradient all-reduce. The monitor's figure is over
the ranks' own compute (to ``on_before_backward``): max / mean = 2 / 1.5.
"""

from __future__ import annotations

import pytest

from tests.launch import launch


@pytest.mark.multiprocess
def test_a_rank_twice_as_slow_reads_two_over_one_and_a_half(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    records = launch("compute_imbalance.py", 2, tmp_path_factory.mktemp("imbalance"))
    assert [r["rank"] for r in records] == [0, 1]
    assert records[1]["logged"] == []  # only rank 0 logs
    logged = {step: m for step, m in records[0]["logged"]}
    assert sorted(logged) == [3, 7]  # two windows of 4 optimizer steps
    for m in logged.values():
        assert m["train/imbalance"] == 1.0  # the same tokens on both ranks ...
        assert m["train/step_time_imbalance"] == pytest.approx(2.0 / 1.5, abs=0.06)  # ... not time
    whole = [r["whole_seconds"] for r in records]
    assert max(whole) / (sum(whole) / 2) < 1.05  # the all-reduce wait hides the slow rank
