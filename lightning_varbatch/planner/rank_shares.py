"""Ranks of different speed or memory: each rank's share of a step and its own budget.

A rank's **share** (``PlanConfig.rank_shares``) is its relative speed, its **memory budget**
(``rank_max_tokens``) caps its micro-batches; both become one budget per rank (:func:`rank_budgets`)
its micro-batches are cut to (:mod:`~.rank_lanes`): equal counts, bigger or smaller micro-batches.

Example:
    >>> rank_budgets(4096, 2, shares=(2, 1))  # rank 1 is half as fast
    (4096, 2048)
    >>> rank_budgets(4096, 2, rank_max_tokens=(3000, 4096))  # equal speed: the smaller memory
    (3000, 3000)
    >>> rank_budgets(4096, 2, shares=(2, 1), rank_max_tokens=(3000, 4096))
    (3000, 1500)
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = [
    "apportion",
    "check_rank_max_tokens",
    "check_rank_settings",
    "check_rank_shares",
    "rank_budgets",
    "scaled_budgets",
]


def apportion(total: int, probabilities: np.ndarray) -> np.ndarray:
    """Split ``total`` into integer counts nearest ``total * probabilities`` (largest remainder).

    Example:
        >>> apportion(10, np.array([0.55, 0.3, 0.15])).tolist()
        [6, 3, 1]
    """
    exact = total * np.asarray(probabilities, dtype=np.float64)
    counts = np.floor(exact).astype(np.int64)
    rest = total - int(counts.sum())
    counts[np.argsort(counts - exact, kind="stable")[:rest]] += 1
    return counts


def _as_sequence(name: str, value: object, example: str) -> Sequence[object]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        if isinstance(value, np.ndarray) and value.ndim == 1:
            return list(value.tolist())
        # Hydra hands lists as ListConfig, which is a Sequence; a bare number is a mistake.
        raise SettingTypeError(
            f"{name} must be a list with one entry per rank, got {value!r:.60} "
            f"({type(value).__name__}); pass e.g. {name}={example}.",
            setting=name,
            value=value,
        )
    if len(value) == 0:
        raise SettingValueError(
            f"{name} must have one entry per rank, got an empty list; pass e.g. "
            f"{name}={example}, or leave it unset (None) for ranks of equal speed and memory.",
            setting=name,
            value=value,
        )
    return value


def check_rank_shares(value: object) -> tuple[float, ...] | None:
    """``rank_shares`` as a tuple of positive finite floats (``None`` stays ``None``).

    Raises:
        SettingTypeError: for a value that is not a list of numbers.
        SettingValueError: for an empty list or a share ≤ 0, NaN or infinite (naming the rank).

    Example:
        >>> check_rank_shares([1, 0.5])
        (1.0, 0.5)
    """
    if value is None:
        return None
    items = _as_sequence("rank_shares", value, "[1.0, 0.5]")
    out = []
    for rank, share in enumerate(items):
        if isinstance(share, bool) or not isinstance(share, numbers.Real):
            raise SettingTypeError(
                f"rank_shares[{rank}] (the share of rank {rank}) must be a number, got "
                f"{share!r:.40} ({type(share).__name__}); pass e.g. rank_shares=[1.0, 0.5].",
                setting="rank_shares",
                value=value,
            )
        share = float(share)
        if not math.isfinite(share) or share <= 0:
            raise SettingValueError(
                f"rank_shares[{rank}] (the share of rank {rank}) must be a positive finite "
                f"number (the rank's relative speed), got {share!r}; every rank needs work: "
                "give a slow rank a small share (e.g. 0.5), not 0.",
                setting="rank_shares",
                value=value,
            )
        out.append(share)
    return tuple(out)


def check_rank_max_tokens(value: object) -> tuple[int, ...] | None:
    """``rank_max_tokens`` as a tuple of positive ints (``None`` stays ``None``).

    Raises:
        SettingTypeError: for a value that is not a list of integers.
        SettingValueError: for an empty list or a budget below 1 (the message names the rank).

    Example:
        >>> check_rank_max_tokens([4096, 3000])
        (4096, 3000)
    """
    if value is None:
        return None
    items = _as_sequence("rank_max_tokens", value, "[4096, 3000]")
    return tuple(
        check_count(
            "rank_max_tokens",
            budget,
            what=f" (rank_max_tokens[{rank}], the memory budget of rank {rank})",
        )
        for rank, budget in enumerate(items)
    )


def _check_length(name: str, values: Sequence[object] | None, world_size: int) -> None:
    if values is not None and len(values) != world_size:
        raise SettingValueError(
            f"{name} has {len(values)} entries but world_size={world_size}: give one entry "
            f"per rank (rank 0 first), or leave {name} unset.",
            setting=name,
            value=tuple(values),
        )


def rank_budgets(
    max_tokens: int,
    world_size: int,
    shares: Sequence[float] | None = None,
    rank_max_tokens: Sequence[int] | None = None,
    *,
    floor: int = 0,
) -> tuple[int, ...]:
    """Every rank's micro-batch budget from its share and its memory budget.

    ``b_r = ⌊c · s_r⌋`` with ``s_r = shares[r] / max(shares)`` and ``c`` the largest value that
    keeps every ``b_r`` within ``rank_max_tokens[r]`` (default ``max_tokens``).

    Args:
        max_tokens: the budget of a rank without its own (``PlanConfig.max_tokens``).
        world_size: the number of ranks.
        shares: relative speeds, one per rank (``None``: all equal).
        rank_max_tokens: memory budgets, one per rank (``None``: all ``max_tokens``).
        floor: the least budget a rank may get (e.g. the cost of the longest example).

    Returns:
        One budget per rank.

    Raises:
        SettingValueError: for a list of the wrong length, a bad share or budget, or a
            ``floor`` above a rank's memory budget (the message names the rank).

    Example:
        >>> rank_budgets(4096, 2, shares=(1, 0.1), floor=1000)
        (4096, 1000)
    """
    world = check_count("world_size", world_size)
    shares = check_rank_shares(shares)
    memory = check_rank_max_tokens(rank_max_tokens)
    _check_length("rank_shares", shares, world)
    _check_length("rank_max_tokens", memory, world)
    limit = np.full(world, check_count("max_tokens", max_tokens), dtype=np.float64)
    if memory is not None:
        limit = np.asarray(memory, dtype=np.float64)
    speed = np.ones(world) if shares is None else np.asarray(shares) / max(shares)
    scale = float(np.min(limit / speed))
    budgets = np.minimum(np.floor(scale * speed + 1e-9), limit).astype(np.int64)
    if floor <= 0 and budgets.min() < 1:  # a share too small for a single token
        r = int(np.argmin(budgets))
        assert shares is not None  # equal speeds give every rank its whole limit
        raise SettingValueError(
            f"rank_shares[{r}]={shares[r]:g} gives rank {r} a budget of 0 tokens ({speed[r]:.2g} "
            f"of the largest rank's {scale:g}): every rank needs work. Raise rank {r}'s share "
            "so that its budget holds the longest example, or leave the rank out of the run.",
            setting="rank_shares",
            value=shares,
        )
    if floor > 0:
        low = np.flatnonzero(limit < floor)
        if low.size:
            r = int(low[0])
            setting = "rank_max_tokens" if memory is not None else "max_tokens"
            raise SettingValueError(
                f"Rank {r}'s memory budget ({int(limit[r])}, {setting}) cannot hold the "
                f"longest example (cost {floor}): raise {setting} for rank {r}, or shorten "
                "the longest examples (oversize='truncate' or 'skip').",
                setting=setting,
                value=memory if memory is not None else max_tokens,
            )
        budgets = np.maximum(budgets, floor)
    return tuple(int(b) for b in budgets)


def scaled_budgets(budgets: Sequence[int], own: int, common: int) -> tuple[int, ...]:
    """The ranks' budgets for a dataset of budget ``own`` in a mixture of budget ``common``.

    ``⌊b_r · own / common⌋``: every dataset divides its steps between the ranks alike.

    Example:
        >>> scaled_budgets((4096, 2048), own=2048, common=4096)
        (2048, 1024)
    """
    return tuple(int(b) * int(own) // int(common) for b in budgets)


class RankSettings(Protocol):
    """What :func:`check_rank_settings` reads of a ``PlanConfig``."""

    @property
    def rank_shares(self) -> Sequence[float] | None: ...
    @property
    def rank_max_tokens(self) -> Sequence[int] | None: ...
    @property
    def max_tokens(self) -> int: ...
    @property
    def max_shapes(self) -> int | None: ...


def check_rank_settings(config: RankSettings) -> dict[str, Any]:
    """``PlanConfig``'s ``rank_shares`` / ``rank_max_tokens``, checked, as tuples.

    Raises:
        SettingTypeError: for a value that is not a list of numbers.
        SettingValueError: for a bad entry (naming the rank), a memory budget above
            ``max_tokens``, lists of different lengths, or ``max_shapes``.

    Example:
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> PlanConfig(64, rank_shares=[1, 0.5]).rank_shares  # checked here
        (1.0, 0.5)
    """
    shares = check_rank_shares(config.rank_shares)
    memory = check_rank_max_tokens(config.rank_max_tokens)
    if memory is not None and max(memory) > config.max_tokens:
        r = memory.index(max(memory))
        raise SettingValueError(
            f"rank_max_tokens[{r}]={memory[r]} exceeds max_tokens={config.max_tokens}: "
            "max_tokens is the largest micro-batch of any rank (collates and checks hold "
            f"every batch to it); set max_tokens={max(memory)}.",
            setting="rank_max_tokens",
            value=memory,
        )
    if (shares is not None or memory is not None) and config.max_shapes is not None:
        raise SettingValueError(
            f"max_shapes={config.max_shapes} cannot be combined with per-rank budgets "
            "(rank_shares / rank_max_tokens): the shapes are chosen for one budget. Unset "
            "max_shapes, or the per-rank settings.",
            setting="max_shapes",
            value=config.max_shapes,
        )
    if shares is not None and memory is not None and len(shares) != len(memory):
        raise SettingValueError(
            f"rank_shares has {len(shares)} entries and rank_max_tokens {len(memory)}: "
            "give both one entry per rank.",
            setting="rank_max_tokens",
            value=memory,
        )
    return {"rank_shares": shares, "rank_max_tokens": memory}
