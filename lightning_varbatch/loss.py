"""Exact token-mean (and example-mean) losses over a whole optimizer step.

With token-budgeted batches, micro-batches carry different numbers of target tokens. The
gradient users want is the mean over *all* real target tokens of the optimizer step, across
ranks and accumulation micro-batches:

    grad = (1 / N_step) * sum over every token t of the step of grad(loss_t)

The usual recipe (mean per micro-batch, then Lightning divides by ``accumulate_grad_batches``
and DDP averages over ranks) weights a token in a small micro-batch more than one in a large
micro-batch. Here each rank returns ``sum_of_token_losses * world_size * accumulate / N_step``:
Lightning's division by the accumulation and the strategy's average over ranks cancel the two
factors, leaving exactly the formula above. ``N_step`` comes from the plan (the batch's
``step_ntokens``): no collective. :class:`VarBatchDeepSpeedStrategy` makes DeepSpeed reduce
gradients as DDP and FSDP do, so the same helper serves all three. When the loss tokens differ
from the planned lengths (e.g. ignored label positions), pass the real per-example counts as
the sampler's ``loss_lengths``, and the plan knows ``N_step`` exactly again.

Example:
    >>> import torch
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
        loss_sum: the *sum* of this micro-batch's per-token losses (``reduction="sum"``,
            padding and ignored positions excluded).
        step_ntokens: real loss tokens of the whole optimizer step over all ranks and
            micro-batches (the batch's ``step_ntokens``).
        world_size: number of ranks averaging gradients (``trainer.world_size``).
        accumulate_grad_batches: micro-batches per optimizer step
            (``trainer.accumulate_grad_batches``).

    Returns:
        The value to return from ``training_step`` (Lightning's automatic optimisation).

    Raises:
        SettingValueError: for a non-positive token count, world size or accumulation
            (``SettingTypeError`` for one that is not an integer; both are ``ValueError``).

    Example:
        >>> import torch
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
        loss_sum_per_example: the sum over this micro-batch of each example's loss (e.g. each
            example's mean token loss, summed over the micro-batch).
        step_nexamples: examples of the whole optimizer step (the batch's ``step_nexamples``).
        world_size: number of ranks averaging gradients.
        accumulate_grad_batches: micro-batches per optimizer step.

    Returns:
        The value to return from ``training_step``.

    Example:
        >>> import torch
        >>> float(example_mean_loss(torch.tensor(3.0), 6, 2, 1))
        1.0
    """
    scale = _scale(world_size, accumulate_grad_batches)
    return loss_sum_per_example * scale / _count(step_nexamples, "step_nexamples")


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
        RuntimeError: when the batch's plan was made for another world size or accumulation
            than the trainer runs (its ``step_ntokens`` would be the wrong normaliser).
    """
    world, accumulate = int(trainer.world_size), int(trainer.accumulate_grad_batches)
    if keys.PLAN_WORLD_SIZE in batch and (
        int(batch[keys.PLAN_WORLD_SIZE]),
        int(batch[keys.PLAN_ACCUMULATE]),
    ) != (world, accumulate):
        raise RuntimeError(
            f"The batch was planned for world_size={int(batch[keys.PLAN_WORLD_SIZE])} and "
            f"accumulate_grad_batches={int(batch[keys.PLAN_ACCUMULATE])}, but the Trainer runs "
            f"world_size={world} and accumulate_grad_batches={accumulate}: step_ntokens would "
            "normalise the loss wrongly. Build the sampler with the Trainer's values "
            "(TokenBudgetDataModule does), or call sampler.set_distributed("
            "trainer.global_rank, trainer.world_size, trainer.accumulate_grad_batches) in "
            "train_dataloader()."
        )
    if keys.STEP_NTOKENS not in batch:
        raise KeyError(
            f"The batch has no {keys.STEP_NTOKENS!r} entry: build the DataLoader with "
            "TokenBudgetDataModule (or PaddingCollate over a TokenBudgetBatchSampler), or call "
            "token_mean_loss(loss_sum, step_ntokens, world_size, accumulate_grad_batches)."
        )
    return token_mean_loss(loss_sum, batch[keys.STEP_NTOKENS], world, accumulate)
