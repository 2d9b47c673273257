"""Every bad input gets an error that says what is wrong and which setting to change."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_varbatch import EpochPlanner, PlanConfig, TokenBudgetBatchSampler, plan_epoch
from lightning_varbatch.errors import SettingTypeError, SettingValueError


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        (np.array([], dtype=np.int64), r"lengths is empty: the dataset has no examples"),
        (np.array([3, -1, 4]), r"lengths\[1\] = -1: every length must be >= 1"),
        (np.array([3, 0, 4]), r"lengths\[1\] = 0: every length must be >= 1"),
        (np.array([3.0, np.nan]), r"lengths\[1\] is nan: lengths must be finite integers"),
        (np.array([3.0, 2.5]), r"lengths\[1\] = 2.5 is not an integer"),
        (np.array([[1, 2, 3]]), r"shape \(num_examples,\) or \(num_examples, 2\)"),
        (np.array([[[1]]]), r"got shape \(1, 1, 1\)"),
        (np.array([[4, 0]]), r"lengths\[0\] = \[4, 0\]: every length must be >= 1"),
    ],
)
def test_bad_lengths(lengths: np.ndarray, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_epoch(lengths, max_tokens=100)


def test_non_numeric_lengths() -> None:
    with pytest.raises(TypeError, match="lengths must be an integer array, got dtype"):
        plan_epoch(np.array(["a", "b"]), max_tokens=100)
    with pytest.raises(TypeError, match="got dtype bool"):
        plan_epoch(np.array([True, False]), max_tokens=100)


@pytest.mark.parametrize("budget", [0, -5])
def test_non_positive_budget(budget: int) -> None:
    with pytest.raises(
        SettingValueError, match=f"max_tokens must be a positive integer, got {budget}"
    ) as e:
        PlanConfig(max_tokens=budget)
    assert type(e.value) is SettingValueError
    assert (e.value.setting, e.value.value) == ("max_tokens", budget)


@pytest.mark.parametrize("budget", [10.5, "64", True, None])
def test_non_integer_budget(budget: object) -> None:
    with pytest.raises(SettingTypeError, match="max_tokens must be a positive integer, got") as e:
        PlanConfig(max_tokens=budget)  # type: ignore[arg-type]
    assert type(e.value) is SettingTypeError and isinstance(e.value, (TypeError, ValueError))
    assert e.value.setting == "max_tokens" and e.value.value is budget


@pytest.mark.parametrize(
    ("setting", "value", "match"),
    [
        ("max_examples", 0, "max_examples must be a positive integer, got 0"),
        ("batch_size_multiple", 0, "batch_size_multiple must be a positive integer"),
        ("pad_to_multiple_of", -1, "pad_to_multiple_of must be a positive integer"),
        ("bucket_width", 0, "bucket_width must be a positive integer"),
        ("seed", -1, "seed must be a non-negative integer"),
        ("tail", "keep", "tail must be one of 'spread', 'drop', 'pad'"),
        ("oversize", "clip", "oversize must be one of 'error', 'skip', 'truncate'"),
        ("layout", "rows", "layout must be one of 'padded', 'packed'"),
        ("cost", "cubic", "cost must be one of 'padded', 'sum', 'quadratic', 'packed' or a call"),
        ("quadratic_coef", -1.0, "quadratic_coef must be a finite number >= 0"),
        ("quadratic_coef", float("nan"), "quadratic_coef must be a finite number >= 0"),
        ("flop_attention", float("inf"), "flop_attention must be a finite number >= 0"),
        ("max_shapes", 0, "max_shapes must be a positive integer"),
    ],
)
def test_bad_settings(setting: str, value: object, match: str) -> None:
    kwargs: dict[str, object] = {"max_tokens": 64, setting: value}
    if setting == "quadratic_coef":
        kwargs["cost"] = "quadratic"
    with pytest.raises(SettingValueError, match=match) as e:
        PlanConfig(**kwargs)  # type: ignore[arg-type]
    assert type(e.value) is SettingValueError and e.value.setting == setting
    assert e.value.value is value


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("tail", None),
        ("oversize", 1),
        ("layout", b"packed"),
        ("quadratic_coef", "0.5"),
        ("flop_attention", True),
        ("shuffle", "false"),
        ("seed", 1.0),
    ],
)
def test_settings_of_the_wrong_type(setting: str, value: object) -> None:
    with pytest.raises(SettingTypeError, match=f"{setting} must be") as e:
        PlanConfig(max_tokens=64, **{setting: value})  # type: ignore[arg-type]
    assert type(e.value) is SettingTypeError and e.value.setting == setting
    assert e.value.value is value


def test_cost_of_wrong_type() -> None:
    with pytest.raises(SettingTypeError, match="cost must be one of 'padded', 'sum'") as e:
        PlanConfig(max_tokens=64, cost=3)  # type: ignore[arg-type]
    assert (e.value.setting, e.value.value) == ("cost", 3)


def test_oversize_error_names_example_length_budget_and_setting() -> None:
    with pytest.raises(ValueError) as err:
        plan_epoch(np.array([5, 8, 300, 7, 400]), max_tokens=256)
    message = str(err.value)
    for part in (
        "Example 2 has length 300",
        "max_tokens=256",
        "oversize='skip'",
        "oversize='truncate'",
        "2 example(s) are over the budget",
    ):
        assert part in message


def test_oversize_error_uses_the_pair_maximum() -> None:
    with pytest.raises(ValueError, match="Example 1 has length 90"):
        plan_epoch(np.array([[5, 6], [3, 90]]), max_tokens=64)


def test_oversize_skip_counts_and_leaves_out() -> None:
    plan = plan_epoch(np.array([5, 300, 7, 400]), max_tokens=256, oversize="skip")
    assert plan.num_skipped == 2
    assert sorted(plan.example_ids().tolist()) == [0, 2]


def test_oversize_skip_of_everything_is_an_error() -> None:
    with pytest.raises(ValueError, match="Every example is over the budget max_tokens=4"):
        plan_epoch(np.array([5, 9]), max_tokens=4, oversize="skip")


def test_oversize_truncate_cuts_to_the_longest_fitting_length() -> None:
    planner = EpochPlanner(
        np.array([[5, 6], [300, 280]]),
        PlanConfig(max_tokens=100, oversize="truncate", cost="quadratic", quadratic_coef=0.01),
    )
    # the longest L with L + 0.01 L^2 <= 100 is 61
    assert planner.prepared.truncate_to == 61
    assert planner.prepared.num_truncated == 1
    assert planner.prepared.key.tolist() == [6, 61]
    sampler = TokenBudgetBatchSampler(
        np.array([[5, 6], [300, 280]]),
        100,
        oversize="truncate",
        cost="quadratic",
        quadratic_coef=0.01,
        rank=0,
        world_size=1,
    )
    assert sampler.truncate_to == 61
    assert sum(b.ntokens for b in sampler) == 6 + 61


def test_budget_below_one_token_even_truncated() -> None:
    with pytest.raises(ValueError, match="Example 0 has length 5"):
        plan_epoch(np.array([5]), max_tokens=2, oversize="truncate", pad_to_multiple_of=8)


def test_more_ranks_than_examples() -> None:
    with pytest.raises(ValueError) as err:
        plan_epoch(np.array([3, 4, 5]), max_tokens=64, world_size=2, accumulate_grad_batches=2)
    message = str(err.value)
    assert message.startswith("More ranks than batches: the data gives only 3 examples")
    assert "world_size=2 x accumulate_grad_batches=2 = 4" in message
    assert "Lower max_tokens, world_size or accumulate_grad_batches" in message


def test_more_ranks_than_micro_batches_with_drop() -> None:
    with pytest.raises(ValueError, match="only 1 micro-batches but world_size=4"):
        plan_epoch(np.array([3, 4, 5]), max_tokens=64, world_size=4, tail="drop")


def test_pad_serves_more_ranks_than_batches() -> None:
    plan = plan_epoch(np.array([3, 4, 5]), max_tokens=64, world_size=4, tail="pad")
    assert plan.num_micro_batches_per_rank == 1
    assert plan.num_duplicated == 9  # three repeats of the one 3-example micro-batch


def test_non_monotone_custom_cost_is_caught() -> None:
    def weird(n: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.where(np.asarray(n) == 2, 1000.0, np.asarray(n) * 1.0)

    with pytest.raises(ValueError, match="a custom cost= must be non-decreasing"):
        # 2 micro-batches of 5 for 3 ranks: one is split into 3 + 2; 2 costs 1000
        plan_epoch(np.ones(10, dtype=np.int64), max_tokens=5, cost=weird, world_size=3)


def test_loss_lengths_shape_mismatch() -> None:
    with pytest.raises(ValueError, match="loss_lengths has shape \\(2,\\) but lengths describe 3"):
        plan_epoch(np.array([3, 4, 5]), max_tokens=64, loss_lengths=np.array([1, 2]))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"world_size": 0}, "world_size must be a positive integer, got 0"),
        ({"accumulate_grad_batches": 0}, "accumulate_grad_batches must be a positive integer"),
        ({"epoch": -1}, "epoch must be a non-negative integer, got -1"),
    ],
)
def test_bad_topology(kwargs: dict[str, int], match: str) -> None:
    planner = EpochPlanner(np.array([3, 4, 5]), PlanConfig(max_tokens=64))
    args = {"epoch": 0, "world_size": 1, "accumulate_grad_batches": 1, **kwargs}
    with pytest.raises(SettingValueError, match=match) as e:
        planner.plan(**args)
    assert type(e.value) is SettingValueError and e.value.setting == next(iter(kwargs))


def test_sampler_rank_out_of_range() -> None:
    with pytest.raises(ValueError, match=r"rank must be in \[0, world_size=2\), got 2"):
        TokenBudgetBatchSampler(np.array([3, 4]), 64, rank=2, world_size=2)
    with pytest.raises(ValueError, match="world_size must be a positive integer, got 0"):
        TokenBudgetBatchSampler(np.array([3, 4]), 64, rank=0, world_size=0)
    with pytest.raises(ValueError, match="accumulate_grad_batches must be a positive integer"):
        TokenBudgetBatchSampler(
            np.array([3, 4]), 64, rank=0, world_size=1, accumulate_grad_batches=0
        )
