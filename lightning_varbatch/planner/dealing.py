"""Dealing an optimizer step's micro-batches to the ranks, with balanced loads.

An optimizer step holds ``world_size * accumulate_grad_batches`` micro-batches; every rank
must get exactly ``accumulate_grad_batches`` of them, and a step is as slow as its most
loaded rank. :func:`deal_steps` gives each micro-batch, largest cost first, to the least-loaded
rank that still has a free slot (LPT scheduling), for all steps at once. Both planners use it:
:class:`~lightning_varbatch.planner.epoch_planner.EpochPlanner` for its steps, and
:class:`~lightning_varbatch.planner.mixture.MixturePlanner` for steps that mix datasets
(``mixing="per_batch"``).

Example:
    >>> import numpy as np
    >>> steps = np.array([[0, 1, 2, 3]])  # one step of four micro-batches
    >>> cost = np.array([9.0, 8.0, 2.0, 1.0])
    >>> deal_steps(steps, cost, world=2, acc=2)[0].tolist()  # rank 0: 9 + 1, rank 1: 8 + 2
    [[0, 3], [1, 2]]
"""

from __future__ import annotations

import numpy as np

__all__ = ["deal_steps"]


def deal_steps(steps: np.ndarray, cost: np.ndarray, world: int, acc: int) -> np.ndarray:
    """Deal each step's micro-batches to ranks so that the per-rank sums of cost are balanced.

    Largest micro-batch first, each to the least-loaded rank with a free micro-batch slot
    (LPT scheduling; ties go to the lowest rank), vectorised over steps. With ``acc == 1``
    each rank gets one micro-batch, in decreasing cost order (the order of ranks does not
    change the balance).

    Args:
        steps: ``(num_steps, world * acc)`` micro-batch ids, one row per optimizer step.
        cost: the cost of every micro-batch, indexed by micro-batch id.
        world: number of ranks.
        acc: micro-batches per rank per optimizer step.

    Returns:
        ``(num_steps, world, acc)`` micro-batch ids: ``[s, r, j]`` is rank ``r``'s ``j``-th
        micro-batch of step ``s``.
    """
    num_steps = steps.shape[0]
    assign = np.empty((num_steps, world, acc), dtype=np.int64)
    if num_steps == 0:
        return assign
    micro_batch_cost = cost[steps]
    by_cost = np.argsort(-micro_batch_cost, axis=1, kind="stable")
    ranked = np.take_along_axis(steps, by_cost, axis=1)
    ranked_cost = np.take_along_axis(micro_batch_cost, by_cost, axis=1)
    if acc == 1:  # one slot per rank: the order of ranks does not change the balance
        assign[:, :, 0] = ranked
        return assign
    load = np.zeros((num_steps, world))
    used = np.zeros((num_steps, world), dtype=np.int64)
    rows = np.arange(num_steps)
    for k in range(world * acc):
        rank = np.argmin(np.where(used < acc, load, np.inf), axis=1)
        assign[rows, rank, used[rows, rank]] = ranked[:, k]
        load[rows, rank] += ranked_cost[:, k]
        used[rows, rank] += 1
    return assign
