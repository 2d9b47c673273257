"""The tail policy (:mod:`lightning_varbatch.planner.tail`), rule by rule."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_varbatch.planner import EpochPlanner, MixturePlanner, PlanConfig
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups
from lightning_varbatch.planner.tail import (
    effective_tail,
    select_micro_batches,
    split_micro_batches,
    spread_tail,
    tail_cut,
)


def _greedy(lengths: np.ndarray, config: PlanConfig) -> tuple[SortedCut, SortedGroups]:
    groups = SortedGroups.build(lengths.astype(np.uint16), None, config.bucket_width)
    return SortedCut.build(groups, config), groups


@pytest.mark.parametrize(
    ("tail", "available", "replanned", "expected"),
    [
        ("spread", 10, False, "spread"),
        ("drop", 10, False, "drop"),
        ("pad", 1, False, "pad"),
        ("drop", 1, False, "drop"),  # too few micro-batches is select_micro_batches' error
        ("spread", 10, True, "spread"),
        ("drop", 10, True, "drop"),  # a re-planned remainder drops as its name says
        ("drop", 3, True, "drop"),  # ... all of it when smaller than one step (counted)
        ("spread", 3, True, "pad"),  # spread pads a remainder smaller than one step
        ("pad", 3, True, "pad"),
    ],
)
def test_effective_tail(tail: str, available: int, replanned: bool, expected: str) -> None:
    config = PlanConfig(max_tokens=8, tail=tail)  # type: ignore[arg-type]
    assert effective_tail(config, available, 2, 2, replanned=replanned) == expected


def test_spread_over_a_whole_epoch_smaller_than_a_step_is_an_error() -> None:
    with pytest.raises(
        ValueError, match=r"More ranks than batches: the data gives only 3 examples"
    ):
        effective_tail(PlanConfig(max_tokens=8), 3, 2, 2, replanned=False)


def test_spread_recuts_the_last_step_evenly() -> None:
    config = PlanConfig(max_tokens=40)
    greedy, groups = _greedy(np.full(13, 10), config)
    assert greedy.sizes.tolist() == [4, 4, 4, 1]
    spread = spread_tail(greedy, groups, 4, config)
    assert spread.sizes.tolist() == [3, 3, 3, 4]
    assert tail_cut(greedy, groups, "spread", 4, config).sizes.tolist() == [3, 3, 3, 4]
    for tail in ("pad", "drop"):
        assert tail_cut(greedy, groups, tail, 4, config) is greedy


def test_spread_falls_back_to_splitting_tiles_when_too_few_examples() -> None:
    config = PlanConfig(max_tokens=40)
    greedy, groups = _greedy(np.full(5, 10), config)  # [4, 1]
    assert split_micro_batches(greedy, groups, 4, config).sizes.tolist() == [1, 1, 2, 1]
    # 8 micro-batches from 5 examples: split as far as possible, select_micro_batches pads the rest
    spread = spread_tail(greedy, groups, 8, config)
    assert spread.sizes.tolist() == [1, 1, 1, 1, 1]
    chosen = select_micro_batches(spread, "spread", 4, 2, np.random.default_rng(0), config)
    assert chosen.micro_batches.size == 8 and chosen.num_duplicated == 3


def test_split_tiles_keeps_pieces_adjacent_and_within_budget() -> None:
    config = PlanConfig(max_tokens=40)
    greedy, groups = _greedy(np.array([10] * 8 + [3] * 3), config)
    split = split_micro_batches(greedy, groups, 4, config)
    assert split.num_micro_batches % 4 == 0
    assert np.array_equal(split.starts[1:], (split.starts + split.sizes)[:-1])  # contiguous
    assert (split.cost <= config.max_tokens).all()


@pytest.mark.parametrize("tail", ["pad", "drop"])
def test_select_tiles_makes_whole_steps_and_counts(tail: str) -> None:
    config = PlanConfig(max_tokens=40, tail=tail)  # type: ignore[arg-type]
    greedy, _ = _greedy(np.full(26, 10), config)  # 7 micro-batches: [4] * 6 + [2]
    chosen = select_micro_batches(greedy, tail, 2, 2, np.random.default_rng(0), config)  # type: ignore[arg-type]
    assert chosen.micro_batches.size % 4 == 0
    if tail == "drop":
        assert chosen.micro_batches.size == 4 and chosen.num_duplicated == 0
        assert chosen.num_dropped == 26 - int(greedy.sizes[chosen.micro_batches].sum())
    else:
        assert chosen.micro_batches.size == 8 and chosen.num_dropped == 0
        repeated = np.flatnonzero(np.diff(chosen.micro_batches) == 0)
        assert chosen.num_duplicated == int(greedy.sizes[chosen.micro_batches[repeated]].sum())


def test_select_tiles_draws_nothing_for_whole_steps() -> None:
    config = PlanConfig(max_tokens=40)
    greedy, _ = _greedy(np.full(16, 10), config)
    rng = np.random.default_rng(0)
    state = rng.bit_generator.state
    chosen = select_micro_batches(greedy, "pad", 2, 2, rng, config)
    assert chosen.micro_batches.tolist() == [0, 1, 2, 3] and rng.bit_generator.state == state


def test_drop_with_fewer_micro_batches_than_a_step_is_an_error() -> None:
    config = PlanConfig(max_tokens=40, tail="drop")
    greedy, _ = _greedy(np.full(8, 10), config)  # 2 micro-batches
    with pytest.raises(ValueError, match=r"gives only 2 micro-batches"):
        select_micro_batches(greedy, "drop", 2, 2, np.random.default_rng(0), config)


@pytest.mark.parametrize("tail", ["spread", "drop"])
def test_both_planners_replan_a_remainder_by_the_same_rule(tail: str) -> None:
    """The re-plan rule holds for EpochPlanner and MixturePlanner alike (one definition):
    "spread" re-plans every example left, "drop" drops (counted) but never repeats."""
    config = PlanConfig(max_tokens=40, tail=tail)  # type: ignore[arg-type]
    lengths = np.full(27, 10)
    for planner in (EpochPlanner(lengths, config), MixturePlanner([lengths], config)):
        first = planner.plan(0, 2, 1)
        plan = planner.plan_resumed(0, 3, 1, [(2, 1, 1)])
        trained = np.bincount(
            np.concatenate([first.consumed_ids(1), plan.example_ids()]), minlength=27
        )
        assert plan.assign.size % 3 == 0
        assert trained.max() == 1  # nothing repeated
        assert int((trained == 0).sum()) == plan.num_dropped  # a drop is counted
        assert (plan.num_dropped > 0) == (tail == "drop")
