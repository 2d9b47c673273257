"""One rank of a run with both callbacks: ``callbacks_train.py OUT STRATEGY MODE [--source S]``.

MODE ``keys``: counts from the batch keys (STEP_NTOKENS, no collective in the scaler);
MODE ``fn``: counts from ``tokens_fn``/``examples_fn`` (the scaler all-reduces at each step).
Writes ``OUT/rank<r>.json``: the lr of every real optimizer step, the micro-batches trained on
and (rank 0) what the loggers received. ``--source hf``: the same sequences as a Hugging Face
dataset through ``TokenBudgetDataModule(ds, "tokens", ...)`` and the library's collate, whose
batches carry the keys themselves.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from hf_source import is_hf, loader_evidence, pop_source
from lightning.pytorch import LightningModule, Trainer, seed_everything
from lightning.pytorch.loggers import Logger
from strategy_common import ACCUMULATE, MAX_TOKENS, collate, loss_sum, make_model, make_sequences
from strategy_train import Sequences, hf_datamodule
from teardown import shutdown
from torch.utils.data import DataLoader

import lightning_varbatch.strategies  # noqa: F401  (registers the names)
from lightning_varbatch import TokenBudgetBatchSampler
from lightning_varbatch.callbacks import BatchSizeLRScaler, TokenThroughputMonitor
from lightning_varbatch.loss import token_mean_loss

STEPS = 4
LR = 0.5
GAMMA = 0.8  # ExponentialLR: chainable, so a factor left in param_groups would compound


class RecordingSGD(torch.optim.SGD):
    """SGD recording, inside its update, the lr it really used (DeepSpeed: once per step)."""

    def __init__(self, params: Any) -> None:
        super().__init__(params, lr=LR)
        self.used: list[float] = []

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.used.append(float(self.param_groups[0]["lr"]))
        super().step()
        return loss


class Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.calls.append((step, {k: float(v) for k, v in metrics.items()}))


def collate_with_keys(examples: list[dict[str, Any]]) -> dict[str, Any]:
    batch = collate(examples)
    batch["nexamples"] = len(examples)
    return batch


class Model(LightningModule):
    """The model; its data comes from a datamodule (``--source hf``) or :class:`ListModel`."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model()
        self.micro_batches: list[dict[str, Any]] = []
        self.step_lrs: list[float] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        record = {
            "step": batch["step"],
            "ntokens": int(batch["ntokens"]),
            "nexamples": len(batch["ids"]),
            "step_ntokens": int(batch["step_ntokens"]),
            "global_step": self.trainer.global_step,
        }
        if "collated_from" in batch:
            record["collated_from"] = batch["collated_from"]
        self.micro_batches.append(record)
        trainer = self.trainer
        return token_mean_loss(
            loss_sum(self.net, batch["tokens"]),
            batch["step_ntokens"],
            trainer.world_size,
            trainer.accumulate_grad_batches,
        )

    def configure_optimizers(self) -> Any:
        opt = RecordingSGD(self.parameters())
        self.step_lrs = opt.used
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=GAMMA)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


class ListModel(Model):
    """The sequences as a Python list, through the sampler and a torch DataLoader."""

    def __init__(self) -> None:
        super().__init__()
        self.sequences = make_sequences()

    def train_dataloader(self) -> DataLoader[dict[str, Any]]:
        sampler = TokenBudgetBatchSampler(
            [len(s) for s in self.sequences],
            MAX_TOKENS,
            rank=self.trainer.global_rank,
            world_size=self.trainer.world_size,
            accumulate_grad_batches=self.trainer.accumulate_grad_batches,
            seed=0,
        )
        return DataLoader(
            Sequences(self.sequences), batch_sampler=sampler, collate_fn=collate_with_keys
        )


def train(out: Path, args: list[str]) -> dict[str, Any]:
    """One run on this rank; ``args``: the command line after OUT. Returns the rank's record."""
    del out  # the record is returned (the signature of the phases of strategy_phases.py)
    argv = list(args)
    source = pop_source(argv)
    strategy, mode = argv[0], argv[1]
    seed_everything(0, verbose=False)
    model = Model() if is_hf(source) else ListModel()
    datamodule = hf_datamodule(source) if is_hf(source) else None
    fns: dict[str, Any] = {}
    if mode == "fn":
        fns = {
            "tokens_fn": lambda b: int((b["tokens"] > 0).sum()),
            "examples_fn": lambda b: len(b["ids"]),
        }
    scaler = BatchSizeLRScaler(rule="sqrt", tokens_fn=fns.get("tokens_fn"))
    monitor = TokenThroughputMonitor(log_every_n_steps=1, **fns)
    logger = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=strategy,
        use_distributed_sampler=False,
        accumulate_grad_batches=ACCUMULATE,
        max_steps=STEPS,
        callbacks=[scaler, monitor],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=datamodule)
    record = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "reference": scaler.reference,
        "scaler_steps": scaler.steps,
        "step_lrs": model.step_lrs,
        "final_lr": float(trainer.lr_scheduler_configs[0].scheduler.get_last_lr()[0]),
        "micro_batches": model.micro_batches,
        "logged": logger.calls,
        "source": source,
    }
    if datamodule is not None:
        record["loader"] = loader_evidence(trainer.train_dataloader)
    return record


def main() -> None:
    out = Path(sys.argv[1])  # tests.launch.launch puts OUT first
    record = train(out, sys.argv[2:])
    (out / f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
