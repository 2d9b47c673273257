"""A tiny module, dict batches with the keys.py entries, a recording logger, a fake clock."""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader

from lightning_varbatch import TokenBudgetBatchSampler, keys, token_budget_dataloader

BASE_LR = 0.1
WARMUP = 4


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP)


class RecordingLogger(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[int, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recording"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        assert step is not None
        self.calls.append((step, dict(metrics)))

    def series(self, key: str) -> dict[int, float]:
        return {step: m[key] for step, m in self.calls if key in m}


class Tokens(LightningModule):
    """Trains on a token-budget loader of its own: the monitor finds its batch sampler, the
    library's collate puts the plan's counts on the batches."""

    def __init__(self, sampler: TokenBudgetBatchSampler, docs: list[dict[str, Any]]) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.sampler, self.docs = sampler, docs

    def train_dataloader(self) -> Any:
        return token_budget_dataloader(self.docs, self.sampler)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch["tokens"].float().unsqueeze(-1)).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


class FakeClock:
    """Every call returns 10 s more than the previous one (first call: 10)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        self.now += 10.0
        return self.now


def micro_batches(ntokens: list[list[int]]) -> list[dict[str, Any]]:
    """Dict batches for steps of micro-batches with the given token counts (2 examples each)."""
    batches = []
    for step in ntokens:
        for n in step:
            batches.append(
                {
                    "x": torch.ones(2, 3),
                    keys.NTOKENS: torch.tensor(n),
                    keys.NEXAMPLES: torch.tensor(2),
                    keys.INPUT_TOKENS: torch.tensor(2 * n),
                    keys.PADDED_TOKENS: torch.tensor(4 * n),
                    keys.STEP_NTOKENS: torch.tensor(sum(step)),
                    keys.STEP_NEXAMPLES: torch.tensor(2 * len(step)),
                }
            )
    return batches


class Module(LightningModule):
    def __init__(self, batches: list[Any], flops_per_token: float | None = None) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(3, 1)
        self.batches = batches
        self.step_lrs: list[float] = []  # lr seen by the real optimizer step
        self.end_lrs: list[float] = []  # lr after every micro-batch (what schedulers see)
        if flops_per_token is not None:
            self.flops_per_token = flops_per_token

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(self.batches, batch_size=None)  # type: ignore[arg-type]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x = batch["x"] if isinstance(batch, dict) else batch[0]
        return self.layer(x).sum()

    def on_train_batch_end(self, *args: Any) -> None:
        self.end_lrs.append(self.trainer.optimizers[0].param_groups[0]["lr"])

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=BASE_LR)
        opt.register_step_post_hook(  # the closure runs inside step()
            lambda o, *_: self.step_lrs.append(o.param_groups[0]["lr"])
        )
        sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit(
    module: Module,
    callbacks: list[Any],
    max_steps: int,
    accumulate: int = 1,
    ckpt_path: str | None = None,
) -> tuple[Trainer, RecordingLogger]:
    logger = RecordingLogger()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return trainer, logger


def scale(rule: str, ratio: float) -> float:
    return {"linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def iter_steps(ntokens: list[list[int]]) -> Iterator[int]:
    for step in ntokens:
        yield sum(step)
