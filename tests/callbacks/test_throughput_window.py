"""The throughput formulas on hand-built windows of three ranks (no Trainer, no collective)."""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_varbatch.callbacks.throughput_window import (
    RankWindow,
    dataset_metrics,
    run_metrics,
    window_metrics,
)


def windows() -> list[RankWindow]:
    return [
        RankWindow(600, 12, 900, 1200, 3.0, 10.0, 0.0, [500.0, 100.0], [2.0, 1.0]),
        RankWindow(300, 6, 400, 800, 1.5, 9.0, 0.0, [300.0, 0.0], [2.0, 0.0]),
        RankWindow(300, 6, 500, 1000, 1.5, 8.0, 0.0, [0.0, 300.0], [0.0, 3.0]),
    ]


def test_global_figures_use_every_rank_and_the_slowest_wall_time() -> None:
    m = window_metrics(windows(), steps=3, flops_per_token=6.0, peak_flops=100.0)
    assert m["train/tokens_per_sec"] == 1200 / 10.0  # all ranks' tokens / slowest rank's time
    assert m["train/device/tokens_per_sec"] == 1200 / 10.0 / 3
    assert m["train/examples_per_sec"] == 24 / 10.0
    assert m["train/batch/examples"] == 8.0
    assert m["train/batch/tokens"] == 400.0
    assert m["train/imbalance"] == pytest.approx(600 / 400)
    assert m["train/step_time_imbalance"] == pytest.approx(3.0 / 2.0)
    assert m["train/step_time"] == pytest.approx(10.0 / 3)
    assert m["train/padding_efficiency"] == pytest.approx(1800 / 3000)
    assert m["train/padded_tokens_per_sec"] == pytest.approx(300.0)
    assert m["train/mfu"] == pytest.approx(6.0 * 120.0 / 3 / 100.0)


def test_step_time_imbalance_is_over_the_ranks_own_compute_not_their_wall_time() -> None:
    # Under DDP every rank's window lasts as long as the slowest rank's: only the compute
    # before the gradient sync tells a rank twice as slow (2 s against 1 s) from its peer.
    fast = RankWindow(tokens=10, compute=1.0, elapsed=5.0)
    slow = RankWindow(tokens=10, compute=2.0, elapsed=5.0)
    m = window_metrics([fast, slow], steps=1)
    assert m["train/step_time_imbalance"] == pytest.approx(2.0 / 1.5)
    assert m["train/imbalance"] == 1.0
    assert window_metrics([slow], steps=1)["train/step_time_imbalance"] == 1.0
    # No rank timed a forward (no backward through Lightning): not a number, never a fake 1.
    assert math.isnan(window_metrics([RankWindow(), RankWindow()], 1)["train/step_time_imbalance"])


def test_padding_metrics_skipped_when_any_rank_lacks_them() -> None:
    ws = windows()
    ws[1].no_padding = 1.0
    assert "train/padding_efficiency" not in window_metrics(ws, steps=1)
    idle = [RankWindow(), RankWindow()]
    assert math.isnan(window_metrics(idle, steps=1)["train/imbalance"])


def test_dataset_shares_and_running_totals() -> None:
    totals = [10.0, 0.0]
    m = dataset_metrics(windows(), ["news", "web"], tokens_per_sec=120.0, totals=totals)
    assert m["train/dataset/news/token_share"] == pytest.approx(800 / 1200)
    assert m["train/dataset/web/batch_share"] == pytest.approx(4 / 8)
    assert m["train/dataset/news/tokens_per_sec"] == pytest.approx(120.0 * 800 / 1200)
    assert totals == [810.0, 400.0]
    assert m["train/dataset/web/total_tokens"] == 400.0


def test_vector_round_trip_keeps_every_field() -> None:
    for w in windows():
        assert RankWindow.from_vector(w.to_vector()) == w


def test_the_maths_imports_and_runs_without_torch_or_lightning() -> None:
    """The formulas are pure Python: a machine without torch and Lightning can import them."""
    from tests.test_layers import BLOCKER

    code = (
        "from lightning_varbatch.callbacks.throughput_window import RankWindow, window_metrics\n"
        "import lightning_varbatch.callbacks as callbacks\n"
        "w = RankWindow(tokens=300, examples=6, real=500, padded=1000, compute=2.0, elapsed=4.0)\n"
        "print(window_metrics([w], steps=2)['train/tokens_per_sec'])\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & BLOCKED))\n"
        "callbacks.TokenThroughputMonitor\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    rate, loaded = done.stdout.strip().splitlines()
    assert (rate, loaded) == ("75.0", "[]")
    # a callback itself still needs Lightning, and says so by the import error
    assert done.returncode != 0 and "is blocked in this test" in done.stderr


def test_run_metrics_sum_every_rank_and_skip_padding_without_counts() -> None:
    m = run_metrics(windows(), seconds=20.0)
    assert m == {
        "train/run/loss_tokens": 1200.0,
        "train/run/examples": 24.0,
        "train/run/seconds": 20.0,
        "train/run/input_tokens": 1800.0,
        "train/run/padded_tokens": 3000.0,
        "train/run/input_tokens_per_sec": 90.0,
        "train/run/padding_efficiency": 0.6,
    }
    unpadded = [*windows(), RankWindow(tokens=1.0, no_padding=1.0)]
    assert set(run_metrics(unpadded, seconds=0.0)) == {
        "train/run/loss_tokens",
        "train/run/examples",
        "train/run/seconds",
    }
    assert math.isnan(run_metrics([RankWindow()], seconds=0.0)["train/run/padding_efficiency"])


def test_add_counts_keeps_times_and_datasets_out() -> None:
    run = RankWindow()
    for w in windows():
        run.add_counts(w)
    assert (run.tokens, run.examples, run.real, run.padded) == (1200.0, 24.0, 1800.0, 3000.0)
    assert (run.compute, run.elapsed, run.dataset_tokens) == (0.0, 0.0, [])
