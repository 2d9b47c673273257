"""Mixed clusters: ``rank_shares`` and ``rank_max_tokens`` (issue 26), one entry per rank.

Every bad value names the setting and, where one entry is at fault, the rank
(``rank_shares[1] (the share of rank 1)``); a list of the wrong length names both lengths.

Example:
    >>> len(CASES) > 20
    True
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from omegaconf import OmegaConf

from lightning_varbatch import (
    EpochPlanner,
    PlanConfig,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error

SHARES = "lightning_varbatch/planner/rank_shares.py"
SAMPLER = "lightning_varbatch/data/sampler.py"
#: Longest example 8 (cost 8 padded, one example), budget 16.
L = np.array([3, 5, 2, 7, 4, 6, 1, 8, 2, 3, 5, 4])


def _config(**kwargs: Any) -> PlanConfig:
    return PlanConfig(max_tokens=16, **kwargs)


def _plan(world_size: int = 2, **kwargs: Any) -> Any:
    return EpochPlanner(L, _config(**kwargs)).plan(0, world_size, 1)


def _sampler(**kwargs: Any) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(L, 16, rank=0, world_size=2, **kwargs)


def _sampler_plan(**kwargs: Any) -> Any:
    return _sampler(**kwargs).plan


def _datamodule_check(world_size: int = 2, **kwargs: Any) -> Any:
    items = [{"tokens": [1] * int(n)} for n in L]
    return TokenBudgetDataModule(items, L, 16, **kwargs).check(world_size=world_size)


def _set_shares(shares: Any) -> None:
    _sampler().set_rank_shares(shares)


def _listconfig(tmp: Any) -> None:
    plan = _plan(rank_shares=OmegaConf.create([1.0, 0.5]))
    assert plan.rank_budget is not None and plan.rank_budget.tolist() == [16, 8]


def _numpy(tmp: Any) -> None:
    plan = _plan(rank_shares=np.array([2.0, 1.0]), rank_max_tokens=np.array([16, 16]))
    assert plan.rank_budget is not None and plan.rank_budget.tolist() == [16, 8]


def _share(id: str, words: str, value: Any, *match: Any, raises: type = SettingValueError) -> Case:
    return error(
        f"config-rank_shares-{id}",
        "planner API",
        f"PlanConfig(max_tokens=16, rank_shares={words})",
        lambda tmp: _config(rank_shares=value),
        "rank_shares",
        *match,
        raises=raises,
        setting="rank_shares",
        fix_in=SHARES,
    )


def _memory(id: str, words: str, value: Any, *match: Any, raises: type = SettingValueError) -> Case:
    return error(
        f"config-rank_max_tokens-{id}",
        "planner API",
        f"PlanConfig(max_tokens=16, rank_max_tokens={words})",
        lambda tmp: _config(rank_max_tokens=value),
        "rank_max_tokens",
        *match,
        raises=raises,
        setting="rank_max_tokens",
        fix_in=SHARES,
    )


CASES: list[Case] = [
    # -- rank_shares: each entry ---------------------------------------------------------------
    _share("zero", "[1.0, 0]", [1.0, 0], "rank_shares[1]", "rank 1", "0.0"),
    _share("negative", "[-1.0, 0.5]", [-1.0, 0.5], "rank_shares[0]", "rank 0", "-1.0"),
    _share("nan", "[1.0, nan]", [1.0, math.nan], "rank_shares[1]", "rank 1", "nan"),
    _share("inf", "[inf, 1.0]", [math.inf, 1.0], "rank_shares[0]", "rank 0", "inf"),
    _share(
        "str-entry",
        "[1.0, '0.5']",
        [1.0, "0.5"],
        "rank_shares[1]",
        "'0.5'",
        raises=SettingTypeError,
    ),
    _share("bool-entry", "[1.0, True]", [1.0, True], "rank_shares[1]", raises=SettingTypeError),
    # -- rank_shares: the list -----------------------------------------------------------------
    _share("not-a-list", "0.5", 0.5, "0.5", "list", "one entry per rank", raises=SettingTypeError),
    _share("str", "'1,0.5'", "1,0.5", "'1,0.5'", "list", raises=SettingTypeError),
    _share("empty", "[]", [], "empty", "one entry per rank"),
    error(
        "planner-rank_shares-wrong-length",
        "planner API",
        "EpochPlanner(rank_shares=[1.0, 0.5, 0.5]).plan(world_size=2)",
        lambda tmp: _plan(rank_shares=[1.0, 0.5, 0.5]),
        "rank_shares",
        "3 entries",
        "world_size=2",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SHARES,
    ),
    error(
        "sampler-rank_shares-too-small-for-a-token",
        "sampler",
        "TokenBudgetBatchSampler(world_size=2, rank_shares=[1.0, 1e-5])",
        lambda tmp: _sampler_plan(rank_shares=[1.0, 1e-5]),
        "rank_shares[1]=1e-05",
        "rank 1",
        "0 tokens",
        raises=SettingValueError,
        setting="rank_shares",
        not_blame=("rank_budgets=",),
        fix_in="lightning_varbatch/planner/rank_shares.py",
    ),
    error(
        "sampler-rank_shares-wrong-length",
        "sampler",
        "TokenBudgetBatchSampler(world_size=2, rank_shares=[1.0])",
        lambda tmp: _sampler_plan(rank_shares=[1.0]),
        "rank_shares",
        "1 entries",
        "world_size=2",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SAMPLER,
    ),
    error(
        "datamodule-rank_shares-wrong-length",
        "DataModule",
        "TokenBudgetDataModule(rank_shares=[1, 0.5]).check(world_size=3)",
        lambda tmp: _datamodule_check(3, rank_shares=[1, 0.5]),
        "rank_shares",
        "2 entries",
        "world_size=3",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SHARES,
    ),
    error(
        "planner-rank_shares-budget-below-longest",
        "planner API",
        "rank_shares=[1.0, 0.1] with max_tokens=16: rank 1's budget (1) below the longest (8)",
        lambda tmp: _plan(rank_shares=[1.0, 0.1]),
        "Rank 1",
        "rank_shares",
        "cost 8",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SHARES,
    ),
    error(
        "sampler-set_rank_shares-zero",
        "sampler",
        "sampler.set_rank_shares([1.0, 0])",
        lambda tmp: _set_shares([1.0, 0]),
        "rank_shares[1]",
        "rank 1",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SAMPLER,
    ),
    error(
        "sampler-set_rank_shares-wrong-length",
        "sampler",
        "sampler.set_rank_shares([1.0]) on 2 ranks",
        lambda tmp: _set_shares([1.0]),
        "set_rank_shares",
        "1 shares",
        "world_size=2",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SAMPLER,
    ),
    accepted(
        "config-rank_shares-listconfig",
        "planner API",
        "rank_shares as a Hydra ListConfig [1.0, 0.5]",
        _listconfig,
        fix_in=SHARES,
    ),
    accepted(
        "config-rank_shares-float32",
        "planner API",
        "PlanConfig(rank_shares=[np.float32(1.0), np.float32(0.5)])",
        lambda tmp: _config(rank_shares=[np.float32(1.0), np.float32(0.5)]),
        fix_in=SHARES,
    ),
    accepted(
        "config-rank_max_tokens-int64",
        "planner API",
        "PlanConfig(rank_max_tokens=[np.int64(16), np.int64(12)])",
        lambda tmp: _config(rank_max_tokens=[np.int64(16), np.int64(12)]),
        fix_in=SHARES,
    ),
    accepted(
        "config-rank_shares-numpy",
        "planner API",
        "rank_shares and rank_max_tokens as numpy arrays",
        _numpy,
        fix_in=SHARES,
    ),
    # -- rank_max_tokens -----------------------------------------------------------------------
    _memory("zero", "[16, 0]", [16, 0], "rank_max_tokens[1]", "rank 1", "0"),
    _memory("negative", "[-4, 16]", [-4, 16], "rank_max_tokens[0]", "rank 0", "-4"),
    _memory("float", "[16, 2.5]", [16, 2.5], "rank_max_tokens[1]", "2.5", raises=SettingTypeError),
    _memory("not-a-list", "16", 16, "16", "list", "one entry per rank", raises=SettingTypeError),
    _memory("above-max_tokens", "[32, 8]", [32, 8], "rank_max_tokens[0]=32", "max_tokens=16"),
    error(
        "sampler-rank_max_tokens-wrong-length",
        "sampler",
        "TokenBudgetBatchSampler(world_size=2, rank_max_tokens=[16])",
        lambda tmp: _sampler_plan(rank_max_tokens=[16]),
        "rank_max_tokens",
        "1 entries",
        "world_size=2",
        raises=SettingValueError,
        setting="rank_max_tokens",
        fix_in=SAMPLER,
    ),
    error(
        "planner-rank_max_tokens-below-longest",
        "planner API",
        "rank_max_tokens=[16, 6]: rank 1's memory cannot hold the longest example (8)",
        lambda tmp: _plan(rank_max_tokens=[16, 6]),
        "rank_max_tokens[1]=6",
        "cost 8",
        raises=SettingValueError,
        setting="rank_max_tokens",
        fix_in=SHARES,
    ),
    error(
        "datamodule-rank_max_tokens-below-longest",
        "DataModule",
        "TokenBudgetDataModule(rank_max_tokens=[16, 6]).check(world_size=2)",
        lambda tmp: _datamodule_check(2, rank_max_tokens=[16, 6]),
        "rank_max_tokens[1]=6",
        "cost 8",
        raises=SettingValueError,
        setting="rank_max_tokens",
        fix_in=SHARES,
    ),
    error(
        "sampler-rank_shares-per-batch-mixture",
        "mixing/DataSource",
        "TokenBudgetBatchSampler.from_sources(..., mixing='per_batch', rank_shares=[1.0, 0.5])",
        lambda tmp: TokenBudgetBatchSampler.from_sources(
            [L, L], 16, rank=0, world_size=2, mixing="per_batch", rank_shares=[1.0, 0.5]
        ),
        "mixing='per_batch'",
        "mixing='per_step'",
        raises=SettingValueError,
        setting="mixing",
        fix_in="lightning_varbatch/planner/mixture.py",
    ),
]
