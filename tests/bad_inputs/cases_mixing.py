"""Several datasets: MixturePlanner settings and per-dataset DataSource settings.

Every per-dataset error must name the dataset (here ``"news"``), like the global ones name the
setting.

Example:
    >>> len(CASES) > 40
    True
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import DataSource, MixturePlanner, PlanConfig, TokenBudgetBatchSampler
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import POSITIVE_REAL_BAD, int_family, real_family

MIXING = "lightning_varbatch/planner/mixture.py"
SOURCES = "lightning_varbatch/planner/mixture_datasets.py"
A = np.array([3, 5, 2, 7, 4, 6, 1, 8])
B = np.array([4, 4, 6, 2])
NEWS = ("'news'", '"news"', "news")


def _planner(sources: Any = None, max_tokens: int = 16, **kwargs: Any) -> MixturePlanner:
    if sources is None:
        sources = [DataSource(A, name="wmt"), DataSource(B, name="news")]
    planner = MixturePlanner(sources, PlanConfig(max_tokens), **kwargs)
    planner.plan(epoch=0, world_size=1)
    return planner


def _setting(name: str, **base: Any) -> Any:
    def call(value: Any) -> Any:
        return _planner(**{**base, name: value})

    return call


def _news(name: str) -> Any:
    """A DataSource setting of the second dataset, ``news``."""

    def call(value: Any) -> Any:
        return _planner([DataSource(A, name="wmt"), DataSource(B, name="news", **{name: value})])

    return call


def _news_lengths(lengths: Any) -> Any:
    def run(tmp: Path) -> Any:
        return _planner([DataSource(A, name="wmt"), DataSource(lengths, name="news")])

    return run


def _cap_honoured(tmp: Path) -> None:
    planner = _planner([DataSource(A, name="wmt"), DataSource(B, name="news", max_examples=1)])
    plan = planner.plan(epoch=0, world_size=1)
    sizes = plan.micro_batch_size[plan.assign].reshape(-1)
    datasets = plan.step_dataset.reshape(-1)
    assert sizes[datasets == 1].max() == 1, "news's max_examples=1 was not honoured"


def _dataset_count(tmp: Path) -> None:
    items = [{"tokens": [1] * int(n)} for n in B[:3]]
    _planner([DataSource(A, name="wmt"), DataSource(B, dataset=items, name="news")])


def _weights_ok(tmp: Path) -> None:
    _planner(weights=np.array([1, 3]), steps_per_epoch=np.int64(6))


def _sampler_mixing(tmp: Path) -> None:
    s = TokenBudgetBatchSampler.from_sources([A, B], 16, rank=0, world_size=1, mixing="per_epoch")
    len(s)


def _single_source(tmp: Path) -> None:
    MixturePlanner(DataSource(A, name="wmt"), PlanConfig(16))


def _sources_none(tmp: Path) -> None:
    MixturePlanner(None, PlanConfig(16))


CASES: list[Case] = [
    error(
        "mix-weights-count",
        "mixing/DataSource",
        "weights=[1, 2, 3] for 2 datasets",
        lambda tmp: _planner(weights=[1, 2, 3], steps_per_epoch=4),
        "weights",
        "3",
        "2",
        fix_in=SOURCES,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "mix-weights-negative",
        "mixing/DataSource",
        "weights=[1, -1]",
        lambda tmp: _planner(weights=[1, -1], steps_per_epoch=4),
        "weights",
        "-1",
        fix_in=SOURCES,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "mix-weights-nan",
        "mixing/DataSource",
        "weights=[1, nan]",
        lambda tmp: _planner(weights=[1, math.nan], steps_per_epoch=4),
        "weights",
        "nan",
        fix_in=SOURCES,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "mix-weights-inf",
        "mixing/DataSource",
        "weights=[1, inf]",
        lambda tmp: _planner(weights=[1, math.inf], steps_per_epoch=4),
        "weights",
        "inf",
        fix_in=SOURCES,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "mix-weights-all-zero",
        "mixing/DataSource",
        "weights=[0, 0]",
        lambda tmp: _planner(weights=[0, 0], steps_per_epoch=4),
        "weights",
        "zero",
        fix_in=SOURCES,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "mix-weights-str",
        "mixing/DataSource",
        "weights='uniform'",
        lambda tmp: _planner(weights="uniform", steps_per_epoch=4),
        "weights",
        "uniform",
        fix_in=SOURCES,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "mix-weights-str-items",
        "mixing/DataSource",
        "weights=['1', 'x']",
        lambda tmp: _planner(weights=["1", "x"], steps_per_epoch=4),
        "weights",
        ("'1'", "'x'", "str"),
        fix_in=SOURCES,
        raises=SettingTypeError,
        setting="weights",
    ),
    error(
        "mix-weights-none",
        "mixing/DataSource",
        "weights=None",
        lambda tmp: _planner(weights=None, steps_per_epoch=4),
        "weights",
        "None",
        fix_in=SOURCES,
        raises=SettingTypeError,
        setting="weights",
    ),
    error(
        "mix-weights-without-steps",
        "mixing/DataSource",
        "weights=[1, 3] without steps_per_epoch",
        lambda tmp: _planner(weights=[1, 3]),
        "weights",
        "steps_per_epoch",
        fix_in=MIXING,
        raises=SettingValueError,
        setting="steps_per_epoch",
    ),
    error(
        "mix-temperature-without-steps",
        "mixing/DataSource",
        "temperature=2 without steps_per_epoch",
        lambda tmp: _planner(temperature=2.0),
        "temperature",
        "steps_per_epoch",
        fix_in=MIXING,
        raises=SettingValueError,
        setting="steps_per_epoch",
    ),
    *real_family(
        "mix-temperature",
        "mixing/DataSource",
        "temperature",
        _setting("temperature", steps_per_epoch=4),
        good=2.0,
        members=[*POSITIVE_REAL_BAD, ("none", None, "None")],
        what="MixturePlanner(steps_per_epoch=4, temperature=",
        fix_in=SOURCES,
    ),
    *int_family(
        "mix-steps_per_epoch",
        "mixing/DataSource",
        "steps_per_epoch",
        _setting("steps_per_epoch"),
        required=False,
        good=4,
        what="MixturePlanner(steps_per_epoch=",
        fix_in=MIXING,
    ),
    error(
        "mix-mixing-unknown",
        "mixing/DataSource",
        "mixing='per_epoch'",
        lambda tmp: _planner(mixing="per_epoch"),
        "mixing",
        "per_epoch",
        "per_step",
        fix_in=MIXING,
        raises=SettingValueError,
        setting="mixing",
    ),
    error(
        "mix-mixing-sampler",
        "mixing/DataSource",
        "TokenBudgetBatchSampler.from_sources(..., mixing='per_epoch')",
        _sampler_mixing,
        "mixing",
        "per_epoch",
        fix_in=MIXING,
        raises=SettingValueError,
        setting="mixing",
    ),
    error(
        "mix-sources-empty",
        "mixing/DataSource",
        "MixturePlanner([], config)",
        lambda tmp: MixturePlanner([], PlanConfig(16)),
        "sources",
        "empty",
        fix_in=MIXING,
        raises=SettingValueError,
        setting="sources",
    ),
    error(
        "mix-sources-none",
        "mixing/DataSource",
        "MixturePlanner(None, config)",
        _sources_none,
        "sources",
        "None",
        fix_in=MIXING,
        raises=SettingTypeError,
        setting="sources",
    ),
    error(
        "mix-sources-single",
        "mixing/DataSource",
        "MixturePlanner(DataSource(...)) (not a list)",
        _single_source,
        "sources",
        "DataSource",
        fix_in=MIXING,
        raises=SettingTypeError,
        setting="sources",
    ),
    error(
        "mix-names-duplicate",
        "mixing/DataSource",
        "two datasets named 'wmt'",
        lambda tmp: _planner([DataSource(A, name="wmt"), DataSource(B, name="wmt")]),
        "wmt",
        "name",
        fix_in=MIXING,
        raises=SettingValueError,
        setting="name",
    ),
    error(
        "mix-config-dict",
        "mixing/DataSource",
        "MixturePlanner(sources, {'max_tokens': 16})",
        lambda tmp: MixturePlanner([A, B], {"max_tokens": 16}),
        "config",
        "PlanConfig",
        fix_in=MIXING,
        raises=SettingTypeError,
        setting="config",
    ),
    accepted(
        "mix-weights-numpy",
        "mixing/DataSource",
        "weights=np.array([1, 3]), steps_per_epoch=np.int64(6)",
        _weights_ok,
        fix_in=SOURCES,
    ),
    # -- per dataset ---------------------------------------------------------------------
    error(
        "source-empty",
        "mixing/DataSource",
        "DataSource(lengths=[], name='news')",
        _news_lengths(np.array([], dtype=int)),
        NEWS,
        "empty",
        fix_in=MIXING,
        setting="lengths",
        raises=SettingValueError,
    ),
    error(
        "source-negative",
        "mixing/DataSource",
        "DataSource([4, -4, 6], name='news')",
        _news_lengths(np.array([4, -4, 6])),
        NEWS,
        "-4",
        fix_in=MIXING,
        setting="lengths",
        raises=SettingValueError,
    ),
    error(
        "source-nan",
        "mixing/DataSource",
        "DataSource([4, nan], name='news')",
        _news_lengths(np.array([4.0, math.nan])),
        NEWS,
        "nan",
        fix_in=MIXING,
        setting="lengths",
        raises=SettingValueError,
    ),
    error(
        "source-three-columns",
        "mixing/DataSource",
        "DataSource(lengths of shape (4, 3))",
        _news_lengths(np.ones((4, 3), dtype=int)),
        NEWS,
        "(4, 3)",
        fix_in=MIXING,
        setting="lengths",
        raises=SettingValueError,
    ),
    error(
        "source-strings",
        "mixing/DataSource",
        "DataSource(['4', '5'], name='news')",
        _news_lengths(np.array(["4", "5"])),
        NEWS,
        "lengths",
        fix_in=MIXING,
        setting="lengths",
        raises=SettingTypeError,
    ),
    error(
        "source-lengths-none",
        "mixing/DataSource",
        "DataSource(None, name='news')",
        _news_lengths(None),
        NEWS,
        "lengths",
        "None",
        fix_in=MIXING,
        setting="lengths",
        raises=SettingTypeError,
    ),
    error(
        "source-over-budget",
        "mixing/DataSource",
        "DataSource([40, 4], name='news') with max_tokens=16",
        _news_lengths(np.array([40, 4])),
        NEWS,
        "max_tokens",
        "40",
        fix_in=MIXING,
        setting="max_tokens",
        raises=SettingValueError,
    ),
    *int_family(
        "source-max_tokens",
        "mixing/DataSource",
        "max_tokens",
        _news("max_tokens"),
        required=False,
        good=16,
        what="DataSource(name='news', max_tokens=",
        extra_match=(NEWS,),
        fix_in=MIXING,
    ),
    *int_family(
        "source-max_examples",
        "mixing/DataSource",
        "max_examples",
        _news("max_examples"),
        required=False,
        good=2,
        what="DataSource(name='news', max_examples=",
        extra_match=(NEWS,),
        fix_in=MIXING,
    ),
    error(
        "source-loss_lengths-count",
        "mixing/DataSource",
        "DataSource(B, loss_lengths of 2 entries for 4, name='news')",
        lambda tmp: _news("loss_lengths")(np.array([1, 2])),
        NEWS,
        "loss_lengths",
        "2",
        "4",
        fix_in=MIXING,
        setting="loss_lengths",
        raises=SettingValueError,
    ),
    error(
        "source-dataset-count",
        "mixing/DataSource",
        "DataSource(4 lengths, dataset of 3 items, name='news')",
        _dataset_count,
        NEWS,
        "4",
        "3",
        fix_in=MIXING,
        raises=ValueError,
    ),
    error(
        "source-name-int",
        "mixing/DataSource",
        "DataSource(name=5)",
        lambda tmp: _planner([DataSource(A, name="wmt"), DataSource(B, name=5)]),
        "name",
        "5",
        fix_in=SOURCES,
        raises=SettingTypeError,
        setting="name",
    ),
    accepted(
        "source-max_examples-honoured",
        "mixing/DataSource",
        "DataSource(name='news', max_examples=1) caps news's micro-batches at 1",
        _cap_honoured,
        fix_in=MIXING,
    ),
]
