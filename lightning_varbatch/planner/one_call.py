"""One epoch planned in one call: :func:`plan_epoch` (an :class:`EpochPlanner` plans many).

Example:
    >>> sorted(plan_epoch([3, 5, 2, 7], max_tokens=10).example_ids().tolist())
    [0, 1, 2, 3]
"""

from __future__ import annotations

from typing import Any

import numpy.typing as npt

from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["plan_epoch"]


def plan_epoch(
    lengths: npt.ArrayLike,
    max_tokens: int,
    *,
    epoch: int = 0,
    world_size: int = 1,
    accumulate_grad_batches: int = 1,
    loss_lengths: npt.ArrayLike | None = None,
    **config: Any,
) -> EpochPlan:
    """Plan one epoch in one call (see :class:`EpochPlanner` to plan many epochs).

    Args:
        lengths: ``(n,)`` or ``(n, 2)`` lengths.
        max_tokens: the token budget of one micro-batch.
        epoch: the epoch.
        world_size: number of ranks.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        loss_lengths: loss tokens per example, when not the lengths / target column.
        **config: any other :class:`PlanConfig` setting (``cost``, ``seed``, ``tail``, ...).

    Returns:
        The plan.

    Example:
        >>> plan = plan_epoch([4, 4, 4, 4], max_tokens=8, world_size=2)
        >>> plan.micro_batch_size[plan.rank_micro_batches(0)].tolist()
        [2]
    """
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, **config), loss_lengths)
    return planner.plan(epoch, world_size, accumulate_grad_batches)
