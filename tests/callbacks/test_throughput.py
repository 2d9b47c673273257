"""TokenThroughputMonitor in one process: exact logged values with a patched clock."""

from __future__ import annotations

import pytest
import torch

import lightning_varbatch.callbacks.throughput as throughput
from lightning_varbatch import keys
from lightning_varbatch.callbacks import TokenThroughputMonitor
from tests.callbacks._common import FakeClock, Module, fit, micro_batches

PEAK = 1000.0


def test_exact_metrics_with_accumulation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "perf_counter", FakeClock())
    steps = [[30, 20], [60, 40], [10, 15]]
    module = Module(micro_batches(steps), flops_per_token=6.0)
    monitor = TokenThroughputMonitor(log_every_n_steps=1, peak_flops=PEAK)
    trainer, logger = fit(module, [monitor], max_steps=3, accumulate=2)

    # Clock: micro-batch i starts at 10(2i+1) and ends at 10(2i+2). Step 0's window opens at the
    # first start (10) and closes at 40; later windows are 40 s long. One rank: its compute
    # time (tests/callbacks/test_throughput_ranks.py) is the mean, step_time_imbalance 1.
    elapsed = [30.0, 40.0, 40.0]
    total = 0.0
    for k, (step, wall) in enumerate(zip(steps, elapsed, strict=True)):
        tokens = sum(step)
        total += tokens
        tps = tokens / wall
        expected = {
            "train/tokens_per_sec": tps,
            "train/device/tokens_per_sec": tps,
            "train/examples_per_sec": 4 / wall,
            "train/padded_tokens_per_sec": 4 * tokens / wall,
            "train/device/padded_tokens_per_sec": 4 * tokens / wall,
            "train/padding_efficiency": 0.5,
            "train/batch/examples": 4.0,
            "train/batch/tokens": float(tokens),
            "train/imbalance": 1.0,
            "train/step_time_imbalance": 1.0,
            "train/step_time": wall,
            "train/total_tokens": total,
            "train/flops_per_sec": 6.0 * tps,
            "train/device/flops_per_sec": 6.0 * tps,
            "train/mfu": 6.0 * tps / PEAK,
        }
        logged = {step_: m for step_, m in logger.calls if "train/tokens_per_sec" in m}[k]
        assert logged == pytest.approx(expected, rel=1e-12)
    assert trainer.progress_bar_metrics["tokens_per_sec"] == pytest.approx(25 / 40)
    assert monitor.state_dict() == {
        "steps": 3,
        "total_tokens": 175.0,
        "total_examples": 12.0,
        "dataset_tokens": [],
    }
    assert not any("train/dataset/" in key for _, m in logger.calls for key in m)


def test_interval_windows_and_tokens_fn(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "perf_counter", FakeClock())
    steps = [[50], [100], [25], [200]]
    batches = [(b["x"], int(b["ntokens"])) for b in micro_batches(steps)]
    module = Module(batches)
    monitor = TokenThroughputMonitor(
        log_every_n_steps=2, tokens_fn=lambda b: b[1], examples_fn=lambda b: b[0].shape[0]
    )
    _, logger = fit(module, [monitor], max_steps=4)
    tps = logger.series("train/tokens_per_sec")
    assert tps == pytest.approx({1: 150 / 30, 3: 225 / 40})
    assert logger.series("train/batch/tokens") == pytest.approx({1: 75.0, 3: 112.5})
    assert logger.series("train/batch/examples") == pytest.approx({1: 2.0, 3: 2.0})
    # No padding information and no FLOPs per token: those metrics are left out.
    assert not logger.series("train/padding_efficiency") and not logger.series("train/mfu")


def test_unreadable_batch_names_the_argument() -> None:
    module = Module([(torch.ones(2, 3),)] * 2)
    with pytest.raises(TypeError, match="tokens_fn"):
        fit(module, [TokenThroughputMonitor()], max_steps=1)
    with pytest.raises(ValueError, match="peak_flops"):
        TokenThroughputMonitor(peak_flops=0)


def test_per_dataset_breakdown(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throughput, "perf_counter", FakeClock())
    steps = [[30, 20], [60, 40], [10, 15]]
    batches = micro_batches(steps)
    for batch, dataset in zip(batches, [0, 1, 1, 1, 0, 0], strict=True):
        batch[keys.DATASET] = torch.tensor(dataset)
    monitor = TokenThroughputMonitor(log_every_n_steps=3, dataset_names=["wmt", "news"])
    _, logger = fit(Module(batches), [monitor], max_steps=3, accumulate=2)
    (step, logged), *_ = [(k, m) for k, m in logger.calls if "train/tokens_per_sec" in m]
    wall = 110.0  # window: first batch start (10) to the last step's end (120)
    assert step == 2
    assert logged["train/dataset/wmt/tokens_per_sec"] == pytest.approx((30 + 10 + 15) / wall)
    assert logged["train/dataset/news/tokens_per_sec"] == pytest.approx((20 + 60 + 40) / wall)
    assert logged["train/dataset/wmt/token_share"] == pytest.approx(55 / 175)
    assert logged["train/dataset/news/batch_share"] == pytest.approx(3 / 6)
    assert logged["train/dataset/news/total_tokens"] == 120.0
    assert monitor.state_dict()["dataset_tokens"] == [55.0, 120.0]


def test_dataset_index_out_of_range_names_the_setting() -> None:
    batches = micro_batches([[5]])
    batches[0][keys.DATASET] = torch.tensor(2)
    with pytest.raises(RuntimeError, match="set dataset_names"):
        fit(Module(batches), [TokenThroughputMonitor(dataset_names=["a", "b"])], max_steps=1)


def test_totals_in_a_checkpoint_between_windows_hold_every_step() -> None:
    # Logging every 3 steps, 4 steps trained: a checkpoint now must count the 4th step too,
    # or a resumed run's train/total_tokens misses it for good.
    steps = [[50], [100], [25], [200]]
    monitor = TokenThroughputMonitor(log_every_n_steps=3)
    fit(Module(micro_batches(steps)), [monitor], max_steps=4)
    state = monitor.state_dict()
    assert state["total_tokens"] == 375.0
    assert state["total_examples"] == 8.0
    assert state["steps"] == 4


def test_run_totals_in_callback_metrics_when_training_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    # Logging every 3 steps, 4 steps trained: the totals hold the unlogged 4th step too.
    monkeypatch.setattr(throughput, "perf_counter", FakeClock())
    steps = [[50], [100], [25], [200]]
    monitor = TokenThroughputMonitor(log_every_n_steps=3)
    trainer, logger = fit(Module(micro_batches(steps)), [monitor], max_steps=4)
    # Clock: micro-batch i starts at 10(2i+1), ends at 10(2i+2); training ends at 90.
    totals = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("train/")}
    assert totals == pytest.approx(
        {
            "train/total_tokens": 375.0,
            "train/total_examples": 8.0,
            "train/run/loss_tokens": 375.0,
            "train/run/examples": 8.0,
            "train/run/seconds": 80.0,
            "train/run/input_tokens": 750.0,
            "train/run/padded_tokens": 1500.0,
            "train/run/input_tokens_per_sec": 750.0 / 80.0,
            "train/run/padding_efficiency": 0.5,
        },
        rel=1e-12,
    )
    assert all(trainer.callback_metrics[k].dtype == torch.float64 for k in totals)
    assert not any("train/run/" in key for _, m in logger.calls for key in m)  # not logged


def test_run_totals_leave_out_padding_without_padding_counts() -> None:
    batches = [(b["x"], int(b["ntokens"])) for b in micro_batches([[50], [100]])]
    monitor = TokenThroughputMonitor(tokens_fn=lambda b: b[1], examples_fn=lambda b: 2)
    trainer, _ = fit(Module(batches), [monitor], max_steps=2)
    keys_ = {k for k in trainer.callback_metrics if k.startswith("train/run/")}
    assert keys_ == {"train/run/loss_tokens", "train/run/examples", "train/run/seconds"}
    assert float(trainer.callback_metrics["train/run/loss_tokens"]) == 150.0
