"""Per-micro-batch figures of a plan: examples, longest length, tokens, Σ L², slots, load.

One entry per micro-batch of a plan (run or not), in a few vectorised passes; the diagnostics
sum them over ranks and steps, the worst-batch check and the memory-budget finder read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from lightning_varbatch.checks import check_choice
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.flops import attention_term, work
from lightning_varbatch.planner.protocol import Planner

__all__ = [
    "LoadModel",
    "MicroBatchFigures",
    "check_plan_of",
    "micro_batch_figures",
    "micro_batch_load",
]

LoadModel = Literal["linear", "quadratic", "flops"]


@dataclass(frozen=True)
class MicroBatchFigures:
    """Per-micro-batch figures of a plan's layout (one entry per micro-batch, run or not).

    Attributes:
        size: examples, int64.
        longest: longest padded planning length, int64.
        real: summed planning lengths, int64.
        squares: summed squared planning lengths, float64.
        slots: token slots: rows × longest, or a packed row's aligned tokens.
        rows: padded rows: the examples, or a shape budget's rows (its masked rows run too).
        attention: :func:`~.flops.attention_term`: ``squares`` if packed, else ``rows × longest²``.
    """

    size: np.ndarray
    longest: np.ndarray
    real: np.ndarray
    squares: np.ndarray
    slots: np.ndarray
    rows: np.ndarray
    attention: np.ndarray


def check_plan_of(planner: Planner, plan: EpochPlan) -> None:
    """Refuse a plan that ``planner`` cannot have made (its ids would index other examples).

    Raises:
        ValueError: naming both sizes.
    """
    n = planner.num_examples
    if plan.order.size and int(plan.order.max()) >= n:
        raise ValueError(
            f"plan holds example id {int(plan.order.max())} but the planner has only {n} "
            "examples: pass the plan together with the planner that made it "
            "(planner.plan(...))."
        )


def micro_batch_figures(planner: Planner, plan: EpochPlan) -> MicroBatchFigures:
    """Examples, longest length, real tokens, Σ L² and slots of every micro-batch of ``plan``.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner(np.array([2, 9, 9, 4, 2]), PlanConfig(max_tokens=18))
        >>> figures = micro_batch_figures(planner, planner.plan(epoch=0))
        >>> figures.size.tolist(), figures.slots.tolist()
        ([2, 3], [18, 12])
    """
    check_plan_of(planner, plan)
    size = np.asarray(plan.micro_batch_size, dtype=np.int64)
    if size.size == 0:
        zero = np.zeros(0, dtype=np.int64)
        none = zero.astype(np.float64)
        return MicroBatchFigures(zero, zero, zero, none, zero, zero, none)
    start = np.asarray(plan.micro_batch_start, dtype=np.int64)
    # Lengths in plan order plus a sentinel (every micro-batch's end an index); the true maximum:
    # with bucket_width > 1 a micro-batch's first member is only in the longest *bucket*.
    key = planner.prepared.key[plan.order]
    keys = np.concatenate([key, np.zeros(1, dtype=key.dtype)])
    bounds = np.stack([start, start + size], axis=1).reshape(-1)
    nonempty = size > 0
    real = np.where(nonempty, np.add.reduceat(keys, bounds, dtype=np.int64)[::2], 0)
    wide = keys.astype(np.float64)
    squares = np.where(nonempty, np.add.reduceat(wide * wide, bounds)[::2], 0.0)
    longest = np.where(nonempty, np.maximum.reduceat(keys, bounds)[::2].astype(np.int64), 0)
    p = planner.config.pad_to_multiple_of
    longest = -(-longest // p) * p
    rows = size
    if plan.micro_batch_shape is not None:  # a shape budget: each runs at its static shape
        rows, longest = (plan.micro_batch_shape[:, i].astype(np.int64) for i in (0, 1))
    packed = planner.config.layout == "packed"
    slots = -(-real // p) * p if packed else rows * longest
    return MicroBatchFigures(
        size=size,
        longest=longest,
        real=real,
        squares=squares,
        slots=slots,
        rows=rows,
        attention=attention_term(rows, longest, squares, packed=packed),
    )


def micro_batch_load(planner: Planner, figures: MicroBatchFigures, model: LoadModel) -> np.ndarray:
    """Every micro-batch's load under ``model`` (see :func:`~.diagnostics.rank_loads`).

    Raises:
        ValueError: for an unknown ``model``.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner(np.array([2, 9, 9, 4, 2]), PlanConfig(max_tokens=18))
        >>> figures = micro_batch_figures(planner, planner.plan(epoch=0))
        >>> micro_batch_load(planner, figures, "linear").tolist()
        [18.0, 12.0]
    """
    cfg = planner.config
    slots = figures.slots.astype(np.float64)
    if model == "linear":
        return slots
    if model == "quadratic":
        return slots + cfg.quadratic_coef * figures.attention
    if model == "flops":
        return work(slots, figures.attention, cfg.flop_attention)
    check_choice("model", model, ("linear", "quadratic", "flops"), what=" (the load model)")
    raise AssertionError(model)  # unreachable: check_choice raised
