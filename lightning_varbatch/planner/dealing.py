"""Dealing an optimizer step's micro-batches to the ranks, with balanced loads, and ordering steps.

Every rank gets ``accumulate_grad_batches`` of a step's micro-batches, and a step is as slow as its
most loaded rank: :func:`deal_steps` balances them (LPT scheduling), :func:`deal_run` forms an
epoch's run into dealt steps, :func:`order_steps` orders them (shuffled, then by the warm-up).

Example:
    >>> steps = np.array([[0, 1, 2, 3]])  # one step of four micro-batches
    >>> cost = np.array([9.0, 8.0, 2.0, 1.0])
    >>> deal_steps(steps, cost, world=2, acc=2)[0].tolist()  # rank 0: 9 + 1, rank 1: 8 + 2
    [[0, 3], [1, 2]]
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np

from lightning_varbatch.planner.length_warmup import LengthWarmupTrace, light_steps, warmup_order
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sorted_cut import SortedCut
from lightning_varbatch.planner.warmup_plan import step_longest

__all__ = ["Warm", "deal_run", "deal_steps", "order_steps"]

#: One plan's length warm-up: scheduled caps, the cap reached, the epoch's id order, its first step.
Warm: TypeAlias = tuple[np.ndarray, int, np.ndarray, int]


def deal_steps(steps: np.ndarray, cost: np.ndarray, world: int, acc: int) -> np.ndarray:
    """Deal each step's micro-batches to ranks so that the per-rank sums of cost are balanced.

    LPT over steps at once: largest first, to the least-loaded rank with a free slot (ties: lowest).

    Args:
        steps: ``(num_steps, world * acc)`` micro-batch ids, one row per optimizer step.
        cost: the cost of every micro-batch, indexed by micro-batch id.
        world: number of ranks.
        acc: micro-batches per rank per optimizer step.

    Returns:
        ``(num_steps, world, acc)`` micro-batch ids, ``[s, r, j]``: step s, rank r, the j-th.
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


def order_steps(
    cut: SortedCut,
    assign: np.ndarray,
    rng: np.random.Generator,
    config: PlanConfig,
    key: np.ndarray,
    warm: Warm | None,
) -> tuple[np.ndarray, LengthWarmupTrace | None]:
    """The steps shuffled, then ordered by the length warm-up ``warm`` (capping ``key``) if on."""
    if config.shuffle:
        assign = assign[rng.permutation(assign.shape[0])]
    trace = None
    if warm is not None and assign.shape[0]:  # an empty rest (all dropped) warms nothing
        caps, floor, order, first = warm
        longest = step_longest(key, cut.starts, cut.sizes, order, assign)
        perm, realised = warmup_order(longest, caps, floor, light_steps(cut.cost, assign))
        assign, longest = assign[perm], longest[perm]
        trace = LengthWarmupTrace(first, caps[: realised.shape[0]], realised, longest)
    return assign, trace


def deal_run(
    cut: SortedCut,
    run: np.ndarray,
    shape: tuple[int, int],
    rng: np.random.Generator,
    config: PlanConfig,
    key: np.ndarray,
    warm: Warm | None,
    *,
    rotate: bool = False,
) -> tuple[np.ndarray, LengthWarmupTrace | None]:
    """``(steps, world, acc)`` micro-batch ids: ``run`` formed into steps, dealt, ordered.

    ``shape``: ``(world, acc)``; ``rotate``: deal each step in a random rank order (rotate_ranks).
    """
    world, acc = shape
    if config.layout == "packed":
        # Packed rows differ in compute (Σ L²): steps of neighbouring compute let dealing even ranks
        run = run[np.argsort(-cut.work[run], kind="stable")]
    assign = deal_steps(run.reshape(-1, world * acc), cut.work, world, acc)
    assign, trace = order_steps(cut, assign, rng, config, key, warm)
    if rotate and world > 1:
        # Rank 0 gets each step's largest micro-batch: over few steps (a stream's window) that
        # skews ranks' real tokens; a random rank order per step evens them (loads unchanged).
        ranks = rng.permuted(np.tile(np.arange(world), (assign.shape[0], 1)), axis=1)
        assign = np.take_along_axis(
            assign, np.broadcast_to(ranks[:, :, None], assign.shape), axis=1
        )
    return assign, trace
