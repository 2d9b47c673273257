"""The length warm-up where it meets the planner: its settings, caps, steps and resume position.

:mod:`~lightning_varbatch.planner.length_warmup` holds the schedule and step order; this module
checks the ``length_warmup*`` settings, gives a plan's caps, steps' longest, a resumed rest's start.

Example:
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> config = PlanConfig(64, length_warmup=4, length_warmup_min=2)
    >>> config.length_warmup, check_warmup_acts(config, [12], [2], ["0"])
    (4, None)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.length_warmup import scheduled_caps

if TYPE_CHECKING:
    from lightning_varbatch.planner.epoch_plan import EpochPlan
    from lightning_varbatch.planner.lengths import PreparedLengths
    from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "check_warmup_acts",
    "micro_batch_longest",
    "step_longest",
    "warmup_caps",
    "warmup_position",
]


def check_warmup_acts(
    config: PlanConfig, longest: Sequence[int], lows: Sequence[int], names: Sequence[str]
) -> None:
    """Refuse a length warm-up that caps nothing: its first cap holds every example already.

    ``longest``: each dataset's longest planned example (one for a single dataset); ``lows``: each
    one's first cap (``length_warmup_min``, a mixture's per dataset); ``names``: for messages.

    Raises:
        SettingValueError: naming ``length_warmup_min``, when no example exceeds its first cap.
    """
    if config.length_warmup is None or any(
        int(top) > int(low) for top, low in zip(longest, lows, strict=True)
    ):
        return
    shown = ", ".join(
        f"{n}: {int(t)} (minimum {int(low)})"
        for n, t, low in zip(names, longest, lows, strict=True)
    )
    raise SettingValueError(
        f"length_warmup_min={config.length_warmup_min} holds every example already (the "
        f"longest: {shown}), so the length warm-up over {config.length_warmup} steps would "
        "change nothing: lower length_warmup_min below the longest example (e.g. to a quarter "
        "of it), or unset length_warmup.",
        setting="length_warmup_min",
        value=config.length_warmup_min,
    )


def warmup_caps(
    config: PlanConfig, prepared: PreparedLengths, epoch: int, first_step: int
) -> np.ndarray | None:
    """The scheduled caps of the warm-up steps a plan holds (``None``: no warm-up).

    Example:
        >>> from lightning_varbatch.planner.lengths import prepare_lengths
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> cfg = PlanConfig(64, length_warmup=4, length_warmup_min=2)
        >>> warmup_caps(cfg, prepare_lengths(np.array([2, 9, 10]), cfg, None), 0, 1).tolist()
        [4, 6, 8]
    """
    first_step = check_count("first_step", first_step, minimum=0)
    if config.length_warmup is None or epoch != 0 or first_step >= config.length_warmup:
        return None
    longest = int(prepared.planned_key.max(initial=0))
    high = longest if config.length_warmup_max is None else config.length_warmup_max
    return scheduled_caps(
        config.length_warmup_schedule,
        config.length_warmup,
        config.length_warmup_min,
        high,
        first=first_step,
    )


def step_longest(
    key: np.ndarray, starts: np.ndarray, sizes: np.ndarray, order: np.ndarray, assign: np.ndarray
) -> np.ndarray:
    """The longest example (planning key) of every step of ``assign``.

    Example:
        >>> step_longest(np.array([5, 3, 9]), np.array([0, 2]), np.array([2, 1]),
        ...              np.array([0, 1, 2]), np.array([[[1]], [[0]]])).tolist()
        [9, 5]
    """
    longest = micro_batch_longest(key, starts, sizes, order)
    return np.asarray(
        longest[assign]
        .reshape(assign.shape[0], int(np.prod(assign.shape[1:])))
        .max(axis=1, initial=0)
    )


def micro_batch_longest(
    key: np.ndarray, starts: np.ndarray, sizes: np.ndarray, order: np.ndarray
) -> np.ndarray:
    """The longest example (planning key) of every micro-batch (``0`` for an empty one).

    Example:
        >>> micro_batch_longest(np.array([5, 3, 9]), np.array([0, 2]), np.array([2, 1]),
        ...                     np.array([0, 1, 2])).tolist()
        [5, 9]
    """
    ordered = key[order].astype(np.int64)
    if starts.size == 0 or ordered.size == 0:
        return np.zeros(starts.size, dtype=np.int64)
    longest = np.maximum.reduceat(ordered, np.minimum(starts, ordered.size - 1))
    longest[sizes == 0] = 0
    return np.asarray(longest)


def warmup_position(plan: EpochPlan, consumed: int, first: int, floor: int) -> tuple[int, int]:
    """The run's step and the warm-up's cap after ``consumed`` micro-batches per rank of ``plan``.

    A started step counts as taken. A mixture's plan counts the cap in the run's steps of the
    schedule (``trace.levels``), a single dataset's in tokens.

    Example:
        >>> from lightning_varbatch.planner import plan_epoch
        >>> plan = plan_epoch(np.arange(1, 200), 400, world_size=2, length_warmup=5)
        >>> step, cap = warmup_position(plan, 3, 0, 0)
        >>> step, cap == int(plan.length_warmup.realised[:3].max())
        (3, True)
    """
    steps = -(-consumed // plan.accumulate_grad_batches)
    trace = plan.length_warmup
    if trace is not None and steps > 0:
        reached = trace.realised if trace.levels is None else trace.levels
        floor = max(floor, int(reached[:steps].max(initial=0)))
    return first + steps, floor
