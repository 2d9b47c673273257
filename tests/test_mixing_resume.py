"""A mixture resumed from a mid-epoch checkpoint continues with exactly the next batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_varbatch import DataSource, TokenBudgetDataModule
from lightning_varbatch.loss import step_token_mean

VOCAB = 20


def _items(n: int, low: int, high: int, seed: int, first_id: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [
        {"id": first_id + i, "tokens": rng.integers(1, VOCAB, size=int(k)).tolist()}
        for i, k in enumerate(rng.integers(low, high, size=n))
    ]


class Recorder(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed, self.out = nn.Embedding(VOCAB, 8), nn.Linear(8, VOCAB)
        self.trained: list[tuple[int, list[int]]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.append((int(batch["dataset"]), batch["id"].tolist()))
        tokens, mask = batch["tokens"], batch["tokens_mask"]
        logits = self.out(self.embed(tokens))[mask]
        loss = nn.functional.cross_entropy(logits, tokens[mask], reduction="sum")
        return step_token_mean(loss, batch, self.trainer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)


def _fit(tmp: Path, max_steps: int = -1, ckpt_path: str | None = None) -> Recorder:
    short, long = _items(120, 2, 9, 0, 0), _items(40, 10, 30, 1, 1000)
    dm = TokenBudgetDataModule(
        [
            DataSource([len(x["tokens"]) for x in short], dataset=short, name="short"),
            DataSource([len(x["tokens"]) for x in long], dataset=long, name="long"),
        ],
        max_tokens=64,
        mixing="per_batch",
        weights=[1, 3],
        temperature=2.0,
        steps_per_epoch=9,
        seed=5,
    )
    model = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        max_epochs=2,
        max_steps=max_steps,
        accumulate_grad_batches=2,
        callbacks=[ModelCheckpoint(dirpath=tmp, every_n_train_steps=4, save_top_k=-1)],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm, ckpt_path=ckpt_path)
    return model


def test_checkpoint_resume_continues_with_the_next_micro_batch(tmp_path: Path) -> None:
    full = _fit(tmp_path / "full")
    assert len(full.trained) == 2 * 9 * 2  # 2 epochs x 9 steps x 2 micro-batches
    assert {d for d, _ in full.trained} == {0, 1}
    _fit(tmp_path / "cut", max_steps=6)
    ckpt = tmp_path / "cut" / "epoch=0-step=4.ckpt"
    resumed = _fit(tmp_path / "resumed", ckpt_path=str(ckpt))
    assert resumed.trained == full.trained[4 * 2 :]
    final = [p.detach() for p in resumed.parameters()]
    assert all(torch.equal(a, b.detach()) for a, b in zip(final, full.parameters(), strict=True))
