"""The batch-size schedule: tokens per optimizer step as a function of the tokens trained.

A schedule gives the fraction of the full step (every rank's budget × accumulation) that a
step holds once the run has trained ``t`` tokens (planning lengths: ``max(source, target)``
for pairs). It is written as Megatron-LM's thresholds in tokens, ``"0:0.25 2M:0.5 8M:1"``
(suffixes K, M, B/G, T), as a linear ramp ``"ramp:0.25:8M"`` (from 0.25 to 1 over 8M
tokens), as ``[(tokens, fraction), ...]`` or ``{tokens: fraction}``, or as a callable
``tokens -> fraction``. Every form becomes thresholds (:class:`BatchSchedule`): a ramp or
a callable in levels at most 1 % apart, each level the fraction at its start (a step never
holds more than its schedule says). The planner plans each level's examples at that fraction
of every rank's budget (``docs/batch-schedule.md``).

Example:
    >>> schedule = BatchSchedule.parse("0:0.25 2M:0.5 8M:1")
    >>> schedule.text, schedule.fraction_at(3_000_000)
    ('0:0.25 2000000:0.5 8000000:1.0', 0.5)
    >>> BatchSchedule.parse("ramp:0.5:1000").num_levels
    71
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = [
    "LEVEL_STEP",
    "BatchSchedule",
    "ScheduleSpec",
    "check_batch_schedule",
    "check_schedule_setting",
]

ScheduleSpec: TypeAlias = (
    str | Sequence[tuple[float, float]] | Mapping[float, float] | Callable[[float], float]
)
#: Ramps and callables become levels at most this far apart (relative): a step's fraction is
#: within 1 % below the schedule's value at any token of its level.
LEVEL_STEP = 1.01
_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}
_TOKENS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*$", re.I)
_SAMPLES = 512  # a callable is read at this many points up to where it reaches 1
_SETTING = "batch_schedule"


def _error(message: str, value: object) -> SettingValueError:
    return SettingValueError(
        f"batch_schedule={value!r}: {message} (docs/batch-schedule.md).",
        setting=_SETTING,
        value=value,
    )


def _tokens(text: str, spec: object) -> int:
    match = _TOKENS.match(text)
    if match is None:
        raise _error(f"{text!r} is not a token count: write e.g. 0, 500000, 2M or 1.5B", spec)
    return round(float(match.group(1)) * _SUFFIX[match.group(2).upper()])


def _fraction(value: object, spec: object) -> float:
    try:
        fraction = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise _error(f"{value!r} is not a fraction of the full step", spec) from None
    if not 0 < fraction <= 1:
        raise _error(
            f"every fraction of the full step must be in (0, 1], got {fraction:g}: the full "
            "step (1) is every rank's budget times the accumulation; raise max_tokens or "
            "accumulate_grad_batches for a larger one",
            spec,
        )
    return fraction


@dataclass(frozen=True)
class BatchSchedule:
    """A schedule as thresholds: ``fractions[i]`` of the full step from ``tokens[i]`` on.

    Attributes:
        tokens: the thresholds in tokens trained, increasing, the first 0.
        fractions: the fraction of the full step from each threshold, non-decreasing, the
            last 1.
    """

    tokens: tuple[int, ...]
    fractions: tuple[float, ...]

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def parse(text: str) -> BatchSchedule:
        """The schedule written as ``text`` (thresholds, or ``"ramp:start:tokens"``)."""
        if text.strip().lower().startswith("ramp"):
            parts = text.strip().split(":")
            if len(parts) != 3:
                raise _error("write a ramp as 'ramp:START_FRACTION:TOKENS'", text)
            return _ramp(_fraction(parts[1], text), _tokens(parts[2], text), text)
        points = []
        for item in text.split():
            if item.count(":") != 1:
                raise _error(f"{item!r} is not 'TOKENS:FRACTION'", text)
            tokens, fraction = item.split(":")
            points.append((_tokens(tokens, text), _fraction(fraction, text)))
        return _thresholds(points, text)

    @property
    def text(self) -> str:
        """The canonical text (what the settings hold and a checkpoint records)."""
        return " ".join(f"{t}:{f!r}" for t, f in zip(self.tokens, self.fractions, strict=True))

    @property
    def num_levels(self) -> int:
        """The thresholds (levels of constant fraction), the last one (1) included."""
        return len(self.tokens)

    @property
    def full_from(self) -> int:
        """Tokens from which every step is a full one."""
        return self.tokens[-1]

    @property
    def smallest(self) -> float:
        """The smallest fraction (the first)."""
        return self.fractions[0]

    def fraction_at(self, tokens: float) -> float:
        """The fraction of the full step once ``tokens`` were trained."""
        i = int(np.searchsorted(np.asarray(self.tokens), tokens, side="right")) - 1
        return self.fractions[max(i, 0)]


def _thresholds(points: Sequence[tuple[int, float]], spec: object) -> BatchSchedule:
    if not points:
        raise _error("the schedule is empty; write e.g. '0:0.25 2M:0.5 8M:1'", spec)
    tokens = [t for t, _ in points]
    fractions = [f for _, f in points]
    if tokens[0] != 0:
        raise _error(f"the first threshold must be 0 tokens, got {tokens[0]}", spec)
    for i in range(1, len(points)):
        if tokens[i] <= tokens[i - 1]:
            raise _error(
                f"thresholds must increase: {tokens[i]} tokens comes after {tokens[i - 1]}",
                spec,
            )
        if fractions[i] < fractions[i - 1]:
            raise _error(
                f"the schedule decreases at {tokens[i]} tokens ({fractions[i - 1]:g} -> "
                f"{fractions[i]:g}): a step's size may only grow",
                spec,
            )
    if fractions[-1] != 1.0:
        raise _error(
            f"the last fraction must be 1 (the full step), got {fractions[-1]:g}: lower "
            "max_tokens or accumulate_grad_batches for a smaller full step",
            spec,
        )
    keep = [0] + [i for i in range(1, len(points)) if fractions[i] > fractions[i - 1]]
    return BatchSchedule(tuple(tokens[i] for i in keep), tuple(fractions[i] for i in keep))


def _levels(fraction: Callable[[float], float], start: float, end: int) -> list[tuple[int, float]]:
    """Thresholds of a non-decreasing ``fraction`` on a grid up to ``end``, levels ≥1 % apart."""
    grid = np.unique(np.linspace(0, end, _SAMPLES + 1).round().astype(np.int64))
    points, level = [(0, start)], start
    for t in grid[1:-1].tolist():
        value = fraction(t)
        if value >= level * LEVEL_STEP:
            points.append((t, value))
            level = value
    points.append((end, 1.0))
    return points


def _ramp(start: float, tokens: int, spec: object) -> BatchSchedule:
    if tokens <= 0 or start == 1.0:
        return BatchSchedule((0,), (1.0,))
    count = math.ceil(math.log(1 / start) / math.log(LEVEL_STEP))
    values = [start * LEVEL_STEP**k for k in range(count)]
    at = [math.ceil((v - start) / (1 - start) * tokens) for v in values]
    points = [(t, v) for t, v in zip(at, values, strict=True) if t < tokens] + [(tokens, 1.0)]
    return _thresholds(points, spec)


def _from_callable(fn: Callable[[float], float], max_tokens: int) -> BatchSchedule:
    def value(tokens: float) -> float:
        try:
            return _fraction(fn(tokens), name)
        except SettingValueError as error:
            raise _error(f"at {tokens:g} tokens: {error}", name) from None

    name = getattr(fn, "__qualname__", repr(fn))
    end = max_tokens
    while value(end) < 1.0:
        end *= 2
        if end > 2**60:
            raise _error("the callable never reaches 1 (the full step)", name)
    return _thresholds(_levels(value, value(0), end), name)


def check_batch_schedule(spec: object, max_tokens: int) -> str | None:
    """``PlanConfig.batch_schedule`` checked, as its canonical text (``None``: no schedule).

    Raises:
        SettingTypeError: for a value of another kind.
        SettingValueError: for a bad threshold or fraction, naming ``batch_schedule``.

    Example:
        >>> check_batch_schedule({0: 0.5, "1K": 1}, 64)
        '0:0.5 1000:1.0'
    """
    if spec is None or isinstance(spec, BatchSchedule):
        return None if spec is None else spec.text
    if isinstance(spec, str):
        schedule = BatchSchedule.parse(spec)
    elif callable(spec):
        schedule = _from_callable(spec, max_tokens)
    elif isinstance(spec, (Mapping, Sequence)):
        items: Any = spec.items() if isinstance(spec, Mapping) else spec
        points = []
        for item in items:
            if not isinstance(item, (tuple, list)) or len(item) != 2:
                raise _error(f"{item!r} is not a (tokens, fraction) pair", spec)
            points.append((_tokens(str(item[0]), spec), _fraction(item[1], spec)))
        schedule = _thresholds(points, spec)
    else:
        raise SettingTypeError(
            f"batch_schedule must be a string such as '0:0.25 2M:0.5 8M:1' or "
            f"'ramp:0.25:8M', (tokens, fraction) pairs or a callable, got "
            f"{type(spec).__name__} {spec!r}.",
            setting=_SETTING,
            value=spec,
        )
    return None if schedule.num_levels == 1 else schedule.text


def check_schedule_setting(config: Any) -> str | None:
    """A ``PlanConfig``'s ``batch_schedule``, checked with the settings it cannot go with.

    Raises:
        SettingValueError: besides a bad schedule, one with ``max_shapes`` or a length
            warm-up, or one whose first fraction leaves no token of ``max_tokens``.
    """
    text = check_batch_schedule(config.batch_schedule, config.max_tokens)
    if text is None:
        return None
    clashes = {
        "max_shapes": "the shapes are chosen once for the full budget; a step at a fraction "
        "of it would need other shapes (and compiled graphs for them)",
        "length_warmup": "both choose which examples the first steps hold; run the warm-up "
        "in one fit and the schedule from the next, or use one of them",
    }
    for name, why in clashes.items():
        if getattr(config, name) is not None:
            raise SettingValueError(
                f"batch_schedule={text!r} cannot be combined with {name}="
                f"{getattr(config, name)!r}: {why}. Unset {name} or batch_schedule.",
                setting=_SETTING,
                value=text,
            )
    if int(config.max_tokens * BatchSchedule.parse(text).smallest) < 1:
        raise _error(f"its first fraction leaves no token of max_tokens={config.max_tokens}", text)
    return text
