"""Ranks of different speed or memory: per-rank budgets in the plan (issue 26).

Property tests over lengths, budgets, world sizes, accumulation, tails, layouts, costs and
shares: equal micro-batch counts, every micro-batch within its rank's budget (re-computed here,
not read from the plan), every example exactly once (or the tail's counted drops and repeats),
each rank's work in proportion to its share, determinism, and exact resume when the world size
and the shares change mid-epoch. Then the sampler (shares in force, set at run time, saved and
restored), the DataModule, and the errors for bad settings.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_varbatch import PlanConfig, TokenBudgetBatchSampler, TokenBudgetDataModule
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner import (
    DataSource,
    EpochPlanner,
    MixturePlanner,
    diagnose,
    wmt_like_lengths,
)
from lightning_varbatch.planner.rank_shares import rank_budgets, scaled_budgets
from tests.launch import launch
from tests.test_planning_properties import planner_or_skip, recomputed_cost, scenarios

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def shared_scenarios(draw: st.DrawFn) -> dict:
    case = draw(scenarios())
    world = min(case["world"], 8)
    shares = draw(st.lists(st.floats(0.1, 4.0), min_size=world, max_size=world))
    case.update(world=world, shares=shares)
    return case


def budgets_for(planner: EpochPlanner, world: int, shares: list[float]) -> tuple[int, ...]:
    """Budgets from ``shares``, each raised to hold the longest example."""
    return rank_budgets(planner.config.max_tokens, world, shares, floor=planner.longest_cost)


@SETTINGS
@given(shared_scenarios())
def test_every_rank_runs_as_many_micro_batches_each_within_its_budget_and_no_example_is_lost(
    case: dict,
) -> None:
    planner = planner_or_skip(case["lengths"], case["config"])
    assume(planner.num_planned > 0)
    cfg, world, acc = planner.config, case["world"], case["acc"]
    budgets = budgets_for(planner, world, case["shares"])
    try:
        plan = planner.plan(case["epoch"], world, acc, rank_budgets=budgets)
    except ValueError as err:  # tail="drop" / "spread" with too few examples for the ranks
        assert "More ranks than batches" in str(err)
        return
    assert plan.assign.shape[1:] == (world, acc)
    key = planner.prepared.key
    for rank in range(world):
        for mb in plan.rank_micro_batches(rank):
            ids = plan.micro_batch_ids(int(mb))
            assert len(ids) > 0
            cost = recomputed_cost(ids, key, cfg)
            limit = budgets[rank] if plan.rank_budget is not None else cfg.max_tokens
            assert cost <= limit + 1e-9, (rank, cost, limit)
    counts = Counter(plan.example_ids().tolist())
    kept = planner.prepared.kept
    planned = set(range(planner.num_examples)) if kept is None else set(kept.tolist())
    assert set(counts) <= planned
    assert len(planned) - len(set(counts)) == plan.num_dropped or cfg.tail == "drop"
    if cfg.tail != "drop":
        assert set(counts) == planned
    assert sum(c - 1 for c in counts.values()) == plan.num_duplicated
    again = planner.plan(case["epoch"], world, acc, rank_budgets=budgets)
    assert np.array_equal(again.assign, plan.assign) and np.array_equal(again.order, plan.order)


@SETTINGS
@given(shared_scenarios(), st.data())
def test_resume_on_another_world_size_with_other_shares_trains_every_example_once(
    case: dict, data: st.DataObject
) -> None:
    config = case["config"]
    assume(config.tail != "drop")
    planner = planner_or_skip(case["lengths"], config)
    assume(planner.num_planned > 0)
    world, acc = case["world"], case["acc"]
    first = budgets_for(planner, world, case["shares"])
    try:
        plan = planner.plan(case["epoch"], world, acc, rank_budgets=first)
    except ValueError as err:
        assert "More ranks than batches" in str(err)
        return
    consumed = data.draw(st.integers(0, plan.num_micro_batches_per_rank))
    world2 = data.draw(st.integers(1, 4))
    shares2 = data.draw(st.lists(st.floats(0.1, 4.0), min_size=world2, max_size=world2))
    second = budgets_for(planner, world2, shares2)
    rest = planner.plan_resumed(
        case["epoch"], world2, 1, [(world, acc, consumed, first)], rank_budgets=second
    )
    trained = Counter(plan.consumed_ids(consumed).tolist())
    trained.update(rest.example_ids().tolist())
    planned = planner.num_planned
    assert len(trained) == planned  # every planned example trained
    # repeats only where a tail policy counted them
    assert sum(trained.values()) - planned <= plan.num_duplicated + rest.num_duplicated


def test_each_ranks_work_follows_its_share_on_wmt_like_lengths() -> None:
    lengths = wmt_like_lengths(200_000, seed=3)
    for layout in ("padded", "packed"):
        planner = EpochPlanner(
            lengths if layout == "padded" else lengths.max(axis=1),
            PlanConfig(max_tokens=4096, layout=layout),
        )
        for shares in ((1.0, 0.5), (1.0, 1.0, 0.5, 0.5), (1.0, 0.8, 0.6, 0.4)):
            world = len(shares)
            budgets = rank_budgets(4096, world, shares)
            plan = planner.plan(0, world, 2, rank_budgets=budgets)
            work = np.array(
                [plan.micro_batch_cost[plan.rank_micro_batches(r)].sum() for r in range(world)]
            )
            target = np.asarray(budgets) / sum(budgets)
            # the bound reached: every rank's share of the epoch's work within 0.5 % of its own
            assert np.abs(work / work.sum() / target - 1).max() < 0.005, (layout, shares)
            diag = diagnose(planner, plan)
            assert diag.imbalance_linear_mean < 1.03, (layout, shares, diag.imbalance_linear_mean)
            assert diag.budget_fill > 0.97


def test_equal_budgets_at_max_tokens_plan_exactly_as_without_shares() -> None:
    lengths = wmt_like_lengths(5_000, seed=1)
    plain = EpochPlanner(lengths, PlanConfig(max_tokens=2048)).plan(1, 2, 2)
    shared = EpochPlanner(lengths, PlanConfig(max_tokens=2048, rank_shares=(3.0, 3.0)))
    same = shared.plan(1, 2, 2)
    assert np.array_equal(plain.assign, same.assign) and np.array_equal(plain.order, same.order)
    assert same.rank_budget is None


def test_shares_do_not_change_the_fingerprint_so_a_resume_may_change_them() -> None:
    a = PlanConfig(max_tokens=64)
    b = PlanConfig(max_tokens=64, rank_shares=[1, 0.5], rank_max_tokens=[64, 40])
    assert a.fingerprint() == b.fingerprint() and a.plain() == b.plain()


# -- the sampler ---------------------------------------------------------------------------


def samplers(lengths: np.ndarray, world: int, **settings: object) -> list[TokenBudgetBatchSampler]:
    return [
        TokenBudgetBatchSampler(lengths, 120, rank=r, world_size=world, **settings)
        for r in range(world)
    ]


LENGTHS = np.random.default_rng(7).integers(3, 40, 600)


def test_sampler_ranks_get_micro_batches_of_their_budget_and_equal_counts() -> None:
    ranks = samplers(LENGTHS, 2, rank_shares=[1, 0.5], accumulate_grad_batches=2)
    assert [len(s) for s in ranks] == [len(ranks[0])] * 2
    assert ranks[0].rank_budgets == (120, 60) and ranks[1].rank_shares == (1.0, 0.5)
    tokens = [sum(b.ntokens for b in s) for s in ranks]
    assert abs(tokens[0] / tokens[1] - 2) < 0.1
    for s, budget in zip(ranks, (120, 60), strict=True):
        for batch in s:
            assert len(batch) * int(LENGTHS[list(batch)].max()) <= budget
    ids = [i for s in ranks for b in s for i in b]
    assert sorted(ids) == list(range(len(LENGTHS)))


def test_shares_set_mid_epoch_take_effect_at_the_next_epoch_and_are_saved() -> None:
    ranks = samplers(LENGTHS, 2)
    iters = [iter(s) for s in ranks]
    seen = [i for it in iters for _ in range(3) for i in next(it)]
    for s in ranks:
        s.set_rank_shares([1.0, 0.5])
    assert ranks[0].rank_shares is None  # the epoch keeps its plan
    seen += [i for it in iters for b in it for i in b]
    assert sorted(seen) == list(range(len(LENGTHS)))
    for s in ranks:
        s.set_epoch(1)
    assert ranks[0].rank_budgets == (120, 60)
    state = ranks[0].state_dict()
    assert state["rank_shares"] == [1.0, 0.5] and state["rank_budgets"] == [120, 60]
    fresh = samplers(LENGTHS, 2)
    for s in fresh:
        s.load_state_dict(state)
    assert fresh[1].rank_budgets == (120, 60)
    fresh[0].set_epoch(2)  # the run's shares stay in force for the next epochs
    assert fresh[0].rank_budgets == (120, 60)


def test_shares_set_by_a_run_are_raised_to_hold_the_longest_example() -> None:
    (s,) = samplers(LENGTHS, 1)
    s.set_distributed(0, 2)
    s.set_rank_shares([1.0, 0.001])
    assert s.rank_budgets == (120, int(LENGTHS.max()))


def test_resume_mid_epoch_onto_three_ranks_and_other_shares_trains_every_example_once() -> None:
    ranks = samplers(LENGTHS, 2, rank_shares=[1, 0.5], accumulate_grad_batches=2)
    iters = [iter(s) for s in ranks]
    seen = [i for it in iters for _ in range(6) for i in next(it)]
    state = ranks[0].state_dict()
    later = samplers(LENGTHS, 3, rank_shares=[0.5, 1, 1])
    for s in later:
        s.load_state_dict(state)
    assert later[0].rank_budgets == (60, 120, 120)
    seen += [i for s in later for b in s for i in b]
    assert sorted(seen) == list(range(len(LENGTHS)))


def test_datamodule_passes_shares_to_its_training_sampler() -> None:
    data = [{"tokens": list(range(int(n)))} for n in LENGTHS]
    dm = TokenBudgetDataModule(data, LENGTHS, max_tokens=120, rank_shares=[1, 0.5])
    assert dm.rank_shares == (1.0, 0.5)
    dm.set_rank_shares([1.0, 0.25])
    assert dm.rank_shares == (1.0, 0.25)


# -- bad settings --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "error", "words"),
    [
        ({"rank_shares": [1.0, 0.0]}, SettingValueError, "rank_shares[1]"),
        ({"rank_shares": [1.0, -1.0]}, SettingValueError, "rank 1"),
        ({"rank_shares": [float("nan"), 1.0]}, SettingValueError, "rank_shares[0]"),
        ({"rank_shares": 0.5}, SettingTypeError, "one entry per rank"),
        ({"rank_shares": []}, SettingValueError, "one entry per rank"),
        ({"rank_shares": ["fast", 1]}, SettingTypeError, "rank_shares[0]"),
        ({"rank_max_tokens": [64, 0]}, SettingValueError, "rank 1"),
        ({"rank_max_tokens": [128, 64]}, SettingValueError, "set max_tokens=128"),
        ({"rank_shares": [1, 1], "rank_max_tokens": [64]}, SettingValueError, "one entry"),
        ({"rank_shares": [1, 1], "max_shapes": 4}, SettingValueError, "max_shapes"),
    ],
)
def test_bad_rank_settings_name_the_setting_and_the_rank(
    settings: dict, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=words.replace("[", r"\[").replace("]", r"\]")) as info:
        PlanConfig(max_tokens=64, **settings)
    assert info.value.setting in ("rank_shares", "rank_max_tokens", "max_shapes")


def test_a_budget_that_cannot_hold_the_longest_example_names_the_rank() -> None:
    planner = EpochPlanner([10, 60, 20], PlanConfig(max_tokens=64, rank_shares=[1, 0.5]))
    with pytest.raises(SettingValueError, match="Rank 1's micro-batch budget is 32") as info:
        planner.plan(0, 2)
    assert info.value.setting == "rank_shares"
    memory = EpochPlanner([10, 60, 20], PlanConfig(max_tokens=64, rank_max_tokens=[64, 50]))
    with pytest.raises(SettingValueError, match=r"raise rank_max_tokens\[1\]=50 \(rank 1's"):
        memory.plan(0, 2)


def test_shares_of_the_wrong_length_for_the_world_size_are_refused() -> None:
    planner = EpochPlanner([10, 20, 20], PlanConfig(max_tokens=64, rank_shares=[1, 0.5]))
    with pytest.raises(SettingValueError, match="rank_shares has 2 entries but world_size=3"):
        planner.plan(0, 3)
    (s,) = samplers(LENGTHS, 1)
    with pytest.raises(SettingValueError, match="got 2 shares but world_size=1"):
        s.set_rank_shares([1.0, 0.5])


def test_mixtures_that_re_deal_micro_batches_refuse_rank_budgets_with_the_reason() -> None:
    with pytest.raises(SettingValueError, match="mixing='per_batch' would re-deal") as info:
        TokenBudgetBatchSampler.from_sources(
            [[3, 4], [5, 6]], 16, rank=0, world_size=2, rank_shares=[1, 0.5], mixing="per_batch"
        )
    assert info.value.setting == "mixing"


@st.composite
def mixtures(draw: st.DrawFn) -> dict:
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    common = draw(st.sampled_from([64, 200, 600]))
    datasets, own = [], []
    for _ in range(draw(st.integers(2, 3))):
        high = draw(st.sampled_from([4, 30, 60]))
        lengths = rng.integers(1, high + 1, size=draw(st.integers(4, 150)))
        datasets.append(lengths)
        smaller = common * 3 // 4
        own.append(smaller if draw(st.booleans()) and smaller >= 2 * high else None)
    world = draw(st.integers(1, 4))
    return {
        "sources": [
            DataSource(lengths, name=f"d{i}", max_tokens=budget)
            for i, (lengths, budget) in enumerate(zip(datasets, own, strict=True))
        ],
        "config": PlanConfig(
            max_tokens=common,
            tail=draw(st.sampled_from(["spread", "pad", "drop"])),
            seed=draw(st.integers(0, 3)),
        ),
        "world": world,
        "acc": draw(st.integers(1, 2)),
        "shares": draw(st.lists(st.floats(0.2, 3.0), min_size=world, max_size=world)),
        "steps": draw(st.sampled_from([None, None, 7])),
    }


@SETTINGS
@given(mixtures(), st.data())
def test_mixture_steps_keep_each_ranks_budget_in_every_dataset_and_resume_elsewhere(
    case: dict, data: st.DataObject
) -> None:
    config, world, acc = case["config"], case["world"], case["acc"]
    mixture = MixturePlanner(case["sources"], config, steps_per_epoch=case["steps"])
    budgets = rank_budgets(config.max_tokens, world, case["shares"], floor=mixture.longest_cost)
    try:
        plan = mixture.plan(0, world, acc, rank_budgets=budgets)
    except ValueError as err:  # a dataset too small for the ranks (named in the message)
        assert "Dataset" in str(err) or "More ranks than batches" in str(err)
        return
    assert plan.assign.shape[1:] == (world, acc)
    key = mixture.prepared.key
    for rank in range(world):
        for mb in plan.rank_micro_batches(rank).tolist():
            dataset = int(plan.micro_batch_dataset[mb])
            own = mixture.budget(dataset)
            limit = scaled_budgets(budgets, own, config.max_tokens)[rank]
            ids = plan.micro_batch_ids(mb)
            assert recomputed_cost(ids, key, config) <= limit, (rank, dataset, limit)
    if case["steps"] is not None or config.tail == "drop":
        return
    assert set(plan.example_ids().tolist()) == set(range(mixture.num_examples))
    consumed = data.draw(st.integers(0, plan.num_micro_batches_per_rank))
    world2 = data.draw(st.integers(1, 3))
    shares2 = data.draw(st.lists(st.floats(0.2, 3.0), min_size=world2, max_size=world2))
    second = rank_budgets(config.max_tokens, world2, shares2, floor=mixture.longest_cost)
    try:
        rest = mixture.plan_resumed(
            0, world2, 1, [(world, acc, consumed, budgets)], rank_budgets=second
        )
    except ValueError as err:
        assert "More ranks than batches" in str(err) or "Dataset" in str(err)
        return
    trained = set(plan.consumed_ids(consumed).tolist()) | set(rest.example_ids().tolist())
    assert trained == set(range(mixture.num_examples))


def test_a_mixture_sampler_takes_shares_at_run_time() -> None:
    rng = np.random.default_rng(5)
    sources = [rng.integers(3, 40, 400), rng.integers(10, 60, 300)]
    ranks = [
        TokenBudgetBatchSampler.from_sources(sources, 240, rank=r, world_size=2) for r in (0, 1)
    ]
    for s in ranks:
        s.set_rank_shares([1.0, 0.5])
    assert ranks[0].rank_budgets == (240, 120) and ranks[1].rank_shares == (1.0, 0.5)
    ids = [i for s in ranks for b in s for i in b]
    assert sorted(ids) == list(range(700))


# -- the budget finder per rank ------------------------------------------------------------


@pytest.mark.multiprocess
def test_each_rank_finds_its_own_budget_and_the_plan_keeps_every_rank_within_its_memory(
    tmp_path: Path,
) -> None:
    records = launch("rank_budget_finder.py", 2, tmp_path, timeout=90)
    assert records[0]["budgets"] == records[1]["budgets"]  # every rank plans the same epoch
    big, small = records[0]["budgets"]
    assert small < big
    for rank, record in enumerate(records):
        assert record["largest_peak"] <= record["limit"]
        assert record["largest_cost"] <= record["own"] <= record["budgets"][rank]
    assert records[0]["micro_batches"] == records[1]["micro_batches"]
    ids = records[0]["ids"] + records[1]["ids"]
    assert sorted(ids) == list(range(3000))


def test_the_budget_finder_refuses_rank_settings_and_says_how_to_search_per_rank() -> None:
    from lightning_varbatch.memory import find_max_tokens

    with pytest.raises(SettingValueError, match="gather_rank_max_tokens"):
        find_max_tokens(lambda b, n: b * n, [10, 20], 10_000, rank_max_tokens=[64, 32])


def test_stream_windows_plan_each_rank_within_its_budget_and_every_example_once() -> None:
    from lightning_varbatch.planner.windows import WindowedPlanner

    rng = np.random.default_rng(2)
    rows = [300, 200, 250]
    lengths = [rng.integers(3, 40, r) for r in rows]
    config = PlanConfig(max_tokens=120, rank_shares=(1.0, 0.5))
    windows = WindowedPlanner(rows, lengths.__getitem__, config, window=200)
    key = np.concatenate(lengths)
    seen: list[int] = []
    tokens = [0, 0]
    for w in range(windows.num_windows):
        part = windows.window_plan(0, w, 2, 2)
        assert part.plan.rank_budget is not None and part.plan.rank_budget.tolist() == [120, 60]
        counts = {part.plan.rank_micro_batches(r).size for r in range(2)}
        assert len(counts) == 1
        for rank, budget in enumerate((120, 60)):
            for mb in part.plan.rank_micro_batches(rank).tolist():
                ids = part.micro_batch_ids(mb)
                assert ids.size * int(key[ids].max()) <= budget
                tokens[rank] += int(key[ids].sum())
        seen += part.example_ids().tolist()
    assert sorted(seen) == list(range(sum(rows)))
    assert abs(tokens[0] / tokens[1] - 2) < 0.15


def test_lanes_split_every_run_of_sorted_positions_in_proportion_to_the_budgets() -> None:
    from lightning_varbatch.planner.rank_lanes import lane_of_positions

    lane = lane_of_positions(10_000, (3, 2, 1))
    for start in range(0, 10_000, 250):  # every run of 250 neighbours (one length range)
        share = np.bincount(lane[start : start + 250], minlength=3) / 250
        assert np.abs(share - [1 / 2, 1 / 3, 1 / 6]).max() < 0.02, start


def test_shares_set_by_a_run_replace_the_configs_until_reset() -> None:
    from lightning_varbatch.data.rank_share_setting import RankShareSetting

    planner = EpochPlanner([30, 40, 50], PlanConfig(max_tokens=100, rank_shares=(1, 0.8)))
    setting = RankShareSetting(planner)
    assert setting.budgets(2) == (100, 80) and not setting.set_by_run
    setting.set((1.0, 0.25), world_size=2)
    assert setting.budgets(2) == (100, 50) and setting.set_by_run  # raised to the longest
    setting.set(None, world_size=2)
    assert setting.budgets(2) == (100, 80) and not setting.set_by_run


def test_one_process_gathers_its_own_budget() -> None:
    from lightning_varbatch.memory.per_rank import gather_rank_max_tokens

    assert gather_rank_max_tokens(3000) == (3000,)
    with pytest.raises(SettingValueError, match="max_tokens"):
        gather_rank_max_tokens(0)


def test_evaluation_splits_plan_their_own_budget_on_every_rank() -> None:
    data = [{"tokens": list(range(int(n)))} for n in LENGTHS]
    dm = TokenBudgetDataModule(
        data, LENGTHS, max_tokens=120, rank_shares=[1, 0.5], val_dataset=data, val_lengths=LENGTHS
    )
    assert dm.planner("train").config.rank_shares == (1.0, 0.5)
    assert dm.planner("val").config.rank_shares is None


def test_ranks_given_other_shares_do_not_plan_the_same_epoch() -> None:
    from lightning_varbatch.data.rank_agreement import plan_digest

    same = plan_digest(samplers(LENGTHS, 2, rank_shares=[1, 0.5])[0])
    assert same == plan_digest(samplers(LENGTHS, 2, rank_shares=[1, 0.5])[1])
    assert same != plan_digest(samplers(LENGTHS, 2, rank_shares=[1, 0.25])[1])
    assert same != plan_digest(samplers(LENGTHS, 2)[1])


def test_a_per_batch_mixture_refuses_shares_set_at_run_time() -> None:
    sampler = TokenBudgetBatchSampler.from_sources(
        [[3, 4], [5, 6]], 16, rank=0, world_size=2, mixing="per_batch"
    )
    with pytest.raises(SettingValueError, match="mixing='per_batch' would re-deal") as info:
        sampler.set_rank_shares([1.0, 0.5])
    assert info.value.setting == "mixing"


def test_lanes_of_very_unequal_shares_on_few_examples_take_every_example_once() -> None:
    """Found by the resume property test: 58 examples over 8 lanes whose shares span 16x.

    A lane over its quota gave back every ``ceil(n / k)``-th position, which for 5 positions
    and 4 to give back is only 3: the lanes' positions no longer matched the data.
    """
    lengths = np.array([4, 3, 3, 2, 2, 1, 1, 1, 1, 4, 3, 4, 3, 3, 4, 3, 3, 3, 3, 4, 2, 4, 3, 1, 2,
                        4, 3, 1, 4, 3, 4, 1, 1, 4, 1, 3, 1, 2, 2, 2, 2, 1, 1, 1, 1, 3, 3, 3, 2, 3,
                        4, 2, 2, 4, 4, 4, 2, 3])  # fmt: skip
    shares = [1.0, 3.0, 3.0, 3.0, 1.5, 2.25, 4.0, 0.25]
    plan = EpochPlanner(lengths, PlanConfig(75, rank_shares=shares)).plan(0, 8)
    counts = np.bincount(plan.example_ids(), minlength=lengths.size)
    assert counts.min() >= 1 and int(np.maximum(counts - 1, 0).sum()) == plan.num_duplicated
