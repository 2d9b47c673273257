"""New per-rank shares from each rank's measured speed: smoothed, with a dead band.

A rank's **speed** is the planned work it ran per second of its own compute; shares in proportion
make a step's ranks finish together. :func:`balanced_shares` sets them from speeds smoothed over
periods (:func:`smoothed_speeds`), in a dead band, from its arguments alone: the same on every rank.

Example:
    >>> balanced_shares([2.0, 4.0], [100.0, 100.0], [1.0, 1.0])  # the first measurement
    (1.0, 0.5)
    >>> balanced_shares([4.0, 4.0], [100.0, 100.0], [1.0, 0.5], previous=(1.0, 0.5))
    (1.0, 0.7071067811865476)
    >>> balanced_shares([2.0, 2.1], [100.0, 100.0], [1.0, 1.0])  # within the 5 % dead band
    (1.0, 1.0)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence

import numpy as np

from lightning_varbatch.checks import check_real
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.rank_shares import check_rank_shares

__all__ = ["balanced_shares", "rank_speeds", "smoothed_speeds"]


def _measurements(name: str, values: object, what: str) -> np.ndarray:
    """``values`` as a 1-d float array of positive finite numbers (one per rank)."""
    if isinstance(values, np.ndarray):
        values = values.tolist()
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise SettingTypeError(
            f"{name} must be a non-empty list with one number per rank ({what}), got "
            f"{values!r:.60}.",
            setting=name,
            value=values,
        )
    out = []
    for rank, value in enumerate(values):
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise SettingTypeError(
                f"{name}[{rank}] ({what} of rank {rank}) must be a number, got {value!r:.40} "
                f"({type(value).__name__}).",
                setting=name,
                value=values,
            )
        number = float(value)
        if not math.isfinite(number) or number <= 0:
            raise SettingValueError(
                f"{name}[{rank}] ({what} of rank {rank}) must be a positive finite number, got "
                f"{number!r}: a rank must have run and been timed on some work before its speed "
                "can be measured.",
                setting=name,
                value=values,
            )
        out.append(number)
    return np.asarray(out, dtype=np.float64)


def rank_speeds(
    seconds: Sequence[float] | np.ndarray, work: Sequence[float] | np.ndarray
) -> tuple[float, ...]:
    """Every rank's speed: planned work per second of its own compute.

    Args:
        seconds: each rank's measured compute seconds.
        work: each rank's planned work (cost units) in those seconds.

    Raises:
        SettingTypeError: for a value that is not a list of numbers.
        SettingValueError: for unequal lengths or a value ≤ 0, NaN or infinite (naming the rank).

    Example:
        >>> rank_speeds([2.0, 4.0], [100, 100])
        (50.0, 25.0)
    """
    secs = _measurements("seconds", seconds, "measured compute seconds")
    units = _measurements("work", work, "planned work")
    if secs.size != units.size:
        raise SettingValueError(
            f"seconds has {secs.size} entries but work has {units.size}: give one of each per "
            "rank (rank 0 first).",
            setting="work",
            value=work,
        )
    return tuple(float(v) for v in units / secs)


def balanced_shares(
    seconds: Sequence[float] | np.ndarray,
    work: Sequence[float] | np.ndarray,
    current: Sequence[float] | np.ndarray,
    *,
    smoothing: float = 0.5,
    tolerance: float = 0.05,
    min_share: float | None = None,
    previous: Sequence[float] | np.ndarray | None = None,
) -> tuple[float, ...]:
    """The shares for the next period, from one period's measured speeds and the shares in force.

    The smoothed speeds ``t`` (:func:`smoothed_speeds`) replace the shares ``s`` (both largest 1)
    unless every ``|t_r / s_r - 1| < tolerance``; each share is then raised to ``min_share``.

    Args:
        seconds: each rank's measured compute seconds in the period (rank 0 first).
        work: each rank's planned work in the period, in the plan's cost units.
        current: the shares in force during the period (``rank_shares``; any positive scale).
        smoothing: the weight of the earlier periods' speeds, in ``[0, 1)`` (0: this period's).
        tolerance: the dead band, in ``[0, 1)``.
        min_share: the least share (of the largest, 1), in ``(0, 1]``; ``None``: no floor.
        previous: the earlier smoothed speeds (:func:`smoothed_speeds`); ``None``: the first period.

    Returns:
        One share per rank, the largest exactly 1.0 (before ``min_share``).

    Raises:
        SettingTypeError: for a setting or measurement of the wrong type.
        SettingValueError: unequal lists, a value not positive and finite, a setting out of range.

    Example:
        >>> balanced_shares([1.0, 1.0, 3.0], [90, 90, 90], [1, 1, 1], smoothing=0.0, min_share=0.5)
        (1.0, 1.0, 0.5)
    """
    speed = np.asarray(smoothed_speeds(seconds, work, previous, smoothing=smoothing))
    shares = check_rank_shares(current)
    assert shares is not None
    if len(shares) != speed.size:
        raise SettingValueError(
            f"rank_shares has {len(shares)} entries but {speed.size} ranks were measured: give "
            "the shares in force, one per rank.",
            setting="rank_shares",
            value=tuple(shares),
        )
    tolerance = check_real(
        "tolerance", tolerance, minimum=0.0, maximum=0.99, strict=False, what=" (the dead band)"
    )
    floor = 0.0
    if min_share is not None:
        floor = check_real(
            "min_share", min_share, maximum=1.0, what=" (the least share, of the largest 1)"
        )
    old = np.asarray(shares, dtype=np.float64)
    old /= old.max()
    target = speed / speed.max()
    new = old if np.all(np.abs(target / old - 1.0) < tolerance) else target
    new = np.maximum(new, floor)
    return tuple(float(s) for s in new)


def _check_smoothing(smoothing: object) -> float:
    value = check_real(
        "smoothing", smoothing, minimum=0.0, strict=False, what=" (the weight of earlier periods)"
    )
    if value >= 1.0:
        raise SettingValueError(
            f"smoothing must be in [0, 1), got {value!r}: at 1 the speeds never move; use "
            "e.g. smoothing=0.5 (half the way per period), or do not balance.",
            setting="smoothing",
            value=smoothing,
        )
    return value


def smoothed_speeds(
    seconds: Sequence[float] | np.ndarray,
    work: Sequence[float] | np.ndarray,
    previous: Sequence[float] | np.ndarray | None = None,
    *,
    smoothing: float = 0.5,
) -> tuple[float, ...]:
    """This period's speeds, smoothed with the earlier periods', as ratios (the largest 1).

    ``previous ** smoothing * measured ** (1 - smoothing)``, or the measured speeds alone.

    Raises:
        SettingValueError: a bad measurement or ``previous``, or ``smoothing`` outside ``[0, 1)``.

    Example:
        >>> smoothed_speeds([1.0, 2.0], [10.0, 10.0])
        (1.0, 0.5)
        >>> smoothed_speeds([1.0, 1.0], [10.0, 10.0], previous=(1.0, 0.25))
        (1.0, 0.5)
    """
    smoothing = _check_smoothing(smoothing)
    speed = np.asarray(rank_speeds(seconds, work))
    speed /= speed.max()
    if previous is not None:
        earlier = _measurements("previous", previous, "smoothed speed")
        if earlier.size != speed.size:
            raise SettingValueError(
                f"previous has {earlier.size} entries but {speed.size} ranks were measured: "
                "pass the smoothed speeds of the same ranks (or None to start afresh).",
                setting="previous",
                value=previous,
            )
        speed = np.exp(
            smoothing * np.log(earlier / earlier.max()) + (1.0 - smoothing) * np.log(speed)
        )
        speed /= speed.max()
    return tuple(float(v) for v in speed)
