"""Direct behaviour tests of planner modules that no other test imports by name.

Each test checks what a caller relies on against an independent reference (a Python loop,
a closed form, a brute force over all assignments), over the family of settings where one
exists (tail policies, layouts, pairs and single lengths).
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import asdict

import numpy as np
import pytest

from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.dealing import deal_run, deal_steps
from lightning_varbatch.planner.epoch_plan import DEPRECATED_NAMES, EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.epoch_resume import EpochResume
from lightning_varbatch.planner.interleave import Part, compose_parts, interleave
from lightning_varbatch.planner.lane_budgets import lane_budgets, single_example_cost, uniform
from lightning_varbatch.planner.length_checks import as_int_lengths, shown_length
from lightning_varbatch.planner.lengths import prepare_lengths
from lightning_varbatch.planner.micro_batch_figures import (
    check_plan_of,
    micro_batch_figures,
    micro_batch_load,
)
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import DataSource
from lightning_varbatch.planner.mixture_topology import MixtureTopology
from lightning_varbatch.planner.mixture_warmup import dataset_warmup_caps, mixture_warmup_caps
from lightning_varbatch.planner.packed_rows import cuts_each_epoch, exact_groups, packed_cut
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.resume_inputs import check_exclude, check_history
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.settings_identity import (
    LATER_SETTINGS,
    RANK_SETTINGS,
    fingerprint_of,
    plain_settings,
)
from lightning_varbatch.planner.shape_budget import ShapeBudget
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups

TAILS = ("spread", "drop", "pad")
LAYOUTS = ("padded", "packed")


def _lengths(n: int = 60, seed: int = 0, pairs: bool = False) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shape = (n, 2) if pairs else (n,)
    return rng.integers(1, 30, size=shape)


# -- dealing ------------------------------------------------------------------------------------


def _lpt_reference(step: list[int], cost: np.ndarray, world: int, acc: int) -> list[list[int]]:
    """LPT in plain Python: largest first (stable), to the least-loaded rank with a free slot."""
    ranked = sorted(step, key=lambda b: -cost[b])  # sorted() is stable
    slots: list[list[int]] = [[] for _ in range(world)]
    load = [0.0] * world
    for b in ranked:
        free = [r for r in range(world) if len(slots[r]) < acc]
        r = min(free, key=lambda r: (load[r], r))
        slots[r].append(b)
        load[r] += float(cost[b])
    return slots


def _best_max_load(step: list[int], cost: np.ndarray, world: int, acc: int) -> float:
    """The optimal largest rank load, over every split of the step into ranks of ``acc``."""
    best = np.inf
    for perm in itertools.permutations(step):
        loads = [sum(cost[b] for b in perm[r * acc : (r + 1) * acc]) for r in range(world)]
        best = min(best, max(loads))
    return float(best)


@pytest.mark.parametrize(("world", "acc"), [(1, 1), (1, 3), (2, 1), (2, 2), (3, 2), (2, 3)])
def test_dealing_gives_every_micro_batch_once_equal_counts_lpt_balance(
    world: int, acc: int
) -> None:
    rng = np.random.default_rng(world * 10 + acc)
    num_steps, per_step = 5, world * acc
    ids = rng.permutation(num_steps * per_step)
    steps = ids.reshape(num_steps, per_step)
    cost = rng.integers(1, 50, size=ids.size).astype(np.float64)
    cost[ids[:3]] = cost[ids[3]]  # ties: they go to the lowest rank, in id-stable order
    assign = deal_steps(steps, cost, world, acc)
    assert assign.shape == (num_steps, world, acc)
    for s in range(num_steps):
        assert sorted(assign[s].reshape(-1).tolist()) == sorted(steps[s].tolist())
        reference = _lpt_reference(steps[s].tolist(), cost, world, acc)
        if acc == 1:  # one slot per rank: decreasing cost over ranks
            assert assign[s, :, 0].tolist() == [r[0] for r in reference]
        else:
            assert assign[s].tolist() == reference
        loads = cost[assign[s]].sum(axis=1)
        if per_step <= 6:
            best = _best_max_load(steps[s].tolist(), cost, world, acc)
            assert best <= loads.max() <= best + cost[steps[s]].max()


def test_dealing_no_steps_and_docstring_example() -> None:
    assert deal_steps(np.zeros((0, 4), dtype=np.int64), np.zeros(0), 2, 2).shape == (0, 2, 2)
    out = deal_steps(np.array([[0, 1, 2, 3]]), np.array([9.0, 8.0, 2.0, 1.0]), world=2, acc=2)
    assert out[0].tolist() == [[0, 3], [1, 2]]


# -- epoch_plan ---------------------------------------------------------------------------------


def _plan(tail: str, layout: str, world: int, acc: int, pairs: bool = False) -> tuple:
    lengths = _lengths(53, seed=world + 7 * acc, pairs=pairs and layout == "padded")
    config = PlanConfig(max_tokens=64, tail=tail, layout=layout, seed=3, loss_offset=0)
    planner = EpochPlanner(lengths, config)
    return planner, planner.plan(epoch=1, world_size=world, accumulate_grad_batches=acc)


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("world", "acc"), [(1, 1), (2, 2), (3, 1)])
def test_epoch_plan_accessors_agree_with_a_reconstruction(
    tail: str, layout: str, world: int, acc: int
) -> None:
    planner, plan = _plan(tail, layout, world, acc, pairs=True)
    order, start, size = plan.order.tolist(), plan.micro_batch_start, plan.micro_batch_size
    ids = [order[int(start[b]) : int(start[b]) + int(size[b])] for b in range(size.size)]
    for b in range(size.size):
        assert plan.micro_batch_ids(b).tolist() == ids[b]
    steps, _, micros = plan.assign.shape
    assert plan.num_steps == steps and plan.num_micro_batches_per_rank == steps * micros
    loss = planner.prepared.loss
    assert plan.micro_batch_tokens.tolist() == [int(loss[i].sum()) for i in ids]
    for s in range(steps):
        step_ids = [i for r in range(world) for m in range(acc) for i in ids[plan.assign[s, r, m]]]
        assert plan.step_tokens[s] == int(loss[step_ids].sum())
        assert plan.step_examples[s] == len(step_ids)
        for r in range(world):
            for m in range(acc):
                assert plan.micro_batch(s, r, m).tolist() == ids[plan.assign[s, r, m]]
    for r in range(world):
        run = [int(plan.assign[s, r, m]) for s in range(steps) for m in range(acc)]
        assert plan.rank_micro_batches(r).tolist() == run
        assert plan.example_ids(r).tolist() == [i for b in run for i in ids[b]]
    everything = [i for b in plan.assign.reshape(-1).tolist() for i in ids[b]]
    assert plan.example_ids().tolist() == everything
    kept = planner.num_planned
    if tail == "spread":  # every example exactly once
        assert sorted(everything) == list(range(kept))
    elif tail == "drop":
        assert len(set(everything)) == len(everything) == kept - plan.num_dropped
    else:
        assert set(everything) == set(range(kept))
        assert len(everything) == kept + plan.num_duplicated
    # micro-batches are within budget under the cost model
    assert (plan.micro_batch_cost <= 64).all()
    for k in range(plan.num_micro_batches_per_rank + 1):
        done, rest = plan.consumed_micro_batches(k)
        cells = [(s, r, m) for s in range(steps) for r in range(world) for m in range(acc)]
        want_done = [int(plan.assign[c]) for c in cells if c[0] * acc + c[2] < k]
        want_rest = [int(plan.assign[c]) for c in cells if c[0] * acc + c[2] >= k]
        assert sorted(done.tolist()) == sorted(want_done)
        assert sorted(rest.tolist()) == sorted(want_rest)
        assert len(done) == world * k
        assert plan.consumed_ids(k).tolist() == [i for b in done.tolist() for i in ids[b]]


@pytest.mark.parametrize(
    ("value", "kind"),
    [
        (-1, SettingValueError),
        (3, SettingValueError),
        (True, SettingTypeError),
        (1.0, SettingTypeError),
    ],
)
def test_epoch_plan_refuses_a_bad_rank_or_consumed_count(value: object, kind: type) -> None:
    _, plan = _plan("spread", "padded", 3, 1)
    with pytest.raises(kind) as info:
        plan.rank_micro_batches(value)  # type: ignore[arg-type]
    assert info.value.setting == "rank"
    total = plan.num_micro_batches_per_rank
    bad = total + 1 if value == 3 else value
    with pytest.raises(kind) as info:
        plan.consumed_micro_batches(bad)  # type: ignore[arg-type]
    assert info.value.setting == "consumed micro-batches"


def test_epoch_plan_deprecated_tile_names_warn_and_read_the_new_ones() -> None:
    _, plan = _plan("spread", "packed", 2, 2)
    for old, new in DEPRECATED_NAMES.items():
        with pytest.warns(DeprecationWarning, match=f"EpochPlan.{old} is deprecated.*{new}"):
            value = getattr(plan, old)
        current = getattr(plan, new)
        if callable(current):
            argument = {
                "tile_ids": 0,
                "rank_tiles": 1,
                "ids_of_tiles": np.array([1, 0]),
                "consumed_tiles": 2,
            }[old]
            got, want = value(argument), current(argument)
            for a, b in zip(
                got if isinstance(got, tuple) else [got],
                want if isinstance(want, tuple) else [want],
                strict=True,
            ):
                np.testing.assert_array_equal(a, b)
        elif current is None:
            assert value is None
        else:
            np.testing.assert_array_equal(value, current)
    fields = {
        "epoch": plan.epoch,
        "world_size": plan.world_size,
        "accumulate_grad_batches": plan.accumulate_grad_batches,
        "order": plan.order,
        "assign": plan.assign,
    }
    with pytest.warns(DeprecationWarning, match="tile_start"):
        old = EpochPlan(
            **fields,
            tile_start=plan.micro_batch_start,
            micro_batch_size=plan.micro_batch_size,
            micro_batch_cost=plan.micro_batch_cost,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        new = EpochPlan(
            **fields,
            micro_batch_start=plan.micro_batch_start,
            micro_batch_size=plan.micro_batch_size,
            micro_batch_cost=plan.micro_batch_cost,
        )
    assert old.example_ids().tolist() == new.example_ids().tolist() == plan.example_ids().tolist()


# -- interleave ---------------------------------------------------------------------------------


def test_interleave_matches_the_stratified_formula_and_spreads_every_label() -> None:
    for seed in range(6):
        rng = np.random.default_rng(seed)
        labels = rng.integers(0, 3, size=40)
        labels[:3] = [0, 1, 2]
        order = interleave(labels, np.random.default_rng(seed + 100))
        assert sorted(order.tolist()) == list(range(labels.size))
        # reference: the j-th of label l's c units sits at (j + u) / c
        u = np.random.default_rng(seed + 100).random(labels.size)
        counts = np.bincount(labels)
        seen = [0] * counts.size
        key = []
        for i, label in enumerate(labels.tolist()):
            key.append((seen[label] + u[i]) / counts[label])
            seen[label] += 1
        assert order.tolist() == sorted(range(labels.size), key=lambda i: (key[i], i))
        out = labels[order]
        for label in range(counts.size):  # each label keeps its own order
            kept = order[out == label]
            assert (np.diff(kept) > 0).all()
        # every prefix holds every label's share to within one unit of each
        for t in range(1, labels.size + 1):
            share = np.bincount(out[:t], minlength=counts.size) / counts
            gap = np.abs(share[:, None] - share[None, :])
            assert (gap <= 1 / counts[:, None] + 1 / counts[None, :] + 1e-12).all()
    assert interleave(np.zeros(0, dtype=np.int64), np.random.default_rng(0)).size == 0


@pytest.mark.parametrize("mixing", ["per_step", "per_batch"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compose_parts_keeps_every_unit_and_renumbers_ids(mixing: str, layout: str) -> None:
    world, acc = 2, 2
    config = PlanConfig(max_tokens=48, layout=layout, seed=5)
    datasets = [_lengths(40, seed=1), _lengths(25, seed=2)]
    plans = [EpochPlanner(d, config).plan(0, world, acc) for d in datasets]
    offsets = [0, datasets[0].size]
    parts = [
        Part(k, p, offsets[k], p.assign if mixing == "per_step" else p.assign.reshape(-1))
        for k, p in enumerate(plans)
    ]
    plan = compose_parts(
        parts[::-1],
        epoch=0,
        world=world,
        acc=acc,
        mixing=mixing,  # type: ignore[arg-type]
        rng=np.random.default_rng(0),
        num_examples=sum(d.size for d in datasets),
        num_skipped=0,
        num_truncated=0,
    )
    assert plan.num_steps == sum(p.num_steps for p in plans)
    # the same examples as the parts, as global ids, each micro-batch whole and labelled
    want = sorted(i + offsets[k] for k, p in enumerate(plans) for i in p.example_ids().tolist())
    assert sorted(plan.example_ids().tolist()) == want
    parts_by_micro = {}
    for k, p in enumerate(plans):
        for b in range(p.micro_batch_size.size):
            ids = tuple((p.micro_batch_ids(b) + offsets[k]).tolist())
            parts_by_micro[ids] = (k, int(p.micro_batch_tokens[b]))
    for b in plan.assign.reshape(-1).tolist():
        k, tokens = parts_by_micro[tuple(plan.micro_batch_ids(b).tolist())]
        assert plan.micro_batch_dataset[b] == k
        assert plan.micro_batch_tokens[b] == tokens
    assert (plan.micro_batch_work is not None) == (layout == "packed")
    for k, p in enumerate(plans):  # each dataset's units keep their order
        mine = plan.step_dataset == k
        if mixing == "per_step":
            steps = [s for s in range(plan.num_steps) if mine[s].all()]
            assert len(steps) == p.num_steps and all(
                mine[s].all() or not mine[s].any() for s in range(plan.num_steps)
            )
            got = [plan.ids_of_micro_batches(plan.assign[s].reshape(-1)).tolist() for s in steps]
            assert got == [
                (p.ids_of_micro_batches(p.assign[s].reshape(-1)) + offsets[k]).tolist()
                for s in range(p.num_steps)
            ]


# -- length_checks ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("lengths", "kind", "message"),
    [
        (None, SettingTypeError, "got NoneType"),
        ("input_ids", SettingTypeError, "column_lengths"),
        (b"ab", SettingTypeError, "got bytes"),
        ({"a": 1}, SettingTypeError, "got dict"),
        ({1, 2}, SettingTypeError, "got set"),
        ([[3, 4], [5]], SettingValueError, r"train_lengths\[1\] is \[5\]"),
        ([3, [4, 5]], SettingValueError, "ragged or mixed"),
        (np.array([True, False]), SettingTypeError, "dtype bool"),
        (["3", "4"], SettingTypeError, "strings"),
        (np.array([1, None], dtype=object), SettingTypeError, r"train_lengths\[1\]"),
        (5, SettingValueError, "a single number is not a dataset"),
        (np.ones((3, 3), dtype=int), SettingValueError, r"shape \(3, 3\)"),
        (np.ones((2, 2, 2), dtype=int), SettingValueError, "3-d"),
        ([], SettingValueError, "is empty"),
        ([3.0, np.nan], SettingValueError, r"train_lengths\[1\] is nan"),
        ([np.inf, 3.0], SettingValueError, r"train_lengths\[0\] is inf"),
        ([3, 2.5], SettingValueError, r"train_lengths\[1\] = 2.5 is not an integer"),
        ([3, 4, 0, 0], SettingValueError, r"train_lengths\[2\] = 0: every length must be >= 1"),
        ([[3, 4], [5, -1]], SettingValueError, r"train_lengths\[1\] = \[5, -1\]"),
        ([3, 2**31], SettingValueError, r"< 2\*\*31"),
    ],
)
def test_every_bad_lengths_array_raises_the_settings_error_naming_it(
    lengths: object, kind: type, message: str
) -> None:
    with pytest.raises(kind, match=message) as info:
        as_int_lengths(lengths, "train_lengths", setting="train_lengths_setting")  # type: ignore[arg-type]
    assert info.value.setting == "train_lengths_setting"
    assert "train_lengths" in str(info.value)
    assert isinstance(info.value, SettingError)
    assert isinstance(info.value, TypeError if kind is SettingTypeError else ValueError)


def test_good_lengths_pass_as_integers_and_loss_lengths_may_be_zero() -> None:
    for given in ([3, 4], np.array([3.0, 4.0]), np.array([3, 4], dtype=np.uint64), (3, 4)):
        out = as_int_lengths(given, "x")
        assert np.issubdtype(out.dtype, np.integer) and out.tolist() == [3, 4]
    assert as_int_lengths([[3, 4], [9, 2]], "x").tolist() == [[3, 4], [9, 2]]
    assert as_int_lengths([0, 2], "loss", minimum=0).tolist() == [0, 2]
    with pytest.raises(SettingValueError) as info:
        as_int_lengths([0, 2], "loss")
    assert info.value.setting == "loss"  # the setting defaults to the name
    assert [shown_length(np.array(v)) for v in (3.0, 2.5, [4, 0])] == ["3", "2.5", "[4, 0]"]


# -- micro_batch_figures ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings",
    [
        {"layout": "padded"},
        {"layout": "padded", "pad_to_multiple_of": 8, "max_tokens": 128},
        {"layout": "packed"},
        {"layout": "packed", "bucket_width": 8, "pad_to_multiple_of": 4},
        {"layout": "padded", "max_shapes": 3},
        {"layout": "padded", "bucket_width": 4, "tail": "pad"},
        {"layout": "padded", "pairs": True},
    ],
)
def test_micro_batch_figures_agree_with_a_loop(settings: dict) -> None:
    settings = dict(settings)
    pairs = settings.pop("pairs", False)
    settings.setdefault("max_tokens", 96)
    config = PlanConfig(seed=1, quadratic_coef=0.01, flop_attention=0.002, **settings)
    lengths = _lengths(70, seed=4, pairs=pairs)
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, 2, 2)
    figures = micro_batch_figures(planner, plan)
    p = config.pad_to_multiple_of
    packed = config.layout == "packed"
    for b in range(plan.micro_batch_size.size):
        ids = plan.micro_batch_ids(b).tolist()
        key = [int(np.max(lengths[i])) for i in ids]  # the planning length: max of a pair
        longest = -(-max(key) // p) * p
        rows = len(ids)
        if plan.micro_batch_shape is not None:
            rows, longest = (int(v) for v in plan.micro_batch_shape[b])
            assert rows >= len(ids) and longest >= max(key)
        real = sum(key)
        squares = float(sum(float(k) ** 2 for k in key))
        slots = -(-real // p) * p if packed else rows * longest
        attention = squares if packed else float(rows) * float(longest) ** 2
        assert figures.size[b] == len(ids)
        assert figures.real[b] == real
        assert figures.squares[b] == pytest.approx(squares, rel=1e-12)
        assert figures.longest[b] == longest
        assert figures.rows[b] == rows
        assert figures.slots[b] == slots
        assert figures.attention[b] == pytest.approx(attention, rel=1e-12)
        assert slots <= config.max_tokens or not packed or len(ids) == 1
        loads = {
            m: micro_batch_load(planner, figures, m)[b] for m in ("linear", "quadratic", "flops")
        }
        assert loads["linear"] == slots
        assert loads["quadratic"] == pytest.approx(slots + 0.01 * attention)
        assert loads["flops"] == pytest.approx(slots + 0.002 * attention)
    with pytest.raises(ValueError, match="model"):
        micro_batch_load(planner, figures, "cubic")  # type: ignore[arg-type]


def test_micro_batch_figures_refuse_a_plan_of_another_planner() -> None:
    small = EpochPlanner(_lengths(10), PlanConfig(max_tokens=64))
    big = EpochPlanner(_lengths(40), PlanConfig(max_tokens=64))
    plan = big.plan(0)
    with pytest.raises(ValueError, match="only 10 examples"):
        check_plan_of(small, plan)
    with pytest.raises(ValueError, match="only 10 examples"):
        micro_batch_figures(small, plan)
    empty = micro_batch_figures(
        small, small.plan_resumed(0, 1, 1, [(1, 1, small.plan(0).num_micro_batches_per_rank)])
    )
    assert empty.size.size == 0 and empty.attention.dtype == np.float64


# -- packed_rows --------------------------------------------------------------------------------


def _greedy_rows(lengths: list[int], room: int, cap: int, multiple: int) -> list[int]:
    """Row sizes of the greedy walk: as many whole examples as fit, capped and rounded."""
    sizes, a = [], 0
    while a < len(lengths):
        k, total = 0, 0
        while a + k < len(lengths) and total + lengths[a + k] <= room:
            total += lengths[a + k]
            k += 1
        k = min(k, cap)
        if k >= multiple:
            k -= k % multiple
        k = max(k, 1)
        sizes.append(k)
        a += k
    return sizes


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"pad_to_multiple_of": 8},
        {"max_examples": 3},
        {"batch_size_multiple": 2},
        {"max_examples": 5, "batch_size_multiple": 2, "pad_to_multiple_of": 4},
    ],
)
def test_packed_cut_matches_the_greedy_walk_and_keeps_the_budget(settings: dict) -> None:
    config = PlanConfig(max_tokens=60, layout="packed", bucket_width=8, **settings)
    assert cuts_each_epoch(config)
    rng = np.random.default_rng(len(settings))
    key = rng.integers(1, 40, size=80)
    order = rng.permutation(80)
    groups = exact_groups(order, key)
    assert groups.ids.tolist() == order.tolist()
    assert groups.longest.tolist() == key[order].tolist()
    rows = packed_cut(groups, config)
    p = config.pad_to_multiple_of
    room = (60 // p) * p
    cap = config.max_examples or 80
    walked = key[order].tolist()
    assert rows.sizes.tolist() == _greedy_rows(walked, room, cap, config.batch_size_multiple)
    assert rows.sizes.sum() == 80
    starts = np.concatenate(([0], np.cumsum(rows.sizes)[:-1]))
    assert rows.starts.tolist() == starts.tolist()
    for a, size, total in zip(
        starts.tolist(), rows.sizes.tolist(), rows.total.tolist(), strict=True
    ):
        real = sum(walked[a : a + size])
        assert total == real
        assert -(-real // p) * p <= 60
        # full: the next example would not fit, unless a count limit stopped the row
        if a + size < 80 and size < cap and config.batch_size_multiple == 1:
            assert real + walked[a + size] > room


def test_packed_cut_is_only_used_for_wide_packed_buckets_and_handles_no_examples() -> None:
    assert not cuts_each_epoch(PlanConfig(max_tokens=64, layout="packed", bucket_width=1))
    assert not cuts_each_epoch(PlanConfig(max_tokens=64, layout="padded", bucket_width=8))
    config = PlanConfig(max_tokens=10, layout="packed", bucket_width=8)
    empty = packed_cut(
        exact_groups(np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)), config
    )
    assert empty.sizes.size == 0


@pytest.mark.parametrize("tail", TAILS)
def test_packed_rows_planned_each_epoch_stay_within_budget(tail: str) -> None:
    config = PlanConfig(max_tokens=50, layout="packed", bucket_width=8, tail=tail)
    lengths = _lengths(90, seed=9)
    planner = EpochPlanner(lengths, config)
    for epoch in range(3):
        plan = planner.plan(epoch, 2, 1)
        for b in plan.assign.reshape(-1).tolist():
            assert lengths[plan.micro_batch_ids(b)].sum() <= 50


# -- protocol -----------------------------------------------------------------------------------


def test_both_planners_are_planners_and_an_incomplete_object_is_not() -> None:
    config = PlanConfig(max_tokens=32, seed=2)
    lengths = [_lengths(20, seed=1), _lengths(15, seed=2)]
    epoch_planner = EpochPlanner(np.concatenate(lengths), config)
    mixture = MixturePlanner(lengths, config)
    for planner in (epoch_planner, mixture):
        assert isinstance(planner, Planner)
        assert planner.num_examples == 35 == planner.offsets[-1]
        assert planner.num_planned + planner.num_skipped == planner.num_examples
        assert len(planner.names) == planner.offsets.size - 1
        # deterministic: another planner built from the same input plans the same
        twin = type(planner)(lengths if planner is mixture else np.concatenate(lengths), config)
        for world, acc in [(1, 1), (2, 2)]:
            a, b = planner.plan(3, world, acc), twin.plan(3, world, acc)
            assert a.example_ids().tolist() == b.example_ids().tolist()
            assert (
                planner.plan_resumed(3, world, acc).example_ids().tolist()
                == a.example_ids().tolist()
            )
        assert planner.fingerprint() == twin.fingerprint()

    class Partial:  # a planner without plan_resumed, prepared, offsets, ...
        num_examples = 3

        def plan(self, epoch: int, world_size: int = 1, accumulate_grad_batches: int = 1) -> None:
            return None

    assert not isinstance(Partial(), Planner)


# -- resume_inputs ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exclude", "kind"),
    [
        ([0, 2], SettingTypeError),
        (np.array([0, 1, 0]), SettingTypeError),
        (np.zeros(4, dtype=bool), SettingValueError),
        (np.zeros((3, 1), dtype=bool), SettingValueError),
    ],
)
def test_a_bad_exclude_mask_is_refused(exclude: object, kind: type) -> None:
    with pytest.raises(kind) as info:
        check_exclude(exclude, 3)
    assert info.value.setting == "exclude"
    planner = EpochPlanner([3, 4, 5], PlanConfig(max_tokens=16))
    with pytest.raises(kind):
        planner.plan(0, exclude=exclude)  # type: ignore[arg-type]


def test_a_good_exclude_mask_leaves_out_exactly_those_examples() -> None:
    mask = np.zeros(30, dtype=bool)
    mask[[1, 5, 7, 20]] = True
    assert check_exclude(mask, 30) is not None
    planner = EpochPlanner(_lengths(30), PlanConfig(max_tokens=64))
    ids = planner.plan(0, exclude=mask).example_ids().tolist()
    assert sorted(ids) == [i for i in range(30) if not mask[i]]


@pytest.mark.parametrize(
    ("history", "kind", "message"),
    [
        ("2,1,5", SettingTypeError, "got str"),
        (None, SettingTypeError, "got NoneType"),
        (5, SettingTypeError, "got int"),
        ({(2, 1, 5)}, SettingTypeError, "got set"),
        ([(2, 1)], SettingValueError, r"history\[0\] is \(2, 1\)"),
        ([(2, 1, 5), "abc"], SettingValueError, r"history\[1\] is 'abc'"),
        ([(2, 1, 5), 7], SettingValueError, r"history\[1\] is 7"),
        ([(0, 1, 5)], SettingValueError, r"history\[0\] world_size"),
        ([(2, 0, 5)], SettingValueError, r"history\[0\] accumulate_grad_batches"),
        ([(2, 1, -1)], SettingValueError, r"history\[0\] consumed"),
        ([(2, 1.5, 3)], SettingTypeError, r"history\[0\] accumulate_grad_batches"),
        ([(2, 1, True)], SettingTypeError, r"history\[0\] consumed"),
    ],
)
def test_a_bad_history_is_refused_naming_the_entry(
    history: object, kind: type, message: str
) -> None:
    with pytest.raises(kind, match=message):
        check_history(history)
    planner = EpochPlanner([3, 4, 5], PlanConfig(max_tokens=16))
    with pytest.raises(kind, match=message):
        planner.plan_resumed(0, 1, 1, history)  # type: ignore[arg-type]


def test_a_good_history_comes_back_as_int_triples() -> None:
    assert check_history([(2, 1, 5), [4, 2, 0]]) == [(2, 1, 5), (4, 2, 0)]
    out = check_history(np.array([[2, 1, 5]], dtype=np.int64))
    assert out == [(2, 1, 5)] and all(type(v) is int for v in out[0])
    assert check_history(()) == []


# -- shape_budget -------------------------------------------------------------------------------


@pytest.mark.parametrize("tail", TAILS)
@pytest.mark.parametrize("pairs", [False, True])
def test_shape_budget_every_micro_batch_runs_at_one_of_its_shapes(tail: str, pairs: bool) -> None:
    lengths = _lengths(80, seed=11, pairs=pairs)
    config = PlanConfig(max_tokens=120, max_shapes=3, tail=tail, pad_to_multiple_of=4)
    planner = EpochPlanner(lengths, config)
    assert isinstance(planner, ShapeBudget)
    shapes = planner.shapes
    assert shapes is not None and 1 <= len(shapes) <= 3
    assert (np.diff(shapes[:, 1]) > 0).all() and (shapes[:, 1] % 4 == 0).all()
    key = lengths.max(axis=1) if pairs else lengths
    assert shapes[-1, 1] >= key.max()
    assert (shapes[:, 0] * shapes[:, 1] <= 120).all()
    known = {tuple(s) for s in shapes.tolist()}
    for epoch, (world, acc) in enumerate([(1, 1), (2, 2), (3, 1)]):
        plan = planner.plan(epoch, world, acc)
        assert plan.micro_batch_shape is not None
        for b in plan.assign.reshape(-1).tolist():
            rows, length = plan.micro_batch_shape[b].tolist()
            assert (rows, length) in known
            longest = int(key[plan.micro_batch_ids(b)].max())
            assert len(plan.micro_batch_ids(b)) <= rows and longest <= length
            # the smallest shape that holds the micro-batch's longest example (bucket_width=1)
            assert length == min(s for _, s in known if s >= longest)
        resumed = planner.plan_resumed(epoch, world, acc, [(world, acc, 1)])
        assert {tuple(s) for s in resumed.micro_batch_shape.tolist()} <= known
    np.testing.assert_array_equal(planner.shapes, shapes)  # chosen once


def test_shape_budget_without_max_shapes_and_given_shape_lengths() -> None:
    free = EpochPlanner([3, 3, 4, 9, 10], PlanConfig(max_tokens=40))
    assert free.shapes is None and free.shape_lengths is None
    assert free.plan(0).micro_batch_shape is None
    with pytest.raises(SettingValueError, match="max_shapes"):
        free.use_shape_lengths(np.array([10]))
    planner = EpochPlanner([3, 3, 4, 9, 10], PlanConfig(max_tokens=40, max_shapes=2))
    assert planner.shapes.tolist() == [[10, 4], [4, 10]]
    with pytest.raises(SettingValueError) as info:
        planner.use_shape_lengths(np.array([4, 8, 12]))
    assert info.value.setting == "shape lengths"
    with pytest.raises(SettingValueError):
        planner.use_shape_lengths(np.array([], dtype=np.int64))
    with pytest.raises(ValueError, match="length 10 does not fit"):
        planner.use_shape_lengths(np.array([5, 8]))
    planner.use_shape_lengths(np.array([20, 5, 20]))  # sorted and unique
    assert planner.shape_lengths.tolist() == [5, 20]
    assert planner.shapes.tolist() == [[8, 5], [2, 20]]
    plan = planner.plan(0)
    assert {tuple(s) for s in plan.micro_batch_shape.tolist()} <= {(8, 5), (2, 20)}
    assert sorted(plan.example_ids().tolist()) == [0, 1, 2, 3, 4]


# -- dealing a run, resume, rank budgets and mixtures -------------------------------------------


def test_deal_run_rotation_permutes_the_ranks_within_each_step_only() -> None:
    config = PlanConfig(max_tokens=60)
    groups = SortedGroups.build(_lengths(120).astype(np.uint16), None, 1)
    cut = SortedCut.build(groups, config)
    run = np.arange(cut.num_micro_batches // 4 * 4)
    args = (cut, run, (2, 2), config, np.zeros(1, dtype=np.int64), None)
    plain, _ = deal_run(*args[:3], np.random.default_rng(0), *args[3:])
    rotated, _ = deal_run(*args[:3], np.random.default_rng(0), *args[3:], rotate=True)
    assert sorted(plain.reshape(-1).tolist()) == run.tolist()
    for step, turned in zip(plain, rotated, strict=True):  # same steps, in the same order
        assert sorted(map(tuple, step.tolist())) == sorted(map(tuple, turned.tolist()))


@pytest.mark.parametrize("tail", TAILS)
def test_a_resumed_epoch_is_exactly_what_its_history_left(tail: str) -> None:
    planner = EpochPlanner(_lengths(80), PlanConfig(max_tokens=60, tail=tail))
    assert isinstance(planner, EpochResume)
    done = planner.plan(0, 3).consumed_ids(2)
    rest = planner.plan_resumed(0, 2, 1, [(3, 1, 2)])
    assert planner.plan_resumed(0, 2, 1, [(3, 1, 2)]) is rest  # one plan for every rank
    counts = np.bincount(np.concatenate([done, rest.example_ids()]), minlength=80)
    assert int((counts == 0).sum()) == rest.num_dropped
    assert int(np.maximum(counts - 1, 0).sum()) == rest.num_duplicated
    np.testing.assert_array_equal(rest.consumed_counts, np.bincount(done, minlength=80))


def test_lane_budgets_plan_as_one_at_max_tokens_and_refuse_what_cannot_hold_the_data() -> None:
    config = PlanConfig(max_tokens=64)
    assert uniform(None, 64) and uniform((64, 64), 64) and not uniform((64, 32), 64)
    assert lane_budgets(config, 2, (64, 64), lambda: 10) is None
    assert lane_budgets(config, 2, (64, 32), lambda: 10) == (64, 32)
    with pytest.raises(SettingValueError, match="world_size=3"):
        lane_budgets(config, 3, (64, 32), lambda: 10)
    with pytest.raises(SettingValueError, match=r"\[1, max_tokens=64\]"):
        lane_budgets(config, 2, (64, 0), lambda: 10)
    shares = PlanConfig(64, rank_shares=(1.0, 0.125))
    with pytest.raises(SettingValueError, match="Rank 1's micro-batch budget is 8") as info:
        lane_budgets(shares, 2, None, lambda: 10)
    assert info.value.setting == "rank_shares"
    padded = PlanConfig(max_tokens=64, pad_to_multiple_of=8)
    assert single_example_cost(prepare_lengths([3, 13, 5], padded), padded) == 16


def test_a_mixture_refuses_rank_budgets_only_where_it_re_deals_micro_batches() -> None:
    sources = [np.full(40, 4), np.full(20, 8)]
    per_step = MixturePlanner(sources, PlanConfig(max_tokens=16))
    assert isinstance(per_step, MixtureTopology)
    plan = per_step.plan(0, 2, rank_budgets=(16, 8))
    assert plan.rank_budget.tolist() == [16, 8]
    assert plan.micro_batch_cost[plan.assign[:, 1]].max() <= 8
    per_batch = MixturePlanner(sources, PlanConfig(max_tokens=16), mixing="per_batch")
    with pytest.raises(SettingValueError, match="mixing='per_batch'") as info:
        per_batch.plan(0, 2, rank_budgets=(16, 8))
    assert info.value.setting == "mixing"


def test_each_dataset_of_a_mixture_warms_up_to_its_own_longest_example() -> None:
    config = PlanConfig(64, length_warmup=4, length_warmup_min=8)
    caps = dataset_warmup_caps(config, [40, 200], [None, 16], [None, None])
    assert caps.tolist() == [[8, 16, 24, 32, 40], [16, 62, 108, 154, 200]]
    assert dataset_warmup_caps(PlanConfig(64), [40], [None], [None]) is None
    source = DataSource([3], name="a", length_warmup_max=4)
    with pytest.raises(SettingValueError, match="DataSource 'a' has length_warmup_max=4"):
        mixture_warmup_caps(PlanConfig(64), [source], [EpochPlanner([3], PlanConfig(64))], ["a"])
    rng = np.random.default_rng(0)
    lengths = [rng.integers(1, 40, 200), rng.integers(1, 200, 100)]
    planner = MixturePlanner(lengths, PlanConfig(256, length_warmup=6, length_warmup_min=8))
    plan = planner.plan(0, 2)
    trace = plan.length_warmup
    assert trace is not None and (np.diff(trace.levels) >= 0).all()
    for step, level in enumerate(trace.levels.tolist()):  # every micro-batch within its cap
        for b in plan.assign[step].reshape(-1).tolist():
            cap = planner.warmup_caps[int(plan.micro_batch_dataset[b]), level]
            assert planner.prepared.key[plan.micro_batch_ids(b)].max() <= cap
    assert planner.plan(1, 2).length_warmup is None


def test_settings_identity_leaves_out_rank_settings_and_later_ones_at_their_default() -> None:
    plain = plain_settings(vars(PlanConfig(64, rank_shares=(1.0, 0.5))))
    assert "rank_shares" not in plain and "loss_offset" not in plain and plain["max_tokens"] == 64
    assert plain_settings(vars(PlanConfig(64, loss_offset=1)))["loss_offset"] == 1
    base = fingerprint_of(asdict(PlanConfig(64)))
    assert fingerprint_of(asdict(PlanConfig(64, rank_max_tokens=(64, 32)))) == base
    assert fingerprint_of(asdict(PlanConfig(64, loss_offset=1))) != base
    assert set(RANK_SETTINGS) <= set(LATER_SETTINGS)
