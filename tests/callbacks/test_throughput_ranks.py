"""TokenThroughputMonitor's per-rank figures: tokens/s of each rank and the shares in force.

One process with the strategy's all-gather replaced by one that adds a second rank carrying
half of rank 0's counts (and times), so the exact logged values are known.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import DataLoader, Dataset

import lightning_varbatch.callbacks.throughput as throughput
from lightning_varbatch.callbacks import TokenThroughputMonitor
from lightning_varbatch.callbacks.throughput import rank_metrics
from lightning_varbatch.callbacks.throughput_window import RankWindow
from tests.callbacks._common import FakeClock, Module, RecordingLogger, micro_batches


class TwoRanks(Callback):
    """Make the strategy's all_gather return this rank's vector and half of it as rank 1's."""

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        trainer.strategy.all_gather = lambda t, *a, **k: torch.stack([t, t * 0.5])  # type: ignore[method-assign]


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


def fit(module: Module, monitor: TokenThroughputMonitor) -> RecordingLogger:
    logger = RecordingLogger()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        callbacks=[TwoRanks(), monitor],
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
