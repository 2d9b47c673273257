"""The settings both DataModules check at construction, and those each one refuses.

Both take the budgets, loader settings and ``loss_offset`` with the same checks and messages;
the map-style DataModule takes every other :class:`~lightning_varbatch.PlanConfig` field as a
keyword (:data:`SAMPLER_KWARGS`), and the stream refuses what it cannot do (:data:`REFUSED`).

Example:
    >>> check_budgets(64, None)
    (64, 64, True)
    >>> "seed" in SAMPLER_KWARGS, "max_tokens" in SAMPLER_KWARGS
    (True, False)
"""

from __future__ import annotations

import reprlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from lightning_varbatch.checks import check_choice, check_count, check_flag
from lightning_varbatch.data.plan_settings import PLAN_SETTINGS
from lightning_varbatch.data.sampler import ON_MISMATCH, OnMismatch
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.mixture_datasets import DataSource
from lightning_varbatch.sources.shards import ShardedSource

__all__ = [
    "DEFAULTS",
    "REFUSED",
    "SAMPLER_KWARGS",
    "changed",
    "check_budgets",
    "check_loader_settings",
    "check_sampler_kwargs",
    "check_stream_arguments",
    "with_loss_offset",
]

#: The planner settings TokenBudgetDataModule takes as ``**sampler_kwargs``: every PlanConfig
#: field but the named arguments (``max_tokens``, and ``loss_offset``: both DataModules').
SAMPLER_KWARGS = PLAN_SETTINGS - {"max_tokens", "loss_offset"}

#: What TokenBudgetDataModule takes and a stream cannot: argument, why, what instead (refused).
REFUSED: dict[str, str] = {
    "train_lengths": "a stream's lengths come from its shards: pass the columns when you "
    "open them instead (shards_from_files(paths, columns=...))",
    "train_loss_lengths": "a stream counts its training loss tokens as each example's length "
    "(the target's for pairs) minus loss_offset: pass loss_offset=1 for teacher forcing",
    "mixing": "a stream reads one ShardedSource; to mix datasets, list all their files in "
    "one ShardedSource, or use TokenBudgetDataModule with a list of DataSource",
    "weights": "a stream reads every shard once per epoch in (shuffled) order and cannot "
    "sample by weight: use TokenBudgetDataModule with a list of DataSource and "
    "steps_per_epoch",
    "temperature": "a stream cannot sample datasets by weight: use TokenBudgetDataModule "
    "with a list of DataSource and steps_per_epoch",
    "steps_per_epoch": "a stream's epoch is one pass over its shards; its length is not known "
    "in advance: stop training with Trainer(max_steps=...) instead",
}

#: The default of each :data:`REFUSED` setting (TokenBudgetDataModule's): it changes nothing,
#: so both DataModules accept it there (a shared config's ``train_loss_lengths: null``).
DEFAULTS: dict[str, Any] = {
    "train_lengths": None,
    "train_loss_lengths": None,
    "mixing": "per_step",
    "weights": "size",
    "temperature": 1.0,
    "steps_per_epoch": None,
}


def changed(settings: Mapping[str, Any]) -> list[str]:
    """The names of ``settings`` given at another value than their :data:`DEFAULTS`.

    Example:
        >>> changed({"train_loss_lengths": None, "temperature": 1, "weights": [1, 2]})
        ['weights']
    """
    return [name for name, value in settings.items() if not _is_default(value, DEFAULTS[name])]


def _is_default(value: object, default: object) -> bool:
    if default is None or isinstance(default, str):  # None, or a name: never an array
        return isinstance(value, type(default)) and value == default
    number = isinstance(value, (int, float, np.number)) and not isinstance(value, bool)
    return number and bool(value == default)


def check_budgets(max_tokens: object, val_max_tokens: object) -> tuple[int, int, bool]:
    """``(max_tokens, val_max_tokens or max_tokens, defaulted)``, checked as planner budgets."""
    budget = check_count("max_tokens", max_tokens)  # the planner's own check and message
    if val_max_tokens is None:
        return budget, budget, True
    return budget, check_count("val_max_tokens", val_max_tokens), False


def check_loader_settings(
    collate: object, num_workers: object, pin_memory: object, on_resume_mismatch: object
) -> tuple[Callable[[Any], Any] | None, int, bool, OnMismatch]:
    """The loader settings both DataModules take, checked; returned in the same order.

    Raises:
        SettingValueError, SettingTypeError: naming the setting.

    Example:
        >>> check_loader_settings(None, 0, False, "error")
        (None, 0, False, 'error')
    """
    workers = check_count(
        "num_workers", num_workers, minimum=0, what=" (0: load in the main process)"
    )
    pin = check_flag("pin_memory", pin_memory)
    mismatch: OnMismatch = check_choice("on_resume_mismatch", on_resume_mismatch, ON_MISMATCH)
    if collate is not None and not callable(collate):
        raise SettingTypeError(
            f"collate must be callable (e.g. PaddingCollate(...)) or None, got "
            f"{type(collate).__name__} {collate!r}.",
            setting="collate",
            value=collate,
        )
    return collate, workers, pin, mismatch


def with_loss_offset(settings: Mapping[str, Any], loss_offset: object) -> dict[str, Any]:
    """The planner's settings: ``loss_offset`` added (unless 0), :data:`DEFAULTS` left out.

    Example:
        >>> with_loss_offset({"seed": 1}, 1), with_loss_offset({"seed": 1, "mixing": None}, 0)
        ({'seed': 1, 'loss_offset': 1}, {'seed': 1})
    """
    out = {k: v for k, v in settings.items() if k not in DEFAULTS}
    if check_count("loss_offset", loss_offset, minimum=0):
        out["loss_offset"] = loss_offset
    return out


def check_sampler_kwargs(sampler_kwargs: Mapping[str, Any]) -> None:
    """Refuse ``loss_lengths`` and unknown planner settings (a SettingTypeError naming it).

    Example:
        >>> check_sampler_kwargs({"seed": 1, "tail": "spread"})
    """
    if "loss_lengths" in sampler_kwargs:
        raise SettingTypeError(
            "TokenBudgetDataModule takes loss lengths per split: pass train_loss_lengths= "
            "(and val_loss_lengths= / test_loss_lengths= for the evaluation splits) instead "
            "of loss_lengths=, which would describe the items of one split only.",
            setting="loss_lengths",
            value=sampler_kwargs["loss_lengths"],
        )
    unknown = sorted(set(sampler_kwargs) - SAMPLER_KWARGS)
    if unknown:
        raise SettingTypeError(
            f"Unknown planner setting(s) {unknown} for TokenBudgetDataModule; valid: "
            f"{sorted(SAMPLER_KWARGS)}.",
            setting=unknown[0],
            value=sampler_kwargs[unknown[0]],
        )


def check_stream_arguments(train_source: object, plan_settings: Mapping[str, Any]) -> None:
    """Refuse a training source that is no stream, and what a stream cannot do.

    Raises:
        SettingTypeError: for a ``train_source`` that is not a :class:`ShardedSource`, or
            ``rank``/``world_size``/``accumulate_grad_batches`` (the Trainer's).
        SettingValueError: for a :data:`REFUSED` setting other than its default.
    """
    if isinstance(train_source, (list, tuple)) and any(
        isinstance(s, DataSource) for s in train_source
    ):
        raise SettingTypeError(
            "train_source is a list of DataSource, a mixture of map-style datasets; a "
            "stream reads one ShardedSource: pass TokenBudgetDataModule(train_dataset=[...]) "
            "for the mixture, or put every dataset's files in one shards_from_files(...).",
            setting="train_source",
            value=train_source,
        )
    if not isinstance(train_source, ShardedSource):
        raise SettingTypeError(
            "train_source must be a ShardedSource (from shards_from_files, "
            "shards_from_hf_iterable or shards_from_litdata), got "
            f"{type(train_source).__name__}; for a map-style dataset use "
            "TokenBudgetDataModule.",
            setting="train_source",
            value=train_source,
        )
    for name in changed({k: v for k, v in plan_settings.items() if k in REFUSED}):
        value = plan_settings[name]
        raise SettingValueError(
            f"StreamingDataModule does not take {name}={reprlib.repr(value)} (only its default, "
            f"{DEFAULTS[name]!r}): {REFUSED[name]}.",
            setting=name,
            value=value,
        )
    for name in ("rank", "world_size", "accumulate_grad_batches"):
        if name in plan_settings:
            raise SettingTypeError(
                f"StreamingDataModule reads {name} from the Trainer: do not pass {name}=.",
                setting=name,
                value=plan_settings[name],
            )
