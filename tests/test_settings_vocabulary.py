"""One bad value gives one exception type and one message wherever it enters.

Every public class or function that takes a shared setting (``pad_to_multiple_of``,
``max_tokens``, ``seed``, ``tail``, ...) is given each bad member of the setting's family (the
catalogue's, :mod:`tests.bad_inputs.families`: ``"4"``, ``2.5``, ``True``, ``0``, ``-3``, NaN,
infinity, ``None`` where the setting is required). Every entry point must raise the SAME
exception class (exactly, not a subclass), carrying the SAME ``.setting`` and the value given as
``.value``, with an identical message: a user who moves a setting from the sampler to the
DataModule, or from the collate to the plan, meets the error they already know. The settings
vocabulary itself (:mod:`lightning_varbatch.checks`) says which class that is: its helper,
called on the same name and value, raises the type every entry point must raise (the message
may add what the setting means, the same words everywhere).

Entry points whose messages add context on purpose are not compared here, and say why:
``DataSource(max_tokens=...)`` names its dataset (one of several), the DataModules' evaluation
budget is ``val_max_tokens``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from lightning_varbatch import (
    BatchSizeLRScaler,
    PackingCollate,
    PaddingCollate,
    PlanConfig,
    StreamingBatches,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    TokenThroughputMonitor,
    plan_epoch,
    shards_from_files,
    token_budget_dataloader,
)
from lightning_varbatch.checks import check_choice, check_count, check_flag
from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.costs import COST_NAMES
from lightning_varbatch.planner.settings import OVERSIZE_POLICIES, TAIL_POLICIES

LENGTHS = np.array([3, 5, 2, 7, 4, 6, 1, 8] * 4)
DATA = [{"tokens": list(range(1, int(n) + 1))} for n in LENGTHS]


@pytest.fixture(autouse=True)
def _one_thread() -> Any:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def shard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One JSON-lines shard holding DATA (the streaming entry points read it)."""
    path = tmp_path_factory.mktemp("shards") / "a.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in DATA))
    return path


class _Probed(Exception):
    """find_max_tokens started probing: every setting it was given passed its checks."""


def _never_run(examples: int, length: int) -> int:
    raise _Probed("settings are checked before any probe runs")


# --------------------------------------------------------------------------- entry points

Call = Callable[[str, Any, Path], Any]


def _plan_settings(name: str, value: Any) -> dict[str, Any]:
    """``{name: value}`` plus what makes the value the only problem (a quadratic cost)."""
    return {name: value}


ENTRY: dict[str, Call] = {
    "PlanConfig": lambda n, v, shard: (
        PlanConfig(v) if n == "max_tokens" else PlanConfig(64, **{n: v})
    ),
    "plan_epoch": lambda n, v, shard: (
        plan_epoch(LENGTHS, v) if n == "max_tokens" else plan_epoch(LENGTHS, 64, **{n: v})
    ),
    "TokenBudgetBatchSampler": lambda n, v, shard: (
        TokenBudgetBatchSampler(LENGTHS, v, rank=0, world_size=1)
        if n == "max_tokens"
        else TokenBudgetBatchSampler(LENGTHS, 64, rank=0, world_size=1, **{n: v})
    ),
    "TokenBudgetBatchSampler.from_sources": lambda n, v, shard: (
        TokenBudgetBatchSampler.from_sources([LENGTHS], v, rank=0, world_size=1)
        if n == "max_tokens"
        else TokenBudgetBatchSampler.from_sources([LENGTHS], 64, rank=0, world_size=1, **{n: v})
    ),
    "TokenBudgetDataModule": lambda n, v, shard: (
        TokenBudgetDataModule(DATA, LENGTHS, v)
        if n == "max_tokens"
        else TokenBudgetDataModule(DATA, LENGTHS, 64, **{n: v})
    ),
    "StreamingDataModule": lambda n, v, shard: (
        StreamingDataModule(shards_from_files(str(shard), "tokens"), max_tokens=v)
        if n == "max_tokens"
        else StreamingDataModule(shards_from_files(str(shard), "tokens"), max_tokens=64, **{n: v})
    ),
    "StreamingBatches": lambda n, v, shard: (
        StreamingBatches(shards_from_files(str(shard), "tokens"), v, rank=0, world_size=1)
        if n == "max_tokens"
        else StreamingBatches(
            shards_from_files(str(shard), "tokens"), 64, rank=0, world_size=1, **{n: v}
        )
    ),
    "find_max_tokens": lambda n, v, shard: _find_max_tokens(n, v),
    "PaddingCollate": lambda n, v, shard: PaddingCollate(**{n: v}),
    "PackingCollate": lambda n, v, shard: PackingCollate(**{n: v}),
    "BatchSizeLRScaler": lambda n, v, shard: BatchSizeLRScaler(**{n: v}),
    "TokenThroughputMonitor": lambda n, v, shard: TokenThroughputMonitor(**{n: v}),
    "token_budget_dataloader": lambda n, v, shard: token_budget_dataloader(
        DATA, TokenBudgetBatchSampler(LENGTHS, 64, rank=0, world_size=1), **{n: v}
    ),
}


def _find_max_tokens(name: str, value: Any) -> Any:
    from lightning_varbatch.memory import find_max_tokens

    return find_max_tokens(_never_run, LENGTHS, 2**30, **{name: value})


#: Which entry points take each shared setting (under that name, with that meaning).
PLANNER_ENTRIES = [
    "PlanConfig",
    "plan_epoch",
    "TokenBudgetBatchSampler",
    "TokenBudgetBatchSampler.from_sources",
    "TokenBudgetDataModule",
    "StreamingDataModule",
    "StreamingBatches",
    "find_max_tokens",
]
TAKEN_BY: dict[str, list[str]] = {
    "pad_to_multiple_of": [*PLANNER_ENTRIES, "PaddingCollate", "PackingCollate"],
    "max_tokens": [*PLANNER_ENTRIES[:-1], "BatchSizeLRScaler"],  # find_max_tokens finds it
    "max_examples": PLANNER_ENTRIES,
    "seed": PLANNER_ENTRIES,
    "bucket_width": PLANNER_ENTRIES,
    "batch_size_multiple": PLANNER_ENTRIES,
    "shuffle": PLANNER_ENTRIES,
    "tail": PLANNER_ENTRIES,
    "oversize": PLANNER_ENTRIES,
    "cost": PLANNER_ENTRIES,
    "loss_offset": [*PLANNER_ENTRIES, "PaddingCollate"],
    "truncate_to": ["PaddingCollate", "PackingCollate"],
    "log_every_n_steps": ["BatchSizeLRScaler", "TokenThroughputMonitor"],
    "num_workers": ["TokenBudgetDataModule", "StreamingDataModule", "token_budget_dataloader"],
    "pin_memory": ["TokenBudgetDataModule", "StreamingDataModule", "token_budget_dataloader"],
}

# --------------------------------------------------------------------------- the families

NAN, INF = math.nan, math.inf
#: (member, value) of an integer setting; 0 is bad for a positive one.
INT_BAD: list[tuple[str, Any]] = [
    ("str", "4"),
    ("float", 2.5),
    ("bool", True),
    ("zero", 0),
    ("negative", -3),
    ("nan", NAN),
    ("inf", INF),
    ("none", None),
]
FLAG_BAD: list[tuple[str, Any]] = [("str", "false"), ("int", 1), ("float", 2.5), ("none", None)]
CHOICE_BAD: list[tuple[str, Any]] = [("unknown", "keep"), ("int", 4), ("none", None)]

#: setting -> (its reference check, the smallest allowed integer, whether None is allowed)
INTS: dict[str, tuple[int, bool]] = {
    "pad_to_multiple_of": (1, False),
    "max_tokens": (1, False),  # BatchSizeLRScaler's None (read the DataModule) is skipped
    "max_examples": (1, True),
    "seed": (0, False),
    "bucket_width": (1, False),
    "batch_size_multiple": (1, False),
    "loss_offset": (0, False),
    "truncate_to": (1, True),
    "log_every_n_steps": (1, True),
    "num_workers": (0, False),
}
FLAGS = ("shuffle", "pin_memory")
CHOICES: dict[str, tuple[str, ...]] = {
    "tail": tuple(TAIL_POLICIES),
    "oversize": tuple(OVERSIZE_POLICIES),
    "cost": tuple(COST_NAMES),
}
#: Entry points where None means "not set" for a setting that is otherwise required.
NONE_MEANS_UNSET = {("max_tokens", "BatchSizeLRScaler")}


def _reference(name: str, value: Any) -> SettingError:
    """The vocabulary's own outcome for ``name=value``: what every entry point must raise."""
    try:
        if name in INTS:
            minimum, allow_none = INTS[name]
            check_count(name, value, minimum=minimum, allow_none=allow_none)
        elif name in FLAGS:
            check_flag(name, value)
        elif name == "cost" and callable(value):
            raise AssertionError("a callable is a valid cost")
        else:
            what = " or a callable (num_examples, longest, total) -> cost" if name == "cost" else ""
            check_choice(name, value, CHOICES[name], what=what)
    except SettingError as error:
        return error
    raise AssertionError(f"{name}={value!r} is not bad")


def _members(name: str) -> list[tuple[str, Any]]:
    if name in INTS:
        minimum, allow_none = INTS[name]
        return [
            (m, v)
            for m, v in INT_BAD
            if not (m == "zero" and minimum == 0) and not (m == "none" and allow_none)
        ]
    return FLAG_BAD if name in FLAGS else CHOICE_BAD


CASES = [
    pytest.param(name, value, id=f"{name}-{member}")
    for name in TAKEN_BY
    for member, value in _members(name)
]


def _same_value(got: Any, given: Any) -> bool:
    if isinstance(given, float) and math.isnan(given):
        return isinstance(got, float) and math.isnan(got)
    return got is given or (type(got) is type(given) and got == given)


def _outcome(entry: str, name: str, value: Any, shard: Path) -> tuple[Any, ...]:
    try:
        ENTRY[entry](name, value, shard)
    except _Probed:
        return ("accepted", None, "", None)
    except Exception as error:  # every outcome is compared, the wrong ones shown
        setting = getattr(error, "setting", None)
        return (type(error).__name__, setting, str(error), getattr(error, "value", "<none>"))
    return ("accepted", None, "", None)


@pytest.mark.parametrize(("name", "value"), CASES)
def test_one_bad_value_one_error_everywhere(name: str, value: Any, shard: Path) -> None:
    kind = type(_reference(name, value)).__name__
    outcomes = {
        entry: _outcome(entry, name, value, shard)
        for entry in TAKEN_BY[name]
        if not (value is None and (name, entry) in NONE_MEANS_UNSET)
    }
    messages = {message for _, _, message, _ in outcomes.values()}
    shown = [
        f"  {entry}: {got[0]} .setting={got[1]!r} .value={got[3]!r}: {got[2]}"
        for entry, got in outcomes.items()
    ]
    wrong = [
        line
        for line, got in zip(shown, outcomes.values(), strict=True)
        if got[:2] != (kind, name) or not _same_value(got[3], value)
    ]
    assert not wrong and len(messages) == 1, (
        f"{name}={value!r} must raise {kind} (.setting={name!r}, .value the value given) with "
        f"one message everywhere; {len(messages)} message(s):\n" + "\n".join(shown)
    )
    assert name in messages.pop()


@pytest.mark.parametrize("entry", sorted({e for entries in TAKEN_BY.values() for e in entries}))
def test_every_entry_point_is_built_with_good_values(entry: str, shard: Path) -> None:
    """The comparison above is only as good as its entry points: each takes good values."""
    name = next(n for n, entries in TAKEN_BY.items() if entry in entries)
    good = {"tail": "drop", "oversize": "skip", "cost": "quadratic", "shuffle": False}.get(name, 2)
    if name == "pin_memory":
        good = False
    if name in ("seed", "loss_offset", "pad_id", "num_workers"):
        good = 0
    kind, _, message, _ = _outcome(
        entry, name, np.int64(good) if isinstance(good, int) else good, shard
    )
    assert kind == "accepted", f"{entry}({name}={good!r}) was refused: {kind}: {message}"


def test_pad_to_multiple_of_str_gives_one_outcome(shard: Path) -> None:
    """The issue's figure: pad_to_multiple_of="4" gave three outcomes (two types) before."""
    outcomes = {
        _outcome(entry, "pad_to_multiple_of", "4", shard)[:3]
        for entry in TAKEN_BY["pad_to_multiple_of"]
    }
    assert len(outcomes) == 1, outcomes
    kind, setting, message = outcomes.pop()
    assert (kind, setting) == ("SettingTypeError", "pad_to_multiple_of")
    # both built-in types users catch today still catch it
    assert issubclass(SettingTypeError, TypeError) and issubclass(SettingTypeError, ValueError)
    assert "'4' (str)" in message


def test_a_value_in_range_of_the_wrong_kind_is_a_type_error_everywhere() -> None:
    """``SettingTypeError`` for a wrong type, ``SettingValueError`` for a bad value."""
    for bad, kind in (("4", SettingTypeError), (0, SettingValueError)):
        with pytest.raises(kind) as caught:
            TokenBudgetBatchSampler(LENGTHS, 64, rank=0, world_size=1, bucket_width=bad)
        assert type(caught.value) is kind and caught.value.setting == "bucket_width"
