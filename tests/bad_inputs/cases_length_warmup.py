"""Planner API: the sequence-length warm-up settings (``length_warmup*``, issue 24).

Example:
    >>> len(CASES) > 20
    True
"""

from __future__ import annotations

from typing import Any

import numpy as np

from lightning_varbatch import DataSource, EpochPlanner, MixturePlanner, PlanConfig
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.windows import WindowedPlanner
from tests.bad_inputs.case import Case, error
from tests.bad_inputs.families import int_family

CONFIG = "lightning_varbatch/planner/warmup_plan.py"
WARMUP = "lightning_varbatch/planner/length_warmup.py"
L = np.array([3, 5, 2, 7, 4, 6, 1, 12])  # the longest above the default minimum, 8


def _config(name: str) -> Any:
    def call(value: Any) -> Any:
        kwargs: dict[str, Any] = {"max_tokens": 16, "length_warmup": 4, name: value}
        return PlanConfig(**kwargs)

    return call


def _schedule(fn: Any) -> Any:
    return PlanConfig(max_tokens=16, length_warmup=4, length_warmup_schedule=fn)


def _source(name: str) -> Any:
    """A length warm-up bound of the second dataset of a mixture, ``news``."""

    def call(value: Any) -> Any:
        news = DataSource(L, name="news", **{name: value})
        planner = MixturePlanner([DataSource(L, name="wmt"), news], PlanConfig(16, length_warmup=4))
        return planner.plan(epoch=0)

    return call


def _nan(p: float) -> float:
    return float("nan")


def _boom(p: float) -> float:
    raise RuntimeError("no")


def _bad_schedule(id: str, words: str, fn: Any, *match: str) -> Case:
    return error(
        f"config-length_warmup_schedule-{id}",
        "planner API",
        f"PlanConfig(length_warmup=4, length_warmup_schedule={words})",
        lambda tmp: _schedule(fn),
        "length_warmup_schedule",
        "[0, 1]",
        *match,
        setting="length_warmup_schedule",
        raises=SettingValueError,
        fix_in=WARMUP,
    )


CASES: list[Case] = [
    *int_family(
        "config-length_warmup",
        "planner API",
        "length_warmup",
        lambda v: PlanConfig(max_tokens=16, length_warmup=v),
        required=False,
        what="PlanConfig(length_warmup=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-length_warmup_min",
        "planner API",
        "length_warmup_min",
        _config("length_warmup_min"),
        what="PlanConfig(length_warmup=4, length_warmup_min=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-length_warmup_max",
        "planner API",
        "length_warmup_max",
        _config("length_warmup_max"),
        required=False,
        good=16,
        what="PlanConfig(length_warmup=4, length_warmup_max=",
        fix_in=CONFIG,
    ),
    error(
        "config-length_warmup_min-above-max",
        "planner API",
        "PlanConfig(length_warmup=4, length_warmup_min=64, length_warmup_max=32)",
        lambda tmp: PlanConfig(16, length_warmup=4, length_warmup_min=64, length_warmup_max=32),
        "length_warmup_min=64",
        "length_warmup_max=32",
        "Lower length_warmup_min",
        setting="length_warmup_min",
        raises=SettingValueError,
        fix_in=CONFIG,
    ),
    error(
        "config-length_warmup_min-without-warmup",
        "planner API",
        "PlanConfig(length_warmup_min=16) (no length_warmup)",
        lambda tmp: PlanConfig(16, length_warmup_min=16),
        "no effect without length_warmup",
        setting="length_warmup_min",
        raises=SettingValueError,
        fix_in=CONFIG,
    ),
    error(
        "config-length_warmup_schedule-unknown",
        "planner API",
        "PlanConfig(length_warmup=4, length_warmup_schedule='cosine')",
        lambda tmp: _schedule("cosine"),
        "length_warmup_schedule",
        "'linear'",
        "'root'",
        setting="length_warmup_schedule",
        raises=SettingValueError,
        fix_in=CONFIG,
    ),
    error(
        "config-length_warmup_schedule-not-callable",
        "planner API",
        "PlanConfig(length_warmup=4, length_warmup_schedule=0.5)",
        lambda tmp: _schedule(0.5),
        "length_warmup_schedule",
        "callable",
        setting="length_warmup_schedule",
        raises=SettingTypeError,
        fix_in=CONFIG,
    ),
    _bad_schedule("decreasing", "lambda p: 1 - p", lambda p: 1 - p, "decreases"),
    _bad_schedule("above-one", "lambda p: 2 * p", lambda p: 2 * p, "returned 1.02"),
    _bad_schedule("negative", "lambda p: p - 0.5", lambda p: p - 0.5, "returned -0.5"),
    _bad_schedule("nan", "a function returning NaN", _nan, "nan"),
    _bad_schedule("string", "lambda p: 'half'", lambda p: "half", "'half'"),
    _bad_schedule("raises", "a function that raises", _boom, "RuntimeError"),
    *int_family(
        "source-length_warmup_min",
        "mixing/DataSource",
        "length_warmup_min",
        _source("length_warmup_min"),
        required=False,
        good=4,
        what="DataSource(name='news', length_warmup_min=",
        extra_match=("news",),
        fix_in="lightning_varbatch/planner/mixture_datasets.py",
    ),
    *int_family(
        "source-length_warmup_max",
        "mixing/DataSource",
        "length_warmup_max",
        _source("length_warmup_max"),
        required=False,
        good=16,
        what="DataSource(name='news', length_warmup_max=",
        extra_match=("news",),
        fix_in="lightning_varbatch/planner/mixture_datasets.py",
    ),
    error(
        "mixture-length_warmup_min-above-max",
        "mixing/DataSource",
        "MixturePlanner([DataSource(a, length_warmup_max=4), b], PlanConfig(..., length_warmup=4))",
        lambda tmp: MixturePlanner(
            [DataSource(L, length_warmup_max=4, name="a"), L], PlanConfig(16, length_warmup=4)
        ),
        "Dataset 'a'",
        "length_warmup_min=8",
        "length_warmup_max=4",
        setting="length_warmup_min",
        raises=SettingValueError,
        fix_in="lightning_varbatch/planner/warmup_plan.py",
    ),
    error(
        "mixture-length_warmup_min-above-its-longest",
        "mixing/DataSource",
        "MixturePlanner([DataSource(lengths up to 12, length_warmup_min=40), b], "
        "PlanConfig(..., length_warmup=4))",
        lambda tmp: MixturePlanner(
            [DataSource(L, length_warmup_min=40, name="short"), L * 2],
            PlanConfig(32, length_warmup=4),
        ),
        "DataSource 'short'",
        "length_warmup_min=40",
        "longest example (12)",
        "never warm up",
        setting="length_warmup_min",
        raises=SettingValueError,
        fix_in="lightning_varbatch/planner/mixture_warmup.py",
    ),
    error(
        "stream-length_warmup",
        "streaming",
        "WindowedPlanner(..., PlanConfig(..., length_warmup=4))",
        lambda tmp: WindowedPlanner([8], lambda s: L, PlanConfig(16, length_warmup=4)),
        "length_warmup=4",
        "window",
        "Unset length_warmup",
        setting="length_warmup",
        raises=SettingValueError,
        fix_in="lightning_varbatch/planner/windows.py",
    ),
    error(
        "planner-first_step-negative",
        "planner API",
        "EpochPlanner(...).plan(0, first_step=-1)",
        lambda tmp: EpochPlanner(L, PlanConfig(16, length_warmup=4)).plan(0, first_step=-1),
        "first_step",
        setting="first_step",
        raises=SettingValueError,
        fix_in="lightning_varbatch/planner/epoch_planner.py",
    ),
    error(
        "planner-length_warmup_min-holds-every-example",
        "planner API",
        "EpochPlanner(lengths up to 12, PlanConfig(length_warmup=4, length_warmup_min=12))",
        lambda tmp: EpochPlanner(L, PlanConfig(16, length_warmup=4, length_warmup_min=12)),
        "length_warmup_min=12",
        "holds every example",
        "change nothing",
        setting="length_warmup_min",
        raises=SettingValueError,
        fix_in="lightning_varbatch/planner/warmup_plan.py",
    ),
    error(
        "config-length_warmup_max-below-the-default-min",
        "planner API",
        "PlanConfig(length_warmup=4, length_warmup_max=4) (length_warmup_min at its default 8)",
        lambda tmp: PlanConfig(16, length_warmup=4, length_warmup_max=4),
        "length_warmup_min=8 (its default)",
        "Raise length_warmup_max",
        setting="length_warmup_max",
        raises=SettingValueError,
        fix_in=WARMUP,
    ),
]
