"""Exact token-mean (and example-mean) losses over a whole optimizer step.

Token-budgeted micro-batches carry different numbers of target tokens; the gradient wanted is
the mean over *all* real target tokens of the optimizer step, across ranks and micro-batches:

    grad = (1 / N_step) * sum over every token t of the step of grad(loss_t)

The usual recipe (mean per micro-batch, then Lightning divides by ``accumulate_grad_batches`` and
DDP averages over ranks) weights a token in a small micro-batch more than one in a large one. Here
each rank returns ``sum_of_token_losses * world_size * accumulate / N_step``: Lightning's division
and the ranks' average cancel the two factors, leaving exactly the formula above. ``N_step`` is the
plan's (the batch's ``step_ntokens``): no collective. DDP, FSDP and
:class:`VarBatchDeepSpeedStrategy` reduce gradients alike. When the loss tokens differ from the
planned lengths (ignored label positions), pass the real counts as the sampler's ``loss_lengths``.

Example:
    >>> per_token = torch.tensor([1.0, 2.0, 3.0])      # this rank's micro-batch
    >>> loss = token_mean_loss(per_token.sum(), step_ntokens=12, world_size=2,
    ...                        accumulate_grad_batches=2)
    >>> float(loss)  # 6 * 2 * 2 / 12
    2.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from lightning_varbatch import keys
from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingValueError


def _scale(world_size: int, accumulate_grad_batches: int) -> int:
    world = check_count("world_size", world_size)
    return world * check_count("accumulate_grad_batches", accumulate_grad_batches)


def _count(value: int | torch.Tensor, name: str) -> torch.Tensor | int:
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise SettingValueError(
                f"{name} must be a scalar, got shape {tuple(value.shape)}; pass the batch's "
                f"{name} entry (one count for the whole optimizer step).",
                setting=name,
                value=value,
            )
        if bool(value <= 0):
            raise SettingValueError(
                f"{name} must be > 0, got {int(value)}: the step has no tokens.",
                setting=name,
                value=value,
            )
        return value
    return check_count(name, value)


def token_mean_loss(
    loss_sum: torch.Tensor,
    step_ntokens: int | torch.Tensor,
    world_size: int,
    accumulate_grad_batches: int,
) -> torch.Tensor:
    """The loss whose gradient is the mean over every real token of the optimizer step.

    Args:
        loss_sum: the *sum* of this micro-batch's real per-token losses (``reduction="sum"``).
        step_ntokens: the step's real loss tokens, all ranks and micro-batches (the batch's).
        world_size: number of ranks averaging gradients (``trainer.world_size``).
        accumulate_grad_batches: micro-batches per step (``trainer.accumulate_grad_batches``).

    Returns:
        The value to return from ``training_step`` (Lightning's automatic optimisation).

    Raises:
        SettingValueError: for a non-positive token count, world size or accumulation
            (``SettingTypeError`` for one that is not an integer; both are ``ValueError``).

    Example:
        >>> float(token_mean_loss(torch.tensor(10.0), 20, 1, 1))
        0.5
    """
    scale = _scale(world_size, accumulate_grad_batches)
    return loss_sum * scale / _count(step_ntokens, "step_ntokens")


def example_mean_loss(
    loss_sum_per_example: torch.Tensor,
    step_nexamples: int | torch.Tensor,
    world_size: int,
    accumulate_grad_batches: int,
) -> torch.Tensor:
    """Like :func:`token_mean_loss`, but every example weighs the same (sequence-level mean).

    Args:
        loss_sum_per_example: this micro-batch's sum of per-example losses (e.g. token means).
        step_nexamples: examples of the whole optimizer step (the batch's ``step_nexamples``).
        world_size: number of ranks averaging gradients.
        accumulate_grad_batches: micro-batches per optimizer step.

    Returns:
        The value to return from ``training_step``.

    Example:
        >>> float(example_mean_loss(torch.tensor(3.0), 6, 2, 1))
        1.0
    """
    scale = _scale(world_size, accumulate_grad_batches)
    return loss_sum_per_example * scale / _count(step_nexamples, "step_nexamples")


def _check_plan(batch: Mapping[str, Any], world: int, accumulate: int, runner: str) -> None:
    """Refuse a batch planned for another topology, or without ``step_ntokens``."""
    if keys.PLAN_WORLD_SIZE in batch and (
        int(batch[keys.PLAN_WORLD_SIZE]),
        int(batch[keys.PLAN_ACCUMULATE]),
    ) != (world, accumulate):
        raise RuntimeError(
            f"The batch was planned for world_size={int(batch[keys.PLAN_WORLD_SIZE])} and "
            f"accumulate_grad_batches={int(batch[keys.PLAN_ACCUMULATE])}, but the {runner} runs "
            f"world_size={world} and accumulate_grad_batches={accumulate}: step_ntokens would "
            f"normalise the loss wrongly. Build the sampler with the {runner}'s values "
            "(TokenBudgetDataModule and TokenBudgetLoop do), or call sampler.set_distributed("
            "rank, world_size, accumulate_grad_batches) before iterating."
        )
    if keys.STEP_NTOKENS not in batch:
        raise KeyError(
            f"The batch has no {keys.STEP_NTOKENS!r} entry: build the DataLoader with "
            "TokenBudgetDataModule (or PaddingCollate over a TokenBudgetBatchSampler), or call "
            "token_mean_loss(loss_sum, step_ntokens, world_size, accumulate_grad_batches)."
        )


def step_token_mean(loss_sum: torch.Tensor, batch: Mapping[str, Any], trainer: Any) -> torch.Tensor:
    """:func:`token_mean_loss` with the counts read from a batch of our collate and a Trainer.

    Args:
        loss_sum: the sum of this micro-batch's per-token losses.
        batch: a batch holding ``step_ntokens`` (as our :class:`PaddingCollate` makes).
        trainer: the Lightning Trainer (``self.trainer`` in a LightningModule).

    Returns:
        The value to return from ``training_step``.

    Raises:
        KeyError: when the batch does not carry ``step_ntokens``; the message says how to get it.
        RuntimeError: when the batch was planned for another world size or accumulation.
    """
    world, accumulate = int(trainer.world_size), int(trainer.accumulate_grad_batches)
    _check_plan(batch, world, accumulate, "Trainer")
    return token_mean_loss(loss_sum, batch[keys.STEP_NTOKENS], world, accumulate)


def loop_token_mean(
    loss_sum: torch.Tensor,
    batch: Mapping[str, Any],
    accumulate_grad_batches: int,
    world_size: int | None = None,
) -> torch.Tensor:
    """The token mean for a loop that sums micro-batch gradients itself (Fabric, ``torchrun``).

    Such a loop backpropagates each micro-batch's loss as it is (unlike the Trainer, no division by
    the accumulation) and DDP, FSDP or :class:`~lightning_varbatch.VarBatchFabricDeepSpeedStrategy`
    average over ranks, so the loss is ``loss_sum * world_size / step_ntokens``.

    Args:
        loss_sum: the sum of this micro-batch's per-token losses.
        batch: a batch holding ``step_ntokens`` (as our collates make).
        accumulate_grad_batches: the loop's micro-batches per optimizer step.
        world_size: ranks averaging gradients (default: ``torch.distributed``'s, else 1).

    Raises:
        KeyError: when the batch does not carry ``step_ntokens``.
        RuntimeError: when the batch was planned for another world size or accumulation.

    Example:
        >>> batch = {"step_ntokens": 8, "plan_world_size": 2, "plan_accumulate_grad_batches": 2}
        >>> float(loop_token_mean(torch.tensor(4.0), batch, 2, world_size=2))
        1.0
    """
    if world_size is None:
        dist = torch.distributed
        world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    world = check_count("world_size", world_size)
    _check_plan(
        batch, world, check_count("accumulate_grad_batches", accumulate_grad_batches), "loop"
    )
    return token_mean_loss(loss_sum, batch[keys.STEP_NTOKENS], world, 1)
