"""Plan diagnostics: hand-computed values, a per-micro-batch reference on random plans, edges."""

from __future__ import annotations

import dataclasses
import json
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.diagnostics import PlanDiagnostics, diagnose, rank_loads
from lightning_varbatch.planner.epoch_planner import EpochPlan, EpochPlanner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.synthetic import wmt_like_lengths


def _diag(
    lengths: np.ndarray, world_size: int = 1, acc: int = 1, **config: object
) -> tuple[EpochPlanner, EpochPlan, PlanDiagnostics]:
    planner = EpochPlanner(lengths, PlanConfig(**config))  # type: ignore[arg-type]
    plan = planner.plan(epoch=0, world_size=world_size, accumulate_grad_batches=acc)
    return planner, plan, diagnose(planner, plan)


def test_equal_lengths_pad_nothing_and_fill_the_budget() -> None:
    _, _, d = _diag(np.full(96, 8), world_size=4, acc=3, max_tokens=64)
    assert d.padding_efficiency == 1.0
    assert d.budget_fill == 1.0
    assert (d.examples_per_batch_min, d.examples_per_batch_max) == (8, 8)
    assert d.examples_per_batch_mean == d.examples_per_batch_p50 == d.examples_per_batch_p95 == 8
    assert d.imbalance_linear_mean == d.imbalance_linear_max == 1.0
    assert d.imbalance_quadratic_mean == d.imbalance_quadratic_max == 1.0
    assert (d.num_micro_batches, d.micro_batches_per_rank, d.num_steps) == (12, 3, 1)
    assert d.real_tokens == d.padded_tokens == 96 * 8
    assert d.coverage == 1.0
    assert d.equal_counts


def test_hand_computed_tiny_plan() -> None:
    # Sorted 9, 9, 4, 2, 2 with budget 18: micro-batches {9, 9} (cost 18) and {4, 2, 2} (cost 12).
    _, _, d = _diag(np.array([2, 9, 9, 4, 2]), world_size=2, max_tokens=18)
    assert (d.real_tokens, d.padded_tokens) == (26, 30)
    assert d.padding_efficiency == pytest.approx(26 / 30)
    assert d.budget_fill == pytest.approx(15 / 18)
    assert (d.examples_per_batch_min, d.examples_per_batch_max) == (2, 3)
    assert d.examples_per_batch_mean == d.examples_per_batch_p50 == 2.5
    assert d.examples_per_batch_p95 == pytest.approx(2.95)
    # One step; rank loads 18 and 12 (linear), 2*(9 + 81/64) and 3*(4 + 16/64) (quadratic).
    assert d.num_steps == 1
    assert d.imbalance_linear_mean == d.imbalance_linear_max == pytest.approx(18 / 15)
    q = np.array([2 * (9 + 81 / 64), 3 * (4 + 16 / 64)])
    assert d.imbalance_quadratic_max == pytest.approx(q.max() / q.mean())
    assert d.cost == "padded"
    assert (d.world_size, d.accumulate_grad_batches, d.max_tokens) == (2, 1, 18)


def test_pairs_are_measured_by_the_longer_side() -> None:
    # Keys max(src, tgt) = 4, 9, 5; budget 12: micro-batches {9} and {5, 4}.
    _, _, d = _diag(np.array([[3, 4], [9, 2], [5, 5]]), max_tokens=12)
    assert (d.real_tokens, d.padded_tokens) == (18, 19)
    assert d.num_examples == d.num_planned == 3


def test_pad_to_multiple_of_counts_padded_slots() -> None:
    _, _, d = _diag(np.full(4, 5), max_tokens=16, pad_to_multiple_of=8)
    assert (d.real_tokens, d.padded_tokens) == (20, 32)
    assert d.padding_efficiency == 0.625
    assert d.budget_fill == 1.0


def test_quadratic_imbalance_uses_the_configured_coefficient() -> None:
    lengths = np.array([2, 9, 9, 4, 2])
    _, _, d = _diag(lengths, world_size=2, max_tokens=18, quadratic_coef=0.5)
    q = np.array([2 * (9 + 0.5 * 81), 3 * (4 + 0.5 * 16)])
    assert d.imbalance_quadratic_max == pytest.approx(q.max() / q.mean())


def _reference(planner: EpochPlanner, plan: EpochPlan) -> dict[str, float]:
    """Per-micro-batch Python loop over the plan's own accessors: what diagnose must reproduce."""
    cfg = planner.config
    key = planner.prepared.key.astype(np.int64)
    p = cfg.pad_to_multiple_of
    real = padded = 0
    lin = np.zeros(plan.assign.shape[:2])
    quad = np.zeros(plan.assign.shape[:2])
    sizes = []
    seen: set[int] = set()
    for s in range(plan.num_steps):
        for r in range(plan.world_size):
            for m in range(plan.accumulate_grad_batches):
                ids = plan.micro_batch(s, r, m)
                k = key[ids]
                longest = -(-int(k.max()) // p) * p
                real += int(k.sum())
                padded += len(ids) * longest
                lin[s, r] += len(ids) * longest
                quad[s, r] += len(ids) * (longest + cfg.quadratic_coef * longest**2)
                sizes.append(len(ids))
                seen.update(ids.tolist())
    lr = lin.max(axis=1) / lin.mean(axis=1)
    qr = quad.max(axis=1) / quad.mean(axis=1)
    return {
        "real_tokens": real,
        "padded_tokens": padded,
        "imbalance_linear_mean": float(lr.mean()),
        "imbalance_linear_max": float(lr.max()),
        "imbalance_quadratic_mean": float(qr.mean()),
        "imbalance_quadratic_max": float(qr.max()),
        "examples_per_batch_mean": float(np.mean(sizes)),
        "examples_per_batch_p95": float(np.percentile(sizes, 95)),
        "coverage": len(seen) / planner.num_planned,
    }


@settings(max_examples=60, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 60), min_size=1, max_size=120),
    budget=st.integers(60, 400),
    world=st.integers(1, 4),
    acc=st.integers(1, 3),
    bucket=st.sampled_from([1, 3, 8]),
    pad=st.sampled_from([1, 4]),
    tail=st.sampled_from(["spread", "drop", "pad"]),
    pairs=st.booleans(),
)
def test_matches_a_per_tile_reference(
    lengths: list[int],
    budget: int,
    world: int,
    acc: int,
    bucket: int,
    pad: int,
    tail: str,
    pairs: bool,
) -> None:
    arr = np.array(lengths)
    if pairs:
        arr = np.stack([arr, np.roll(arr, 1)], axis=1)
    config = PlanConfig(max_tokens=budget, bucket_width=bucket, pad_to_multiple_of=pad, tail=tail)  # type: ignore[arg-type]
    planner = EpochPlanner(arr, config)
    try:
        plan = planner.plan(epoch=1, world_size=world, accumulate_grad_batches=acc)
    except ValueError as err:
        assert "More ranks than batches" in str(err)
        return
    d = diagnose(planner, plan)
    for name, want in _reference(planner, plan).items():
        assert getattr(d, name) == pytest.approx(want), name
    assert 0 < d.padding_efficiency <= 1
    assert 0 < d.budget_fill <= 1
    assert d.imbalance_linear_max >= d.imbalance_linear_mean >= 1
    assert d.imbalance_quadratic_max >= d.imbalance_quadratic_mean >= 1
    assert d.equal_counts
    assert d.num_micro_batches == world * d.micro_batches_per_rank
    assert d.coverage == pytest.approx(1 - d.num_dropped / d.num_planned)
    loads = rank_loads(planner, plan)
    assert loads.shape == (d.num_steps, world)
    assert loads.sum() == d.padded_tokens


def test_bucket_width_uses_the_true_longest_member() -> None:
    # One bucket [8, 16) holding 15 and many 8s: micro-batches that miss the 15 pad only to 8.
    lengths = np.array([15] + [8] * 40)
    planner, plan, d = _diag(lengths, max_tokens=64, bucket_width=8, shuffle=True, seed=3)
    longest = [
        int(planner.prepared.key[plan.micro_batch_ids(t)].max())
        for t in range(len(plan.micro_batch_size))
    ]
    assert sorted(set(longest)) == [8, 15]
    want = sum(int(n) * m for n, m in zip(plan.micro_batch_size.tolist(), longest, strict=True))
    assert d.padded_tokens == want
    assert d.real_tokens == int(lengths.sum())


def test_drop_and_pad_are_counted() -> None:
    lengths = np.full(50, 10)  # 5 micro-batches of 10 examples at budget 100
    _, _, drop = _diag(lengths, world_size=2, max_tokens=100, tail="drop")
    assert (drop.num_micro_batches, drop.num_dropped, drop.num_duplicated) == (4, 10, 0)
    assert drop.coverage == pytest.approx(0.8)
    _, _, pad = _diag(lengths, world_size=2, max_tokens=100, tail="pad")
    assert (pad.num_micro_batches, pad.num_dropped, pad.num_duplicated) == (6, 0, 10)
    assert pad.coverage == 1.0
    assert pad.real_tokens == 60 * 10  # the repeated micro-batch counts twice


def test_skipped_and_truncated_are_counted() -> None:
    _, _, skip = _diag(np.array([5, 5, 50, 5]), max_tokens=20, oversize="skip")
    assert (skip.num_examples, skip.num_planned, skip.num_skipped) == (4, 3, 1)
    assert skip.coverage == 1.0
    _, _, cut = _diag(np.array([5, 5, 50, 5]), max_tokens=20, oversize="truncate")
    assert (cut.num_truncated, cut.num_planned) == (1, 4)
    assert cut.real_tokens == 35  # the long example counts as cut to 20


def test_empty_replan_does_not_crash() -> None:
    planner = EpochPlanner(np.array([3, 4, 5]), PlanConfig(max_tokens=10))
    plan = planner.plan(0, exclude=np.ones(3, dtype=bool))
    d = diagnose(planner, plan)
    assert (d.num_micro_batches, d.num_steps, d.real_tokens) == (0, 0, 0)
    assert d.coverage == 0.0
    assert d.imbalance_linear_max == 1.0
    assert d.equal_counts
    assert "0 micro-batches" in d.format()


def test_to_dict_is_json_and_format_names_every_figure() -> None:
    _, _, d = _diag(wmt_like_lengths(5000), world_size=4, max_tokens=4096, cost="quadratic")
    back = json.loads(json.dumps(d.to_dict()))
    assert back == d.to_dict()
    assert list(back) == [f.name for f in dataclasses.fields(PlanDiagnostics)]
    assert back["cost"] == "quadratic"
    text = d.format()
    for word in ("padding efficiency", "budget fill", "examples per batch", "rank imbalance"):
        assert word in text
    assert f"{100 * d.padding_efficiency:.1f} %" in text


def test_custom_cost_is_named() -> None:
    def tokens(n: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
        return np.asarray(total, dtype=np.float64)

    _, _, d = _diag(np.array([3, 4, 5]), max_tokens=10, cost=tokens)
    assert d.cost.endswith("tokens")


def test_rank_loads_rejects_unknown_model() -> None:
    planner, plan, _ = _diag(np.array([3, 4, 5]), max_tokens=10)
    with pytest.raises(
        SettingValueError, match="model must be one of 'linear', 'quadratic', 'flops'"
    ):
        rank_loads(planner, plan, "cubic")  # type: ignore[arg-type]


def test_fast_on_a_million_examples() -> None:
    planner = EpochPlanner(wmt_like_lengths(1_000_000), PlanConfig(max_tokens=16384))
    plan = planner.plan(epoch=0, world_size=8)
    start = time.perf_counter()
    d = diagnose(planner, plan)
    assert time.perf_counter() - start < 2.0  # ~0.1 s here; generous for slow CI machines
    assert d.coverage == 1.0
    assert d.real_tokens == int(planner.prepared.key.astype(np.int64).sum())
