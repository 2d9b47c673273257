"""The length warm-up where it meets the planner: its settings, caps, steps and resume position.

:mod:`~lightning_varbatch.planner.length_warmup` holds the schedule and the step order; this
module checks the ``length_warmup*`` settings of a ``PlanConfig``, computes the caps of one
plan from them, the longest example of every step, and where a resumed remainder continues.

Example:
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> check_warmup_settings(PlanConfig(64, length_warmup=10))["length_warmup"]
    10
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from lightning_varbatch.checks import check_choice, check_count
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.length_warmup import SCHEDULES, check_schedule, scheduled_caps

if TYPE_CHECKING:
    from lightning_varbatch.planner.epoch_plan import EpochPlan
    from lightning_varbatch.planner.lengths import PreparedLengths
    from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "WARMUP_DEFAULTS",
    "check_warmup_settings",
    "step_longest",
    "warmup_caps",
    "warmup_position",
]

#: The warm-up settings and their defaults (off): at these values a ``PlanConfig``'s
#: fingerprint and plans are those of versions without the warm-up.
WARMUP_DEFAULTS: dict[str, Any] = {
    "length_warmup": None,
    "length_warmup_min": 8,
    "length_warmup_max": None,
    "length_warmup_schedule": "linear",
}


def check_warmup_settings(config: PlanConfig) -> dict[str, Any]:
    """Validate the four ``length_warmup*`` settings; their values as plain Python ints.

    Raises:
        SettingValueError: a non-positive ``length_warmup`` / ``length_warmup_min`` /
            ``length_warmup_max``, a minimum above the maximum, an unknown or misbehaving
            schedule, or a warm-up setting without ``length_warmup``; ``.setting`` names it.
        SettingTypeError: a setting of the wrong type.
    """
    low = check_count("length_warmup_min", config.length_warmup_min)
    high = check_count("length_warmup_max", config.length_warmup_max, allow_none=True)
    schedule = config.length_warmup_schedule
    if isinstance(schedule, str):
        check_choice(
            "length_warmup_schedule",
            schedule,
            SCHEDULES,
            what=" or a callable progress -> fraction in [0, 1]",
        )
    elif callable(schedule):
        check_schedule(schedule)
    else:
        raise SettingTypeError(
            f"length_warmup_schedule must be one of {', '.join(map(repr, SCHEDULES))} or "
            f"a callable progress -> fraction, got {schedule!r} "
            f"({type(schedule).__name__}); pass e.g. length_warmup_schedule='root'.",
            setting="length_warmup_schedule",
            value=schedule,
        )
    if high is not None and low > high:
        raise SettingValueError(
            f"length_warmup_min={low} is above length_warmup_max={high}: the cap grows "
            "from the minimum to the maximum. Lower length_warmup_min or raise (or unset) "
            "length_warmup_max.",
            setting="length_warmup_min",
            value=low,
        )
    if config.length_warmup is not None:
        steps = check_count(
            "length_warmup",
            config.length_warmup,
            what=" (optimizer steps of the warm-up; None for no warm-up)",
        )
        return {"length_warmup": steps, "length_warmup_min": low, "length_warmup_max": high}
    unused = [
        name
        for name in ("length_warmup_min", "length_warmup_max", "length_warmup_schedule")
        if getattr(config, name) != WARMUP_DEFAULTS[name]
    ]
    if unused:
        raise SettingValueError(
            f"{unused[0]}={getattr(config, unused[0])!r} has no effect without "
            "length_warmup: set length_warmup=<optimizer steps> to warm up, or leave "
            f"{', '.join(unused)} unset.",
            setting=unused[0],
            value=getattr(config, unused[0]),
        )
    return {"length_warmup_min": low, "length_warmup_max": high}


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
    key, kept = prepared.key, prepared.kept
    longest = int(key.max(initial=0) if kept is None else key[kept].max(initial=0))
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
    ordered = key[order].astype(np.int64)
    if starts.size == 0 or ordered.size == 0:
        return np.zeros(assign.shape[0], dtype=np.int64)
    longest = np.maximum.reduceat(ordered, np.minimum(starts, ordered.size - 1))
    longest[sizes == 0] = 0
    return np.asarray(longest[assign].reshape(assign.shape[0], -1).max(axis=1, initial=0))


def warmup_position(plan: EpochPlan, consumed: int, first: int, floor: int) -> tuple[int, int]:
    """The run's step and the warm-up's cap after ``consumed`` micro-batches per rank of ``plan``.

    A started step counts as taken: its examples ran under its cap.

    Example:
        >>> from lightning_varbatch.planner.epoch_planner import plan_epoch
        >>> plan = plan_epoch(np.arange(1, 200), 400, world_size=2, length_warmup=5)
        >>> step, cap = warmup_position(plan, 3, 0, 0)
        >>> step, cap == int(plan.length_warmup.realised[:3].max())
        (3, True)
    """
    steps = -(-consumed // plan.accumulate_grad_batches)
    trace = plan.length_warmup
    if trace is not None and steps > 0:
        floor = max(floor, int(trace.realised[:steps].max(initial=0)))
    return first + steps, floor
