"""Planner API: the batch-size schedule (``batch_schedule``, issue 32).

Every bad schedule names ``batch_schedule`` (as ``.setting`` and in the message) and what is
wrong with it; the settings it cannot go with are refused naming both.

Example:
    >>> len(CASES) > 25
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import (
    EpochPlanner,
    MixturePlanner,
    PlanConfig,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.windows import WindowedPlanner
from tests.bad_inputs.case import Case, accepted, error

SCHEDULE = "lightning_varbatch/planner/batch_schedule.py"
PLAN = "lightning_varbatch/planner/scheduled_plan.py"
#: Longest example 12 (cost 12 padded); budget 64.
L = np.array([3, 5, 2, 7, 4, 6, 1, 12, 2, 3, 5, 4] * 4)


def _config(value: Any, **kwargs: Any) -> PlanConfig:
    return PlanConfig(max_tokens=64, batch_schedule=value, **kwargs)


def _bad(
    id: str,
    words: str,
    value: Any,
    *match: str,
    raises: type[BaseException] = SettingValueError,
) -> Case:
    return error(
        f"config-batch_schedule-{id}",
        "planner API",
        f"PlanConfig(max_tokens=64, batch_schedule={words})",
        lambda tmp: _config(value),
        "batch_schedule",
        *match,
        raises=raises,
        setting="batch_schedule",
        fix_in=SCHEDULE,
    )


def _boom(tokens: float) -> float:
    raise RuntimeError("no")


def _dips(tokens: float) -> float:
    return 0.5 if tokens < 1000 else 0.25 if tokens < 2000 else 1.0


def _flat(tokens: float) -> float:
    return 0.5


def _resume_other_schedule(tmp: Path) -> None:
    sampler = TokenBudgetBatchSampler(
        L, 64, rank=0, world_size=1, batch_schedule="0:0.5 100:1", shuffle=False
    )
    next(iter(sampler))
    state = sampler.state_dict()
    other = TokenBudgetBatchSampler(L, 64, rank=0, world_size=1, batch_schedule="0:0.25 100:1")
    other.load_state_dict(state)


def _every_form(tmp: Path) -> None:
    forms = ["0:0.5 1K:1", [(0, 0.5), (1000, 1)], {0: 0.5, "1K": 1.0}, ((0, 0.5), ["1e3", 1])]
    assert len({_config(f).batch_schedule for f in forms}) == 1


def _numpy_values(tmp: Path) -> None:
    points = [(np.int64(0), np.float32(0.5)), (np.int64(1000), np.float64(1.0))]
    assert _config(points).batch_schedule == "0:0.5 1000:1.0"


def _items() -> list[dict[str, Any]]:
    return [{"tokens": [1] * int(n)} for n in L]


CASES: list[Case] = [
    _bad("not-tokens", "'0:0.25 two:1'", "0:0.25 two:1", "'two'", "token count"),
    _bad("unknown-suffix", "'0:0.5 1X:1'", "0:0.5 1X:1", "'1X'", "2M"),
    _bad("no-fraction", "'0:0.25 2M'", "0:0.25 2M", "'2M'", "TOKENS:FRACTION"),
    _bad("commas", "'0:0.5,1K:1'", "0:0.5,1K:1", "TOKENS:FRACTION"),
    _bad("not-a-fraction", "'0:half 1K:1'", "0:half 1K:1", "'half'", "fraction"),
    _bad("zero", "'0:0 1K:1'", "0:0 1K:1", "(0, 1]", "got 0", "start above 0"),
    _bad("negative", "'0:-0.5 1K:1'", "0:-0.5 1K:1", "(0, 1]", "-0.5"),
    _bad("above-one", "'0:0.5 1K:1.5'", "0:0.5 1K:1.5", "(0, 1]", "1.5"),
    _bad("nan", "'0:nan 1K:1'", "0:nan 1K:1", "(0, 1]", "nan"),
    _bad("inf", "'0:0.5 1K:inf'", "0:0.5 1K:inf", "(0, 1]", "inf"),
    _bad("decreasing", "'0:0.5 1K:0.25 2K:1'", "0:0.5 1K:0.25 2K:1", "decreases", "0.5 -> 0.25"),
    _bad("out-of-order", "'0:0.25 2K:0.5 1K:1'", "0:0.25 2K:0.5 1K:1", "must increase", "1000"),
    _bad("last-not-one", "'0:0.25 1K:0.5'", "0:0.25 1K:0.5", "last fraction must be 1"),
    _bad("first-not-zero", "'1K:0.25 2K:1'", "1K:0.25 2K:1", "first threshold", "0 tokens"),
    _bad("empty", "''", "", "empty", "0:0.25 2M:0.5 8M:1"),
    _bad("empty-list", "[]", [], "empty"),
    _bad("ramp-malformed", "'ramp:0.25'", "ramp:0.25", "ramp:START_FRACTION:TOKENS"),
    _bad("ramp-zero-start", "'ramp:0:8M'", "ramp:0:8M", "(0, 1]", "got 0"),
    _bad("ramp-tokens", "'ramp:0.25:lots'", "ramp:0.25:lots", "'lots'", "token count"),
    _bad("ramp-negative-tokens", "'ramp:0.25:-5'", "ramp:0.25:-5", "'-5'"),
    _bad("pair-of-three", "[(0, 0.5, 1)]", [(0, 0.5, 1)], "(0, 0.5, 1)", "(tokens, fraction)"),
    _bad("dict-above-one", "{0: 0.5, 1000: 2}", {0: 0.5, 1000: 2}, "(0, 1]", "got 2"),
    _bad("callable-above-one", "lambda t: 2.0", lambda t: 2.0, "(0, 1]", "got 2"),
    _bad(
        "callable-from-zero",
        "lambda t: min(1.0, t / 1e4) (a linear warm-up from 0)",
        lambda t: min(1.0, t / 1e4),
        "got 0",
        "start above 0",
        "ramp:0.1:1M",
    ),
    _bad("callable-dips", "a function 0.5, then 0.25, then 1", _dips, "_dips", "decreases"),
    _bad("callable-never-full", "a function always 0.5", _flat, "_flat", "never reaches 1"),
    _bad("callable-raises", "a function that raises", _boom, "_boom", "RuntimeError"),
    _bad("float", "0.5", 0.5, "float", "'ramp:0.25:8M'", raises=SettingTypeError),
    _bad("bool", "True", True, "bool", raises=SettingTypeError),
    error(
        "config-batch_schedule-no-token-left",
        "planner API",
        "PlanConfig(max_tokens=3, batch_schedule='0:0.1 10:1')",
        lambda tmp: PlanConfig(3, batch_schedule="0:0.1 10:1"),
        "batch_schedule",
        "max_tokens=3",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=SCHEDULE,
    ),
    error(
        "config-batch_schedule-with-max_shapes",
        "planner API",
        "PlanConfig(..., batch_schedule='0:0.5 1K:1', max_shapes=2)",
        lambda tmp: _config("0:0.5 1K:1", max_shapes=2),
        "batch_schedule",
        "max_shapes=2",
        "Unset max_shapes or batch_schedule",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=SCHEDULE,
    ),
    error(
        "config-batch_schedule-with-length_warmup",
        "planner API",
        "PlanConfig(..., batch_schedule='0:0.5 1K:1', length_warmup=4)",
        lambda tmp: _config("0:0.5 1K:1", length_warmup=4),
        "batch_schedule",
        "length_warmup=4",
        "Unset length_warmup or batch_schedule",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=SCHEDULE,
    ),
    error(
        "planner-batch_schedule-first-fraction-too-small",
        "planner API",
        "EpochPlanner(longest example 12, PlanConfig(max_tokens=64, "
        "batch_schedule='0:0.1 1K:1')).plan(0)",
        lambda tmp: EpochPlanner(L, _config("0:0.1 1K:1")).plan(0),
        "batch_schedule",
        "fraction 0.1",
        "12",
        "at least 0.1875",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=PLAN,
    ),
    error(
        "sampler-batch_schedule-first-fraction-too-small",
        "sampler",
        "TokenBudgetBatchSampler(longest example 12, 64, batch_schedule='0:0.1 1K:1') "
        "(built, nothing planned yet)",
        lambda tmp: TokenBudgetBatchSampler(
            L, 64, rank=0, world_size=2, batch_schedule="0:0.1 1K:1"
        ),
        "batch_schedule",
        "fraction 0.1",
        "at least 0.1875",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=PLAN,
    ),
    error(
        "dm-batch_schedule-first-fraction-too-small-with-shares",
        "DataModule",
        "TokenBudgetDataModule(longest 12, 64, rank_shares=[1, 0.5], "
        "batch_schedule='0:0.25 1K:1') (built, no Trainer yet)",
        lambda tmp: TokenBudgetDataModule(
            _items(), L, 64, rank_shares=[1, 0.5], batch_schedule="0:0.25 1K:1"
        ),
        "batch_schedule",
        "rank 1",
        "at least 0.375",
        "rank_shares",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=PLAN,
    ),
    error(
        "sampler-batch_schedule-decreasing",
        "sampler",
        "TokenBudgetBatchSampler(..., batch_schedule='0:1 1K:0.5')",
        lambda tmp: TokenBudgetBatchSampler(
            L, 64, rank=0, world_size=1, batch_schedule="0:1 1K:0.5"
        ),
        "batch_schedule",
        "decreases",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=SCHEDULE,
    ),
    error(
        "dm-batch_schedule-above-one",
        "DataModule",
        "TokenBudgetDataModule(..., batch_schedule='0:2 1K:1')",
        lambda tmp: TokenBudgetDataModule(_items(), L, 64, batch_schedule="0:2 1K:1"),
        "batch_schedule",
        "(0, 1]",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in=SCHEDULE,
    ),
    error(
        "resume-batch_schedule-changed",
        "resume/state",
        "a sampler state saved under batch_schedule='0:0.5 100:1', loaded under '0:0.25 100:1'",
        _resume_other_schedule,
        "batch_schedule",
        "0:0.5 100:1.0",
        "0:0.25 100:1.0",
        "restart_epoch",
        raises=ResumeMismatchError,
        fix_in="lightning_varbatch/data/sampler_resume.py",
    ),
    error(
        "mix-batch_schedule",
        "mixing/DataSource",
        "MixturePlanner([a, b], PlanConfig(..., batch_schedule='0:0.5 1K:1'))",
        lambda tmp: MixturePlanner([L, L], _config("0:0.5 1K:1")),
        "batch_schedule",
        "mixture",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in="lightning_varbatch/planner/mixture.py",
    ),
    error(
        "stream-batch_schedule",
        "streaming",
        "WindowedPlanner(..., PlanConfig(..., batch_schedule='0:0.5 1K:1'))",
        lambda tmp: WindowedPlanner([48], lambda s: L, _config("0:0.5 1K:1")),
        "batch_schedule",
        "Unset batch_schedule",
        raises=SettingValueError,
        setting="batch_schedule",
        fix_in="lightning_varbatch/planner/windows.py",
    ),
    accepted(
        "config-batch_schedule-every-form",
        "planner API",
        "batch_schedule as text, (tokens, fraction) pairs, a dict, suffixed strings",
        _every_form,
        note="accepted: one canonical schedule",
    ),
    accepted(
        "config-batch_schedule-numpy",
        "planner API",
        "batch_schedule=[(np.int64(0), np.float32(0.5)), (np.int64(1000), 1.0)]",
        _numpy_values,
    ),
]
