"""A budget's most demanding micro-batch, as the memory model predicts it.

:func:`predict_worst` plans the lengths with a candidate ``max_tokens`` (the
:class:`~lightning_varbatch.planner.EpochPlanner` the DataModule would use) and returns the
predicted peak of the plan's most demanding micro-batch and its shape; :func:`single_budget` the
least budget holding one example; :func:`planning_lengths` one checked planning length per example.

Example:
    >>> predict_worst([30, 60, 90] * 10, 360, (1000.0, 2.0, 0.0), 1, 1, {})
    (1720.0, 4, 90)
    >>> single_budget(PlanConfig(max_tokens=4096, pad_to_multiple_of=8), 61)
    64
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt

from lightning_varbatch.memory.model import Coefficients
from lightning_varbatch.planner.diagnostics import micro_batch_figures
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.lengths import as_int_lengths
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["Worst", "planning_lengths", "predict_worst", "single_budget"]

Worst = tuple[float, int, int]
"""``(predicted peak bytes, examples, longest)`` of a plan's most demanding micro-batch."""


def planning_lengths(lengths: npt.ArrayLike) -> np.ndarray:
    """One planning length per example (the larger of a pair), validated as the planner does.

    Example:
        >>> planning_lengths([[3, 9], [7, 2]]).tolist()
        [9, 7]
    """
    arr = as_int_lengths(lengths, "lengths")
    if arr.ndim == 2:
        arr = arr.max(axis=1)
    return arr.astype(np.int64)


def single_budget(config: PlanConfig, longest: int) -> int:
    """The smallest ``max_tokens`` that holds one example of planning length ``longest``."""
    multiple = config.pad_to_multiple_of
    padded = np.array([-(-longest // multiple) * multiple], dtype=np.int64)
    cost = config.cost_fn(np.ones(1, dtype=np.int64), padded, np.array([longest]))
    return max(1, math.ceil(float(cost[0])))


def predict_worst(
    lengths: npt.ArrayLike,
    max_tokens: int,
    coef: Coefficients,
    epochs: int,
    world_size: int,
    settings: dict[str, Any],
    refused: list[tuple[int, ValueError]] | None = None,
) -> Worst | None:
    """Predicted peak of the plan's most demanding micro-batch and its shape.

    Epochs ``0 .. epochs - 1`` of ``world_size`` ranks are planned; the largest prediction counts.
    ``None`` when the budget cannot be planned (``oversize="skip"``/``"truncate"`` over too many
    examples; the error goes to ``refused``): settings were checked, only the budget can fail.
    """
    try:
        planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, **settings))
    except ValueError as error:
        if refused is not None:
            refused.append((max_tokens, error))
        return None
    best: Worst | None = None
    for epoch in range(epochs):
        found = _worst_of_plan(planner, planner.plan(epoch=epoch, world_size=world_size), coef)
        if found is not None and (best is None or found[0] > best[0]):
            best = found
    return best


def _worst_of_plan(planner: EpochPlanner, plan: Any, coef: Coefficients) -> Worst | None:
    """The most demanding micro-batch that runs in ``plan`` (``None``: none runs)."""
    figures = micro_batch_figures(planner, plan)
    run = np.unique(np.asarray(plan.assign).reshape(-1))
    run = run[figures.size[run] > 0]
    if run.size == 0:
        return None
    a, b, c = coef
    slots = figures.slots[run].astype(np.float64)
    attention = figures.attention[run]  # a shape's masked rows run too
    predicted = a + b * slots + c * attention
    i = int(np.argmax(predicted))
    return float(predicted[i]), int(figures.rows[run][i]), int(figures.longest[run][i])
