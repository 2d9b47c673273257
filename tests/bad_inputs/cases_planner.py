"""Planner API: every PlanConfig setting, and every kind of bad lengths.

Example:
    >>> len(CASES) > 60
    True
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import EpochPlanner, PlanConfig, TokenBudgetBatchSampler, plan_epoch
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import int_family, real_family

L = np.array([3, 5, 2, 7, 4, 6, 1, 8])
CONFIG = "lightning_varbatch/planner/settings.py"
LENGTHS = "lightning_varbatch/planner/length_checks.py"


def _config(name: str) -> Any:
    def call(value: Any) -> Any:
        kwargs: dict[str, Any] = {"max_tokens": 16, name: value}
        return PlanConfig(**kwargs)

    return call


def _cover(sampler: TokenBudgetBatchSampler, n: int) -> None:
    """Every example exactly once (the accepted cases check the result, not only no error)."""
    seen = sorted(i for batch in sampler for i in batch)
    assert seen == list(range(n)), f"the epoch covered {seen}, not 0..{n - 1}"


def _sampler(lengths: Any, max_tokens: Any = 16, **kwargs: Any) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(lengths, max_tokens, rank=0, world_size=1, **kwargs)


def _lengths_case(
    id: str,
    words: str,
    lengths: Any,
    *match: Any,
    raises: type[BaseException],
    setting: str | None = None,
) -> Case:
    def run(tmp: Path) -> Any:
        return _sampler(lengths)

    return error(
        id,
        "lengths",
        words,
        run,
        "lengths",
        *match,
        raises=raises,
        setting=setting,
        fix_in=LENGTHS,
    )


def _loss_over_length(tmp: Path) -> None:
    _sampler(L, loss_lengths=L * 10)  # more loss tokens than the example has tokens


def _huge(tmp: Path) -> None:
    n = 2**22 + 5
    sampler = _sampler(np.array([3, n, 5]), max_tokens=2**23)
    _cover(sampler, 3)


def _huge_pairs(tmp: Path) -> None:
    sampler = _sampler(np.array([[2**23, 4], [3, 3]]), max_tokens=2**24)
    _cover(sampler, 2)


def _list_lengths(tmp: Path) -> None:
    _cover(_sampler([3, 5, 2, 7]), 4)


def _float_integral(tmp: Path) -> None:
    _cover(_sampler(np.array([3.0, 5.0, 2.0])), 3)


def _uint16(tmp: Path) -> None:
    _cover(_sampler(np.array([3, 5, 2], dtype=np.uint16)), 3)


def _torch_lengths(tmp: Path) -> None:
    import torch

    _cover(_sampler(torch.tensor([3, 5, 2])), 3)


def _truncate_almost_all(tmp: Path) -> None:
    # 10 of 11 examples over a budget of 8: truncating nearly everything must not be silent.
    lengths = np.array([4] + [40] * 10)
    TokenBudgetBatchSampler(lengths, 8, rank=0, world_size=1, oversize="truncate")


def _skip_all(tmp: Path) -> None:
    _sampler(np.array([40, 50, 60]), max_tokens=8, oversize="skip")


def _over_budget(tmp: Path) -> None:
    _sampler(np.array([3, 5, 99, 4]), max_tokens=16)


def _loss_count(tmp: Path) -> None:
    _sampler(L, loss_lengths=np.array([1, 2, 3]))


def _loss_negative(tmp: Path) -> None:
    _sampler(L, loss_lengths=np.array([1, 2, 3, -4, 1, 1, 1, 1]))


def _cost_raises(tmp: Path) -> None:
    def cost(n: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
        return n * longest / 0 if isinstance(n, int) else n["tokens"]  # a bug in the user's model

    _sampler(L, cost=cost)


def _cost_negative(tmp: Path) -> None:
    def cost(n: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
        return -(n * longest).astype(float)

    _cover(_sampler(L, cost=cost), len(L))


def _loss_pairs(tmp: Path) -> None:
    _sampler(L, loss_lengths=np.ones((len(L), 2), dtype=int))


def _cost_bad_shape(tmp: Path) -> None:
    def cost(n: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.array([1.0])  # one number for any number of candidates

    _sampler(L, cost=cost)


def _cost_nan(tmp: Path) -> None:
    def cost(n: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.full(np.shape(n), np.nan)

    _cover(_sampler(L, cost=cost), len(L))


def _more_ranks(tmp: Path) -> None:
    plan_epoch(np.array([3, 4, 5]), max_tokens=16, world_size=8)


def _planner_config(tmp: Path) -> None:
    EpochPlanner(L, {"max_tokens": 16})


def _epoch_plan(value: Any) -> Any:
    return EpochPlanner(L, PlanConfig(16)).plan(epoch=value)


CASES: list[Case] = [
    *int_family(
        "config-max_tokens",
        "planner API",
        "max_tokens",
        _config("max_tokens"),
        what="PlanConfig(max_tokens=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-max_examples",
        "planner API",
        "max_examples",
        _config("max_examples"),
        required=False,
        what="PlanConfig(max_examples=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-batch_size_multiple",
        "planner API",
        "batch_size_multiple",
        _config("batch_size_multiple"),
        what="PlanConfig(batch_size_multiple=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-pad_to_multiple_of",
        "planner API",
        "pad_to_multiple_of",
        _config("pad_to_multiple_of"),
        what="PlanConfig(pad_to_multiple_of=",
        fix_in=CONFIG,
        not_blame=("raise max_tokens",),
    ),
    *int_family(
        "config-loss_offset",
        "planner API",
        "loss_offset",
        _config("loss_offset"),
        zero_ok=True,
        good=1,
        what="PlanConfig(loss_offset=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-max_shapes",
        "planner API",
        "max_shapes",
        _config("max_shapes"),
        required=False,
        what="PlanConfig(max_shapes=",
        fix_in=CONFIG,
    ),
    *int_family(
        "config-bucket_width",
        "planner API",
        "bucket_width",
        _config("bucket_width"),
        what="PlanConfig(bucket_width=",
        fix_in=CONFIG,
        not_blame=("raise max_tokens",),
    ),
    *int_family(
        "config-seed",
        "planner API",
        "seed",
        _config("seed"),
        zero_ok=True,
        what="PlanConfig(seed=",
        fix_in=CONFIG,
    ),
    *real_family(
        "config-quadratic_coef",
        "planner API",
        "quadratic_coef",
        lambda v: PlanConfig(16, cost="quadratic", quadratic_coef=v),
        what="PlanConfig(cost='quadratic', quadratic_coef=",
        members=[
            ("negative", -0.5, "-0.5"),
            ("nan", math.nan, "nan"),
            ("inf", math.inf, "inf"),
            ("str", "0.5", ("'0.5'", "str")),
            ("none", None, "None"),
            ("bool", True, "True"),
        ],
        fix_in=CONFIG,
    ),
    *real_family(
        "config-flop_attention",
        "planner API",
        "flop_attention",
        lambda v: PlanConfig(16, layout="packed", flop_attention=v),
        what="PlanConfig(layout='packed', flop_attention=",
        members=[
            ("negative", -0.5, "-0.5"),
            ("nan", math.nan, "nan"),
            ("inf", math.inf, "inf"),
            ("str", "0.5", ("'0.5'", "str")),
            ("none", None, "None"),
            ("bool", True, "True"),
        ],
        fix_in=CONFIG,
    ),
    error(
        "config-layout-unknown",
        "planner API",
        "PlanConfig(layout='flat')",
        lambda tmp: PlanConfig(16, layout="flat"),
        "layout",
        "flat",
        "packed",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="layout",
    ),
    error(
        "config-layout-packed-with-cost",
        "planner API",
        "PlanConfig(layout='packed', cost='quadratic')",
        lambda tmp: PlanConfig(16, layout="packed", cost="quadratic"),
        "layout='packed'",
        "quadratic",
        "cost",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="cost",
    ),
    error(
        "config-max_shapes-with-layout",
        "planner API",
        "PlanConfig(max_shapes=8, layout='packed')",
        lambda tmp: PlanConfig(16, max_shapes=8, layout="packed"),
        "max_shapes=8",
        "layout",
        "unset max_shapes",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="max_shapes",
    ),
    error(
        "config-max_shapes-with-cost",
        "planner API",
        "PlanConfig(max_shapes=8, cost='sum')",
        lambda tmp: PlanConfig(16, max_shapes=8, cost="sum"),
        "max_shapes=8",
        "cost",
        "unset max_shapes",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="max_shapes",
    ),
    error(
        "config-max_shapes-with-bucket_width",
        "planner API",
        "PlanConfig(max_shapes=8, bucket_width=2)",
        lambda tmp: PlanConfig(16, max_shapes=8, bucket_width=2),
        "max_shapes=8",
        "bucket_width",
        "unset max_shapes",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="max_shapes",
    ),
    error(
        "config-max_shapes-with-batch_size_multiple",
        "planner API",
        "PlanConfig(max_shapes=8, batch_size_multiple=8)",
        lambda tmp: PlanConfig(16, max_shapes=8, batch_size_multiple=8),
        "max_shapes=8",
        "batch_size_multiple",
        "unset max_shapes",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="max_shapes",
    ),
    error(
        "config-cost-packed-without-layout",
        "planner API",
        "PlanConfig(cost='packed')",
        lambda tmp: PlanConfig(16, cost="packed"),
        "cost='packed'",
        "layout='packed'",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="cost",
    ),
    error(
        "config-tail-unknown",
        "planner API",
        "PlanConfig(tail='keep')",
        lambda tmp: PlanConfig(16, tail="keep"),
        "tail",
        "keep",
        "spread",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="tail",
    ),
    error(
        "config-tail-none",
        "planner API",
        "PlanConfig(tail=None)",
        lambda tmp: PlanConfig(16, tail=None),
        "tail",
        "None",
        fix_in=CONFIG,
        raises=SettingTypeError,
        setting="tail",
    ),
    error(
        "config-pair_order-unknown",
        "planner API",
        "PlanConfig(pair_order='min')",
        lambda tmp: PlanConfig(16, pair_order="min"),
        "pair_order",
        "min",
        "two_sided",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="pair_order",
    ),
    error(
        "config-oversize-unknown",
        "planner API",
        "PlanConfig(oversize='clip')",
        lambda tmp: PlanConfig(16, oversize="clip"),
        "oversize",
        "clip",
        "truncate",
        fix_in=CONFIG,
        raises=SettingValueError,
        setting="oversize",
    ),
    error(
        "config-oversize-bool",
        "planner API",
        "PlanConfig(oversize=True)",
        lambda tmp: PlanConfig(16, oversize=True),
        "oversize",
        "True",
        fix_in=CONFIG,
        raises=SettingTypeError,
        setting="oversize",
    ),
    error(
        "config-cost-unknown",
        "planner API",
        "PlanConfig(cost='linear')",
        lambda tmp: PlanConfig(16, cost="linear"),
        "cost",
        "linear",
        "padded",
        fix_in="lightning_varbatch/planner/costs.py",
        raises=SettingValueError,
        setting="cost",
    ),
    error(
        "config-cost-int",
        "planner API",
        "PlanConfig(cost=5)",
        lambda tmp: PlanConfig(16, cost=5),
        "cost",
        ("int", "5"),
        fix_in="lightning_varbatch/planner/costs.py",
        raises=SettingTypeError,
        setting="cost",
    ),
    error(
        "config-cost-none",
        "planner API",
        "PlanConfig(cost=None)",
        lambda tmp: PlanConfig(16, cost=None),
        "cost",
        "None",
        fix_in="lightning_varbatch/planner/costs.py",
        raises=SettingTypeError,
        setting="cost",
    ),
    error(
        "config-shuffle-str-false",
        "planner API",
        "PlanConfig(shuffle='false')",
        lambda tmp: PlanConfig(16, shuffle="false"),
        "shuffle",
        "false",
        fix_in=CONFIG,
        raises=SettingTypeError,
        setting="shuffle",
    ),
    error(
        "config-shuffle-none",
        "planner API",
        "PlanConfig(shuffle=None)",
        lambda tmp: PlanConfig(16, shuffle=None),
        "shuffle",
        "None",
        fix_in=CONFIG,
        raises=SettingTypeError,
        setting="shuffle",
    ),
    error(
        "config-shuffle-int",
        "planner API",
        "PlanConfig(shuffle=2)",
        lambda tmp: PlanConfig(16, shuffle=2),
        "shuffle",
        "2",
        fix_in=CONFIG,
        raises=SettingTypeError,
        setting="shuffle",
    ),
    accepted(
        "config-shuffle-np-bool",
        "planner API",
        "PlanConfig(shuffle=np.bool_(False))",
        lambda tmp: PlanConfig(16, shuffle=np.bool_(False)),
        fix_in=CONFIG,
    ),
    error(
        "planner-config-dict",
        "planner API",
        "EpochPlanner(lengths, config={'max_tokens': 16})",
        _planner_config,
        "config",
        "PlanConfig",
        fix_in="lightning_varbatch/planner/epoch_planner.py",
        raises=SettingTypeError,
        setting="config",
    ),
    *int_family(
        "planner-epoch",
        "planner API",
        "epoch",
        _epoch_plan,
        zero_ok=True,
        what="EpochPlanner.plan(epoch=",
        fix_in="lightning_varbatch/planner/epoch_planner.py",
    ),
    error(
        "planner-more-ranks-than-examples",
        "planner API",
        "plan_epoch(3 examples, world_size=8, tail='spread')",
        _more_ranks,
        "world_size",
        "8",
        "3",
        fix_in="lightning_varbatch/planner/epoch_planner.py",
        raises=ValueError,
    ),
    error(
        "planner-cost-raises",
        "planner API",
        "cost= a callable that raises inside (a bug in the user's cost model)",
        _cost_raises,
        "cost",
        setting="cost",
        raises=SettingValueError,
        fix_in="lightning_varbatch/planner/sorted_cut.py",
    ),
    error(
        "planner-cost-negative",
        "planner API",
        "cost= a callable returning negative costs",
        _cost_negative,
        "cost",
        ("negative", "< 0", ">= 0"),
        fix_in="lightning_varbatch/planner/sorted_cut.py",
        raises=SettingValueError,
        setting="cost",
    ),
    error(
        "planner-cost-bad-shape",
        "planner API",
        "cost= a callable returning one number for any number of candidates",
        _cost_bad_shape,
        "cost",
        "shape",
        fix_in="lightning_varbatch/planner/sorted_cut.py",
        raises=SettingValueError,
        setting="cost",
    ),
    error(
        "planner-cost-nan",
        "planner API",
        "cost= a callable returning NaN",
        _cost_nan,
        "cost",
        "nan",
        fix_in="lightning_varbatch/planner/sorted_cut.py",
        raises=SettingValueError,
        setting="cost",
    ),
    # -- lengths -------------------------------------------------------------------------
    _lengths_case(
        "lengths-ragged",
        "lengths=[[3, 4], [5]] (ragged pairs)",
        [[3, 4], [5]],
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-three-columns",
        "lengths of shape (4, 3)",
        np.ones((4, 3), dtype=int),
        "(4, 3)",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-one-column",
        "lengths of shape (4, 1)",
        np.ones((4, 1), dtype=int),
        "(4, 1)",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-3d",
        "lengths of shape (2, 2, 2)",
        np.ones((2, 2, 2), dtype=int),
        "(2, 2, 2)",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-strings",
        "lengths=['3', '5']",
        np.array(["3", "5"]),
        ("str", "<U", "'3'"),
        setting="lengths",
        raises=SettingTypeError,
    ),
    _lengths_case(
        "lengths-str-scalar",
        "lengths='3 5 2' (a string)",
        "3 5 2",
        ("str", "<U", "'3 5 2'"),
        setting="lengths",
        raises=SettingTypeError,
    ),
    _lengths_case(
        "lengths-bool",
        "lengths=[True, False]",
        np.array([True, False]),
        "bool",
        setting="lengths",
        raises=SettingTypeError,
    ),
    _lengths_case(
        "lengths-object-none",
        "lengths=[3, None, 4]",
        [3, None, 4],
        ("None", "object"),
        setting="lengths",
        raises=SettingTypeError,
    ),
    _lengths_case(
        "lengths-none", "lengths=None", None, "None", setting="lengths", raises=SettingTypeError
    ),
    _lengths_case(
        "lengths-dict",
        "lengths={'a': 3}",
        {"a": 3},
        ("dict", "object"),
        setting="lengths",
        raises=SettingTypeError,
    ),
    _lengths_case(
        "lengths-nan",
        "lengths=[3, nan, 4]",
        np.array([3.0, np.nan, 4.0]),
        "nan",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-inf",
        "lengths=[3, inf]",
        np.array([3.0, np.inf]),
        "inf",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-fraction",
        "lengths=[3, 2.5]",
        np.array([3.0, 2.5]),
        "2.5",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-negative",
        "lengths=[3, -2, 4]",
        np.array([3, -2, 4]),
        "-2",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-zero",
        "lengths=[3, 0, 4]",
        np.array([3, 0, 4]),
        "0",
        ">= 1",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-pair-zero",
        "lengths=[[3, 4], [0, 2]]",
        np.array([[3, 4], [0, 2]]),
        "0",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-empty",
        "lengths=[]",
        np.array([], dtype=np.int64),
        "empty",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-empty-list",
        "lengths=[] (a Python list)",
        [],
        "empty",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-0d",
        "lengths=np.array(5) (0-d)",
        np.array(5),
        ("()", "0-d", "scalar"),
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-int-scalar",
        "lengths=5 (an int)",
        5,
        ("int", "()", "scalar"),
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-2-31",
        "lengths=[3, 2**31]",
        np.array([3, 2**31]),
        "2147483648",
        setting="lengths",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-uint64-overflow",
        "lengths=[3, 2**63] (uint64)",
        np.array([3, 2**63], dtype=np.uint64),
        "9223372036854775808",
        setting="lengths",
        raises=SettingValueError,
    ),
    error(
        "lengths-over-budget",
        "lengths",
        "an example of length 99 with max_tokens=16",
        _over_budget,
        "max_tokens",
        "16",
        "99",
        "oversize",
        fix_in=LENGTHS,
        setting="max_tokens",
        raises=SettingValueError,
    ),
    error(
        "lengths-skip-all",
        "lengths",
        "oversize='skip' with every example over the budget",
        _skip_all,
        "max_tokens",
        "8",
        "skip",
        fix_in=LENGTHS,
        setting="max_tokens",
        raises=SettingValueError,
    ),
    error(
        "lengths-truncate-almost-all",
        "lengths",
        "oversize='truncate' with 10 of 11 examples over max_tokens=8",
        _truncate_almost_all,
        "truncate",
        "10",
        "max_tokens",
        warn_ok=True,
        fix_in=LENGTHS,
        setting="max_tokens",
        raises=SettingValueError,
    ),
    _lengths_case(
        "lengths-generator",
        "lengths=(n for n in ...) (a generator)",
        (n for n in (3, 5, 2)),
        ("generator", "object"),
        setting="lengths",
        raises=SettingTypeError,
    ),
    error(
        "lengths-loss-over-length",
        "lengths",
        "loss_lengths ten times the 1-D lengths (more loss tokens than tokens)",
        _loss_over_length,
        "loss_lengths",
        "30",
        fix_in=LENGTHS,
        setting="loss_lengths",
        raises=SettingValueError,
    ),
    error(
        "lengths-loss-count",
        "lengths",
        "loss_lengths with 3 entries for 8 lengths",
        _loss_count,
        "loss_lengths",
        "3",
        "8",
        fix_in=LENGTHS,
        setting="loss_lengths",
        raises=SettingValueError,
    ),
    error(
        "lengths-loss-pairs",
        "lengths",
        "loss_lengths of shape (8, 2) (pairs) for 8 examples",
        _loss_pairs,
        "loss_lengths",
        "(8, 2)",
        fix_in=LENGTHS,
        setting="loss_lengths",
        raises=SettingValueError,
    ),
    error(
        "lengths-loss-negative",
        "lengths",
        "loss_lengths holding -4",
        _loss_negative,
        "loss_lengths",
        "-4",
        fix_in=LENGTHS,
        setting="loss_lengths",
        raises=SettingValueError,
    ),
    accepted(
        "lengths-huge-within-budget",
        "lengths",
        "a length of 2**22 + 5 with max_tokens=2**23",
        _huge,
        fix_in=LENGTHS,
    ),
    accepted(
        "lengths-huge-pairs-within-budget",
        "lengths",
        "pair lengths [[2**23, 4], [3, 3]] with max_tokens=2**24",
        _huge_pairs,
        fix_in=LENGTHS,
    ),
    accepted(
        "lengths-python-list", "lengths", "lengths as a Python list", _list_lengths, fix_in=LENGTHS
    ),
    accepted(
        "lengths-integral-floats",
        "lengths",
        "lengths=[3.0, 5.0, 2.0]",
        _float_integral,
        fix_in=LENGTHS,
    ),
    accepted("lengths-uint16", "lengths", "lengths of dtype uint16", _uint16, fix_in=LENGTHS),
    accepted(
        "lengths-torch-tensor",
        "lengths",
        "lengths as a torch tensor",
        _torch_lengths,
        fix_in=LENGTHS,
    ),
]
