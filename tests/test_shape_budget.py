"""The shape budget (issue 17): ``PlanConfig(max_shapes=K)``, checked against references.

Every reference here is written independently of the library: the optimal shape lengths by
brute force over all subsets of candidate lengths, the costs and the padded slots by hand,
the loss on a shaped batch against the loss on the free-shape batch of the same examples.
"""

from __future__ import annotations

import copy
import itertools
from collections import Counter
from typing import Any

import datasets
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from lightning_varbatch import (
    EpochPlanner,
    MixturePlanner,
    PaddingCollate,
    PlanConfig,
    TokenBudgetBatchSampler,
    token_budget_dataloader,
)
from lightning_varbatch.callbacks.worst_batch import check_names, worst_micro_batches
from lightning_varbatch.data.collate import attach_plan
from lightning_varbatch.data.columnar import ColumnarItems, fetch_rows
from lightning_varbatch.planner.diagnostics import diagnose
from lightning_varbatch.planner.shapes import MAX_CANDIDATES, choose_shape_lengths
from tests.test_planning_properties import planner_or_skip

# oversize="skip"/"truncate" scenarios warn about the examples they cut or leave out (by design)
pytestmark = pytest.mark.filterwarnings("ignore:oversize=:UserWarning")

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _round_up(x: np.ndarray | int, p: int) -> Any:
    return -(-np.asarray(x, dtype=np.int64) // p) * p


def _padded_total(key: np.ndarray, lengths: np.ndarray | list[int], p: int) -> int:
    """Sum over examples of the shortest of ``lengths`` that holds the padded example."""
    chosen = np.sort(np.asarray(lengths, dtype=np.int64))
    padded = _round_up(key, p)
    assert padded.max() <= chosen[-1], "the lengths do not cover every example"
    return int(chosen[np.searchsorted(chosen, padded, side="left")].sum())


def _brute_force_total(key: np.ndarray, k: int, p: int) -> int:
    """Least padded total over every set of at most ``k`` multiples of ``p`` up to the max."""
    top = int(_round_up(int(np.max(key)), p))
    candidates = list(range(p, top, p))  # every multiple of p below the longest
    best = None
    for size in range(min(k - 1, len(candidates)) + 1):
        for subset in itertools.combinations(candidates, size):
            total = _padded_total(key, [*subset, top], p)
            best = total if best is None else min(best, total)
    assert best is not None
    return best


def _cost(rows: int, length: int, config: PlanConfig) -> float:
    """A padded micro-batch's cost under the built-in models, recomputed by hand."""
    if config.cost == "padded":
        return float(rows * length)
    assert config.cost == "quadratic"
    return float(rows * (length + config.quadratic_coef * length * length))


# -- 1. the shape lengths are optimal -----------------------------------------------------


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    n=st.integers(1, 40),
    high=st.sampled_from([3, 9, 20]),
    k=st.integers(1, 4),
    p=st.sampled_from([1, 1, 2, 4]),
)
def test_shape_lengths_are_optimal(seed: int, n: int, high: int, k: int, p: int) -> None:
    key = np.random.default_rng(seed).integers(1, high + 1, size=n)
    got = choose_shape_lengths(key, k, p)
    distinct = np.unique(_round_up(key, p))
    assert got.dtype == np.int64
    assert 1 <= got.size <= k
    assert (np.diff(got) > 0).all(), got.tolist()  # strictly ascending
    assert (got % p == 0).all(), got.tolist()
    assert int(got[-1]) == int(distinct[-1])  # the longest example has a shape
    if distinct.size <= k:  # fewer distinct (rounded) lengths than shapes: all of them
        assert got.tolist() == distinct.tolist()
    assert _padded_total(key, got, p) == _brute_force_total(key, k, p), got.tolist()


def test_shape_lengths_hand_checked() -> None:
    assert choose_shape_lengths(np.array([3, 3, 4, 9, 10, 10]), 2, 1).tolist() == [4, 10]
    assert choose_shape_lengths(np.array([1, 2, 3, 7, 8]), 2, 4).tolist() == [4, 8]
    assert choose_shape_lengths(np.array([5, 1, 5]), 1, 1).tolist() == [5]
    assert choose_shape_lengths(np.array([5, 1, 5]), 7, 1).tolist() == [1, 5]
    assert choose_shape_lengths(np.array([5, 1, 5]), 7, 8).tolist() == [8]
    # many short, one long: the short ones get their own length
    assert choose_shape_lengths(np.array([2] * 50 + [100]), 2, 1).tolist() == [2, 100]
    assert choose_shape_lengths(np.zeros(0, dtype=np.int64), 3, 1).tolist() == []


@pytest.mark.parametrize(("k", "p"), [(1, 1), (3, 1), (8, 8), (16, 1)])
def test_many_distinct_lengths_take_the_quantile_path(k: int, p: int) -> None:
    rng = np.random.default_rng(k)
    key = np.concatenate([rng.integers(1, 20 * MAX_CANDIDATES, size=30_000), [123_457]])
    assert np.unique(_round_up(key, p)).size > MAX_CANDIDATES
    got = choose_shape_lengths(key, k, p)
    assert 1 <= got.size <= k
    assert (np.diff(got) > 0).all() and (got % p == 0).all()
    assert int(got[-1]) == int(_round_up(123_457, p))
    # never worse than one length for everything, and with k > 1 strictly better here
    one = _padded_total(key, got[-1:], p)
    assert _padded_total(key, got, p) <= one
    if k > 1:
        assert _padded_total(key, got, p) < one


# -- 2. plan invariants ---------------------------------------------------------------------


@st.composite
def scenarios(draw: st.DrawFn) -> dict:
    n = draw(st.integers(1, 250))
    pairs = draw(st.booleans())
    high = draw(st.sampled_from([4, 30, 300]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    lengths = rng.integers(1, high + 1, size=(n, 2) if pairs else (n,))
    cost = draw(st.sampled_from(["padded", "quadratic"]))
    pad = draw(st.sampled_from([1, 1, 8]))
    oversize = draw(st.sampled_from(["error", "skip", "truncate"]))
    longest = int(_round_up(int(lengths.max()), pad))
    single = longest * (1 + longest / 64) if cost == "quadratic" else longest
    low = 1 if oversize != "error" else int(np.ceil(single))
    max_tokens = draw(st.integers(max(low, 1), max(low, 1) + 4 * int(single) + 64))
    return {
        "lengths": lengths,
        "config": PlanConfig(
            max_tokens=max_tokens,
            max_examples=draw(st.sampled_from([None, None, 3, 16])),
            cost=cost,
            pad_to_multiple_of=pad,
            seed=draw(st.integers(0, 5)),
            tail=draw(st.sampled_from(["spread", "drop", "pad"])),
            oversize=oversize,
            max_shapes=draw(st.integers(1, 6)),
        ),
        "world": draw(st.integers(1, 4)),
        "acc": draw(st.integers(1, 3)),
        "epoch": draw(st.integers(0, 3)),
    }


def _plan_or_none(planner: EpochPlanner, epoch: int, world: int, acc: int) -> Any:
    try:
        return planner.plan(epoch, world, acc)
    except ValueError as err:
        assert "More ranks than batches" in str(err)
        assert planner.num_planned < world * acc or planner.config.tail == "drop"
        return None


def _planned_ids(planner: EpochPlanner) -> np.ndarray:
    kept = planner.prepared.kept
    return np.arange(planner.num_examples) if kept is None else np.asarray(kept)


def _check_shapes_of_planner(planner: EpochPlanner) -> None:
    """The planner's shapes: <= K, ascending multiples, covering, rows the most that fit."""
    cfg = planner.config
    assert cfg.max_shapes is not None
    p = cfg.pad_to_multiple_of
    key = planner.prepared.key[_planned_ids(planner)]
    shapes = planner.shapes
    assert shapes is not None and shapes.shape[1] == 2
    assert 1 <= len(shapes) <= cfg.max_shapes
    lengths = shapes[:, 1]
    assert np.array_equal(lengths, planner.shape_lengths)
    assert (np.diff(lengths) > 0).all() and (lengths % p == 0).all()
    assert int(lengths[-1]) == int(_round_up(int(key.max()), p))
    for rows, length in shapes.tolist():
        assert rows >= 1
        assert _cost(rows, length, cfg) <= cfg.max_tokens
        # the most rows that fit: one more is over the budget or over max_examples
        more_over = _cost(rows + 1, length, cfg) > cfg.max_tokens
        assert more_over or rows == cfg.max_examples, (rows, length)
        if cfg.max_examples is not None:
            assert rows <= cfg.max_examples


def _check_plan(planner: EpochPlanner, plan: Any) -> None:
    """Every run micro-batch: one of the planner's shapes, the tightest that holds it, in budget."""
    cfg = planner.config
    p = cfg.pad_to_multiple_of
    key = planner.prepared.key
    shapes = {tuple(s) for s in planner.shapes.tolist()}
    lengths = planner.shape_lengths
    assert plan.micro_batch_shape is not None and plan.micro_batch_shape.shape == (
        len(plan.micro_batch_size),
        2,
    )
    run = plan.assign.reshape(-1)
    seen_shapes = set()
    for t in run.tolist():
        ids = plan.micro_batch_ids(t)
        rows, length = (int(x) for x in plan.micro_batch_shape[t])
        seen_shapes.add((rows, length))
        assert (rows, length) in shapes
        assert 1 <= len(ids) <= rows
        longest = int(_round_up(int(key[ids].max()), p))
        assert longest <= length
        # the shortest shape that holds the micro-batch's longest example
        assert length == int(lengths[np.searchsorted(lengths, longest)])
        assert _cost(rows, length, cfg) <= cfg.max_tokens
    assert len(seen_shapes) <= cfg.max_shapes


@SETTINGS
@given(scenarios())
def test_plan_invariants_under_a_shape_budget(case: dict) -> None:
    lengths, config = case["lengths"], case["config"]
    world, acc, epoch = case["world"], case["acc"], case["epoch"]
    planner = planner_or_skip(lengths, config)
    _check_shapes_of_planner(planner)
    first_shapes = planner.shapes.copy()
    planned = set(_planned_ids(planner).tolist())
    for e in (epoch, epoch + 1):
        plan = _plan_or_none(planner, e, world, acc)
        if plan is None:
            return
        _check_plan(planner, plan)
        samplers = [
            TokenBudgetBatchSampler.from_planner(
                planner, rank=r, world_size=world, accumulate_grad_batches=acc, epoch=e
            )
            for r in range(world)
        ]
        batches = [list(s) for s in samplers]
        assert {len(b) for b in batches} == {plan.num_micro_batches_per_rank}
        for rank_batches in batches:
            for b in rank_batches:
                assert (b.pad_rows, b.pad_length) in {tuple(s) for s in first_shapes.tolist()}
                assert 1 <= len(b) <= b.pad_rows
                assert max(b.planned_lengths) <= b.pad_length
                assert b.planned_lengths == planner.prepared.key[list(b)].tolist()
        seen = Counter(i for rank_batches in batches for b in rank_batches for i in b)
        assert set(seen) <= planned
        if config.tail == "spread" and plan.num_duplicated == 0:
            assert set(seen) == planned and max(seen.values()) == 1
        elif config.tail == "drop":
            assert max(seen.values()) == 1
            assert len(planned) - len(seen) == plan.num_dropped
        else:
            assert set(seen) == planned
            assert sum(seen.values()) - len(planned) == plan.num_duplicated
        # same seed and epoch: the same plan, shapes included, from a fresh planner
        again = EpochPlanner(lengths, config).plan(e, world, acc)
        assert np.array_equal(again.order, plan.order)
        assert np.array_equal(again.assign, plan.assign)
        assert np.array_equal(again.micro_batch_shape, plan.micro_batch_shape)
        assert np.array_equal(planner.shapes, first_shapes)  # chosen once for all epochs


@SETTINGS
@given(scenarios(), st.floats(0, 1), st.integers(1, 4), st.integers(1, 3))
def test_resume_with_another_topology_keeps_the_shapes(
    case: dict, where: float, new_world: int, new_acc: int
) -> None:
    lengths = case["lengths"]
    config = PlanConfig(**{**case["config"].__dict__, "tail": "spread"})
    world, acc, epoch = case["world"], case["acc"], case["epoch"]
    planner = planner_or_skip(lengths, config)
    assume(planner.num_planned >= max(world * acc, new_world * new_acc))
    shapes = planner.shapes.copy()
    plan = planner.plan(epoch, world, acc)
    assume(plan.num_duplicated == 0)
    consumed = int(where * plan.num_micro_batches_per_rank)
    done = plan.consumed_ids(consumed)
    rest = planner.num_planned - done.size
    assume(rest >= new_world * new_acc)
    resumed = planner.plan_resumed(epoch, new_world, new_acc, [(world, acc, consumed)])
    assert np.array_equal(planner.shapes, shapes)
    # the shapes of a fresh planner: chosen from all examples, not from the rest
    assert np.array_equal(EpochPlanner(lengths, config).shapes, shapes)
    if resumed.assign.size:
        _check_plan(planner, resumed)
    assume(resumed.num_duplicated == 0)
    got = Counter(resumed.example_ids().tolist())
    assert max(got.values(), default=1) == 1
    assert set(got).isdisjoint(done.tolist())
    assert set(got) | set(done.tolist()) == set(_planned_ids(planner).tolist())


def test_sampler_resume_on_more_ranks_keeps_static_shapes() -> None:
    lengths = np.random.default_rng(5).integers(1, 90, size=(400, 2))
    kw: dict[str, Any] = {"max_tokens": 600, "max_shapes": 3, "pad_to_multiple_of": 8}
    first = TokenBudgetBatchSampler(lengths, rank=0, world_size=2, **kw)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    shapes = {tuple(s) for s in first.planner.shapes.tolist()}
    seen: list[int] = []
    for r in range(3):
        s = TokenBudgetBatchSampler(lengths, rank=r, world_size=3, **kw)
        s.load_state_dict(state)
        for b in s:
            assert (b.pad_rows, b.pad_length) in shapes
            assert len(b) <= b.pad_rows and max(b.planned_lengths) <= b.pad_length
            seen.extend(b)
    assert len(seen) == len(set(seen))


@SETTINGS
@given(
    seed=st.integers(0, 2**16),
    k=st.integers(1, 5),
    pad=st.sampled_from([1, 4]),
    world=st.integers(1, 3),
    acc=st.integers(1, 2),
    mixing=st.sampled_from(["per_step", "per_batch"]),
)
def test_mixture_shares_one_set_of_lengths(
    seed: int, k: int, pad: int, world: int, acc: int, mixing: str
) -> None:
    rng = np.random.default_rng(seed)
    a = rng.integers(1, 40, size=int(rng.integers(20, 200)))
    b = rng.integers(20, 130, size=int(rng.integers(20, 200)))
    config = PlanConfig(max_tokens=600, max_shapes=k, pad_to_multiple_of=pad)
    mixture = MixturePlanner([a, b], config, mixing=mixing)
    lengths = [p.shape_lengths for p in mixture.planners]
    assert np.array_equal(lengths[0], lengths[1])
    assert lengths[0].size <= k
    assert int(lengths[0][-1]) == int(_round_up(max(int(a.max()), int(b.max())), pad))
    plan = mixture.plan(0, world, acc)
    assert plan.micro_batch_shape is not None
    key = np.concatenate([a, b])
    run = plan.assign.reshape(-1)
    assert np.unique(plan.micro_batch_shape[run, 1]).size <= k
    assert np.unique(plan.micro_batch_shape[run], axis=0).shape[0] <= k
    for t in run.tolist():
        ids = plan.micro_batch_ids(t)
        rows, length = plan.micro_batch_shape[t].tolist()
        assert length in lengths[0].tolist()
        assert 1 <= len(ids) <= rows
        assert int(_round_up(int(key[ids].max()), pad)) <= length
        assert rows * length <= config.max_tokens


# -- 3. refusals and the fingerprint --------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "setting"),
    [
        ({"layout": "packed"}, "layout"),
        ({"cost": "sum"}, "cost"),
        ({"bucket_width": 2}, "bucket_width"),
        ({"batch_size_multiple": 8}, "batch_size_multiple"),
    ],
)
def test_settings_a_shape_budget_cannot_keep_are_refused(
    kwargs: dict[str, Any], setting: str
) -> None:
    with pytest.raises(ValueError, match=setting) as err:
        PlanConfig(max_tokens=100, max_shapes=4, **kwargs)
    assert "max_shapes" in str(err.value)
    with pytest.raises(ValueError, match=setting):
        TokenBudgetBatchSampler([3, 4, 5], 100, rank=0, world_size=1, max_shapes=4, **kwargs)
    PlanConfig(max_tokens=100, **kwargs)  # fine without a shape budget


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "3"])
def test_bad_max_shapes_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_shapes"):
        PlanConfig(max_tokens=100, max_shapes=bad)
    with pytest.raises(ValueError, match="max_shapes"):
        TokenBudgetBatchSampler([3, 4, 5], 100, rank=0, world_size=1, max_shapes=bad)


def test_numpy_integer_max_shapes_is_accepted() -> None:
    config = PlanConfig(max_tokens=100, max_shapes=np.int64(3))
    assert config.max_shapes == 3 and type(config.max_shapes) is int


# Fingerprints computed at the commit before the shape budget (da0e675): checkpoints saved
# then must still resume, so a config without max_shapes keeps its fingerprint.
_OLD_FINGERPRINTS = [
    ({"max_tokens": 4096}, "94cd02f82963e2bb"),
    (
        {
            "max_tokens": 1000,
            "cost": "quadratic",
            "pad_to_multiple_of": 8,
            "seed": 3,
            "tail": "drop",
        },
        "bd444bf0d45a4b61",
    ),
    ({"max_tokens": 512, "layout": "packed", "flop_attention": 0.5}, "b70623d424ce642f"),
]


@pytest.mark.parametrize(("kwargs", "fingerprint"), _OLD_FINGERPRINTS)
def test_fingerprint_without_a_shape_budget_is_unchanged(
    kwargs: dict[str, Any], fingerprint: str
) -> None:
    assert PlanConfig(**kwargs).fingerprint() == fingerprint
    assert PlanConfig(**kwargs, max_shapes=None).fingerprint() == fingerprint


def test_fingerprint_changes_with_a_shape_budget() -> None:
    base = PlanConfig(max_tokens=4096).fingerprint()
    eight = PlanConfig(max_tokens=4096, max_shapes=8).fingerprint()
    four = PlanConfig(max_tokens=4096, max_shapes=4).fingerprint()
    assert len({base, eight, four}) == 3
    assert EpochPlanner(np.arange(1, 9), PlanConfig(max_tokens=64, max_shapes=8)).fingerprint != (
        EpochPlanner(np.arange(1, 9), PlanConfig(max_tokens=64)).fingerprint
    )


# -- 4. collate and sampler end to end ------------------------------------------------------

VOCAB = 23


def _rows(rng: np.random.Generator, n: int, pairs: bool) -> list[dict[str, Any]]:
    def seq(high: int) -> list[int]:
        return rng.integers(1, VOCAB, size=int(rng.integers(1, high))).tolist()

    if pairs:
        return [{"source": seq(60), "target": seq(40), "id": i} for i in range(n)]
    return [{"tokens": seq(70), "id": i} for i in range(n)]


def _lengths(rows: list[dict[str, Any]], pairs: bool) -> np.ndarray:
    if pairs:
        return np.array([[len(r["source"]), len(r["target"])] for r in rows])
    return np.array([len(r["tokens"]) for r in rows])


class _TinyModel(torch.nn.Module):
    """Embedding + linear, with a masked mean of the source added to every target token."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(VOCAB, 6).double()
        self.out = torch.nn.Linear(6, VOCAB).double()

    def loss(self, batch: dict[str, Any], pairs: bool) -> torch.Tensor:
        field = "target" if pairs else "tokens"
        tokens, mask = batch[field], batch[f"{field}_mask"]
        h = self.emb(tokens)
        if pairs:
            smask = batch["source_mask"].unsqueeze(-1).double()
            pooled = (self.emb(batch["source"]) * smask).sum(1) / smask.sum(1).clamp(min=1)
            h = h + pooled.unsqueeze(1)
        logits = self.out(torch.tanh(h))
        labels = (tokens * 7 + 3) % VOCAB
        per_token = torch.nn.functional.cross_entropy(
            logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none"
        ).reshape(tokens.shape)
        return (per_token * mask).sum() / mask.sum()

    def loss_and_grads(self, batch: dict[str, Any], pairs: bool) -> list[torch.Tensor]:
        self.zero_grad()
        loss = self.loss(batch, pairs)
        loss.backward()
        return [loss.detach()] + [p.grad.detach().clone() for p in self.parameters()]


class _RecordingCollate(PaddingCollate):
    """A PaddingCollate (so the loader reads Hugging Face rows as columns) that records."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.types: set[type] = set()

    def __call__(self, items: Any) -> dict[str, Any]:
        self.types.add(type(items))
        return super().__call__(items)


def _free_collate(dataset: Any, mb: Any, collate: PaddingCollate, hf: bool) -> dict[str, Any]:
    """The same examples collated with free shapes (the plan's counts kept)."""
    free = copy.copy(mb)
    free.pad_rows = free.pad_length = None
    assert list(free) == list(mb) and mb.pad_rows is not None
    return collate(attach_plan(fetch_rows(dataset, free, hf), free))


@pytest.mark.parametrize(
    ("source", "pairs", "pad", "oversize"),
    [
        ("list", True, 1, "error"),
        ("list", False, 8, "error"),
        ("hf", True, 8, "error"),
        ("hf", False, 1, "truncate"),
    ],
)
def test_every_batch_has_its_static_shape_and_the_same_loss(
    source: str, pairs: bool, pad: int, oversize: str
) -> None:
    rng = np.random.default_rng(11 + pad + pairs)
    rows = _rows(rng, 70, pairs)
    lengths = _lengths(rows, pairs)
    hf = source == "hf"
    dataset: Any = datasets.Dataset.from_list(rows) if hf else rows
    fields = ("source", "target") if pairs else ("tokens",)
    k = 3
    max_tokens = 200 if oversize == "error" else 50  # truncate: cuts the long ones
    kw: dict[str, Any] = {"pad_to_multiple_of": pad, "oversize": oversize, "seed": 4}
    collate = PaddingCollate(pad_to_multiple_of=pad, pad_id=0)
    recording = _RecordingCollate(pad_to_multiple_of=pad, pad_id=0)

    model = _TinyModel()
    shaped_totals: Counter[str] = Counter()
    shapes_seen: set[tuple[int, int]] = set()
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(
            lengths, max_tokens, rank=rank, world_size=2, max_shapes=k, **kw
        )
        truncate_to = sampler.planner.dataset_truncate_to(0) or 10**9
        assert (sampler.plan.num_truncated > 0) == (oversize == "truncate")
        plan_shapes = {tuple(s) for s in sampler.planner.shapes.tolist()}
        loader = token_budget_dataloader(dataset, sampler, collate_fn=recording)
        mbs = list(sampler)
        batches = list(loader)
        assert len(batches) == len(mbs)
        for mb, batch in zip(mbs, batches, strict=True):
            shape = (mb.pad_rows, mb.pad_length)
            assert shape in plan_shapes
            shapes_seen.add(shape)
            real = [min(len(rows[i][f]), truncate_to) for i in mb for f in fields]
            for f in fields:
                assert tuple(batch[f].shape) == shape, (f, shape)
                assert tuple(batch[f"{f}_mask"].shape) == shape
                mask = batch[f"{f}_mask"]
                want = [min(len(rows[i][f]), truncate_to) for i in mb]
                assert mask.sum(1).tolist() == want + [0] * (shape[0] - len(mb))
                assert not mask[len(mb) :].any()
                assert (batch[f][~mask] == 0).all()  # padding everywhere off the mask
                for j, i in enumerate(mb):
                    assert batch[f][j, : want[j]].tolist() == rows[i][f][: want[j]]
            assert int(batch["nexamples"]) == len(mb)
            assert int(batch["ntokens"]) == mb.ntokens
            assert int(batch["step_ntokens"]) == mb.step_ntokens
            assert int(batch["input_tokens"]) == sum(real)
            assert int(batch["padded_tokens"]) == len(fields) * shape[0] * shape[1]
            assert batch["id"].tolist() == list(mb)
            # the same examples with free shapes: the same counts and the same loss/grads
            free = _free_collate(dataset, mb, collate, hf)
            for name in ("ntokens", "nexamples", "step_ntokens", "input_tokens"):
                assert int(free[name]) == int(batch[name]), name
            for f in fields:
                assert free[f].shape[0] == len(mb)
                assert free[f].shape[1] <= shape[1]
                assert int(free[f"{f}_mask"].sum()) == int(batch[f"{f}_mask"].sum())
            got = model.loss_and_grads(batch, pairs)
            want_grads = model.loss_and_grads(free, pairs)
            for g, w in zip(got, want_grads, strict=True):
                torch.testing.assert_close(g, w, rtol=1e-12, atol=1e-13)
            for name in ("ntokens", "nexamples", "input_tokens"):
                shaped_totals[name] += int(batch[name])
    assert len(shapes_seen) <= k
    if hf:  # the Hugging Face dataset took the columnar path
        assert recording.types == {ColumnarItems}
    else:
        assert ColumnarItems not in recording.types
    # the unshaped run of the same data: the same totals over the epoch
    free_totals: Counter[str] = Counter()
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(lengths, max_tokens, rank=rank, world_size=2, **kw)
        for batch in token_budget_dataloader(dataset, sampler, collate_fn=collate):
            for name in ("ntokens", "nexamples", "input_tokens"):
                free_totals[name] += int(batch[name])
    assert shaped_totals == free_totals
    if oversize == "error":
        assert shaped_totals["nexamples"] == len(rows)


def test_step_counts_match_the_unshaped_run_on_equal_lengths() -> None:
    """Equal lengths: the shaped plan is the unshaped one, so every count matches batch by batch."""
    rows = [{"tokens": [1 + (i % 7)] * 10} for i in range(64)]
    lengths = np.full(64, 10)
    got, want = [], []
    for max_shapes, out in ((2, got), (None, want)):
        sampler = TokenBudgetBatchSampler(
            lengths, 60, rank=0, world_size=1, max_shapes=max_shapes, accumulate_grad_batches=2
        )
        for batch in token_budget_dataloader(rows, sampler):
            out.append([int(batch[k]) for k in ("ntokens", "nexamples", "step_ntokens")])
    assert got == want


def test_datamodule_takes_max_shapes() -> None:
    from lightning_varbatch import TokenBudgetDataModule

    rows = _rows(np.random.default_rng(3), 50, pairs=False)
    dm = TokenBudgetDataModule(rows, _lengths(rows, False), 120, max_shapes=2)
    shapes = set()
    ids = []
    for batch in dm.train_dataloader():
        shapes.add(tuple(batch["tokens"].shape))
        assert int(batch["tokens_mask"].any(1).sum()) == int(batch["nexamples"])
        ids.extend(batch["id"].tolist())  # other entries: the real items only
    assert 1 <= len(shapes) <= 2
    assert sorted(ids) == list(range(50))


# -- 5. diagnostics -------------------------------------------------------------------------


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_diagnostics_count_the_static_shapes(case: dict) -> None:
    planner = planner_or_skip(case["lengths"], case["config"])
    plan = _plan_or_none(planner, case["epoch"], case["world"], case["acc"])
    assume(plan is not None)
    diag = diagnose(planner, plan)
    key = planner.prepared.key
    run = plan.assign.reshape(-1)
    count: Counter[tuple[int, int]] = Counter()
    real: Counter[tuple[int, int]] = Counter()
    for t in run.tolist():
        shape = tuple(int(x) for x in plan.micro_batch_shape[t])
        count[shape] += 1
        real[shape] += int(key[plan.micro_batch_ids(t)].sum())
    want = tuple(
        (
            rows,
            length,
            count[(rows, length)],
            real[(rows, length)],
            rows * length * count[(rows, length)],
        )
        for rows, length in sorted(count, key=lambda s: s[1])
    )
    assert diag.shapes == want
    assert sum(row[2] for row in diag.shapes) == diag.num_micro_batches == run.size
    assert diag.num_shapes == len(count) <= planner.config.max_shapes
    slots = sum(row[4] for row in want)
    assert diag.padded_tokens == slots
    assert diag.real_tokens == sum(real.values())
    assert diag.padding_efficiency == pytest.approx(sum(real.values()) / slots, rel=1e-12)
    text = diag.format()
    assert f"shapes              {len(count)} distinct (rows, length)" in text
    assert "(free shapes)" not in text
    for rows, length, n, r, s in want:
        line = next(x for x in text.splitlines() if f"{rows:,} x {length:,} " in x)
        assert f"{n:,} micro-batches" in line
        assert f"{100 * r / s:5.1f} % real tokens" in line


def test_free_shapes_have_no_shape_table() -> None:
    planner = EpochPlanner(np.array([2, 9, 9, 4, 2]), PlanConfig(max_tokens=18))
    diag = diagnose(planner, planner.plan(0, 2))
    assert diag.shapes == () and planner.shapes is None and planner.shape_lengths is None
    assert "(free shapes)" in diag.format()


# -- 6. the worst-batch check runs every shape on every rank --------------------------------


@pytest.mark.parametrize("kinds", [("padded_tokens", "examples", "attention"), ("examples",)])
def test_worst_tiles_has_one_check_per_shape_on_every_rank(kinds: tuple[str, ...]) -> None:
    lengths = np.concatenate([np.random.default_rng(8).integers(1, 40, size=300), np.full(3, 200)])
    reports = []
    for rank in range(2):
        sampler = TokenBudgetBatchSampler(
            lengths, 800, rank=rank, world_size=2, max_shapes=4, pad_to_multiple_of=8
        )
        shapes = sampler.planner.shapes.tolist()
        assert len(shapes) == 4
        worst = worst_micro_batches(sampler, kinds)
        names = check_names(sampler, kinds)
        assert len(worst) == len(kinds) + len(shapes) == len(names)
        assert [w.kind for w in worst] == names
        assert names == [*kinds, *(f"shape {r}x{n}" for r, n in shapes)]
        mine = sampler.plan.rank_micro_batches(rank).tolist()
        for w in worst:
            assert w.rank == rank and mine[w.position] == w.micro_batch
            rows, length = sampler.plan.micro_batch_shape[w.micro_batch].tolist()
            assert w.longest == length
            assert w.padded_tokens == rows * length
            assert w.attention == rows * length * length
            mb = sampler.micro_batch(w.position)
            assert list(mb) == sampler.plan.micro_batch_ids(w.micro_batch).tolist()
            assert (mb.pad_rows, mb.pad_length) == (rows, length)
        for w, (rows, length) in zip(worst[len(kinds) :], shapes, strict=True):
            of_shape = [
                p
                for p, t in enumerate(mine)
                if sampler.plan.micro_batch_shape[t].tolist() == [rows, length]
            ]
            if of_shape:  # this rank's fullest micro-batch of that shape
                assert (w.examples, w.longest) == (
                    max(int(sampler.plan.micro_batch_size[mine[p]]) for p in of_shape),
                    length,
                )
        reports.append(names)
    assert reports[0] == reports[1]  # every rank runs as many checks, in the same order


def test_mixture_with_per_dataset_budgets_keeps_at_most_k_shapes() -> None:
    """``max_shapes`` bounds the static ``(rows, length)`` shapes, not only the lengths.

    Datasets with their own ``max_tokens`` get their own rows per length, so a mixture would
    run up to ``K`` shapes per dataset (``torch.compile`` compiles each). Either the shapes
    stay within ``K`` or the combination is refused, naming ``max_shapes``.
    """
    from lightning_varbatch import DataSource

    rng = np.random.default_rng(0)
    a, b = rng.integers(1, 60, 300), rng.integers(1, 60, 300)
    config = PlanConfig(max_tokens=600, max_shapes=3)
    try:
        mixture = MixturePlanner([DataSource(a), DataSource(b, max_tokens=300)], config)
    except ValueError as err:  # refusing the combination is a fine answer
        assert "max_shapes" in str(err)
        return
    plan = mixture.plan(0, 2, 1)
    run = plan.assign.reshape(-1)
    shapes = np.unique(plan.micro_batch_shape[run], axis=0)
    assert len(shapes) <= 3, shapes.tolist()
    assert diagnose(mixture, plan).num_shapes <= 3


def test_worst_tiles_of_a_mixture_has_one_check_per_shape() -> None:
    """A mixture under a shape budget runs static shapes too: each gets its check."""
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, 60, 300), rng.integers(20, 90, 200)
    config = PlanConfig(max_tokens=600, max_shapes=3)
    kinds = ("padded_tokens", "examples")
    names = []
    for rank in range(2):
        mixture = MixturePlanner([a, b], config)
        sampler = TokenBudgetBatchSampler.from_planner(mixture, rank=rank, world_size=2)
        assert sampler.plan.micro_batch_shape is not None  # the micro-batches are shaped
        shapes = mixture.planners[0].shapes.tolist()
        assert shapes == mixture.planners[1].shapes.tolist()
        worst = worst_micro_batches(sampler, kinds)
        want = [*kinds, *(f"shape {r}x{n}" for r, n in shapes)]
        assert check_names(sampler, kinds) == want
        assert [w.kind for w in worst] == want
        names.append(want)
    assert names[0] == names[1]
