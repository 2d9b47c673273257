"""Planner settings as the data layer takes them: keywords or one ``PlanConfig``, checked once.

The sampler and both DataModules take the fields of :class:`~lightning_varbatch.PlanConfig` as
keywords of the same names (the sampler also a ``PlanConfig`` as ``config=``). They are read from
the dataclass, not listed here: a new ``PlanConfig`` setting reaches every entry point.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from dataclasses import fields
from typing import Any

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "PLAN_SETTINGS",
    "check_accumulate",
    "check_topology",
    "plain_settings",
    "plan_config",
    "reject_unknown",
]

#: The names of every planner setting (the fields of ``PlanConfig``).
PLAN_SETTINGS: frozenset[str] = frozenset(f.name for f in fields(PlanConfig))


def plain(value: Any) -> Any:
    """A numpy scalar as the Python scalar (``np.int64(1024)`` -> ``1024``); else ``value``.

    Example:
        >>> plain(np.int64(3)), plain("a")
        (3, 'a')
    """
    return value.item() if isinstance(value, np.generic) else value


def reject_unknown(owner: str, unknown: Iterable[str], valid: Iterable[str]) -> None:
    """Refuse misspelt settings with the closest valid names (a TypeError naming ``owner``).

    Example:
        >>> reject_unknown("f", ["max_tokens"], ["max_tokens", "seed"])  # all known: no error
    """
    valid = sorted(valid)
    given = unknown
    unknown = sorted(set(unknown) - set(valid))
    if not unknown:
        return
    hints = [
        f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
        for name in unknown
        for close in [difflib.get_close_matches(name, valid, n=1)]
    ]
    raise SettingTypeError(
        f"{owner} got unknown setting(s) {', '.join(hints)}; valid settings: {valid}. "
        "Check the spelling.",
        setting=unknown[0],
        value=given[unknown[0]] if isinstance(given, Mapping) else None,
    )


def plain_settings(**settings: Any) -> dict[str, Any]:
    """Planner settings with numpy scalars made plain (PlanConfig checks their values).

    Example:
        >>> plain_settings(max_tokens=np.int64(8))
        {'max_tokens': 8}
    """
    reject_unknown("The planner", settings, PLAN_SETTINGS)
    return {k: plain(v) for k, v in settings.items()}


def plan_config(settings: Mapping[str, Any], config: PlanConfig | None = None) -> PlanConfig:
    """The planner settings as one :class:`PlanConfig`: ``config``, or one built from keywords.

    Args:
        settings: planner settings as keywords (``max_tokens=None`` is ignored given a ``config``).
        config: a ready :class:`PlanConfig`, or ``None``.

    Raises:
        SettingTypeError: for an unknown setting or a ``config`` that is not a ``PlanConfig``.
        SettingValueError: for settings given both ways (``.setting`` names the first).

    Example:
        >>> plan_config({}, PlanConfig(max_tokens=8)).max_tokens
        8
    """
    if config is None:
        return PlanConfig(**plain_settings(**settings))
    if not isinstance(config, PlanConfig):
        raise SettingTypeError(
            f"config must be a PlanConfig, got {type(config).__name__} {config!r:.60}; pass "
            "config=PlanConfig(max_tokens=...), or the settings as keywords.",
            setting="config",
            value=config,
        )
    both = [k for k, v in settings.items() if not (k == "max_tokens" and v is None)]
    if both:
        raise SettingValueError(
            f"{both[0]}= was given with config=PlanConfig(...), which holds every planner "
            f"setting: pass the settings either as config= or as keywords, not both (e.g. "
            f"config=dataclasses.replace(config, {both[0]}=...)).",
            setting=both[0],
            value=settings[both[0]],
        )
    return config


def check_accumulate(value: Any) -> int:
    """``accumulate_grad_batches`` checked as a setting.

    Example:
        >>> check_accumulate(np.int64(2))
        2
    """
    return check_count(
        "accumulate_grad_batches",
        value,
        what=" (micro-batches per rank per optimizer step, as Trainer(accumulate_grad_batches))",
    )


def check_topology(rank: Any, world_size: Any) -> tuple[int | None, int | None]:
    """``rank`` and ``world_size`` as given (``None``: found later), checked as settings.

    Example:
        >>> check_topology(1, 2), check_topology(None, None)
        ((1, 2), (None, None))
    """
    world = check_count("world_size", world_size, allow_none=True)
    if rank is None:
        return None, world
    rank = check_count("rank", rank, minimum=0)
    if world is not None and rank >= world:
        raise SettingValueError(
            f"rank must be in [0, world_size={world}), got {rank}; pass this process's rank "
            "(in a LightningModule or DataModule: trainer.global_rank).",
            setting="rank",
            value=rank,
        )
    return rank, world
