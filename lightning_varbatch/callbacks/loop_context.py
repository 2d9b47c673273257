"""What the step rules read from a training loop: a Trainer's, a Fabric loop's or a plain one's.

The LR rule and the throughput meter (:class:`~lightning_varbatch.BatchSizeLRRule`,
:class:`~lightning_varbatch.TokenThroughputMeter`) see the loop as a :class:`LoopContext`: world
size, accumulation, device, rank-0 loggers, train loader and the two collectives they need.
:class:`TrainerContext` reads them from a Trainer (the callbacks' adapter);
:class:`~lightning_varbatch.TokenBudgetLoop` from Fabric or ``torch.distributed``.

Example:
    >>> from types import SimpleNamespace
    >>> trainer = SimpleNamespace(world_size=2, accumulate_grad_batches=4)
    >>> TrainerContext(trainer).accumulate_grad_batches
    4
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["LoopContext", "TrainerContext"]


class LoopContext(Protocol):
    """The loop as the rules see it (every member is read when a rule needs it)."""

    world_size: int
    accumulate_grad_batches: int
    is_global_zero: bool
    log_every_n_steps: int
    loggers: Sequence[Any]  # objects with ``log_metrics(metrics, step=...)``
    train_dataloader: Any  # its ``batch_sampler``: the plan's shares, warm-up cap, names
    datamodule: Any  # for the training budget when the loader has none

    @property
    def device(self) -> torch.device:
        """The rank's device."""
        ...

    @property
    def flops_per_token(self) -> float | None:
        """Model FLOPs per loss token, when the model says."""
        ...

    def sum_over_ranks(self, value: Tensor) -> Tensor:
        """``value`` summed over every rank (a collective: every rank calls it)."""
        ...

    def gather(self, value: Tensor) -> Tensor:
        """Every rank's ``value`` stacked in rank order (a collective)."""
        ...


class TrainerContext:
    """A Lightning ``Trainer`` as a :class:`LoopContext` (the callbacks' adapter).

    Args:
        trainer: the running Trainer.

    Example:
        >>> from types import SimpleNamespace
        >>> TrainerContext(SimpleNamespace(log_every_n_steps=7)).log_every_n_steps
        7
    """

    def __init__(self, trainer: Any) -> None:
        self.trainer = trainer

    def __getattr__(self, name: str) -> Any:
        # the other LoopContext members (world_size, loggers, ...): the Trainer's own attributes
        return getattr(self.trainer, name)

    @property
    def device(self) -> torch.device:
        """The rank's device (``trainer.strategy.root_device``)."""
        return self.trainer.strategy.root_device

    @property
    def flops_per_token(self) -> float | None:
        """The LightningModule's ``flops_per_token`` attribute, if it has one."""
        return getattr(self.trainer.lightning_module, "flops_per_token", None)

    def sum_over_ranks(self, value: Tensor) -> Tensor:
        """``trainer.strategy.reduce(value, reduce_op="sum")``."""
        return self.trainer.strategy.reduce(value.to(self.device), reduce_op="sum")

    def gather(self, value: Tensor) -> Tensor:
        """``trainer.strategy.all_gather(value)``."""
        return self.trainer.strategy.all_gather(value.to(self.device))
