"""The batch-size schedule: tokens per optimizer step as a function of the tokens trained.

A schedule gives the fraction of the full step (every rank's budget × accumulation) a step holds
once the run has trained ``t`` tokens (planning lengths: ``max(source, target)`` for pairs):
Megatron-LM's thresholds in tokens, ``"0:0.25 2M:0.5 8M:1"`` (suffixes K, M, B/G, T), a linear ramp
``"ramp:0.25:8M"`` (0.25 to 1 over 8M tokens), ``[(tokens, fraction), ...]``, ``{tokens: fraction}``
or a callable ``tokens -> fraction``, all made thresholds (:class:`BatchSchedule`; a ramp or
callable in levels at most 1 % apart, each the fraction at its start). Each level's examples are
planned at its fraction of every rank's budget, in whole steps: a level's left-over joins the next,
whose first step may begin up to a step's tokens early (``docs/batch-schedule.md``).

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
    "MIN_LEVEL_STEPS",
    "BatchSchedule",
    "ScheduleSpec",
    "check_batch_schedule",
    "check_schedule_setting",
]

ScheduleSpec: TypeAlias = (
    str | Sequence[tuple[float, float]] | Mapping[float, float] | Callable[[float], float]
)
#: Ramp or callable levels are at most this far apart: a step's fraction ≤ 1 % below the schedule.
LEVEL_STEP = 1.01
#: A ramp's levels are merged at plan time so that each spans at least this many of its steps.
MIN_LEVEL_STEPS = 4
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
        raise _error(
            f"{value!r} is not a fraction of the full step: write a number in (0, 1], "
            "e.g. 0.5 for half of it",
            spec,
        ) from None
    if math.isnan(fraction):
        raise _error(
            "every fraction of the full step must be a number in (0, 1], got nan: write "
            "e.g. 0.5 for half of it",
            spec,
        )
    if fraction <= 0:
        raise _error(
            f"every fraction of the full step must be in (0, 1], got {fraction:g}: a step "
            "must hold tokens; start above 0, e.g. '0:0.1 1M:1', 'ramp:0.1:1M' or "
            "min(1.0, 0.1 + tokens / 1e6) in place of a warm-up from 0",
            spec,
        )
    if fraction > 1:
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
        fractions: the fraction of the full step from each threshold, non-decreasing, the last 1.
        ramp: ``(start, tokens)`` of a ramp (its levels are ``tokens`` / ``fractions``).
    """

    tokens: tuple[int, ...]
    fractions: tuple[float, ...]
    ramp: tuple[float, int] | None = None

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
                raise _error(
                    f"{item!r} is not 'TOKENS:FRACTION': write each threshold as e.g. "
                    "'2M:0.5' (from 2M tokens trained, half the full step)",
                    text,
                )
            tokens, fraction = item.split(":")
            points.append((_tokens(tokens, text), _fraction(fraction, text)))
        return _thresholds(points, text)

    @property
    def text(self) -> str:
        """The canonical text (what the settings hold and a checkpoint records)."""
        if self.ramp is not None:
            return f"ramp:{self.ramp[0]!r}:{self.ramp[1]}"
        return " ".join(f"{t}:{f!r}" for t, f in zip(self.tokens, self.fractions, strict=True))

    def levels_for(self, step_tokens: int) -> BatchSchedule:
        """The levels to plan with full steps of ``step_tokens`` (thresholds: as given).

        A ramp's levels are merged so that each spans at least :data:`MIN_LEVEL_STEPS` of
        its steps: a level of about one step would end in an under-filled one.

        Example:
            >>> BatchSchedule.parse("ramp:0.5:1000").levels_for(100).fractions
            (0.5, 0.604054, 0.729764, 0.881634, 1.0)
        """
        if self.ramp is None:
            return self
        keep = [0]
        for i in range(1, len(self.tokens) - 1):
            span = MIN_LEVEL_STEPS * self.fractions[keep[-1]] * step_tokens
            if self.tokens[i] - self.tokens[keep[-1]] >= span:
                keep.append(i)
        keep.append(len(self.tokens) - 1)
        tokens, fractions = (tuple(v[i] for i in keep) for v in (self.tokens, self.fractions))
        return BatchSchedule(tokens, fractions, self.ramp)  # type: ignore[arg-type]

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


def _levels(
    fraction: Callable[[float], float], start: float, end: int, name: str
) -> list[tuple[int, float]]:
    """Thresholds of a non-decreasing ``fraction`` on a grid up to ``end``, levels ≥1 % apart.

    One decreasing between grid points is refused (``name``: the callable), as in text form.
    """
    grid = np.unique(np.linspace(0, end, _SAMPLES + 1).round().astype(np.int64))
    points, level, last = [(0, start)], start, (0, start)
    for t in grid[1:].tolist():
        value = fraction(t)
        if value < last[1]:
            raise _error(
                f"the callable decreases between {last[0]} and {t} tokens ({last[1]:g} -> "
                f"{value:g}): a step's size may only grow; return the running maximum",
                name,
            )
        last = (t, value)
        if value >= 1.0:  # the full step from the first sample that reaches it
            break
        if value >= level * LEVEL_STEP:
            points.append((t, round(value, 6)))
            level = value
    points.append((t, 1.0))
    return points


def _ramp(start: float, tokens: int, spec: object) -> BatchSchedule:
    if tokens <= 0 or start == 1.0:
        return BatchSchedule((0,), (1.0,))
    count = math.ceil(math.log(1 / start) / math.log(LEVEL_STEP))
    values = [start] + [round(start * LEVEL_STEP**k, 6) for k in range(1, count)]
    at = [math.ceil((v - start) / (1 - start) * tokens) for v in values]
    points: dict[int, float] = {}  # a short ramp: levels on one token, the higher one kept
    for t, v in zip(at, values, strict=True):
        if t < tokens:
            points[t] = v
    levels = _thresholds([*points.items(), (tokens, 1.0)], spec)
    return BatchSchedule(levels.tokens, levels.fractions, (start, tokens))


def _from_callable(fn: Callable[[float], float], max_tokens: int) -> BatchSchedule:
    def value(tokens: float) -> float:
        try:
            result = fn(tokens)
        except Exception as error:  # the user's callable: say where it failed
            raise _error(
                f"the callable raised {type(error).__name__}: {error} at {tokens:g} tokens; "
                "it must map any token count >= 0 to a fraction in (0, 1]",
                name,
            ) from error
        return _fraction(result, name)

    name = getattr(fn, "__qualname__", repr(fn))
    end = max_tokens
    while value(end) < 1.0:
        end *= 2
        if end > 2**60:
            raise _error(
                "the callable never reaches 1 (the full step): return 1.0 once the "
                "full step is reached, e.g. min(1.0, 0.25 + tokens / 8e6)",
                name,
            )
    return _thresholds(_levels(value, value(0), end, name), name)


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
                raise _error(
                    f"{item!r} is not a (tokens, fraction) pair: write each as e.g. "
                    "(2_000_000, 0.5) or ('2M', 0.5)",
                    spec,
                )
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
        need = 1 / config.max_tokens
        raise _error(
            f"its first fraction leaves no token of max_tokens={config.max_tokens}: start "
            f"at a fraction of at least {need:.4g}, or raise max_tokens",
            text,
        )
    return text
