"""Sequence-length warm-up over several datasets (issue 24): per dataset and overall."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_varbatch import (
    DataSource,
    MixturePlanner,
    PlanConfig,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.mixture_datasets import MIXING_POLICIES
from lightning_varbatch.planner.warmup_report import warmup_report

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OFF = {
    "length_warmup": None,
    "length_warmup_min": 8,
    "length_warmup_max": None,
    "length_warmup_schedule": "linear",
}


def _half_then_full(p: float) -> float:
    return 0.5 if p < 0.5 else 1.0


@st.composite
def mixtures(draw: st.DrawFn) -> dict:
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    count = draw(st.integers(2, 3))
    common = draw(st.integers(400, 3000))
    sources = []
    for i in range(count):
        n = draw(st.integers(20, 300))
        scale = draw(st.floats(2.0, 4.5))
        lengths = np.clip(rng.lognormal(scale, 0.8, n).astype(np.int64), 1, 300)
        own = draw(st.sampled_from([None, None, 600, 2000]))
        low = draw(st.sampled_from([None, None, 4]))
        high = draw(st.sampled_from([None, None, 64, 400]))
        sources.append(
            DataSource(
                lengths,
                name=f"d{i}",
                max_tokens=own,
                length_warmup_min=low,
                length_warmup_max=high,
            )
        )
    stream = draw(st.booleans())
    config = PlanConfig(
        max_tokens=common,
        seed=seed,
        tail=draw(st.sampled_from(["spread", "spread", "drop", "pad"])),
        shuffle=draw(st.booleans()),
        length_warmup=draw(st.integers(1, 30)),
        length_warmup_min=draw(st.sampled_from([1, 8, 32])),
        length_warmup_max=draw(st.sampled_from([None, None, 128])),
        length_warmup_schedule=draw(st.sampled_from(["linear", "root", "step", _half_then_full])),
    )
    return {
        "sources": sources,
        "config": config,
        "mixing": draw(st.sampled_from(MIXING_POLICIES)),
        "steps_per_epoch": draw(st.integers(3, 20)) if stream else None,
        "world": draw(st.integers(1, 4)),
        "acc": draw(st.integers(1, 3)),
    }


def _planner(case: dict, warm: bool = True) -> MixturePlanner:
    config, sources = case["config"], case["sources"]
    if not warm:
        config = dataclasses.replace(config, **OFF)
        sources = [
            dataclasses.replace(s, length_warmup_min=None, length_warmup_max=None) for s in sources
        ]
    return MixturePlanner(
        sources, config, mixing=case["mixing"], steps_per_epoch=case["steps_per_epoch"]
    )


def _steps(plan) -> list[tuple[int, ...]]:
    return sorted(map(tuple, plan.assign.reshape(plan.num_steps, -1).tolist()))


def _key(planner: MixturePlanner) -> np.ndarray:
    return planner.prepared.key


def _check_caps(planner: MixturePlanner, plan) -> None:
    """The caps of every warm-up step hold for every micro-batch, per dataset and overall."""
    trace = plan.length_warmup
    assert trace is not None
    key = _key(planner)
    w = trace.num_steps
    assert w >= 1
    for name in ("realised", "scheduled", "levels"):
        assert (np.diff(getattr(trace, name)) >= 0).all(), f"{name} never decreases"
    assert (np.diff(trace.dataset_realised, axis=1) >= 0).all()
    assert (trace.realised >= trace.scheduled).all()
    assert (trace.dataset_realised >= trace.dataset_scheduled).all()
    assert np.array_equal(trace.dataset_realised, planner.warmup_caps[:, trace.levels])
    advanced = set(trace.advanced.tolist())
    for s in range(plan.num_steps):
        longest = 0
        for b in plan.assign[s].ravel().tolist():
            ids = plan.micro_batch_ids(b)
            top = int(key[ids].max(initial=0))
            longest = max(longest, top)
            if s < w:
                d = int(plan.micro_batch_dataset[b])
                assert top <= trace.dataset_realised[d, s], "the realised cap is never exceeded"
                if s not in advanced:  # the schedule itself, where it did not advance
                    assert top <= trace.dataset_scheduled[d, s]
        assert int(trace.step_longest[s]) == longest
        if s < w:
            assert longest <= trace.realised[s]


@pytest.mark.slow
@SETTINGS
@given(mixtures())
def test_mixture_warmup_only_reorders_the_steps(case: dict) -> None:
    world, acc = case["world"], case["acc"]
    try:
        planner = _planner(case)
        plan = planner.plan(0, world, acc)
    except ValueError:
        return  # a dataset too small for the ranks: the same error as without a warm-up
    bare = _planner(case, warm=False).plan(0, world, acc)
    # Same micro-batches and steps: only the order of the steps changes.
    assert np.array_equal(plan.order, bare.order)
    assert np.array_equal(plan.micro_batch_start, bare.micro_batch_start)
    assert plan.assign.shape == bare.assign.shape  # equal counts on every rank
    assert _steps(plan) == _steps(bare)
    assert (plan.num_dropped, plan.num_duplicated) == (bare.num_dropped, bare.num_duplicated)
    budgets = np.array([planner.budget(d) for d in range(planner.num_datasets)])
    assert (plan.micro_batch_cost <= budgets[plan.micro_batch_dataset]).all()
    ids = plan.example_ids()
    if case["steps_per_epoch"] is None and plan.num_duplicated == plan.num_dropped == 0:
        assert sorted(ids.tolist()) == list(range(planner.num_examples))
    assert sorted(ids.tolist()) == sorted(bare.example_ids().tolist())
    _check_caps(planner, plan)
    again = _planner(case).plan(0, world, acc)  # determinism from (seed, epoch)
    assert np.array_equal(again.assign, plan.assign)
    later = planner.plan(1, world, acc)  # after epoch 0: the ordinary plan
    assert later.length_warmup is None
    assert np.array_equal(later.assign, _planner(case, warm=False).plan(1, world, acc).assign)
    report = warmup_report(planner, plan)
    assert report is not None and report.datasets == tuple(planner.names)
    assert sum(r.num_steps for r in report.rows) == plan.num_steps
    assert all(len(r.dataset_caps) == planner.num_datasets for r in report.rows[:-1])


@pytest.mark.slow
@SETTINGS
@given(mixtures(), st.integers(1, 4), st.integers(1, 3), st.floats(0, 1))
def test_mixture_resumes_mid_warmup_on_another_world_size(
    case: dict, world2: int, acc2: int, where: float
) -> None:
    world, acc = case["world"], case["acc"]
    try:
        planner = _planner(case)
        first = planner.plan(0, world, acc)
        consumed = int(where * first.num_micro_batches_per_rank)
        rest = planner.plan_resumed(0, world2, acc2, [(world, acc, consumed)])
    except ValueError:
        return
    done = first.consumed_ids(consumed).tolist()
    left = rest.example_ids().tolist()
    # Every example not run yet is re-planned, as without a warm-up: nothing consumed runs
    # again, and nothing is lost but what the re-plan's tail policy drops (counted).
    if case["steps_per_epoch"] is None:  # one pass (a sampled epoch repeats by design)
        assert not set(done) & set(left), "nothing consumed is planned again"
        missing = set(range(planner.num_examples)) - set(done) - set(left)
        assert len(missing) == rest.num_dropped
    budgets = np.array([planner.budget(d) for d in range(planner.num_datasets)])
    assert (rest.micro_batch_cost <= budgets[rest.micro_batch_dataset]).all()
    assert rest.assign.shape[1:] == (world2, acc2)
    steps = math.ceil(consumed / acc)
    trace = rest.length_warmup
    if steps >= case["config"].length_warmup or rest.num_steps == 0:
        assert trace is None
        return
    assert trace is not None and trace.first_step == steps
    # The schedule continues at the run's step, never below the level already reached.
    assert np.array_equal(
        trace.dataset_scheduled, planner.warmup_caps[:, steps : steps + trace.num_steps]
    )
    reached = first.length_warmup.levels[:steps].max(initial=0)
    assert trace.levels[0] >= max(reached, steps)
    _check_caps(planner, rest)
    # Resumed twice (a third topology) continues from the second one's position.
    part = int(where * rest.num_micro_batches_per_rank)
    third = planner.plan_resumed(0, 1, 1, [(world, acc, consumed), (world2, acc2, part)])
    if third.length_warmup is not None:
        assert third.length_warmup.first_step == steps + math.ceil(part / acc2)
        _check_caps(planner, third)


def _two(n: int = 600) -> list[DataSource]:
    rng = np.random.default_rng(5)
    short = np.clip(rng.lognormal(2.5, 0.7, 3 * n).astype(np.int64), 1, 120)
    long = np.clip(rng.lognormal(4.0, 0.6, n).astype(np.int64), 1, 400)
    return [DataSource(short, name="short"), DataSource(long, name="long")]


def test_mixtures_are_no_longer_refused_and_each_dataset_warms_up_to_its_own_longest() -> None:
    sources = _two()
    planner = MixturePlanner(sources, PlanConfig(2048, length_warmup=20, length_warmup_min=8))
    plan = planner.plan(0, 2, 1)
    trace = plan.length_warmup
    assert trace is not None and trace.dataset_realised.shape == (2, trace.num_steps)
    # Per dataset: each cap grows from the minimum to the dataset's own longest example.
    tops = [int(np.max(s.lengths)) for s in sources]
    assert planner.warmup_caps[:, 0].tolist() == [8, 8]
    assert planner.warmup_caps[:, -1].tolist() == tops
    # ... so both datasets take part from the first steps on: the shares hold.
    early = plan.step_dataset[: trace.num_steps // 2, 0, 0]
    assert set(early.tolist()) == {0, 1}
    # One cap for the mixture (overall): a common length_warmup_max gives equal caps.
    overall = MixturePlanner(sources, PlanConfig(2048, length_warmup=20, length_warmup_max=400))
    assert (overall.warmup_caps[:, :-1] == overall.warmup_caps[0, :-1]).all()
    _check_caps(overall, overall.plan(0, 2, 1))
    # Another schedule is another plan: a checkpoint's fingerprint says so.
    other = MixturePlanner(sources, PlanConfig(2048, length_warmup=21, length_warmup_min=8))
    assert other.fingerprint() != planner.fingerprint()
    plain = MixturePlanner(sources, PlanConfig(2048))
    assert plain.warmup_caps is None and plain.plan(0, 2).length_warmup is None


def test_a_dataset_setting_without_a_warmup_or_below_the_minimum_is_refused() -> None:
    a, b = _two(40)
    with pytest.raises(SettingValueError, match="no effect without length_warmup") as err:
        MixturePlanner([dataclasses.replace(a, length_warmup_max=64), b], PlanConfig(2048))
    assert err.value.setting == "length_warmup_max"
    with pytest.raises(SettingValueError, match="Dataset 'long'") as err:
        MixturePlanner(
            [a, dataclasses.replace(b, length_warmup_min=100, length_warmup_max=50)],
            PlanConfig(2048, length_warmup=5),
        )
    assert err.value.setting == "length_warmup_min"
    with pytest.raises(SettingValueError, match="length_warmup_min"):
        DataSource(np.arange(1, 5), length_warmup_min=0)


def test_sampler_from_sources_resumes_mid_warmup_on_three_ranks() -> None:
    kw = {"length_warmup": 25, "length_warmup_schedule": "root", "seed": 3, "mixing": "per_batch"}
    two = [
        TokenBudgetBatchSampler.from_sources(_two(), 2048, rank=r, world_size=2, **kw)
        for r in range(2)
    ]
    assert two[0].plan.length_warmup is not None
    state = two[0].state_dict(consumed=5)
    seen = [i for s in two for b in list(s)[:5] for i in b]
    three = [
        TokenBudgetBatchSampler.from_sources(_two(), 2048, rank=r, world_size=3, **kw)
        for r in range(3)
    ]
    for s in three:
        s.load_state_dict(state)
    rest = [i for s in three for b in s for i in b]
    total = sum(len(s.lengths) for s in _two())
    assert sorted(seen + rest) == list(range(total))
    assert three[0].plan.length_warmup.first_step == 5
    # TokenThroughputMonitor's train/length_cap reads the mixture's realised cap.
    from types import SimpleNamespace

    from lightning_varbatch.callbacks.throughput import length_cap

    trainer = SimpleNamespace(train_dataloader=SimpleNamespace(batch_sampler=three[0]))
    trace = three[0].plan.length_warmup
    assert length_cap(trainer, 6) == int(trace.realised[1])
    assert length_cap(trainer, 25) is None
    # The same world size replays the same plan exactly.
    again = TokenBudgetBatchSampler.from_sources(_two(), 2048, rank=0, world_size=2, **kw)
    again.load_state_dict(state)
    assert [list(b) for b in again] == [list(b) for b in list(two[0])[5:]]
    other = TokenBudgetBatchSampler.from_sources(
        _two(), 2048, rank=0, world_size=2, **{**kw, "length_warmup": 30}
    )
    with pytest.raises(ValueError, match="length_warmup"):
        other.load_state_dict(state)


def test_datamodule_warms_up_several_datasets_and_not_their_evaluation() -> None:
    sources = _two(150)
    items = [[{"tokens": list(range(1, int(n) + 1))} for n in s.lengths] for s in sources]
    train = [dataclasses.replace(s, dataset=d) for s, d in zip(sources, items, strict=True)]
    val = [
        dataclasses.replace(s, dataset=d, length_warmup_max=50)
        for s, d in zip(train, items, strict=True)
    ]
    dm = TokenBudgetDataModule(
        train,
        max_tokens=1024,
        val_dataset=val,
        length_warmup=10,
        length_warmup_min=16,
        mixing="per_step",
    )
    assert dm.planner("train").config.length_warmup == 10
    counted = sum(int(b["ntokens"]) for b in dm.train_dataloader())
    assert counted == sum(int(np.sum(s.lengths)) for s in sources)
    # Evaluation needs no curriculum: the val split plans without the warm-up.
    val_planner = dm.planner("val")
    assert val_planner.config.length_warmup is None
    assert val_planner.plan(0).length_warmup is None


def test_evaluation_split_of_one_dataset_does_not_warm_up() -> None:
    lengths = np.random.default_rng(2).integers(1, 120, 400)
    items = [{"tokens": list(range(1, int(n) + 1))} for n in lengths]
    dm = TokenBudgetDataModule(
        items,
        lengths,
        1024,
        val_dataset=items[:100],
        val_lengths=lengths[:100],
        test_dataset=items[:50],
        test_lengths=lengths[:50],
        length_warmup=12,
    )
    assert dm.planner("train").config.length_warmup == 12
    for stage in ("val", "test"):
        assert dm.planner(stage).config.length_warmup is None
        assert dm.planner(stage).plan(0).length_warmup is None
