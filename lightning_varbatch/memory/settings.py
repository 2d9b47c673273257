"""The settings of :func:`~lightning_varbatch.memory.find_max_tokens`, checked before any probe.

:func:`search_settings` checks every argument (the search's, the plan settings through
:class:`~lightning_varbatch.PlanConfig`, the lengths as the planner does) and resolves the range
into a :class:`Search`: a bad setting is reported as such, never as "no budget fits".

Example:
    >>> s = search_settings(lambda b, n: b * n, [30, 60, 90], 10**6, bounds=(90, 9000))
    >>> s.low, s.high, s.step, s.needed, s.allowed
    (90, 9000, 9, 90, 900000.0)
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
import numpy.typing as npt

from lightning_varbatch.checks import check_count, check_real
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.memory.prediction import planning_lengths, single_budget
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["Search", "check_plan_settings", "search_settings"]


@dataclass(frozen=True)
class Search:
    """Checked settings of one budget search and the range they resolve to.

    The arguments of :func:`~lightning_varbatch.memory.find_max_tokens` (``limit`` is its
    ``memory_limit_bytes``, ``plan_settings`` checked into ``config``), and:

    Attributes:
        allowed: ``limit * (1 - margin)``: what a predicted peak may reach.
        grid: the candidates, sorted and distinct (``None``: bisection of ``low .. high``).
        low, high: the smallest and largest budget of the range.
        step: the resolution of the bisection (``None`` with candidates).
        longest: the longest planning length, padded to ``pad_to_multiple_of``.
        needed: the smallest budget that holds the longest example.
    """

    lengths: npt.ArrayLike
    limit: int
    margin: float
    allowed: float
    probes: int
    rounds: int
    epochs: int
    world_size: int
    plan_settings: dict[str, Any]
    config: PlanConfig
    grid: list[int] | None
    low: int
    high: int
    step: int | None
    longest: int
    needed: int

    @property
    def probe_top(self) -> int:
        """The tokens of the largest initial probe: the lower quarter of the range."""
        return max(self.longest, self.low + (self.high - self.low) // 4)


def search_settings(
    run_batch: Callable[[int, int], int | float],
    lengths: npt.ArrayLike,
    memory_limit_bytes: int,
    *,
    candidates: Iterable[int] | None = None,
    bounds: tuple[int, int] | None = None,
    step: int | None = None,
    probes: int = 4,
    margin: float = 0.1,
    rounds: int = 3,
    epochs: int = 1,
    world_size: int = 1,
    plan_settings: dict[str, Any] | None = None,
) -> Search:
    """Check the arguments of :func:`~lightning_varbatch.memory.find_max_tokens`, in order.

    Raises:
        SettingTypeError, SettingValueError: as :func:`~lightning_varbatch.memory.find_max_tokens`.
    """
    limit = check_count("memory_limit_bytes", memory_limit_bytes, what=" (bytes)")
    _check_run_batch(run_batch)
    margin = _check_margin(margin)
    probes = check_count("probes", probes, minimum=3)
    rounds = check_count("rounds", rounds)
    epochs = check_count("epochs", epochs)
    world_size = check_count("world_size", world_size)
    step = check_count("step", step, allow_none=True)
    grid = None if candidates is None else _check_candidates(candidates)
    pair = _check_bounds(bounds) if grid is None and bounds is not None else None
    settings = dict(plan_settings or {})
    config = check_plan_settings(settings, grid[-1] if grid else 2**62)
    longest, needed, (low, high) = _budget_range(config, planning_lengths(lengths), grid, pair)
    if grid is None and step is None:
        step = max(config.pad_to_multiple_of, math.ceil((high - low) / 1024))
    return Search(
        lengths=lengths,
        limit=limit,
        margin=margin,
        allowed=limit * (1 - margin),
        probes=probes,
        rounds=rounds,
        epochs=epochs,
        world_size=world_size,
        plan_settings=settings,
        config=config,
        grid=grid,
        low=low,
        high=high,
        step=step,
        longest=longest,
        needed=needed,
    )


def _budget_range(
    config: PlanConfig,
    planning: np.ndarray,
    grid: list[int] | None,
    pair: tuple[int, int] | None,
) -> tuple[int, int, tuple[int, int]]:
    """``(longest padded, budget that holds it, (low, high))``; refuses a range below it."""
    multiple = config.pad_to_multiple_of
    index = int(planning.argmax())
    raw_longest = int(planning[index])
    longest = -(-raw_longest // multiple) * multiple
    needed = single_budget(config, raw_longest)  # the budget that holds the longest example
    if grid is not None:
        low, high = grid[0], grid[-1]
    else:
        low, high = pair or (longest, 64 * max(longest, needed))
    if config.oversize == "error" and high < needed:
        _refuse_range(config, grid, (low, high), index, raw_longest, longest, needed)
    return longest, needed, (low, high)


def _check_run_batch(run_batch: object) -> None:
    if not callable(run_batch):
        raise SettingTypeError(
            f"run_batch must be callable as run_batch(examples, length) -> peak bytes, got "
            f"{run_batch!r} ({type(run_batch).__name__}).",
            setting="run_batch",
            value=run_batch,
        )


def _check_margin(margin: object) -> float:
    checked = check_real("margin", margin, minimum=0.0, maximum=1.0, strict=False)
    if checked == 1.0:
        raise SettingValueError(
            "margin must be a finite number >= 0 and < 1 (the share of the limit kept free), "
            "got 1.0: nothing would be left to fill; pass e.g. margin=0.1.",
            setting="margin",
            value=checked,
        )
    return checked


def _check_candidates(candidates: object) -> list[int]:
    if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
        raise SettingTypeError(
            f"candidates must be an iterable of budgets (e.g. range(1024, 65537, 1024)), "
            f"got {candidates!r} ({type(candidates).__name__}).",
            setting="candidates",
            value=candidates,
        )
    grid = sorted({check_count("candidates", c) for c in candidates})
    if not grid:
        raise SettingValueError(
            "candidates is empty: pass the budgets to choose from, e.g. "
            "candidates=range(1024, 65537, 1024) (or leave it unset to search bounds=).",
            setting="candidates",
            value=candidates,
        )
    return grid


def _check_bounds(bounds: object) -> tuple[int, int]:
    pair = tuple(bounds) if isinstance(bounds, (tuple, list)) else None
    if pair is None or len(pair) != 2:
        raise SettingTypeError(
            f"bounds must be a (low, high) pair of budgets, got {bounds!r}.",
            setting="bounds",
            value=bounds,
        )
    low, high = (check_count("bounds", b) for b in pair)
    if low > high:
        raise SettingValueError(
            f"bounds must be (low, high) with low <= high, got {bounds!r}.",
            setting="bounds",
            value=bounds,
        )
    return low, high


def check_plan_settings(settings: dict[str, Any], top: int) -> PlanConfig:
    """Validate the plan settings before any probe runs (``max_tokens`` is the one searched).

    Raises:
        SettingValueError: for ``max_tokens`` among them.
        SettingTypeError: for a name that is no plan setting (with the closest one, if any).

    Example:
        >>> check_plan_settings({"max_examples": 64}, top=4096).max_examples
        64
    """
    if "max_tokens" in settings:
        raise SettingValueError(
            f"find_max_tokens chooses max_tokens itself, got max_tokens="
            f"{settings['max_tokens']!r}: pass the budgets to choose from as candidates= (or "
            "bounds= and step=) instead.",
            setting="max_tokens",
            value=settings["max_tokens"],
        )
    for name in ("rank_shares", "rank_max_tokens"):
        if settings.get(name) is not None:
            raise SettingValueError(
                f"find_max_tokens finds the budget of the device it runs on, got {name}="
                f"{settings[name]!r}: on ranks of different memory run it on every rank with "
                "that rank's memory limit and pass gather_rank_max_tokens(result) as "
                "rank_max_tokens (see docs/mixed-clusters.md).",
                setting=name,
                value=settings[name],
            )
    valid = [f.name for f in fields(PlanConfig) if f.name != "max_tokens"]
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingTypeError(
            f"find_max_tokens got {name}={settings[name]!r}, which is not a plan setting"
            f"{hint}; check the spelling: the plan settings it passes on are "
            f"{', '.join(valid)}.",
            setting=name,
            value=settings[name],
        )
    return PlanConfig(max_tokens=top, **settings)


def _refuse_range(
    config: PlanConfig,
    grid: list[int] | None,
    pair: tuple[int, int],
    index: int,
    raw_longest: int,
    longest: int,
    needed: int,
) -> None:
    """Every budget of the range is below the longest example (under ``oversize="error"``)."""
    given = "candidates" if grid is not None else "bounds"
    value: object = pair if grid is None else grid
    shown = f"up to {pair[1]}" if grid is not None else f"{value}"
    raise SettingValueError(
        f"find_max_tokens: every budget of {given} ({shown}) is below the longest example: "
        f"example {index} has length {raw_longest} (padded {longest}), and the smallest "
        f"budget that holds it is max_tokens={needed} (cost={config.cost!r}). Pass "
        f"{given} reaching at least {needed}, or oversize='skip' / 'truncate' to leave out "
        "or cut the longest examples.",
        setting=given,
        value=value,
    )
