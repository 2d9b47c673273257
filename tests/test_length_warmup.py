"""Sequence-length warm-up (issue 24): the planner policy, its guarantees and its settings."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_varbatch import EpochPlanner, PlanConfig, TokenBudgetBatchSampler
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.length_warmup import scheduled_caps, warmup_order

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCHEDULES = ["linear", "root", "step", lambda p: p * p]


def _half_then_full(p: float) -> float:
    return 0.5 if p < 0.5 else 1.0


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    n = draw(st.integers(20, 600))
    layout = draw(st.sampled_from(["padded", "packed"]))
    pairs = layout == "padded" and draw(st.booleans())
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    single = np.clip(rng.lognormal(3.0, 0.9, n).astype(np.int64), 1, 300)
    lengths = single
    if pairs:
        lengths = np.stack([single, np.clip(single + rng.integers(-8, 8, n), 1, 300)], 1)
    config = PlanConfig(
        max_tokens=draw(st.integers(300, 4000)),
        seed=seed,
        layout=layout,
        tail=draw(st.sampled_from(["spread", "spread", "drop", "pad"])),
        shuffle=draw(st.booleans()),
        bucket_width=draw(st.sampled_from([1, 1, 4])),
        max_examples=draw(st.sampled_from([None, None, 16])),
        length_warmup=draw(st.integers(1, 40)),
        length_warmup_min=draw(st.sampled_from([1, 8, 32])),
        length_warmup_schedule=draw(st.sampled_from([*SCHEDULES, _half_then_full])),
    )
    return {
        "lengths": lengths,
        "config": config,
        "world": draw(st.integers(1, 4)),
        "acc": draw(st.integers(1, 3)),
    }


def _key(lengths: np.ndarray) -> np.ndarray:
    return lengths.max(axis=1) if lengths.ndim == 2 else lengths


def _check_caps(plan, lengths: np.ndarray) -> None:
    trace = plan.length_warmup
    key = _key(lengths)
    longest = [
        max((int(key[plan.micro_batch_ids(b)].max(initial=0)) for b in row.ravel()), default=0)
        for row in plan.assign
    ]
    assert trace.step_longest.tolist() == longest
    realised = trace.realised
    assert (np.diff(realised) >= 0).all(), "the cap never shrinks"
    assert (np.diff(trace.scheduled) >= 0).all()
    assert (realised >= trace.scheduled).all()
    assert (trace.step_longest[: trace.num_steps] <= realised).all(), "the cap is never exceeded"


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_warmup_only_reorders_the_steps_of_the_plan(case: dict) -> None:
    lengths, config, world, acc = case["lengths"], case["config"], case["world"], case["acc"]
    try:
        plan = EpochPlanner(lengths, config).plan(0, world, acc)
    except ValueError:
        return  # too few micro-batches for the ranks: the same error as without a warm-up
    off = dataclasses.replace(
        config,
        length_warmup=None,
        length_warmup_min=8,
        length_warmup_max=None,
        length_warmup_schedule="linear",
    )
    plain = EpochPlanner(lengths, off)
    bare = plain.plan(0, world, acc)
    # Same micro-batches, same steps, same ranks: only the order of the steps changes, so every
    # guarantee of the ordinary plan (budget, equal counts, tail, balance) carries over.
    assert np.array_equal(plan.order, bare.order)
    assert plan.assign.shape == bare.assign.shape  # equal counts on every rank
    steps = sorted(map(tuple, plan.assign.reshape(plan.num_steps, -1).tolist()))
    assert steps == sorted(map(tuple, bare.assign.reshape(bare.num_steps, -1).tolist()))
    assert (plan.micro_batch_cost <= config.max_tokens).all()
    assert sorted(plan.example_ids().tolist()) == sorted(bare.example_ids().tolist())
    if config.tail == "spread" and plan.num_duplicated == 0:
        assert sorted(plan.example_ids().tolist()) == list(range(len(lengths)))
    # The exact token mean's denominators: each step's loss tokens are its micro-batches'.
    for s in range(plan.num_steps):
        ids = np.concatenate([plan.micro_batch_ids(b) for b in plan.assign[s].ravel()])
        loss = lengths[ids, 1] if lengths.ndim == 2 else lengths[ids]
        assert int(plan.step_tokens[s]) == int(loss.sum())
    _check_caps(plan, lengths)
    assert 1 <= plan.length_warmup.num_steps <= min(config.length_warmup, plan.num_steps)
    again = EpochPlanner(lengths, config).plan(0, world, acc)  # determinism from (seed, epoch)
    assert np.array_equal(again.assign, plan.assign)
    # After epoch 0 the plan is the ordinary one.
    later = EpochPlanner(lengths, config).plan(1, world, acc)
    assert later.length_warmup is None
    assert np.array_equal(later.assign, plain.plan(1, world, acc).assign)


@pytest.mark.slow
@SETTINGS
@given(scenarios(), st.integers(1, 4), st.integers(1, 3), st.floats(0, 1))
def test_resume_on_another_world_size_mid_warmup(
    case: dict, world2: int, acc2: int, where: float
) -> None:
    lengths, config, world, acc = case["lengths"], case["config"], case["world"], case["acc"]
    planner = EpochPlanner(lengths, config)
    try:
        first = planner.plan(0, world, acc)
        consumed = int(where * first.num_micro_batches_per_rank)
        rest = planner.plan_resumed(0, world2, acc2, [(world, acc, consumed)])
    except ValueError:
        return
    done = first.consumed_ids(consumed)
    left = rest.example_ids()
    assert not set(done.tolist()) & set(left.tolist()), "nothing consumed is planned again"
    # What the first topology dropped is re-planned; the re-plan drops only what it counts.
    missing = set(range(len(lengths))) - set(done.tolist()) - set(left.tolist())
    assert len(missing) == rest.num_dropped
    steps = math.ceil(consumed / acc)
    trace = rest.length_warmup
    if steps >= config.length_warmup or rest.num_steps == 0:
        assert trace is None
        return
    # The schedule continues where the first topology stopped, never below its cap.
    assert trace.first_step == steps
    high = int(_key(lengths).max())
    expected = scheduled_caps(
        config.length_warmup_schedule,
        config.length_warmup,
        config.length_warmup_min,
        high,
        first=steps,
    )
    assert np.array_equal(trace.scheduled, expected[: trace.num_steps])
    reached = first.length_warmup.realised[:steps].max(initial=0)
    assert trace.realised[0] >= reached
    _check_caps(rest, lengths)


def test_sampler_resumes_mid_warmup_on_three_ranks_and_refuses_another_schedule() -> None:
    rng = np.random.default_rng(1)
    lengths = np.clip(rng.lognormal(3.0, 0.9, 3000).astype(np.int64), 1, 300)
    kw = {"length_warmup": 30, "length_warmup_schedule": "root", "seed": 3}
    two = [TokenBudgetBatchSampler(lengths, 2048, rank=r, world_size=2, **kw) for r in range(2)]
    state = two[0].state_dict(consumed=5)
    seen = [i for s in two for b in list(s)[:5] for i in b]
    three = [TokenBudgetBatchSampler(lengths, 2048, rank=r, world_size=3, **kw) for r in range(3)]
    for s in three:
        s.load_state_dict(state)
    rest = [i for s in three for b in s for i in b]
    assert sorted(seen + rest) == list(range(lengths.size))
    # The remainder still warms up from step 5 on, under the cap the first 5 steps reached.
    assert three[0].plan.length_warmup.first_step == 5
    other = TokenBudgetBatchSampler(
        lengths, 2048, rank=0, world_size=2, **{**kw, "length_warmup": 40}
    )
    with pytest.raises(ValueError, match="length_warmup"):
        other.load_state_dict(state)


def test_the_schedule_advances_when_no_short_step_is_left() -> None:
    # 2 % short examples: the steps under a low cap run out, the cap jumps to what is left.
    lengths = np.concatenate([np.full(40, 4), np.full(2000, 200)])
    plan = EpochPlanner(lengths, PlanConfig(1024, length_warmup=20, length_warmup_min=4)).plan(0)
    trace = plan.length_warmup
    assert trace.advanced.size > 0 and (trace.advanced_by > 0).all()
    assert sorted(plan.example_ids().tolist()) == list(range(lengths.size))


def test_warmup_order_prefers_the_ordinary_order_and_advances() -> None:
    perm, realised = warmup_order(np.array([9, 3, 5, 3]), np.array([3, 3, 4]), floor=0)
    assert perm.tolist() == [1, 3, 2, 0] and realised.tolist() == [3, 3, 5]


def test_default_leaves_fingerprints_and_plans_unchanged() -> None:
    base = PlanConfig(4096)
    assert base.fingerprint() == PlanConfig(4096, length_warmup=None).fingerprint()
    assert "length_warmup" not in base.plain()
    prints = {
        PlanConfig(4096, length_warmup=10).fingerprint(),
        PlanConfig(4096, length_warmup=11).fingerprint(),
        PlanConfig(4096, length_warmup=10, length_warmup_min=16).fingerprint(),
        PlanConfig(4096, length_warmup=10, length_warmup_max=64).fingerprint(),
        PlanConfig(4096, length_warmup=10, length_warmup_schedule="root").fingerprint(),
        base.fingerprint(),
    }
    assert len(prints) == 6
    plan = EpochPlanner(np.arange(1, 500), base).plan(0, 2)
    assert plan.length_warmup is None


def test_step_schedule_doubles_and_root_front_loads() -> None:
    assert scheduled_caps("step", 4, 16, 128, first=0).tolist() == [16, 32, 64, 128]
    root = scheduled_caps("root", 10, 8, 1024, first=0)
    linear = scheduled_caps("linear", 10, 8, 1024, first=0)
    assert (root >= linear).all() and root[0] == linear[0] == 8


def test_the_datamodule_and_the_plan_command_take_the_setting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_varbatch import TokenBudgetDataModule
    from lightning_varbatch.plan import main

    lengths = np.random.default_rng(2).integers(1, 120, 2000)
    items = [{"tokens": list(range(1, int(n) + 1))} for n in lengths]
    dm = TokenBudgetDataModule(items, lengths, 1024, length_warmup=12, length_warmup_min=16)
    assert dm.planner("train").config.length_warmup == 12
    counted = sum(int(b["ntokens"]) for b in dm.train_dataloader())  # checked against the plan
    assert counted == int(lengths.sum())
    path = tmp_path / "lengths.npy"
    np.save(path, lengths)
    argv = ["--lengths", str(path), "--max-tokens", "1024", "--world-size", "2", "--no-png"]
    assert main([*argv, "--length-warmup", "12", "--length-warmup-schedule", "step"]) == 0
    out = capsys.readouterr().out
    assert "length warm-up" in out and "after" in out
    assert main([*argv, "--length-warmup", "-3"]) == 2
    assert "length_warmup" in capsys.readouterr().err


def test_the_report_shows_cap_examples_and_padding_per_stage() -> None:
    from lightning_varbatch.planner.warmup_report import step_figures, warmup_report

    rng = np.random.default_rng(4)
    lengths = np.clip(rng.lognormal(3.2, 0.7, 20_000).astype(np.int64), 1, 256)
    planner = EpochPlanner(lengths, PlanConfig(1024, length_warmup=40, length_warmup_min=16))
    plan = planner.plan(0, 4, 2)
    report = warmup_report(planner, plan, stages=4)
    assert report is not None and [r.num_steps for r in report.rows][:4] == [10] * 4
    warm, after = report.rows[:4], report.rows[4]
    assert after.label == "after" and after.cap_max == 0
    assert sum(r.num_steps for r in report.rows) == plan.num_steps
    # Many short examples first, fewer long ones later: examples per step fall, tokens do not.
    assert warm[0].examples_per_step > warm[-1].examples_per_step
    assert all(r.cap_min <= r.cap_max and r.longest <= r.cap_max for r in warm)
    figures = step_figures(planner, plan)
    assert int(figures["examples"].sum()) == lengths.size
    assert int(figures["real"].sum()) == int(lengths.sum())
    budget = 1024 * 4 * 2
    assert min(r.min_real_tokens for r in warm) >= 0.9 * budget
    assert report.to_dict()["stages"][0]["label"] == "steps 0-9"
    assert "length warm-up" in report.format()
    assert warmup_report(planner, planner.plan(1, 4, 2)) is None


@pytest.mark.parametrize("settings", [{"max_shapes": 4}, {"layout": "packed", "bucket_width": 8}])
def test_shape_budget_and_packed_buckets_keep_their_shapes_under_the_cap(settings: dict) -> None:
    rng = np.random.default_rng(5)
    lengths = np.clip(rng.lognormal(3.2, 0.8, 8000).astype(np.int64), 1, 300)
    config = PlanConfig(1024, length_warmup=30, **settings)
    plan = EpochPlanner(lengths, config).plan(0, 2, 2)
    bare = EpochPlanner(lengths, PlanConfig(1024, **settings)).plan(0, 2, 2)
    _check_caps(plan, lengths)
    assert sorted(plan.example_ids().tolist()) == sorted(bare.example_ids().tolist())
    if plan.micro_batch_shape is not None:
        assert np.array_equal(plan.micro_batch_shape, bare.micro_batch_shape)


def test_planner_side_helpers_and_the_benchmark_case() -> None:
    from benchmarks.planning.length_warmup import lm_lengths, run_case
    from lightning_varbatch.planner.length_warmup import WARMUP_DEFAULTS, check_warmup_settings

    assert check_warmup_settings(PlanConfig(64)) == {
        "length_warmup_min": 8,
        "length_warmup_max": None,
    }
    assert set(WARMUP_DEFAULTS) <= {f.name for f in dataclasses.fields(PlanConfig)}
    row = run_case("lm", lm_lengths(20_000), "packed", repeats=1)
    assert row["truncating"]["discarded"] > 0 and abs(row["tokens_ratio"] - 1) < 0.05


def test_a_warmup_whose_minimum_holds_every_example_is_refused() -> None:
    from lightning_varbatch.planner.warmup_plan import check_warmup_acts

    lengths = np.array([3, 5, 8, 8])
    with pytest.raises(SettingValueError, match="holds every example already") as error:
        EpochPlanner(lengths, PlanConfig(64, length_warmup=4, length_warmup_min=8))
    assert error.value.setting == "length_warmup_min"
    EpochPlanner(lengths, PlanConfig(64, length_warmup=4, length_warmup_min=7))  # caps one: fine
    # a mixture is refused only when no dataset is warmed up
    check_warmup_acts(PlanConfig(64, length_warmup=4), [8, 12], [8, 8], ["a", "b"])
    with pytest.raises(SettingValueError, match=r"a: 8 \(minimum 8\), b: 6 \(minimum 8\)"):
        check_warmup_acts(PlanConfig(64, length_warmup=4), [8, 6], [8, 8], ["a", "b"])


def test_a_maximum_below_the_default_minimum_names_the_maximum() -> None:
    with pytest.raises(SettingValueError, match="Raise length_warmup_max to 8") as error:
        PlanConfig(64, length_warmup=4, length_warmup_max=4)
    assert error.value.setting == "length_warmup_max"
    with pytest.raises(SettingValueError, match="Lower length_warmup_min") as error:
        PlanConfig(64, length_warmup=4, length_warmup_min=10, length_warmup_max=9)
    assert error.value.setting == "length_warmup_min"
