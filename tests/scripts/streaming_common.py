"""Shards, model and fit helper of the streaming tests (tests/test_streaming_lightning.py).

The shards are very unequal: ``big.jsonl`` holds about ten times the tokens of each other shard,
so a split of the shards by rank would give one rank far more work (and more batches).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_varbatch.data.streaming_datamodule import StreamingDataModule
from lightning_varbatch.loss import step_token_mean
from lightning_varbatch.sources.shards import ShardedSource, shards_from_files

VOCAB = 16
MAX_TOKENS = 64
WINDOW = 100
EVERY = 9  # the DDP run checkpoints every EVERY optimizer steps (step 9: inside window 1)
#: (file name, examples, (min, max) length): shard 0 has ~10x the tokens of each other one.
SHARDS = (
    ("big.jsonl", 100, (20, 40)),
    ("a.parquet", 60, (2, 8)),
    ("b.jsonl", 60, (2, 8)),
    ("c.parquet", 60, (2, 8)),
)
NUM_EXAMPLES = sum(n for _, n, _ in SHARDS)


def write_shards(folder: Path) -> list[Path]:
    """Write the shards (ids 0.. in shard order), deterministic."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    paths, first = [], 0
    for name, n, (lo, hi) in SHARDS:
        rows = [
            {
                "id": first + i,
                "tokens": rng.integers(1, VOCAB, int(rng.integers(lo, hi + 1))).tolist(),
            }
            for i in range(n)
        ]
        path = folder / name
        if name.endswith(".jsonl"):
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=16)
        paths.append(path)
        first += n
    return paths


def source(folder: Path) -> ShardedSource:
    return shards_from_files([folder / name for name, _, _ in SHARDS], "tokens", cache_dir=None)


class Model(LightningModule):
    """Predicts each token from its embedding; records the ids of every trained micro-batch."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)
        self.trained: list[dict[str, Any]] = []
        self.first_batch_at: float | None = None

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if self.first_batch_at is None:
            self.first_batch_at = time.perf_counter()
        self.trained.append(
            {
                "epoch": self.trainer.current_epoch,
                "global_step": self.trainer.global_step,
                "ids": batch["id"].tolist(),
                "tokens": int(batch["ntokens"]),
            }
        )
        tokens, mask = batch["tokens"], batch["tokens_mask"]
        logits = self.out(torch.tanh(self.embed(tokens)))
        loss = nn.functional.cross_entropy(logits[mask], tokens[mask], reduction="sum")
        return step_token_mean(loss, batch, self.trainer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


class TimedDataModule(StreamingDataModule):
    """Records how long each train_dataloader() call (where a restore is applied) took."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.loader_seconds: list[float] = []
        self.loader_built_at: float | None = None

    def train_dataloader(self) -> Any:
        start = time.perf_counter()
        loader = super().train_dataloader()
        self.loader_built_at = time.perf_counter()
        self.loader_seconds.append(self.loader_built_at - start)
        return loader


def fit(
    folder: Path,
    *,
    devices: int = 1,
    accumulate: int = 2,
    max_epochs: int = 1,
    num_workers: int = 0,
    ckpt_dir: Path | None = None,
    ckpt_every: int | None = None,
    ckpt_path: str | None = None,
    callbacks: list[Any] | None = None,
) -> tuple[Trainer, Model, TimedDataModule]:
    model = Model()
    dm = TimedDataModule(source(folder), MAX_TOKENS, window=WINDOW, num_workers=num_workers, seed=5)
    callbacks = list(callbacks or [])
    if ckpt_every is not None:
        callbacks.append(
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=ckpt_every, save_top_k=-1)
        )
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if devices > 1 else "auto",
        accumulate_grad_batches=accumulate,
        max_epochs=max_epochs,
        callbacks=callbacks,
        enable_checkpointing=bool(callbacks),
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, model, dm
