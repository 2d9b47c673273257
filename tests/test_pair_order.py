"""Pairs in the two-sided order: padding against independent references, and every guarantee.

The references (:mod:`benchmarks.planning.pair_reference`) are written from the definitions,
not from the planner: the padded slots of both tensors recounted from the ids, fairseq's max
order and the narrow-bucket order cut by a plain greedy loop, and the exact optimum of small inputs.
"""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import pytest

from benchmarks.planning.pair_reference import (
    bucket_order,
    greedy_cut,
    max_order,
    optimum,
    padded_slots,
)
from lightning_varbatch import EpochPlanner, PlanConfig, TokenBudgetBatchSampler
from lightning_varbatch.callbacks.worst_micro_batches import worst_micro_batches
from lightning_varbatch.errors import ResumeMismatchError, SettingValueError
from lightning_varbatch.planner import EpochPlan, pair_slots, wmt_like_lengths
from lightning_varbatch.planner.lengths import prepare_lengths
from lightning_varbatch.planner.one_call import plan_epoch
from lightning_varbatch.planner.pair_buckets import MOST_PAIRS_TRIED, WIDTHS, pair_width
from lightning_varbatch.planner.pair_order import MIN_CELL, order_within
from lightning_varbatch.planner.shape_settings import check_shape_settings

PAIRS = wmt_like_lengths(20_000, seed=0).astype(np.int64)
BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)


def batches_of(plan: EpochPlan) -> list[np.ndarray]:
    """Every micro-batch's ids, as planned (the run's repeats and drops aside)."""
    starts, sizes = plan.micro_batch_start, plan.micro_batch_size
    return [plan.order[s : s + n] for s, n in zip(starts, sizes, strict=True)]


def padding(batches: list[np.ndarray], pairs: np.ndarray) -> float:
    real = sum(int(pairs[b].sum()) for b in batches)
    return 1 - real / padded_slots(batches, pairs)


@pytest.mark.parametrize("budget", BUDGETS)
def test_pads_at_most_the_better_reference_order_with_the_same_micro_batches(
    budget: int,
) -> None:
    plans = {
        order: EpochPlanner(PAIRS, PlanConfig(budget, pair_order=order)).plan(0, world_size=2)
        for order in ("two_sided", "max")
    }
    ours = padding(batches_of(plans["two_sided"]), PAIRS)
    references = {
        "max": padding(greedy_cut(max_order(PAIRS, seed=0), PAIRS, budget), PAIRS),
        **{
            f"buckets {w:.0%}": padding(greedy_cut(bucket_order(PAIRS, w), PAIRS, budget), PAIRS)
            for w in (0.02, 0.05, 0.1)
        },
    }
    assert ours <= min(references.values()), (ours, references)
    # at most a few more micro-batches than the max order (where wider buckets pad less)
    counts = {k: len(p.micro_batch_size) for k, p in plans.items()}
    assert counts["max"] <= counts["two_sided"] <= 1.01 * counts["max"]
    for ids in batches_of(plans["two_sided"]):  # a budget on each side
        assert len(ids) * PAIRS[ids].max(axis=0).max() <= budget


def test_the_gain_is_large_where_micro_batches_hold_few_pairs() -> None:
    """At 512-1024 tokens the mismatch of the two sides is most of the max order's padding."""
    for budget, most in ((512, 0.02), (1024, 0.03)):
        plan = EpochPlanner(PAIRS, PlanConfig(budget)).plan(0)
        assert padding(batches_of(plan), PAIRS) < most


def test_the_bucket_width_is_the_one_that_pads_least() -> None:
    """Few pairs per planning length: the chosen geometric width pads less than exact lengths."""
    pairs = PAIRS[:2000]
    chosen = EpochPlanner(pairs, PlanConfig(512))
    exact = EpochPlanner(pairs, PlanConfig(512))
    exact._pair_width = 0.0  # as if only the exact lengths were tried
    assert chosen.plan(0).num_micro_batches_per_rank > 0 and chosen._pair_width == 0.05
    padded = [padding(batches_of(p.plan(0)), pairs) for p in (chosen, exact)]
    assert padded[0] < padded[1]
    # a resume re-plans the rest in the same buckets: the width is the data's, not the rest's
    rest = chosen.plan_resumed(0, 2, 1, [(1, 1, 40)])
    assert chosen._pair_width == 0.05 and rest.num_micro_batches_per_rank > 0


def test_within_a_few_percent_of_the_exact_optimum_on_small_inputs() -> None:
    """Small inputs: padded slots against every partition into as many micro-batches."""
    rng = np.random.default_rng(0)
    pool = wmt_like_lengths(50_000, seed=3).astype(np.int64)
    ratios = []
    for trial in range(25):
        pairs = pool[rng.choice(len(pool), 9, replace=False)]
        budget = int(pairs.max() * rng.integers(2, 5))
        plan = EpochPlanner(pairs, PlanConfig(budget, seed=trial)).plan(0)
        ours = padded_slots(batches_of(plan), pairs)
        best = optimum(pairs, budget, len(plan.micro_batch_size))
        assert best <= ours  # the bound holds (the optimum may not beat a plan it includes)
        ratios.append(ours / best)
    assert np.mean(ratios) < 1.1 and min(ratios) == 1.0


def test_ranks_are_balanced_by_both_sides_padded_slots() -> None:
    pairs = PAIRS[:3000]
    plan = EpochPlanner(pairs, PlanConfig(1024, pad_to_multiple_of=8)).plan(0, world_size=4)
    assert plan.micro_batch_work is not None
    for m, ids in enumerate(batches_of(plan)):
        longest = -(-pairs[ids].max(axis=0) // 8) * 8
        assert plan.micro_batch_work[m] == len(ids) * longest.sum()
    starts, sizes = plan.micro_batch_start, plan.micro_batch_size
    assert np.array_equal(pair_slots(plan.order, starts, sizes, pairs, 8), plan.micro_batch_work)
    loads = plan.micro_batch_work[plan.assign].sum(axis=2)  # (steps, ranks)
    assert np.median(loads.max(axis=1) / loads.mean(axis=1)) < 1.05


def test_epochs_still_change_the_micro_batches_members() -> None:
    """Cells of at least MIN_CELL pairs: few micro-batches repeat from one epoch to the next."""
    planner = EpochPlanner(PAIRS[:5000], PlanConfig(1024))
    sets = [
        {frozenset(b.tolist()) for b in batches_of(planner.plan(e, world_size=2))} for e in range(2)
    ]
    assert len(sets[0] & sets[1]) / len(sets[0]) < 0.1
    assert sorted(np.concatenate([list(s) for s in sets[0]]).tolist()) == list(range(5000))


def test_one_length_per_example_plans_and_fingerprints_as_before() -> None:
    lengths = PAIRS[:2000, 0]
    plans = [EpochPlanner(lengths, PlanConfig(512, pair_order=o)) for o in ("two_sided", "max")]
    assert plans[0].fingerprint() == plans[1].fingerprint() == PlanConfig(512).fingerprint()
    a, b = (p.plan(1, world_size=2) for p in plans)
    assert np.array_equal(a.order, b.order) and np.array_equal(a.assign, b.assign)
    assert a.micro_batch_work is None


def test_a_state_of_the_max_order_is_refused_by_the_two_sided_one_naming_it() -> None:
    """A checkpoint of pairs planned by max(source, target) (also every one saved before the
    setting existed) does not resume silently under the other order."""
    pairs = PAIRS[:3000]
    old = TokenBudgetBatchSampler(pairs, 512, rank=0, world_size=1, pair_order="max")
    it = iter(old)
    taken = [list(next(it)) for _ in range(4)]
    state = pickle.loads(pickle.dumps(old.state_dict()))
    new = TokenBudgetBatchSampler(pairs, 512, rank=0, world_size=1)
    with pytest.raises(ResumeMismatchError, match="pair_order") as caught:
        new.load_state_dict(state)
    assert caught.value.changed == ["pair_order"]
    # a state saved before the setting existed does not name it: its fingerprint tells
    settings = {k: v for k, v in state["settings"].items() if k != "pair_order"}
    with pytest.raises(ResumeMismatchError, match="pair_order='max'") as caught:
        new.load_state_dict({**state, "settings": settings})
    assert caught.value.changed == ["fingerprint"]
    again = TokenBudgetBatchSampler(pairs, 512, rank=0, world_size=1, pair_order="max")
    again.load_state_dict(state)
    rest = [list(b) for b in again]
    assert sorted(i for b in taken + rest for i in b) == list(range(3000))


def test_order_within_alternates_direction_and_keeps_cells_of_alike_pairs() -> None:
    rng = np.random.default_rng(5)
    pairs = rng.integers(1, 30, size=(400, 2))
    diff = pairs[:, 0] - pairs[:, 1]
    ids = np.arange(400, dtype=np.int32)
    starts = np.array([0, 150, 400])
    ordered, cells = order_within(ids.copy(), starts, diff)
    diff = pairs[ordered, 0] - pairs[ordered, 1]
    assert np.all(np.diff(diff[:150]) >= 0) and np.all(np.diff(diff[150:]) <= 0)
    assert sorted(ordered[:150].tolist()) == list(range(150))  # groups keep their members
    assert cells[0] == 0 and cells[-1] == 400 and {0, 150} <= set(cells.tolist())
    ends = set(starts.tolist())
    for a, b in ((0, 150), (150, 400)):  # at most one cell per MIN_CELL pairs of a group
        assert ((cells >= a) & (cells < b)).sum() <= (b - a) // MIN_CELL + 1
    for b in cells[1:-1].tolist():  # a cell never splits a run of equal source - target
        assert b in ends or diff[b] != diff[b - 1]


def test_pair_width_is_the_planners_and_only_for_pairs_it_can_reorder() -> None:
    pairs = PAIRS[:2000]
    config = PlanConfig(512)
    planner = EpochPlanner(pairs, config)
    planner.plan(0)
    assert pair_width(prepare_lengths(pairs, config), config) == planner._pair_width in WIDTHS
    assert pair_width(prepare_lengths(pairs[:, 0], config), config) == 0.0  # one length each
    flat = PlanConfig(512, pair_order="max")
    assert pair_width(prepare_lengths(pairs, flat), flat) == 0.0
    many = np.ones((MOST_PAIRS_TRIED + 1, 2), dtype=np.int16)
    assert pair_width(prepare_lengths(many, config), config) == 0.0


def test_plan_epoch_is_one_planners_epoch() -> None:
    one = plan_epoch(PAIRS[:500], 1024, epoch=2, world_size=2, seed=4)
    many = EpochPlanner(PAIRS[:500], PlanConfig(1024, seed=4)).plan(2, 2)
    assert np.array_equal(one.order, many.order) and np.array_equal(one.assign, many.assign)


def test_a_shape_budget_names_the_setting_it_cannot_keep() -> None:
    config = PlanConfig(64)
    check_shape_settings(config)  # no clash at the defaults
    with pytest.raises(SettingValueError, match="bucket_width") as caught:
        check_shape_settings(dataclasses.replace(config, bucket_width=2, max_shapes=4))
    assert caught.value.setting == "max_shapes"


def test_worst_batch_check_picks_the_micro_batch_whose_two_sides_pad_most() -> None:
    """Equal budget cost, unequal tensors: the memory check must run the larger pair."""
    pairs = np.array([[8, 2], [8, 2], [8, 8], [8, 8], [2, 8], [2, 8]])
    sampler = TokenBudgetBatchSampler(pairs, 16, rank=0, world_size=1, shuffle=False)
    worst = worst_micro_batches(sampler, ["padded_tokens"])[0]
    assert sorted(sampler.plan.micro_batch_ids(worst.micro_batch).tolist()) == [2, 3]
