"""Sequence-length warm-up: a length curriculum at a constant token budget, nothing cut.

Over the run's first ``length_warmup`` optimizer steps, the longest example a step may hold (its
*cap*) grows from ``length_warmup_min`` to ``length_warmup_max`` (:func:`scheduled_caps`). Only
the *order of the steps* changes (:func:`warmup_order`), every example runs once; where no step
left fits its cap the schedule *advances* (:class:`LengthWarmupTrace`; ``docs/length-warmup.md``).

Example:
    >>> caps = scheduled_caps("linear", 4, 8, 64, first=0)
    >>> caps.tolist()
    [8, 22, 36, 50]
    >>> perm, realised = warmup_order(np.array([60, 9, 30, 8, 64]), caps, floor=0)
    >>> perm.tolist(), realised.tolist()
    ([3, 1, 2, 0, 4], [8, 22, 36, 60])
"""

from __future__ import annotations

import hashlib
import heapq
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol, TypeAlias

import numpy as np

from lightning_varbatch.checks import check_choice, check_count
from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = [
    "SCHEDULES",
    "WARMUP_DEFAULTS",
    "LengthWarmupTrace",
    "ScheduleFn",
    "ScheduleName",
    "WarmupSettings",
    "check_schedule",
    "check_warmup_settings",
    "light_steps",
    "scheduled_caps",
    "warmup_order",
]

ScheduleName: TypeAlias = Literal["linear", "root", "step"]
#: A user schedule: progress in ``[0, 1]`` -> non-decreasing fraction ``[0, 1]`` of the min-max cap.
ScheduleFn: TypeAlias = Callable[[float], float]
SCHEDULES: tuple[str, ...] = ("linear", "root", "step")
_PROBES = np.linspace(0.0, 1.0, 101)


class WarmupSettings(Protocol):
    """What :func:`check_warmup_settings` reads of a ``PlanConfig``."""

    @property
    def length_warmup(self) -> int | None: ...  # noqa: D102
    @property
    def length_warmup_min(self) -> int: ...  # noqa: D102
    @property
    def length_warmup_max(self) -> int | None: ...  # noqa: D102
    @property
    def length_warmup_schedule(self) -> ScheduleName | ScheduleFn: ...  # noqa: D102


#: The warm-up settings' defaults (off): then a ``PlanConfig``'s fingerprint, plans are as before.
WARMUP_DEFAULTS: dict[str, Any] = {
    "length_warmup": None,
    "length_warmup_min": 8,
    "length_warmup_max": None,
    "length_warmup_schedule": "linear",
}


def check_warmup_settings(config: WarmupSettings) -> dict[str, Any]:
    """Validate the four ``length_warmup*`` settings; their values as plain Python ints.

    Raises:
        SettingValueError: a non-positive ``length_warmup``/``_min``/``_max``, a minimum above the
            maximum, a bad schedule, a warm-up setting without ``length_warmup`` (named).
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
        given = "length_warmup_min" if low != WARMUP_DEFAULTS["length_warmup_min"] else None
        raise SettingValueError(
            f"length_warmup_min={low}{'' if given else ' (its default)'} is above "
            f"length_warmup_max={high}: the cap grows from the minimum to the maximum. "
            + (
                "Lower length_warmup_min or raise (or unset) length_warmup_max."
                if given
                else f"Raise length_warmup_max to {low} or more, or set a lower length_warmup_min."
            ),
            setting=given or "length_warmup_max",
            value=low if given else high,
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


def _schedule_error(fn: object, text: str) -> SettingValueError:
    name = getattr(fn, "__qualname__", repr(fn))
    return SettingValueError(
        f"length_warmup_schedule={name} {text}: a schedule is called with the progress of the "
        "warm-up (a float in [0, 1]) and must return the fraction of the way from "
        "length_warmup_min to the maximum, a finite number in [0, 1] that never decreases "
        "(e.g. lambda p: p ** 0.5), or be one of 'linear', 'root', 'step'.",
        setting="length_warmup_schedule",
        value=fn,
    )


def _fractions(fn: ScheduleFn, progress: np.ndarray) -> np.ndarray:
    """Call a user schedule at every ``progress`` and check what comes back."""
    out = np.empty(progress.shape[0], dtype=np.float64)
    for i, p in enumerate(progress.tolist()):
        try:
            value = fn(p)
        except Exception as err:  # any failure of user code is reported the same way
            raise _schedule_error(fn, f"raised {type(err).__name__}: {err}") from err
        if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
            raise _schedule_error(fn, f"returned {value!r} ({type(value).__name__}) at {p:g}")
        if not (math.isfinite(float(value)) and 0.0 <= float(value) <= 1.0):
            raise _schedule_error(fn, f"returned {float(value)!r} at progress {p:g}")
        out[i] = float(value)
    drops = np.flatnonzero(np.diff(out) < -1e-12)
    if drops.size:
        i = int(drops[0])
        raise _schedule_error(
            fn,
            f"decreases from {out[i]:g} at progress {progress[i]:g} to {out[i + 1]:g} at "
            f"{progress[i + 1]:g}",
        )
    return out


def check_schedule(fn: ScheduleFn) -> None:
    """Probe a user schedule at 101 points of ``[0, 1]``.

    Raises:
        SettingValueError: (``.setting``: ``"length_warmup_schedule"``) when it fails, returns
            something that is not a number in ``[0, 1]``, or decreases.

    Example:
        >>> check_schedule(lambda p: p ** 0.5)
        >>> check_schedule(lambda p: 1 - p)
        Traceback (most recent call last):
        ...
        lightning_varbatch.errors.SettingValueError: length_warmup_schedule=<lambda> decreases ...
    """
    _fractions(fn, _PROBES)


def schedule_values(schedule: ScheduleName | ScheduleFn, warmup: int | None) -> str:
    """What a schedule is, for a settings fingerprint: a name, or a callable by its values.

    The values at every warm-up step's progress (``s / warmup``), the only points the planner
    reads: a replaced schedule of other values is told apart.

    Example:
        >>> schedule_values("root", 10)
        'root'
        >>> schedule_values(lambda p: p * p, 4) == schedule_values(lambda p: p**2, 4)
        True
    """
    if isinstance(schedule, str) or not callable(schedule):
        return str(schedule)
    progress = np.arange(warmup or 0, dtype=np.float64) / max(warmup or 1, 1)
    values = np.round(_fractions(schedule, progress), 12)
    return "values " + hashlib.sha1(values.tobytes()).hexdigest()[:12]


def scheduled_caps(
    schedule: ScheduleName | ScheduleFn, warmup: int, low: int, high: int, *, first: int
) -> np.ndarray:
    """The scheduled cap of warm-up steps ``first, ..., warmup - 1`` of the run.

    Step ``s`` is at progress ``p = s / warmup``: ``"linear"`` ``low + p (high - low)``,
    ``"root"`` ``low + √p (high - low)`` (Li et al. 2022), ``"step"`` ``low · 2^⌊p k⌋`` in ``k``
    stages to ``high``, a callable ``low + f(p) (high - low)``; whole tokens in ``[low, high]``.

    Returns:
        ``int64`` caps, one per remaining warm-up step (empty when ``first >= warmup``).

    Example:
        >>> scheduled_caps("step", 8, 8, 64, first=0).tolist()
        [8, 8, 16, 16, 32, 32, 64, 64]
        >>> scheduled_caps("root", 4, 8, 64, first=2).tolist()
        [47, 56]
    """
    progress = np.arange(max(first, 0), warmup, dtype=np.float64) / warmup
    high = max(high, low)
    if schedule == "step":
        stages = math.ceil(math.log2(high / low)) + 1 if high > low else 1
        caps = low * np.exp2(np.floor(progress * stages))
    else:
        if schedule == "linear":
            frac = progress
        elif schedule == "root":
            frac = np.sqrt(progress)
        else:
            frac = _fractions(schedule, progress)  # type: ignore[arg-type]
        caps = low + frac * (high - low)
    return np.clip(np.floor(caps + 1e-9), low, high).astype(np.int64)


def light_steps(micro_batch_cost: np.ndarray, assign: np.ndarray) -> np.ndarray:
    """Steps under 90 % of the median step's cost: they run last, so no warm-up step is short.

    Example:
        >>> light_steps(np.array([10.0, 10.0, 1.0]), np.array([[[0]], [[1]], [[2]]])).tolist()
        [False, False, True]
    """
    cost = (
        micro_batch_cost[assign]
        .reshape(assign.shape[0], int(np.prod(assign.shape[1:])))
        .sum(axis=1)
    )
    if cost.size == 0:
        return np.zeros(0, dtype=bool)
    return np.asarray(cost < 0.9 * np.median(cost))


def warmup_order(
    step_longest: np.ndarray, caps: np.ndarray, floor: int, light: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Reorder steps so that warm-up position ``s`` holds no example longer than its cap.

    Args:
        step_longest: the longest example of every step, in the ordinary order.
        caps: the scheduled cap of each warm-up position (non-decreasing).
        floor: the cap already reached before the first position (a resumed remainder).
        light: steps far below the budget (:func:`light_steps`): they go last.

    Returns:
        ``(perm, realised)``: ``perm`` indexes the ordinary order (the warm-up positions first,
        then the others, light ones last); ``realised[s]`` is the cap position ``s`` ran under
        (non-decreasing, above the schedule where it advanced).
    """
    if light is not None and light.any() and not light.all():
        full, last = np.flatnonzero(~light), np.flatnonzero(light)
        perm, realised = warmup_order(step_longest[full], caps, floor)
        return np.concatenate((full[perm], last)), realised
    n = step_longest.shape[0]
    count = min(n, caps.shape[0])
    by_length = np.argsort(step_longest, kind="stable")
    ladder = step_longest[by_length]
    pool: list[int] = []
    pushed = 0
    cap = int(floor)
    taken = np.zeros(n, dtype=bool)
    perm = np.empty(n, dtype=np.int64)
    realised = np.empty(count, dtype=np.int64)
    for s in range(count):
        cap = max(cap, int(caps[s]))
        if not pool and pushed < n and ladder[pushed] > cap:
            cap = int(ladder[pushed])  # nothing left fits: the schedule advances
        fits = int(np.searchsorted(ladder, cap, side="right"))
        for j in by_length[pushed:fits].tolist():
            heapq.heappush(pool, j)
        pushed = max(pushed, fits)
        step = heapq.heappop(pool)
        perm[s], taken[step], realised[s] = step, True, cap
    perm[count:] = np.flatnonzero(~taken)
    return perm, realised


@dataclass(frozen=True)
class LengthWarmupTrace:
    """What the length warm-up did to one plan (``plan.length_warmup``).

    Attributes:
        first_step: the run's optimizer step this plan's step 0 is.
        scheduled: the scheduled cap of each warm-up step of this plan, in plan order.
        realised: the cap each warm-up step ran under (above ``scheduled`` where it advanced).
        step_longest: the longest example (planning key) of every step of the plan.
        levels: a mixture's only: the run's step whose caps each warm-up step ran under.
        dataset_scheduled: a mixture's only: ``(datasets, steps)`` scheduled caps
            (``scheduled`` and ``realised`` are then the largest over the datasets).
        dataset_realised: a mixture's only: ``(datasets, steps)`` realised caps.

    Example:
        >>> t = LengthWarmupTrace(0, np.array([8, 16]), np.array([8, 20]), np.array([8, 20, 9]))
        >>> t.num_steps, t.advanced.tolist(), t.advanced_by.tolist()
        (2, [1], [4])
    """

    first_step: int
    scheduled: np.ndarray
    realised: np.ndarray
    step_longest: np.ndarray
    levels: np.ndarray | None = None
    dataset_scheduled: np.ndarray | None = None
    dataset_realised: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        """Warm-up steps in this plan."""
        return int(self.scheduled.shape[0])

    @property
    def raised(self) -> np.ndarray:
        """Tokens each warm-up step's cap ran above its schedule (any dataset's, in a mixture)."""
        raised = self.realised - self.scheduled
        if self.dataset_realised is not None and self.dataset_scheduled is not None:
            own = (self.dataset_realised - self.dataset_scheduled).max(axis=0, initial=0)
            raised = np.maximum(raised, own)
        return np.asarray(raised)

    @property
    def advanced(self) -> np.ndarray:
        """Plan steps where the schedule advanced (no step left fitted under its cap)."""
        return np.flatnonzero(self.raised > 0)

    def cap_at(self, step: int) -> int | None:
        """The realised cap of the run's optimizer ``step`` (``None`` outside the warm-up).

        Example:
            >>> t = LengthWarmupTrace(2, np.array([8, 16]), np.array([8, 20]), np.array([8, 20]))
            >>> t.cap_at(3), t.cap_at(4), t.cap_at(1)
            (20, None, None)
        """
        index = step - self.first_step
        return int(self.realised[index]) if 0 <= index < self.num_steps else None

    @property
    def advanced_by(self) -> np.ndarray:
        """How many tokens the cap was raised at each of :attr:`advanced`."""
        return self.raised[self.advanced]
