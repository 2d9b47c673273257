"""The tail policy (:mod:`lightning_varbatch.planner.tail`), rule by rule."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_varbatch import TokenBudgetBatchSampler
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
        ("spread", 3, True, "spread"),  # a rest smaller than a step splits, then repeats
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


# --- issue 38: the rest of an elastic resume under "spread" repeats the fewest examples ---


def _elastic_rest(
    lengths: np.ndarray,
    max_tokens: int,
    before: tuple[int, int],
    after: tuple[int, int],
    consumed: int,
    rank_shares: list[float] | None = None,
    **settings: object,
) -> tuple[list[int], list[list[int]]]:
    """Every rank trains ``consumed`` micro-batches on ``before`` = (world, acc), saves, and
    resumes on ``after``: the examples consumed and the rest's micro-batches (all ranks)."""
    (w1, a1), (w2, a2) = before, after
    first = [
        TokenBudgetBatchSampler(
            lengths, max_tokens, rank=r, world_size=w1, accumulate_grad_batches=a1, **settings
        )
        for r in range(w1)
    ]
    done = [int(i) for s in first for b in list(s)[:consumed] for i in b]
    state = first[0].state_dict(consumed=consumed)
    shares = {} if rank_shares is None else {"rank_shares": rank_shares}
    second = [
        TokenBudgetBatchSampler(
            lengths,
            max_tokens,
            rank=r,
            world_size=w2,
            accumulate_grad_batches=a2,
            **shares,
            **settings,
        )
        for r in range(w2)
    ]
    for s in second:
        s.load_state_dict(state)
    assert len({len(s) for s in second}) == 1  # equal counts on every rank
    return done, [[int(i) for i in b] for s in second for b in s]


def _extra_runs(num_examples: int, done: list[int], rest: list[list[int]]) -> tuple[int, int]:
    """The rest's runs beyond one per example not consumed, and that number of examples;
    asserts the rest trains exactly those examples (none lost, none consumed again)."""
    left = sorted(set(range(num_examples)) - set(done))
    runs = [i for b in rest for i in b]
    assert sorted(set(runs)) == left
    return len(runs) - len(left), len(left)


def test_an_elastic_rest_smaller_than_a_step_repeats_only_the_empty_slots() -> None:
    """6 examples left for 3 ranks x 3 micro-batches: 9 micro-batches of one example, 3 of
    them repeats (whole micro-batches of 3 repeated before: 21 extra runs)."""
    done, rest = _elastic_rest(np.full(30, 10), 30, (1, 1), (3, 3), consumed=8)
    extra, left = _extra_runs(30, done, rest)
    assert (left, len(rest), extra) == (6, 9, 3)
    assert [len(b) for b in rest] == [1] * 9


def test_an_elastic_rest_in_lanes_moves_spare_examples_before_repeating() -> None:
    """Ranks of their own budgets: 8 examples left for 9 micro-batches repeat 1 (2 before:
    one lane kept two examples in one micro-batch while another repeated)."""
    lengths = np.array([28, 13, 27, 9, 28, 22, 24, 21, 4, 4, 4, 28, 18, 27, 8, 16, 12, 21])
    shares = [1.0, 0.8067339747056139, 0.7580051719990348]
    done, rest = _elastic_rest(lengths, 52, (4, 3), (3, 3), consumed=1, rank_shares=shares)
    extra, left = _extra_runs(lengths.size, done, rest)
    assert (left, len(rest), extra) == (8, 9, 1)


@st.composite
def _elastic_cases(draw: st.DrawFn) -> dict[str, object]:
    pairs = draw(st.booleans())
    n = draw(st.integers(2, 60))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    lengths = rng.integers(1, 40, size=(n, 2) if pairs else n)
    longest = int(lengths.max()) * (2 if pairs else 1)
    world = draw(st.integers(1, 4))
    shares = None
    if world > 1 and draw(st.booleans()):
        others = st.lists(st.floats(0.7, 1.0), min_size=world - 1, max_size=world - 1)
        shares = [1.0, *draw(others)]
    return {
        "lengths": lengths,
        "max_tokens": draw(st.integers(longest * 3 // 2, longest * 5)),
        "before": (draw(st.integers(1, 4)), draw(st.integers(1, 3))),
        "after": (world, draw(st.integers(1, 3))),
        "rank_shares": shares,
        "cost": draw(st.sampled_from(["padded", "padded", "sum", "quadratic"])),
        "from_end": draw(st.integers(0, 3)),  # consumed micro-batches: near the epoch's end
    }


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_elastic_cases())
def test_an_elastic_rest_repeats_the_fewest_examples(case: dict[str, object]) -> None:
    """Over random elastic resumes (world size, accumulation, rank shares, pairs, costs): the
    rest trains every example not consumed, and repeats exactly as many as its micro-batches
    outnumber them (each repeat one example alone in a micro-batch, none while there are
    enough); with one budget its micro-batches are the fewest whole steps its greedy cut
    allows."""
    lengths = cast(np.ndarray, case["lengths"])
    max_tokens = cast(int, case["max_tokens"])
    before = cast(tuple[int, int], case["before"])
    after = cast(tuple[int, int], case["after"])
    shares = cast("list[float] | None", case["rank_shares"])
    cost = case["cost"]
    assume(before != after)  # the same topology resumes the saved plan exactly, not re-planned
    try:
        first = TokenBudgetBatchSampler(
            lengths,
            max_tokens,
            rank=0,
            world_size=before[0],
            accumulate_grad_batches=before[1],
            cost=cost,
        )
        consumed = max(1, len(first) - cast(int, case["from_end"]))
        done, rest = _elastic_rest(lengths, max_tokens, before, after, consumed, shares, cost=cost)
    except ValueError:  # more ranks than batches for the first topology, or a share too small
        assume(False)
        raise
    extra, left = _extra_runs(lengths.shape[0], done, rest)
    assert extra == max(0, len(rest) - left)
    if shares is None and lengths.ndim == 1 and left:
        step = after[0] * after[1]
        remaining = np.sort(np.setdiff1d(np.arange(lengths.shape[0]), done))
        greedy = EpochPlanner(lengths[remaining], PlanConfig(max_tokens, cost=cost)).plan(0)
        assert len(rest) <= max(step, -(-greedy.micro_batch_size.size // step) * step)
