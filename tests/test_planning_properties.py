"""Property-based tests of the plan invariants users rely on."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_varbatch import EpochPlanner, PlanConfig, TokenBudgetBatchSampler

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 400))
    cost = draw(st.sampled_from(["padded", "sum", "quadratic", "packed"]))
    pairs = cost != "packed" and draw(st.booleans())  # packed rows: one length per example
    high = draw(st.sampled_from([4, 30, 300]))
    seed = draw(st.integers(0, 2**16))
    rng = np.random.default_rng(seed)
    shape = (n, 2) if pairs else (n,)
    lengths = rng.integers(1, high + 1, size=shape)
    pad = draw(st.sampled_from([1, 1, 8]))
    oversize = draw(st.sampled_from(["error", "skip", "truncate"]))
    longest = int(lengths.max())
    padded_longest = -(-longest // pad) * pad
    single = padded_longest * (1 + padded_longest / 64) if cost == "quadratic" else padded_longest
    # Budgets from "barely fits the longest example" to "fits many"; under skip/truncate
    # also budgets that some examples do not fit.
    low = 1 if oversize != "error" else int(np.ceil(single))
    max_tokens = draw(st.integers(max(low, 1), max(low, 1) + 4 * int(single) + 64))
    return {
        "lengths": lengths,
        "config": PlanConfig(
            max_tokens=max_tokens,
            max_examples=draw(st.sampled_from([None, None, 3, 16])),
            cost="padded" if cost == "packed" else cost,
            layout="packed" if cost == "packed" else "padded",
            flop_attention=draw(st.sampled_from([0.0, 1 / 64, 1.0])),
            batch_size_multiple=draw(st.sampled_from([1, 1, 2, 8])),
            pad_to_multiple_of=pad,
            bucket_width=draw(st.sampled_from([1, 1, 3])),
            seed=draw(st.integers(0, 5)),
            tail=draw(st.sampled_from(["spread", "drop", "pad"])),
            oversize=oversize,
            pair_order=draw(st.sampled_from(["two_sided", "max"])),
        ),
        "world": draw(st.sampled_from([1, 2, 3, 8, 64])),
        "acc": draw(st.integers(1, 3)),
        "epoch": draw(st.integers(0, 3)),
    }


def planner_or_skip(lengths: np.ndarray, config: PlanConfig) -> EpochPlanner:
    """The planner, or hypothesis rejects the case (a budget too small even to truncate to)."""
    try:
        return EpochPlanner(lengths, config)
    except ValueError as err:  # budget too small even to truncate to length 1
        assert "max_tokens" in str(err)
        assume(False)
        raise


def recomputed_cost(ids: np.ndarray, key: np.ndarray, config: PlanConfig) -> float:
    """Independent re-computation of a micro-batch's cost under the built-in models."""
    lens = key[ids].astype(np.int64)
    p = config.pad_to_multiple_of
    longest = -(-int(lens.max()) // p) * p
    if config.cost == "padded":
        return float(len(ids) * longest)
    if config.cost == "sum":
        return float(lens.sum())
    if config.cost == "packed":  # one row: the real tokens, aligned to the multiple
        return float(-(-int(lens.sum()) // p) * p)
    return float(len(ids) * (longest + config.quadratic_coef * longest * longest))


@pytest.mark.slow
@SETTINGS
@given(scenarios())
def test_plan_invariants(case: dict) -> None:
    lengths, config = case["lengths"], case["config"]
    world, acc = case["world"], case["acc"]
    planner = planner_or_skip(lengths, config)
    prep = planner.prepared
    try:
        plan = planner.plan(case["epoch"], world, acc)
    except ValueError as err:
        assert "More ranks than batches" in str(err)
        assert f"world_size={world}" in str(err)
        available = planner.num_planned
        assert available < world * acc or config.tail == "drop"
        return
    samplers = [
        TokenBudgetBatchSampler.from_planner(
            planner, rank=r, world_size=world, accumulate_grad_batches=acc, epoch=case["epoch"]
        )
        for r in range(world)
    ]
    batches = [list(s) for s in samplers]
    # Every rank: the same number of micro-batches, a multiple of the accumulation.
    counts = {len(b) for b in batches}
    assert counts == {plan.num_micro_batches_per_rank}
    assert all(len(s) == len(b) for s, b in zip(samplers, batches, strict=True))
    assert plan.num_micro_batches_per_rank % acc == 0
    # No micro-batch over budget, none empty.
    key = prep.key
    for rank_batches in batches:
        for b in rank_batches:
            assert len(b) >= 1
            assert recomputed_cost(np.asarray(b), key, config) <= config.max_tokens
            if config.max_examples is not None:
                assert len(b) <= config.max_examples
    # Coverage exactly as the policies report.
    seen = Counter(i for rank_batches in batches for b in rank_batches for i in b)
    planned = set(range(len(key))) if prep.kept is None else set(prep.kept.tolist())
    assert set(seen) <= planned
    assert len(key) - len(planned) == plan.num_skipped
    if config.tail == "spread" and plan.num_duplicated == 0:
        assert set(seen) == planned and max(seen.values()) == 1
    elif config.tail == "drop":
        assert max(seen.values()) == 1
        assert len(planned) - len(seen) == plan.num_dropped
    else:  # pad, or spread that ran out of examples to split
        assert set(seen) == planned
        assert sum(seen.values()) - len(planned) == plan.num_duplicated
    # Token counts carried by each batch are exact.
    loss = prep.loss.astype(np.int64)
    step_tokens: Counter[int] = Counter()
    for rank_batches in batches:
        for b in rank_batches:
            assert b.ntokens == int(loss[list(b)].sum())
            step_tokens[b.step] += b.ntokens
    for rank_batches in batches:
        for b in rank_batches:
            assert b.step_ntokens == step_tokens[b.step]
    # Same seed and epoch: the same plan, from a fresh planner.
    again = EpochPlanner(lengths, config).plan(case["epoch"], world, acc)
    assert np.array_equal(again.order, plan.order)
    assert np.array_equal(again.assign, plan.assign)


@pytest.mark.slow
@settings(SETTINGS, max_examples=50)  # the slowest property here: every rank, two topologies
@given(
    scenarios(),
    st.floats(0, 1),
    st.sampled_from([1, 2, 3, 5]),
    st.integers(1, 3),
)
def test_resume_consumes_exactly_the_rest(
    case: dict, where: float, new_world: int, new_acc: int
) -> None:
    lengths = case["lengths"]
    config = PlanConfig(**{**case["config"].__dict__, "tail": "spread"})
    world, acc, epoch = case["world"], case["acc"], case["epoch"]
    planner = planner_or_skip(lengths, config)
    assume(planner.num_planned >= max(world * acc, new_world * new_acc))
    assume(planner.plan(epoch, world, acc).num_duplicated == 0)
    assume(planner.plan(epoch, new_world, new_acc).num_duplicated == 0)
    first = [
        TokenBudgetBatchSampler.from_planner(
            planner, rank=r, world_size=world, accumulate_grad_batches=acc, epoch=epoch
        )
        for r in range(world)
    ]
    total = len(first[0])
    stop = int(where * total)
    consumed: list[int] = []
    states = []
    for s in first:
        it = iter(s)
        for _ in range(stop):
            consumed.extend(next(it))
        states.append(s.state_dict())
    assert all(state == states[0] for state in states)  # the same on every rank
    for topology in [(world, acc), (new_world, new_acc)]:
        rest: list[int] = []
        resumed = []
        for r in range(topology[0]):
            s = TokenBudgetBatchSampler.from_planner(
                planner, rank=r, world_size=topology[0], accumulate_grad_batches=topology[1]
            )
            s.load_state_dict(states[0])
            s.set_epoch(epoch)  # Lightning calls this on resume; it must keep the position
            resumed.append(list(s))
            assert len(resumed[-1]) == len(resumed[0])
            rest.extend(i for b in resumed[-1] for i in b)
        everything = Counter(consumed + rest)
        planned = planner.num_planned
        # Nothing lost; repeated only when the remainder is too small to fill every rank
        # (tail padding), and then exactly as counted.
        assert len(everything) == planned
        assert sum(everything.values()) - planned == s.plan.num_duplicated
        if topology == (world, acc):  # same topology: exactly the original remainder
            for r in range(world):
                original = list(
                    TokenBudgetBatchSampler.from_planner(
                        planner,
                        rank=r,
                        world_size=world,
                        accumulate_grad_batches=acc,
                        epoch=epoch,
                    )
                )
                assert [list(b) for b in original[stop:]] == [list(b) for b in resumed[r]]


def test_epochs_change_order_and_composition_but_not_padding() -> None:
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 60, size=(5000, 2))
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=600))
    plans = [planner.plan(e, world_size=4, accumulate_grad_batches=2) for e in range(4)]
    firsts = [tuple(p.micro_batch(0, 0).tolist()) for p in plans]
    assert len(set(firsts)) == 4  # batch order changes every epoch
    compositions = [
        {frozenset(p.micro_batch_ids(t).tolist()) for t in p.assign.reshape(-1)} for p in plans
    ]
    for a in range(4):
        for b in range(a + 1, 4):
            shared = len(compositions[a] & compositions[b]) / len(compositions[a])
            assert shared < 0.5  # most batches hold different examples
    # padding stays as tight: the cut is the same every epoch (pairs in buckets of neighbouring
    # lengths may swap a length between micro-batches: their exact costs move by a hair)
    costs = [float(p.micro_batch_cost.sum()) for p in plans]
    assert max(costs) <= 1.001 * min(costs)
    assert len({p.micro_batch_size.tobytes() for p in plans}) == 1


def test_seed_changes_the_plan() -> None:
    lengths = np.random.default_rng(2).integers(1, 40, size=2000)
    a = EpochPlanner(lengths, PlanConfig(max_tokens=400, seed=0)).plan(0, 2)
    b = EpochPlanner(lengths, PlanConfig(max_tokens=400, seed=1)).plan(0, 2)
    assert not np.array_equal(a.order, b.order)


def test_no_shuffle_is_sorted_longest_first_and_epoch_independent() -> None:
    lengths = np.array([5, 1, 9, 3, 9, 2, 7, 7])
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=18, shuffle=False))
    p0, p1 = planner.plan(0), planner.plan(1)
    assert np.array_equal(p0.assign, p1.assign) and np.array_equal(p0.order, p1.order)
    assert [p0.micro_batch_ids(int(t)).tolist() for t in p0.rank_micro_batches(0)] == [
        [2, 4],
        [6, 7],
        [0, 3, 5],
        [1],
    ]


def test_steps_group_similar_shapes_and_balance_ranks() -> None:
    lengths = np.random.default_rng(3).integers(1, 200, size=50000)
    plan = EpochPlanner(lengths, PlanConfig(max_tokens=16384)).plan(0, 8, 2)
    per_rank = plan.micro_batch_cost[plan.assign].sum(axis=2)  # (steps, ranks)
    imbalance = per_rank.max(axis=1) / per_rank.mean(axis=1)
    assert imbalance.mean() <= 1.01
    assert np.median(imbalance) <= 1.005
    # Within one step the longest examples differ little across ranks (no stragglers).
    longest = np.array(
        [
            [
                plan.micro_batch_ids(int(t)).size
                and int(lengths[plan.micro_batch_ids(int(t))].max())
                for t in row
            ]
            for row in plan.assign[:, :, 0]
        ]
    )
    spread = (longest.max(axis=1) - longest.min(axis=1)) / longest.max(axis=1)
    assert np.median(spread) <= 0.1


@pytest.mark.parametrize("acc", [1, 3])
def test_deal_pairs_big_with_small(acc: int) -> None:
    lengths = np.concatenate([np.full(30, 50), np.full(30, 10)])
    plan = EpochPlanner(lengths, PlanConfig(max_tokens=100, shuffle=False)).plan(0, 2, acc)
    per_rank = plan.micro_batch_cost[plan.assign].sum(axis=2)
    assert (per_rank.max(axis=1) / per_rank.mean(axis=1)).mean() <= 1.2


@pytest.mark.parametrize(("n", "world", "acc"), [(200_000, 8, 1), (50_000, 8, 2), (20_000, 3, 1)])
def test_default_tail_keeps_every_step_balanced(n: int, world: int, acc: int) -> None:
    """The last, partial step is re-cut evenly: no step pairs full and half-size batches."""
    from lightning_varbatch.planner.synthetic import wmt_like_lengths

    lengths = wmt_like_lengths(n, seed=1)
    plan = EpochPlanner(lengths, PlanConfig(max_tokens=16384)).plan(0, world, acc)
    per_rank = plan.micro_batch_cost[plan.assign].sum(axis=2)
    imbalance = per_rank.max(axis=1) / per_rank.mean(axis=1)
    assert imbalance.max() <= 1.02
    assert np.array_equal(np.sort(plan.example_ids()), np.arange(n))


# -- the tail step is as even as the rest (issue 12 §5) -----------------------------------


def _last_step(plan: object, num_micro_batches: int) -> np.ndarray:
    """Micro-batch ids of the optimizer step that holds the last micro-batch (the re-cut tail)."""
    assign = plan.assign  # type: ignore[attr-defined]
    step = int(np.flatnonzero((assign == num_micro_batches - 1).any(axis=(1, 2)))[0])
    return np.asarray(assign[step])


@SETTINGS
@given(
    n=st.integers(1, 300),
    length=st.integers(1, 40),
    per_batch=st.integers(1, 12),
    cost=st.sampled_from(["padded", "sum", "quadratic"]),
    max_examples=st.sampled_from([None, None, 2, 5]),
    batch_size_multiple=st.sampled_from([1, 1, 2, 4]),
    world=st.integers(1, 6),
    acc=st.integers(1, 3),
    seed=st.integers(0, 3),
)
def test_tail_step_of_equal_lengths_is_even(
    n: int,
    length: int,
    per_batch: int,
    cost: str,
    max_examples: int | None,
    batch_size_multiple: int,
    world: int,
    acc: int,
    seed: int,
) -> None:
    """Equal lengths, tail="spread": the last step's micro-batches differ by <= 1 example.

    Precisely: in the optimizer step that holds the last micro-batch, (1) the sizes of all
    ``world * acc`` micro-batches differ by at most one example (13 examples over 4
    micro-batches: [4, 3, 3, 3], never [4, 4, 4, 1]), (2) every rank's example count differs
    by at most one from every other rank's, and (3) every micro-batch of the epoch is
    within the budget and every example runs exactly once (unless the budget holds a
    single example and the epoch has fewer examples than a multiple of ``world * acc``
    needs, where some repeat, counted, as before).
    """
    assume(max_examples is None or batch_size_multiple <= max_examples)
    single = length if cost != "quadratic" else length * (1 + length / 64)
    config = PlanConfig(
        max_tokens=int(np.ceil(single * per_batch)),
        max_examples=max_examples,
        cost=cost,
        batch_size_multiple=batch_size_multiple,
        seed=seed,
    )
    assume(n >= world * acc)
    planner = EpochPlanner(np.full(n, length), config)
    plan = planner.plan(0, world, acc)
    sizes = plan.micro_batch_size
    # more micro-batches than examples can fill (one example per budget): repeats are counted
    assume(plan.num_duplicated == 0)
    assert sorted(plan.example_ids().tolist()) == list(range(n))
    assert (plan.micro_batch_cost <= config.max_tokens).all()
    last = _last_step(plan, plan.micro_batch_start.size)
    step_sizes = sizes[last]
    assert int(step_sizes.max()) - int(step_sizes.min()) <= 1, step_sizes.tolist()
    per_rank = step_sizes.sum(axis=1)
    assert int(per_rank.max()) - int(per_rank.min()) <= 1, step_sizes.tolist()


def _min_max_cut(costs: np.ndarray, parts: int) -> float:
    """Smallest possible largest cost over cuts of positions 0..n into ``parts`` runs.

    ``costs[a, b]`` is the cost of the run ``[a, b)`` (``inf`` when not allowed).
    """
    n = costs.shape[0] - 1
    best = np.full(n + 1, np.inf)
    best[0] = 0.0
    for _ in range(parts):
        # best'[b] = min over a < b of max(best[a], costs[a, b])
        nxt = np.min(np.maximum(best[:, None], costs), axis=0)
        nxt[0] = np.inf
        best = nxt
    return float(best[n])


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 48),
    high=st.sampled_from([3, 10, 60]),
    cost=st.sampled_from(["padded", "sum", "quadratic"]),
    max_examples=st.sampled_from([None, None, 3]),
    pad=st.sampled_from([1, 1, 4]),
    slack=st.integers(0, 200),
    world=st.integers(1, 4),
    acc=st.integers(1, 2),
)
def test_tail_step_has_the_smallest_possible_largest_micro_batch(
    seed: int,
    n: int,
    high: int,
    cost: str,
    max_examples: int | None,
    pad: int,
    slack: int,
    world: int,
    acc: int,
) -> None:
    """Any lengths, tail="spread": the tail is cut as evenly as the budget allows.

    Precisely: when the re-cut tail is one optimizer step (its examples, in the planner's
    length order, are those of the greedy cut's last partial step, or of its last full step
    when there is no partial one), the largest micro-batch cost of that step equals the
    smallest largest cost any cut of those examples into ``world * acc`` contiguous
    micro-batches (each within ``max_examples``) can have, and under that largest cost its
    smallest micro-batch cost is the largest possible: both found here by brute force
    (dynamic programming over all cuts).
    """
    from lightning_varbatch.planner.sorted_cut import SortedCut

    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, high + 1, size=n)
    p = pad
    longest = -(-int(lengths.max()) // p) * p
    single = longest * (1 + longest / 64) if cost == "quadratic" else longest
    config = PlanConfig(
        max_tokens=int(np.ceil(single)) + slack,
        max_examples=max_examples,
        cost=cost,
        pad_to_multiple_of=pad,
        shuffle=False,
    )
    wa = world * acc
    planner = EpochPlanner(lengths, config)
    greedy = SortedCut.build(planner.groups, config)
    m = greedy.num_micro_batches
    take = m % wa or wa
    assume(m >= take)
    start = int(greedy.starts[m - take])
    assume(n - start >= wa)  # the tail region is one step
    plan = planner.plan(0, world, acc)
    last = _last_step(plan, plan.micro_batch_start.size)
    step_max = float(plan.micro_batch_cost[last].max())
    # brute force over the same examples in the same (length-sorted) order
    key = planner.groups.longest[planner.groups.group_of(np.arange(start, n))]
    k = n - start
    costs = np.full((k + 1, k + 1), np.inf)
    for a in range(k):
        for b in range(a + 1, k + 1):
            size = b - a
            if max_examples is not None and size > max_examples:
                continue
            first = -(-int(key[a]) // p) * p
            c = config.cost_fn(np.array([size]), np.array([first]), np.array([key[a:b].sum()]))
            costs[a, b] = float(c[0]) if float(c[0]) <= config.max_tokens else np.inf
    shown = (plan.micro_batch_size[last].tolist(), plan.micro_batch_cost[last].tolist())
    optimum = _min_max_cut(costs, wa)
    assert step_max == pytest.approx(optimum, rel=1e-6), shown
    # ... and under that largest cost, the smallest micro-batch is as large as it can be
    allowed = np.where(costs <= optimum * (1 + 1e-9), costs, np.inf)
    assert float(plan.micro_batch_cost[last].min()) == pytest.approx(
        _max_min_cut(allowed, wa), rel=1e-6
    ), shown


def _max_min_cut(costs: np.ndarray, parts: int) -> float:
    """Largest possible smallest cost over cuts into ``parts`` runs (``inf``: not allowed)."""
    n = costs.shape[0] - 1
    gain = np.where(np.isfinite(costs), costs, -np.inf)
    best = np.full(n + 1, -np.inf)
    best[0] = np.inf
    for _ in range(parts):
        nxt = np.max(np.minimum(best[:, None], gain), axis=0)
        nxt[0] = -np.inf
        best = nxt
    return float(best[n])
