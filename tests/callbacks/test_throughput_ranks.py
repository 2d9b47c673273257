"""TokenThroughputMonitor's per-rank figures: tokens/s, shares in force, own compute time.

One process with the strategy's all-gather replaced by one that adds a second rank carrying
half of rank 0's counts (and times), so the exact logged values are known.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

import lightning_varbatch.callbacks.compute_clock as compute_clock
import lightning_varbatch.callbacks.throughput as throughput
from lightning_varbatch.callbacks import TokenThroughputMonitor
from lightning_varbatch.callbacks.compute_clock import ComputeClock
from lightning_varbatch.callbacks.throughput import rank_metrics
from lightning_varbatch.callbacks.throughput_window import RankWindow
from tests.callbacks._common import FakeClock, Module, RecordingLogger, micro_batches


class TwoRanks(Callback):
    """Make the strategy's all_gather return this rank's vector and half of it as rank 1's."""

    def __init__(self) -> None:
        self.sent: list[RankWindow] = []  # this rank's windows, as gathered

    def gather(self, t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        self.sent.append(RankWindow.from_vector(t.tolist()))
        return torch.stack([t, t * 0.5])

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        trainer.strategy.all_gather = self.gather  # type: ignore[method-assign,assignment]


class Batches(Dataset[Any]):
    def __init__(self, batches: list[dict[str, Any]]) -> None:
        self.batches = batches

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return self.batches[i]


class SharesSampler:
    """A batch sampler of one item per batch that says which shares its plan was made with."""

    def __init__(self, n: int, rank_shares: tuple[float, ...] | None) -> None:
        self.n = n
        self.rank_shares = rank_shares

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter([[i] for i in range(self.n)])


class SamplerModule(Module):
    def __init__(self, batches: list[Any], shares: tuple[float, ...] | None) -> None:
        super().__init__(batches)
        self.shares = shares

    def train_dataloader(self) -> DataLoader[Any]:
        sampler = SharesSampler(len(self.batches), self.shares)
        return DataLoader(
            Batches(self.batches),
            batch_sampler=sampler,  # type: ignore[arg-type]
            collate_fn=lambda items: items[0],
        )


def fit(
    module: Module, monitor: TokenThroughputMonitor, ranks: TwoRanks | None = None
) -> RecordingLogger:
    logger = RecordingLogger()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        callbacks=[ranks or TwoRanks(), monitor],
        logger=logger,
        log_every_n_steps=1,
        use_distributed_sampler=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    return logger


@pytest.mark.parametrize("shares", [(2.0, 1.0), None])
def test_per_rank_tokens_per_sec_and_shares(
    monkeypatch: pytest.MonkeyPatch, shares: tuple[float, ...] | None
) -> None:
    monkeypatch.setattr(throughput, "perf_counter", FakeClock())
    steps = [[30], [60]]
    logger = fit(
        SamplerModule(micro_batches(steps), shares), TokenThroughputMonitor(log_every_n_steps=1)
    )
    # Clock: micro-batch i starts at 10(2i+1), ends at 10(2i+2); windows of 10 s then 20 s
    # (rank 1's halved elapsed never is the max).
    for k, (step, wall) in enumerate(zip(steps, [10.0, 20.0], strict=True)):
        logged = logger.calls[k][1]
        tokens = step[0]
        assert logged["train/rank/0/tokens_per_sec"] == pytest.approx(tokens / wall)
        assert logged["train/rank/1/tokens_per_sec"] == pytest.approx(tokens / 2 / wall)
        assert logged["train/rank/0/tokens_per_sec"] + logged[
            "train/rank/1/tokens_per_sec"
        ] == pytest.approx(logged["train/tokens_per_sec"])
        assert logged["train/step_time_imbalance"] == pytest.approx(1.0 / 0.75)
        if shares is None:
            assert not any(key.endswith("/share") for key in logged)
        else:
            assert logged["train/rank/0/share"] == 1.0
            assert logged["train/rank/1/share"] == 0.5


def test_rank_metrics_single_rank_and_mismatched_shares() -> None:
    one = RankWindow(tokens=10, elapsed=2.0)
    assert rank_metrics([one], (1.0,)) == {}
    # shares for another number of ranks (e.g. a stale plan) are left out, not misattributed
    assert rank_metrics([one, one], (1.0, 0.5, 0.5)) == {
        "train/rank/0/tokens_per_sec": 5.0,
        "train/rank/1/tokens_per_sec": 5.0,
    }


class Clock:
    """A clock that moves only when the model says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedModule(Module):
    """Each forward takes 3 s; each backward 100 s (with DDP, the gradient all-reduce's wait)."""

    def __init__(self, batches: list[Any], clock: Clock) -> None:
        super().__init__(batches)
        self.clock = clock

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.clock.now += 3.0
        return super().training_step(batch, batch_idx)

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self.clock.now += 100.0
        super().backward(loss, *args, **kwargs)


def test_compute_time_is_the_forward_before_the_backward(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(throughput, "perf_counter", clock)
    monkeypatch.setattr(compute_clock, "perf_counter", clock)
    ranks = TwoRanks()
    logger = fit(TimedModule(micro_batches([[30], [60]]), clock), TokenThroughputMonitor(), ranks)
    # Each window: one micro-batch of 3 s forward and 100 s backward; rank 1 half of each.
    # (The last gather is the run's counts when training ends, without times.)
    assert [(w.compute, w.elapsed) for w in ranks.sent] == [(3.0, 103.0), (3.0, 103.0), (0, 0)]
    for _, logged in logger.calls:
        assert logged["train/step_time"] == 103.0
        assert logged["train/step_time_imbalance"] == pytest.approx(3.0 / 2.25)


class FakeEvent:
    """A CUDA event on a fake device timeline (``FakeEvent.now``, seconds)."""

    now = 0.0

    def __init__(self, enable_timing: bool) -> None:
        self.at = math.nan

    def record(self) -> None:
        self.at = FakeEvent.now

    def elapsed_time(self, end: FakeEvent) -> float:
        return (end.at - self.at) * 1000.0  # milliseconds, as torch's


def test_on_a_gpu_the_compute_is_read_from_events_once_per_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    synced: list[torch.device] = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", synced.append)
    clock = ComputeClock(torch.device("cuda", 0))
    for forward in (2.0, 3.0):
        start = clock.mark()
        FakeEvent.now += forward
        assert clock.interval(start, clock.mark()) == 0.0  # no synchronize per micro-batch
        FakeEvent.now += 50.0  # the backward, not timed
    assert synced == []
    assert clock.collect() == 5.0
    assert synced == [torch.device("cuda", 0)]
    assert clock.collect() == 0.0
