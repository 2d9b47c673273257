"""The Trainer callbacks over the step rules: the same objects, called from Lightning's hooks.

:class:`BatchSizeLRScaler` is :class:`~lightning_varbatch.BatchSizeLRRule` and
:class:`TokenThroughputMonitor` is :class:`~lightning_varbatch.TokenThroughputMeter`, plus the hooks
calling them (arguments, keys and state are the rule's); ``TokenBudgetLoop`` calls them alike.

Example:
    >>> issubclass(BatchSizeLRScaler, BatchSizeLRRule)
    True
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_varbatch.callbacks.batch_counts import is_step_boundary
from lightning_varbatch.callbacks.loop_context import TrainerContext
from lightning_varbatch.callbacks.lr_scaling import BatchSizeLRRule
from lightning_varbatch.callbacks.throughput import TokenThroughputMeter

__all__ = ["BatchSizeLRScaler", "TokenThroughputMonitor"]


class BatchSizeLRScaler(BatchSizeLRRule, Callback):
    """:class:`BatchSizeLRRule` as a Trainer callback (same arguments, keys and state).

    Example:
        >>> scaler = BatchSizeLRScaler(rule="linear", max_tokens=4096, max_scale=1.0)
        >>> trainer = Trainer(callbacks=[scaler], accumulate_grad_batches=2)  # doctest: +SKIP
    """

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.attach(trainer.optimizers)  # after the strategy wrapped them and a resume

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.detach()

    @override
    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self.detach()

    @override
    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self.detach()

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        boundary = is_step_boundary(trainer)
        self.on_micro_batch(batch, TrainerContext(trainer), boundary, trainer.global_step)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        self.on_micro_batch_end(is_step_boundary(trainer))


class TokenThroughputMonitor(TokenThroughputMeter, Callback):
    """:class:`TokenThroughputMeter` as a Trainer callback (same arguments, keys and state).

    Example:
        >>> monitor = TokenThroughputMonitor(log_every_n_steps=50, peak_flops=989e12)
        >>> trainer = Trainer(callbacks=[monitor])  # doctest: +SKIP
    """

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.start(TrainerContext(trainer))

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.on_micro_batch(batch)

    @override
    def on_before_backward(
        self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor
    ) -> None:
        self.before_backward()

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        boundary = is_step_boundary(trainer)
        metrics = self.on_micro_batch_end(TrainerContext(trainer), boundary, trainer.global_step)
        if metrics is not None and self.prog_bar:
            pl_module.log(
                "tokens_per_sec",
                metrics["train/tokens_per_sec"],
                prog_bar=True,
                logger=False,
                on_step=True,
                on_epoch=False,
            )

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        totals = self.end(TrainerContext(trainer))
        trainer.callback_metrics.update(
            {key: torch.tensor(value, dtype=torch.float64) for key, value in totals.items()}
        )
