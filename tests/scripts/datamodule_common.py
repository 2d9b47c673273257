"""Data, model and a fit helper shared by the datamodule tests and the per-rank DDP script."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from torch import nn

from lightning_varbatch.data.datamodule import TokenBudgetDataModule
from lightning_varbatch.loss import step_token_mean

VOCAB = 12
NUM_TRAIN = 60
NUM_VAL = 23
MAX_TOKENS = 40


def make_pairs(n: int, seed: int) -> list[dict[str, Any]]:
    """Source/target pairs of very different lengths; pad id 0 is never a token."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        s, t = (int(x) for x in rng.choice([1, 2, 3, 5, 8, 11], size=2))
        items.append(
            {
                "id": i,
                "source": rng.integers(1, VOCAB, size=s).tolist(),
                "target": torch.tensor(rng.integers(1, VOCAB, size=t)),
            }
        )
    return items


def pair_lengths(items: list[dict[str, Any]]) -> np.ndarray:
    return np.array([[len(x["source"]), len(x["target"])] for x in items])


def pair_columns(items: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """The pairs as the columns of a Hugging Face dataset (targets as lists of ids)."""
    return {
        "id": [x["id"] for x in items],
        "source": [list(x["source"]) for x in items],
        "target": [x["target"].tolist() for x in items],
    }


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)
        self.trained: list[dict[str, Any]] = []
        self.validated: list[dict[str, Any]] = []

    def _loss_sum(self, batch: dict[str, Any]) -> torch.Tensor:
        target, mask = batch["target"], batch["target_mask"]
        context = (self.embed(batch["source"]) * batch["source_mask"][..., None]).sum(1)
        logits = self.out(torch.tanh(self.embed(target) + context[:, None]))
        return nn.functional.cross_entropy(logits[mask], target[mask], reduction="sum")

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.append(
            {
                "epoch": self.trainer.current_epoch,
                "batch_idx": batch_idx,
                "global_step": self.trainer.global_step,
                "ids": batch["id"].tolist(),
                "ntokens": int(batch["ntokens"]),
                "step_ntokens": int(batch["step_ntokens"]),
            }
        )
        return step_token_mean(self._loss_sum(batch), batch, self.trainer)

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.validated.append(
            {
                "epoch": self.trainer.current_epoch,
                "sanity": self.trainer.sanity_checking,
                "ids": batch["id"].tolist(),
            }
        )
        self.log(
            "val_loss", self._loss_sum(batch), sync_dist=True, batch_size=int(batch["nexamples"])
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        # momentum gives the optimizer state to checkpoint (FSDPStrategy.load_checkpoint in
        # Lightning 2.6 indexes the first state entry and fails on a stateless optimizer)
        return torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)


def quiet_trainer(**settings: Any) -> Trainer:
    """A CPU Trainer without logger, checkpoints, progress bar or summary; ``settings`` win."""
    defaults: dict[str, Any] = {
        "accelerator": "cpu",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    return Trainer(**{**defaults, **settings})


def make_datamodule(
    num_workers: int = 0, with_val: bool = True, source: str = "list"
) -> TokenBudgetDataModule:
    """The pairs as lists, or as Hugging Face datasets of the same items.

    ``source`` ``hf`` / ``hf:DIR`` (see ``hf_source.py``): the lengths are then the dataset's
    ``("source", "target")`` columns.
    """
    train: Any = make_pairs(NUM_TRAIN, 1)
    val: Any = make_pairs(NUM_VAL, 2) if with_val else None
    lengths: Any = pair_lengths
    if source != "list":
        # Only the per-rank scripts pass a source: tests/scripts is then on sys.path.
        from hf_source import as_dataset

        lengths = ("source", "target")
        train = as_dataset(pair_columns(train), source, "train")
        val = None if val is None else as_dataset(pair_columns(val), source, "val")
    return TokenBudgetDataModule(
        train,
        lengths,
        MAX_TOKENS,
        val_dataset=val,
        val_lengths=lengths if with_val else None,
        num_workers=num_workers,
        seed=3,
    )


def fit(
    *,
    devices: int = 1,
    strategy: str = "auto",
    accumulate: int = 1,
    max_epochs: int = 2,
    max_steps: int = -1,
    ckpt_dir: Path | None = None,
    ckpt_every: int | None = None,
    ckpt_path: str | None = None,
    num_workers: int = 0,
    with_val: bool = True,
    source: str = "list",
) -> tuple[Trainer, Model, TokenBudgetDataModule]:
    """Trainer.fit with the trainer's default use_distributed_sampler=True."""
    model = Model()
    dm = make_datamodule(num_workers, with_val, source)
    callbacks: list[Any] = []
    if ckpt_every is not None:
        callbacks.append(
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=ckpt_every, save_top_k=-1)
        )
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        strategy=strategy,
        accumulate_grad_batches=accumulate,
        max_epochs=max_epochs,
        max_steps=max_steps,
        callbacks=callbacks,
        enable_checkpointing=ckpt_every is not None,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=None if with_val else 0,
    )
    trainer.fit(model, datamodule=dm, ckpt_path=ckpt_path)
    return trainer, model, dm
