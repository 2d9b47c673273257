"""Property-based tests of the multi-dataset plan invariants (every mixing policy)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_varbatch import DataSource, MixturePlanner, PlanConfig, TokenBudgetBatchSampler
from lightning_varbatch.planner.mixture_datasets import mixture_probabilities

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def mixtures(draw: st.DrawFn) -> dict:
    num = draw(st.integers(1, 4))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    sources, budgets = [], []
    common = draw(st.sampled_from([64, 200, 1000]))
    for i in range(num):
        n = draw(st.integers(1, 150))
        high = draw(st.sampled_from([4, 30, 60]))
        pairs = draw(st.booleans())
        lengths = rng.integers(1, high + 1, size=(n, 2) if pairs else (n,))
        own = draw(st.sampled_from([None, None, 64, 400]))
        budget = common if own is None else own
        assume(int(lengths.max()) <= budget)
        budgets.append(budget)
        sources.append(
            DataSource(
                lengths,
                max_tokens=own,
                max_examples=draw(st.sampled_from([None, 3, 8])),
                name=f"d{i}",
            )
        )
    steps = draw(st.sampled_from([None, None, 1, 7, 40]))
    if steps is None:
        weights, temperature = "size", 1.0
    else:
        weights = draw(
            st.sampled_from(["size", [float(w) for w in rng.integers(0, 5, size=num)], [1.0] * num])
        )
        assume(weights == "size" or any(weights))
        temperature = draw(st.sampled_from([1.0, 1.0, 3.0]))
    return {
        "sources": sources,
        "budgets": budgets,
        "config": PlanConfig(
            max_tokens=common,
            seed=draw(st.integers(0, 3)),
            tail=draw(st.sampled_from(["spread", "drop", "pad"])),
            cost=draw(st.sampled_from(["padded", "sum"])),
        ),
        "mixing": draw(st.sampled_from(["per_step", "per_batch"])),
        "weights": weights,
        "temperature": temperature,
        "steps": steps,
        "world": draw(st.sampled_from([1, 2, 3])),
        "acc": draw(st.integers(1, 2)),
        "epoch": draw(st.integers(0, 3)),
    }


def _planner(case: dict) -> MixturePlanner:
    return MixturePlanner(
        case["sources"],
        case["config"],
        mixing=case["mixing"],
        weights=case["weights"],
        temperature=case["temperature"],
        steps_per_epoch=case["steps"],
    )


def _plan_or_skip(planner: MixturePlanner, epoch: int, world: int, acc: int):
    try:
        return planner.plan(epoch, world, acc)
    except ValueError as err:  # a dataset too small for every rank: a documented error
        assert "Dataset 'd" in str(err)
        assume(False)
        raise


def _key(source: DataSource) -> np.ndarray:
    lengths = np.asarray(source.lengths)
    return lengths.max(axis=1) if lengths.ndim == 2 else lengths


def _cost(lengths: np.ndarray, cost: str) -> float:
    return float(lengths.sum()) if cost == "sum" else float(len(lengths) * lengths.max())


@SETTINGS
@given(mixtures())
def test_mixture_invariants(case: dict) -> None:
    planner = _planner(case)
    world, acc = case["world"], case["acc"]
    plan = _plan_or_skip(planner, case["epoch"], world, acc)
    sources, offsets = case["sources"], planner.offsets

    # every rank runs the same number of micro-batches, and every micro-batch fits ITS budget
    per_rank = [plan.rank_micro_batches(r).size for r in range(world)]
    assert len(set(per_rank)) == 1
    for micro_batch in np.unique(plan.assign):
        d = int(plan.micro_batch_dataset[micro_batch])
        ids = plan.micro_batch_ids(int(micro_batch)).astype(np.int64)
        assert ids.size > 0
        assert ((ids >= offsets[d]) & (ids < offsets[d + 1])).all(), "micro-batch mixes datasets"
        cap = sources[d].max_examples
        assert cap is None or ids.size <= cap
        key = _key(sources[d])[ids - offsets[d]]
        assert _cost(key, case["config"].cost) <= case["budgets"][d]
        assert plan.micro_batch_tokens[micro_batch] == int(
            _loss(sources[d])[ids - offsets[d]].sum()
        )

    if case["mixing"] == "per_step":  # a step is one dataset on every rank and micro-batch
        for s in range(plan.num_steps):
            assert np.unique(plan.step_dataset[s]).size == 1

    run = plan.example_ids().astype(np.int64)
    seen = Counter(run.tolist())
    if case["steps"] is None:  # one pass: each example once, up to the counted tail policy
        missing = planner.num_examples - len(seen)
        extra = sum(c - 1 for c in seen.values())
        assert missing == plan.num_dropped
        assert extra == plan.num_duplicated
    else:  # N steps split by weight, within one unit of each share
        unit = plan.step_dataset[:, 0, 0] if case["mixing"] == "per_step" else plan.step_dataset
        counts = np.bincount(unit.ravel(), minlength=len(sources))
        total = counts.sum()
        assert total == case["steps"] * (1 if case["mixing"] == "per_step" else world * acc)
        probs = planner.probabilities
        assert (np.abs(counts - total * probs) < 1 + 1e-9).all()
        assert plan.num_duplicated == run.size - len(seen)


def _loss(source: DataSource) -> np.ndarray:
    lengths = np.asarray(source.lengths)
    return lengths[:, 1] if lengths.ndim == 2 else lengths


@SETTINGS
@given(mixtures())
def test_same_seed_and_epoch_same_plan(case: dict) -> None:
    a = _plan_or_skip(_planner(case), case["epoch"], case["world"], case["acc"])
    b = _plan_or_skip(_planner(case), case["epoch"], case["world"], case["acc"])
    assert np.array_equal(a.assign, b.assign)
    assert np.array_equal(a.example_ids(), b.example_ids())


@SETTINGS
@given(mixtures(), st.data())
def test_shares_hold_along_the_epoch(case: dict, data: st.DataObject) -> None:
    plan = _plan_or_skip(_planner(case), case["epoch"], case["world"], case["acc"])
    if case["mixing"] == "per_step":
        units = plan.step_dataset[:, 0, 0]
    else:  # micro-batches in the order a step lists them, ranks first
        units = plan.step_dataset.reshape(-1)
    assume(units.size > 0)
    num = len(case["sources"])
    total = np.bincount(units, minlength=num)
    k = data.draw(st.integers(1, units.size))
    prefix = np.bincount(units[:k], minlength=num)
    if case["mixing"] == "per_step":  # stratified interleaving: within D + 1 of k * share
        assert (np.abs(prefix - k * total / units.size) <= num + 1 + 1e-9).all()


@SETTINGS
@given(mixtures(), st.data())
def test_resume_with_another_world_size(case: dict, data: st.DataObject) -> None:
    """Resume mid-epoch on another world size: what is left is re-planned, none lost."""
    world, acc, epoch = case["world"], case["acc"], case["epoch"]
    planner = _planner(case)
    plan = _plan_or_skip(planner, epoch, world, acc)
    total = plan.num_micro_batches_per_rank
    assume(total > 0)
    consumed = data.draw(st.integers(0, total))
    new_world = data.draw(st.sampled_from([1, 2, 4]))
    left_micro_batches = plan.consumed_micro_batches(consumed)[1]
    rest = planner.plan_resumed(epoch, new_world, 1, [(world, acc, consumed)])
    got = Counter(rest.example_ids().tolist())
    done = Counter(plan.consumed_ids(consumed).tolist())
    epoch = done + got
    if case["steps"] is None:  # one pass: every example not run yet, once, but the counted
        kept = planner.prepared.kept
        planned = range(planner.num_examples) if kept is None else kept.tolist()
        left = Counter({i: 1 for i in planned if i not in done})
        assert sum((left - got).values()) == rest.num_dropped  # a drop is counted
    else:  # a sampled epoch: the earlier plan's micro-batches not run yet, repeats kept
        left = Counter(plan.ids_of_micro_batches(left_micro_batches).tolist())
    # the repeats of the whole epoch, consumed part included, are counted
    assert sum(epoch.values()) - len(epoch) == rest.num_duplicated
    if case["mixing"] == "per_step":
        for s in range(rest.num_steps):
            assert np.unique(rest.step_dataset[s]).size == 1
    assert len({rest.rank_micro_batches(r).size for r in range(new_world)}) == 1


@pytest.mark.slow
@SETTINGS
@given(mixtures(), st.data())
def test_sampler_resume_same_topology_gives_exactly_the_rest(
    case: dict, data: st.DataObject
) -> None:
    world, acc = case["world"], case["acc"]
    planner = _planner(case)
    _plan_or_skip(planner, case["epoch"], world, acc)
    rank = data.draw(st.integers(0, world - 1))

    def sampler() -> TokenBudgetBatchSampler:
        return TokenBudgetBatchSampler.from_planner(
            planner, rank=rank, world_size=world, accumulate_grad_batches=acc, epoch=case["epoch"]
        )

    full = [(list(b), b.dataset, b.step_ntokens) for b in sampler()]
    cut = data.draw(st.integers(0, len(full)))
    first = sampler()
    state = first.state_dict(consumed=cut)
    second = sampler()
    second.load_state_dict(state)
    rest = [(list(b), b.dataset, b.step_ntokens) for b in second]
    assert rest == full[cut:]


def test_stream_covers_each_example_once_per_pass() -> None:
    """A small dataset upsampled over epochs: every pass holds each of its examples once."""
    small = DataSource(np.arange(1, 13), name="small")  # 12 examples, budget 24
    big = DataSource(np.full(400, 8), name="big")
    planner = MixturePlanner(
        [big, small], PlanConfig(max_tokens=24), weights=[1, 1], steps_per_epoch=10
    )
    ids: list[int] = []
    for epoch in range(4):
        plan = planner.plan(epoch, world_size=2)
        micro_batches = plan.assign.reshape(-1)
        micro_batches = micro_batches[plan.micro_batch_dataset[micro_batches] == 1]
        ids += plan.ids_of_micro_batches(micro_batches).tolist()
    per_pass = 12
    assert len(ids) >= 3 * per_pass
    for k in range(len(ids) // per_pass):
        chunk = ids[k * per_pass : (k + 1) * per_pass]
        assert sorted(chunk) == list(range(400, 412)), f"pass {k} is not a permutation"


def test_temperature_flattens_shares() -> None:
    sizes = np.array([900, 100])
    natural = mixture_probabilities(sizes)
    flat = mixture_probabilities(sizes, temperature=5.0)
    assert natural.tolist() == pytest.approx([0.9, 0.1])
    assert flat[1] == pytest.approx(100**0.2 / (900**0.2 + 100**0.2))
    assert mixture_probabilities(sizes, [0, 3]).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("steps", [None, 9])
@pytest.mark.parametrize("mixing", ["per_step", "per_batch"])
def test_sampler_state_resumes_on_another_world_size(steps: int | None, mixing: str) -> None:
    rng = np.random.default_rng(3)
    sources = [
        DataSource(rng.integers(1, 40, size=300), name="a"),
        DataSource(rng.integers(20, 60, size=(90, 2)), name="b", max_tokens=120),
    ]
    weights = "size" if steps is None else [1.0, 2.0]
    planner = MixturePlanner(
        sources,
        PlanConfig(max_tokens=200, seed=4),
        mixing=mixing,
        weights=weights,
        steps_per_epoch=steps,
    )
    old = [
        TokenBudgetBatchSampler.from_planner(planner, rank=r, world_size=2, epoch=1)
        for r in range(2)
    ]
    full = Counter(i for s in old for b in s for i in b)
    consumed = Counter(i for s in old for b in list(s)[:3] for i in b)
    state = old[0].state_dict(consumed=3)
    new = TokenBudgetBatchSampler.from_planner(planner, rank=0, world_size=1)
    new.load_state_dict(state)
    rest = Counter(i for b in new for i in b)
    assert new.epoch == 1
    assert not (full - consumed - rest), "an example of the epoch was lost on resume"
    assert sum((consumed + rest - full).values()) == new.plan.num_duplicated
