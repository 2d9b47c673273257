"""Token-budgeted batches in a Lightning Fabric loop or a plain ``torchrun`` loop, no Trainer.

:class:`TokenBudgetLoop` runs what the Trainer's callbacks run, from the same objects: it iterates
the loader's epoch, knows which micro-batch ends an optimizer step, calls the LR rule
(:class:`~lightning_varbatch.BatchSizeLRRule`) and the throughput meter
(:class:`~lightning_varbatch.TokenThroughputMeter`), gives the exact token-mean loss
(:func:`~lightning_varbatch.loss.loop_token_mean`) and saves the trained position with the rules'
state (``fabric.save(path, {"loop": loop, ...})``). A loop reads::

    loop = TokenBudgetLoop(loader, [opt], fabric=fabric, model=model, accumulate_grad_batches=2)
    for epoch in range(loop.epoch, epochs):
        for batch in loop.epoch_batches(epoch):
            loop.backward(loop.token_mean(loss_sum(model, batch), batch))
            if loop.step():          # the optimizer stepped: step a per-step scheduler here
                scheduler.step()

Under DeepSpeed (:class:`~lightning_varbatch.VarBatchFabricDeepSpeedStrategy`) :meth:`step` calls
the engine on every micro-batch; it steps and syncs at its accumulation boundary, the loop's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from lightning_varbatch.callbacks.lr_scaling import BatchSizeLRRule
from lightning_varbatch.callbacks.throughput import TokenThroughputMeter
from lightning_varbatch.checks import check_count
from lightning_varbatch.loss import loop_token_mean

__all__ = ["TokenBudgetLoop"]


def _sampler_of(loader: Any) -> Any:
    sampler = getattr(loader, "batch_sampler", None)
    if not hasattr(sampler, "set_distributed") or not hasattr(sampler, "state_dict"):
        raise TypeError(
            "TokenBudgetLoop needs a loader over a TokenBudgetBatchSampler (from "
            "TokenBudgetDataModule.train_dataloader() or token_budget_dataloader(), possibly "
            f"wrapped by fabric.setup_dataloaders), got a batch_sampler of type "
            f"{type(sampler).__name__}."
        )
    return sampler


class TokenBudgetLoop:
    """The micro-batches, step boundaries, step rules and position of a loop without a Trainer.

    It is the rules' :class:`~lightning_varbatch.callbacks.loop_context.LoopContext`.
    ``at_boundary`` says, from a micro-batch's arrival to :meth:`step`, whether it ends an
    optimizer step: clip gradients then, before :meth:`step` (DeepSpeed: its config's
    ``gradient_clipping``).

    Args:
        loader: the training loader (``TokenBudgetDataModule.train_dataloader()``, as it is or
            through ``fabric.setup_dataloaders``; Fabric's defaults keep its sampler).
        optimizers: the optimizers the loop steps (Fabric's wrappers or torch optimizers).
        fabric: the ``Fabric`` object; ``None`` for a plain loop (``torch.distributed``).
        model: the model that :meth:`backward` skips gradient sync for inside a step (a
            Fabric module, a ``DistributedDataParallel`` or a plain module).
        accumulate_grad_batches: micro-batches per optimizer step (the sampler plans for it).
        lr_rule: an LR rule called every micro-batch, or ``None``.
        meter: a throughput meter called every micro-batch, or ``None``.
        log_every_n_steps: the rules' default log interval in optimizer steps.
        loggers: loggers with ``log_metrics(metrics, step=...)`` (default: Fabric's).

    Raises:
        TypeError: for a loader without a token-budget batch sampler.
        SettingValueError: for a non-positive accumulation or log interval.

    Example:
        >>> from lightning_varbatch import token_budget_dataloader, TokenBudgetBatchSampler
        >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7)]
        >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7], 8, rank=0, world_size=1, seed=0)
        >>> net = torch.nn.Linear(1, 1)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> loop = TokenBudgetLoop(token_budget_dataloader(data, sampler), [opt], model=net)
        >>> for batch in loop.epoch_batches(0):
        ...     loss = loop.token_mean(net(torch.ones(1, 1)).sum() * batch["ntokens"], batch)
        ...     loop.backward(loss)
        ...     stepped = loop.step()
        >>> loop.steps, loop.state_dict()["sampler"]["consumed"]
        (3, 3)
    """

    def __init__(
        self,
        loader: Any,
        optimizers: Sequence[Any] = (),
        *,
        fabric: Any = None,
        model: Any = None,
        accumulate_grad_batches: int = 1,
        lr_rule: BatchSizeLRRule | None = None,
        meter: TokenThroughputMeter | None = None,
        log_every_n_steps: int = 50,
        loggers: Sequence[Any] | None = None,
    ) -> None:
        self.train_dataloader = loader
        self.sampler = _sampler_of(loader)
        self.optimizers, self.fabric, self.model = list(optimizers), fabric, model
        self.accumulate_grad_batches = check_count(
            "accumulate_grad_batches", accumulate_grad_batches
        )
        self.log_every_n_steps = check_count("log_every_n_steps", log_every_n_steps)
        self.lr_rule, self.meter = lr_rule, meter
        self.loggers: Sequence[Any] = list(
            fabric.loggers if loggers is None and fabric else loggers or []
        )
        self.datamodule = None
        if fabric is not None:
            self.rank, self.world_size = int(fabric.global_rank), int(fabric.world_size)
        elif dist.is_available() and dist.is_initialized():
            self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        else:
            self.rank, self.world_size = 0, 1
        self.is_global_zero = self.rank == 0
        self.sampler.set_distributed(self.rank, self.world_size, self.accumulate_grad_batches)
        self.steps = 0  # optimizer steps taken (all epochs)
        self.at_boundary = False  # the current micro-batch ends an optimizer step
        self._trained = 0  # micro-batches of this epoch trained, counted from its start
        self._pending = False  # a micro-batch was handed out and step() not called yet
        self._started = False
        strategy = getattr(fabric, "strategy", None)
        self._engine_steps = type(strategy).__name__.endswith("DeepSpeedStrategy")

    @property
    def device(self) -> torch.device:
        """The rank's device (Fabric's, else the model's, else the CPU)."""
        if self.fabric is not None:
            return self.fabric.device
        param = next(iter(self.model.parameters()), None) if self.model is not None else None
        return torch.device("cpu") if param is None else param.device

    @property
    def flops_per_token(self) -> float | None:
        """The model's ``flops_per_token`` attribute, if it has one."""
        return getattr(self.model, "flops_per_token", None)

    def sum_over_ranks(self, value: Tensor) -> Tensor:
        """``value`` summed over the ranks (Fabric's or torch's all-reduce)."""
        value = value.to(self.device)
        if self.fabric is not None:
            return self.fabric.all_reduce(value, reduce_op="sum")
        if self.world_size > 1:
            dist.all_reduce(value)
        return value

    def gather(self, value: Tensor) -> Tensor:
        """Every rank's ``value`` stacked in rank order."""
        value = value.to(self.device)
        if self.fabric is not None:
            return self.fabric.all_gather(value)
        rows = [torch.empty_like(value) for _ in range(self.world_size)]
        if self.world_size > 1:
            dist.all_gather(rows, value)
        else:
            rows = [value]
        return torch.stack(rows)

    @property
    def epoch(self) -> int:
        """The sampler's epoch (after :meth:`load_state_dict`, the one to resume)."""
        return int(self.sampler.epoch)

    def epoch_batches(self, epoch: int) -> Iterator[Any]:
        """This rank's micro-batches of ``epoch`` (the rest of it after a resume).

        Raises:
            RuntimeError: when a micro-batch is asked for before the previous one's :meth:`step`.
        """
        if not self._started:
            self._started = True
            if self.lr_rule is not None:
                self.lr_rule.attach(self.optimizers)
            if self.meter is not None:
                self.meter.start(self)
        if epoch != self.epoch:
            self.sampler.set_epoch(epoch)
            self._trained = 0
        else:
            self._trained = int(self.sampler.consumed)
        # Fabric's loader sets its samplers' epoch to its count of iter() calls: make it the epoch.
        if hasattr(self.train_dataloader, "_num_iter_calls"):
            self.train_dataloader._num_iter_calls = epoch
        for batch in self.train_dataloader:
            if self._pending:
                raise RuntimeError(
                    "TokenBudgetLoop: call loop.step() after each micro-batch's backward (it "
                    "steps the optimizer at the step's last micro-batch and closes the rules)."
                )
            self._pending = True
            self.at_boundary = (self._trained + 1) % self.accumulate_grad_batches == 0
            if self.lr_rule is not None:
                self.lr_rule.on_micro_batch(batch, self, self.at_boundary, self.steps)
            if self.meter is not None:
                self.meter.on_micro_batch(batch)
            yield batch

    def token_mean(self, loss_sum: Tensor, batch: Any) -> Tensor:
        """The loss whose gradient, summed over the step, is the step's exact token mean."""
        return loop_token_mean(loss_sum, batch, self.accumulate_grad_batches, self.world_size)

    def _no_sync(self) -> contextlib.AbstractContextManager[Any]:
        if self.at_boundary or self.model is None or self._engine_steps:
            return contextlib.nullcontext()
        if self.fabric is not None:
            return self.fabric.no_backward_sync(self.model)
        no_sync = getattr(self.model, "no_sync", None)
        return contextlib.nullcontext() if no_sync is None else no_sync()

    def backward(self, loss: Tensor) -> None:
        """Backward, without gradient sync inside a step (DeepSpeed syncs by itself)."""
        if self.meter is not None:
            self.meter.before_backward()
        with self._no_sync():
            if self.fabric is not None:
                self.fabric.backward(loss, model=self.model)
            else:
                loss.backward()

    def step(self) -> bool:
        """After each micro-batch's backward: step and zero the optimizers at the boundary.

        Returns:
            Whether this micro-batch ended an optimizer step (step a scheduler then).
        """
        if self._engine_steps:
            # The engine steps (and zeroes) at its accumulation boundary, the loop's; Fabric's
            # optimizer.step() would call the ZeRO optimizer directly (_FabricOptimizer.step).
            self.fabric.strategy.model.step()
        elif self.at_boundary:
            for optimizer in self.optimizers:
                optimizer.step()
                optimizer.zero_grad()
        self._pending = False
        self._trained += 1
        boundary = self.at_boundary
        if boundary:
            self.steps += 1
        if self.lr_rule is not None:
            self.lr_rule.on_micro_batch_end(boundary)
        if self.meter is not None:
            self.meter.on_micro_batch_end(self, boundary, self.steps)
        return boundary

    def end(self) -> dict[str, float]:
        """Unhook the LR rule; the meter's run totals (a collective), else ``{}``."""
        if self.lr_rule is not None:
            self.lr_rule.detach()
        return {} if self.meter is None else self.meter.end(self)

    def state_dict(self) -> dict[str, Any]:
        """The trained position and the rules' state (for ``fabric.save`` or ``torch.save``).

        Raises:
            RuntimeError: inside an optimizer step (save after :meth:`step` returned True).
        """
        if self._trained % self.accumulate_grad_batches:
            raise RuntimeError(
                "TokenBudgetLoop.state_dict() inside an optimizer step: the gradients of its "
                "first micro-batches are not saved. Save after loop.step() returns True."
            )
        state: dict[str, Any] = {
            "steps": self.steps,
            "sampler": self.sampler.state_dict(consumed=self._trained),
        }
        for name, rule in (("lr_rule", self.lr_rule), ("meter", self.meter)):
            if rule is not None:
                state[name] = rule.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any], **sampler_kwargs: Any) -> None:
        """Resume at the saved position, also on another world size or accumulation.

        Args:
            state: a :meth:`state_dict`.
            **sampler_kwargs: passed to the sampler's ``load_state_dict`` (``on_mismatch``).
        """
        self.steps = int(state["steps"])
        self.sampler.load_state_dict(state["sampler"], **sampler_kwargs)
        for name, rule in (("lr_rule", self.lr_rule), ("meter", self.meter)):
            if rule is not None and name in state:
                rule.load_state_dict(state[name])
