"""Direct behaviour tests of data modules that no other test imports by name.

Each test checks what a collate, the sampler or a DataModule relies on, against an
independent reference (a Python loop over the rows, the planner's own plan), over every
padded field, layout and topology change where there is a family.
"""

from __future__ import annotations

import json
import pickle
import warnings
from dataclasses import fields

import numpy as np
import pyarrow as pa
import pytest
import torch

from lightning_varbatch import keys
from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.columnar import ColumnarItems
from lightning_varbatch.data.micro_batch import MicroBatch
from lightning_varbatch.data.packed_collate import PackingCollate
from lightning_varbatch.data.pairing import (
    collate_for_plan,
    column_keys,
    dataset_column_keys,
    plan_layout,
)
from lightning_varbatch.data.plan_items import (
    PlanItems,
    attach_plan,
    batch_info,
    check_map_style,
    count_entries,
    item_label,
    plan_entries,
    static_shape,
)
from lightning_varbatch.data.plan_settings import (
    PLAN_SETTINGS,
    check_accumulate,
    check_topology,
    plain_settings,
    plan_config,
    reject_unknown,
)
from lightning_varbatch.data.ragged import Ragged, arrow_list_problem
from lightning_varbatch.data.sampler_resume import resume_position
from lightning_varbatch.data.sampler_state import (
    EpochPosition,
    lengths_digest,
    read_state,
    save_state,
    state_differences,
)
from lightning_varbatch.data.token_fields import as_tokens, check_key, other_entries, ragged_field
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.remainder_guard import consumed_ledger
from lightning_varbatch.planner.settings import PlanConfig


def _micro_batch(ids: list[int], **extra: object) -> MicroBatch:
    counts = {"epoch": 1, "step": 2, "micro": 1, "rank": 0, "ntokens": 5}
    counts |= {"step_ntokens": 11, "step_nexamples": 4}
    return MicroBatch(ids, **(counts | extra))  # type: ignore[arg-type]


def _rows(seed: int, n: int = 6) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(1, 100, size=int(rng.integers(0, 9))).tolist() for _ in range(n)]


# -- ragged -------------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("multiple", [1, 3, 8])
@pytest.mark.parametrize("limit", [None, 0, 1, 4])
def test_ragged_truncate_and_pad_match_a_loop(seed: int, multiple: int, limit: int | None) -> None:
    rows = _rows(seed)
    rows[0] = rows[0] or [7]  # at least one token
    from_rows = Ragged.from_rows([torch.tensor(r, dtype=torch.long) for r in rows])
    from_arrow = Ragged.from_arrow(pa.chunked_array([rows[:2], rows[2:]]))
    for ragged in (from_rows, from_arrow):
        assert ragged.values.tolist() == [v for r in rows for v in r]
        assert ragged.lengths.tolist() == [len(r) for r in rows] and len(ragged) == len(rows)
        cut = [r[:limit] if limit else r for r in rows]
        padded, mask = ragged.truncate(limit).pad(pad_id=-1, multiple=multiple)
        width = -(-max(len(r) for r in cut) // multiple) * multiple
        assert padded.dtype == torch.long and mask.dtype == torch.bool
        assert padded.tolist() == [r + [-1] * (width - len(r)) for r in cut]
        assert mask.tolist() == [[j < len(r) for j in range(width)] for r in cut]
        shape = (len(rows) + 2, width + 5)
        padded, mask = ragged.truncate(limit).pad(pad_id=0, multiple=multiple, shape=shape)
        assert tuple(padded.shape) == tuple(mask.shape) == shape
        want = [r + [0] * (shape[1] - len(r)) for r in cut] + [[0] * shape[1]] * 2
        assert padded.tolist() == want
        assert mask.sum().item() == sum(len(r) for r in cut)
        assert not mask[len(rows) :].any()


def test_ragged_of_no_rows_and_rows_without_tokens() -> None:
    empty = Ragged.from_rows([])
    assert len(empty) == 0 and empty.pad(0)[0].shape == (0, 0)
    blank = Ragged.from_rows([torch.zeros(0, dtype=torch.long)] * 2)
    padded, mask = blank.pad(5, multiple=4)
    assert padded.shape == (2, 0) and mask.shape == (2, 0)
    assert blank.truncate(3) is blank


@pytest.mark.parametrize(
    ("column", "row", "problem", "error"),
    [
        (pa.chunked_array([["a b"]]), 0, "is text", TypeError),
        (pa.chunked_array([pa.array(["a"], pa.large_string())]), 0, "is text", TypeError),
        (pa.chunked_array([[1, 2]]), 0, "not a list of integer token ids", TypeError),
        (pa.chunked_array([[[1.5], [2.0]]]), 0, "holds double values", TypeError),
        (pa.chunked_array([[[True]]]), 0, "holds bool values", TypeError),
        (pa.chunked_array([[[1], None]]), 1, "is null", ValueError),
        # the row that holds the null, not the micro-batch's first (issue 31)
        (pa.chunked_array([[[1], [2]], [[3, None]]]), 2, "holds a null token id", TypeError),
    ],
)
def test_arrow_list_problem_names_every_column_that_is_not_token_ids(
    column: pa.ChunkedArray, row: int, problem: str, error: type[Exception]
) -> None:
    found = arrow_list_problem(column)
    assert found is not None and found[0] == row and problem in found[1] and found[2] is error


def test_arrow_list_problem_accepts_every_integer_list_type() -> None:
    for kind in (pa.list_(pa.int32()), pa.large_list(pa.int64()), pa.list_(pa.uint16(), 2)):
        column = pa.chunked_array([pa.array([[1, 2], [3, 4]], kind)])
        assert arrow_list_problem(column) is None
        assert Ragged.from_arrow(column).values.tolist() == [1, 2, 3, 4]


# -- token_fields -------------------------------------------------------------------------------


def test_check_key_accepts_a_name_and_refuses_others() -> None:
    assert check_key("tokens_key", "input_ids") == "input_ids"
    with pytest.raises(SettingTypeError) as info:
        check_key("tokens_key", 3)
    assert info.value.setting == "tokens_key"
    with pytest.raises(SettingValueError) as info:
        check_key("source_key", "")
    assert info.value.setting == "source_key"


@pytest.mark.parametrize(
    "value",
    [
        [3, 1, 4],
        (3, 1, 4),
        np.array([3, 1, 4], dtype=np.int32),
        np.array([3, 1, 4], dtype=np.uint16),
        torch.tensor([3, 1, 4], dtype=torch.int16),
        torch.tensor([3, 1, 4], dtype=torch.uint8),
        torch.tensor([3, 1, 4]),
    ],
)
def test_as_tokens_gives_a_long_tensor_of_the_ids(value: object) -> None:
    out = as_tokens(value, "tokens", "item 0")
    assert out.dtype == torch.long and out.tolist() == [3, 1, 4]
    frozen = np.array([3, 1, 4])
    frozen.flags.writeable = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a read-only array is copied, without torch's warning
        assert as_tokens(frozen, "tokens", "item 0").tolist() == [3, 1, 4]


@pytest.mark.parametrize(
    ("value", "kind", "message"),
    [
        ("hello", TypeError, "is a str"),
        (b"hello", TypeError, "is a bytes"),
        ([[1, 2], [3, 4]], ValueError, r"1-D .* shape \(2, 2\)"),
        (torch.tensor(3), ValueError, r"shape \(\)"),
        ([1.5, 2.0], TypeError, "torch.float32"),
        (torch.tensor([True, False]), TypeError, "torch.bool"),
        ([{"a": 1}], TypeError, "not a sequence of integer token ids"),
    ],
)
def test_as_tokens_refuses_what_is_not_token_ids_naming_field_and_item(
    value: object, kind: type, message: str
) -> None:
    with pytest.raises(kind, match=message) as info:
        as_tokens(value, "target", "dataset item 9")
    assert "'target'" in str(info.value) and "dataset item 9" in str(info.value)


@pytest.mark.parametrize("field", ["source", "target"])
def test_ragged_field_reads_every_field_from_lists_and_arrow_alike(field: str) -> None:
    sources, targets = _rows(1, 5), _rows(2, 5)
    items = [
        {"source": s, "target": np.array(t, dtype=np.int32), "id": i, "name": f"n{i}"}
        for i, (s, t) in enumerate(zip(sources, targets, strict=True))
    ]
    rows = {"source": sources, "target": targets}[field]
    listed = ragged_field(items, field)
    table = pa.table({"source": sources, "target": targets, "id": list(range(5))})
    columnar = ragged_field(ColumnarItems(table), field)
    for ragged in (listed, columnar):
        assert ragged.values.dtype == torch.long
        assert ragged.values.tolist() == [v for r in rows for v in r]
        assert ragged.lengths.tolist() == [len(r) for r in rows]
    others = other_entries(items, ["source", "target"])
    assert others["id"].tolist() == list(range(5)) and others["id"].dtype == torch.long
    assert others["name"] == [f"n{i}" for i in range(5)]
    assert other_entries(ColumnarItems(table), ["source", "target"])["id"].tolist() == list(
        range(5)
    )


def test_other_entries_keeps_non_integer_entries_as_lists() -> None:
    items = [{"tokens": [1], "flag": True, "x": 1}, {"tokens": [2], "flag": False, "x": None}]
    out = other_entries(items, ["tokens"])
    assert out == {"flag": [True, False], "x": [1, None]}
    table = pa.table({"tokens": [[1], [2]], "x": pa.array([1, None], pa.int64())})
    assert other_entries(ColumnarItems(table), ["tokens"])["x"] == [1, None]


def test_ragged_field_errors_name_the_field_and_the_dataset_item() -> None:
    items = attach_plan([{"tokens": [1, 2]}, {"tokens": "text"}], _micro_batch([10, 11]))
    with pytest.raises(TypeError, match=r"'tokens' of dataset item 11 \(epoch 1, step 2"):
        ragged_field(items, "tokens")
    table = pa.table({"tokens": pa.array([[1], None], pa.list_(pa.int64()))})
    arrow_items = attach_plan(table, _micro_batch([20, 21]))
    with pytest.raises(ValueError, match=r"'tokens' of dataset item 21 \(.*\) is null"):
        ragged_field(arrow_items, "tokens")
    holes = attach_plan(pa.table({"tokens": [[1], [2, None]]}), _micro_batch([20, 21]))
    with pytest.raises(TypeError, match=r"'tokens' of dataset item 21.*null token id"):
        ragged_field(holes, "tokens")
    with pytest.raises(TypeError, match=r"'text' of dataset item 20.*is text"):
        ragged_field(attach_plan(pa.table({"text": ["a"] * 2}), _micro_batch([20, 21])), "text")


# -- plan_items ---------------------------------------------------------------------------------


def test_batch_info_has_every_plan_count_and_plan_entries_the_keyed_ones() -> None:
    mb = _micro_batch([3, 4], dataset=2, truncate_to=9, world_size=4, pad_rows=3, pad_length=8)
    info = batch_info(mb)
    assert info is not None
    assert set(info) == {c.attribute for c in keys.PLAN_COUNTS}
    for count in keys.PLAN_COUNTS:
        value = getattr(mb, count.attribute, None)
        assert info[count.attribute] == (count.default if value is None else value)
    entries = plan_entries(info)
    assert entries == {
        c.key: info[c.attribute]
        for c in keys.PLAN_COUNTS
        if c.key is not None and info[c.attribute] is not None
    }
    assert entries[keys.STEP_NTOKENS] == 11 and entries[keys.DATASET] == 2
    assert batch_info([3, 4]) is None  # a plain list of indices
    plain = batch_info(_micro_batch([3]))
    assert plain is not None and plain["truncate_to"] is None and plain["dataset"] == 0


def test_count_entries_are_zero_dim_views_of_one_tensor() -> None:
    entries = count_entries({"ntokens": 5, "nexamples": 2}, {"step_ntokens": 11, "epoch": 1})
    assert {k: int(v) for k, v in entries.items()} == {
        "ntokens": 5,
        "nexamples": 2,
        keys.STEP_NTOKENS: 11,
    }
    storages = {v.untyped_storage().data_ptr() for v in entries.values()}
    assert len(storages) == 1 and all(
        v.shape == () and v.dtype == torch.long for v in entries.values()
    )
    assert set(count_entries({"ntokens": 1}, None)) == {"ntokens"}


@pytest.mark.parametrize("arrow", [False, True])
def test_attach_plan_carries_counts_ids_and_planned_lengths_through_pickling(arrow: bool) -> None:
    rows = [{"tokens": [1, 2, 3]}, {"tokens": [4]}]
    fetched = pa.table({"tokens": [[1, 2, 3], [4]]}) if arrow else rows
    mb = _micro_batch([7, 2], planned_lengths=[3, 1])
    items = attach_plan(fetched, mb)
    assert isinstance(items, ColumnarItems if arrow else PlanItems)
    for got in (items, pickle.loads(pickle.dumps(items))):
        assert got.info == batch_info(mb)
        assert got.ids == [7, 2] and got.planned_lengths == [3, 1]
        assert ragged_field(got, "tokens").lengths.tolist() == [3, 1]
    bare = attach_plan(rows, [0, 1])
    assert bare.info is None and bare.ids == [0, 1] and bare.planned_lengths is None
    assert item_label(bare, 1) == "dataset item 1"
    assert item_label(items, 1) == "dataset item 2 (epoch 1, step 2, micro-batch 1, position 1)"
    assert item_label([{"tokens": [1]}], 0) == "item 0 of the micro-batch"
    with pytest.raises(RuntimeError, match="returned 2 items for 3 indices"):
        attach_plan(fetched, [0, 1, 2])


def test_static_shape_and_the_map_style_check() -> None:
    assert static_shape({"pad_rows": 4, "pad_length": 16}, 4) == (4, 16)
    assert static_shape({"pad_rows": None, "pad_length": 16}, 4) is None
    assert static_shape(None, 4) is None
    with pytest.raises(ValueError, match="5 items but its static shape only 4 rows"):
        static_shape({"pad_rows": 4, "pad_length": 16}, 5)
    check_map_style([{"tokens": [1]}])
    with pytest.raises(TypeError, match="not indexable"):
        check_map_style(iter([1]), "train_dataset")

    class Stream(torch.utils.data.IterableDataset):
        def __iter__(self):  # type: ignore[no-untyped-def]
            yield {"tokens": [1]}

    with pytest.raises(TypeError, match="train_dataset is an iterable-style dataset"):
        check_map_style(Stream(), "train_dataset")


# -- pairing ------------------------------------------------------------------------------------

PLANS = {
    "padded": PlanConfig(max_tokens=64, pad_to_multiple_of=4),
    "packed": PlanConfig(max_tokens=64, layout="packed", pad_to_multiple_of=4),
    "max_shapes": PlanConfig(max_tokens=64, max_shapes=2, pad_to_multiple_of=4),
}


@pytest.mark.parametrize("layout", list(PLANS))
def test_every_layout_gets_its_collate_and_refuses_the_other(layout: str) -> None:
    config = PLANS[layout]
    assert plan_layout(config) == layout
    wanted, other = (
        (PackingCollate, PaddingCollate) if layout == "packed" else (PaddingCollate, PackingCollate)
    )
    default = collate_for_plan(config, None, loss_offset=1 if layout == "packed" else None)
    assert type(default) is wanted and default.pad_to_multiple_of == 4
    given = wanted(pad_to_multiple_of=2)  # 2 divides the plan's 4: it pads no wider
    assert collate_for_plan(config, given) is given
    with pytest.raises(SettingValueError, match=f"collate_fn={other.__name__}") as info:
        collate_for_plan(config, other(), setting="collate_fn")
    assert info.value.setting == "collate_fn"
    setting = "max_shapes=2" if layout == "max_shapes" else f"layout='{layout}'"
    assert setting in str(info.value)

    def plain(batch: object) -> object:
        return batch

    assert collate_for_plan(config, plain) is plain
    with pytest.raises(SettingTypeError) as info:
        collate_for_plan(config, "PaddingCollate")  # type: ignore[arg-type]
    assert info.value.setting == "collate"
    wide = wanted(pad_to_multiple_of=8)
    if layout == "max_shapes":  # the shape decides the width, not the multiple
        assert collate_for_plan(config, wide) is wide
    else:
        with pytest.raises(SettingValueError, match="pads wider than the plan"):
            collate_for_plan(config, wide)


def test_the_default_collate_takes_keys_and_loss_offset_and_refuses_what_cannot_pack() -> None:
    calls = []

    def names() -> dict[str, str]:
        calls.append(1)
        return {"source_key": "src", "target_key": "tgt"}

    padded = collate_for_plan(PLANS["padded"], None, loss_offset=1, keys=names)
    assert (padded.source_key, padded.target_key, padded.loss_offset) == ("src", "tgt", 1)
    given = PaddingCollate()
    assert collate_for_plan(PLANS["padded"], given, keys=names) is given
    assert calls == [1]  # the keys are read only to build a default
    with pytest.raises(SettingValueError) as info:
        collate_for_plan(PLANS["packed"], None, keys=names)
    assert info.value.setting == "layout"
    with pytest.raises(SettingValueError) as info:
        collate_for_plan(PLANS["packed"], None, loss_offset=0)
    assert info.value.setting == "loss_offset"
    packed = collate_for_plan(PLANS["packed"], None, keys={"tokens_key": "input_ids"})
    assert packed.tokens_key == "input_ids"
    with pytest.raises(SettingValueError, match=r"loss_offset=0\) counts"):
        collate_for_plan(PLANS["padded"], PaddingCollate(), loss_offset=1)
    unchecked = PaddingCollate(check_ntokens=False)
    assert collate_for_plan(PLANS["padded"], unchecked, loss_offset=1) is unchecked


def test_the_default_collates_pad_every_field_within_the_plan() -> None:
    sources, targets = _rows(3, 4), _rows(4, 4)
    sources[0], targets[0] = sources[0] or [1], targets[0] or [1]
    items = [{"source": s, "target": t} for s, t in zip(sources, targets, strict=True)]
    ntokens = sum(len(t) for t in targets)
    mb = _micro_batch(list(range(4)), ntokens=ntokens)
    batch = collate_for_plan(PLANS["padded"], None)(attach_plan(items, mb))
    for field, rows in (("source", sources), ("target", targets)):
        width = -(-max(len(r) for r in rows) // 4) * 4
        assert batch[field].tolist() == [r + [0] * (width - len(r)) for r in rows]
        assert batch[f"{field}_mask"].tolist() == [[j < len(r) for j in range(width)] for r in rows]
    assert int(batch["ntokens"]) == ntokens and int(batch[keys.STEP_NTOKENS]) == 11
    # the packed default: one row of every example, labels shifted within each document
    docs = [r for r in sources if r]
    mb = _micro_batch(list(range(len(docs))), ntokens=sum(len(d) - 1 for d in docs))
    packed = collate_for_plan(PLANS["packed"], None, loss_offset=1)(
        attach_plan([{"tokens": d} for d in docs], mb)
    )
    flat = [v for d in docs for v in d]
    width = -(-len(flat) // 4) * 4
    assert packed["input_ids"][0, : len(flat)].tolist() == flat
    assert packed["input_ids"].shape[1] == width
    labels = [v for d in docs for v in [*d[1:], -100]]
    assert packed["labels"][0, : len(flat)].tolist() == labels


def test_column_keys_name_the_token_columns_only() -> None:
    assert column_keys(("src", "tgt"), lambda c: True) == {"source_key": "src", "target_key": "tgt"}
    assert column_keys(["ids"], lambda c: True) == {"tokens_key": "ids"}
    assert column_keys("ids", lambda c: True) == {"tokens_key": "ids"}
    assert column_keys("n", lambda c: False) == {}
    assert column_keys(("src", "n"), lambda c: c == "src") == {}
    assert column_keys(("a", "b", "c"), lambda c: True) == {}
    assert column_keys(3, lambda c: True) == {} and column_keys([], lambda c: True) == {}
    assert column_keys("x", lambda c: None) == {}
    table = pa.table({"ids": [[1]], "n": [1], "tgt": pa.array([[2]], pa.large_list(pa.int32()))})
    assert dataset_column_keys(table, "ids") == {"tokens_key": "ids"}
    assert dataset_column_keys(table, ("ids", "tgt")) == {"source_key": "ids", "target_key": "tgt"}
    assert dataset_column_keys(table, "n") == {} and dataset_column_keys(table, "missing") == {}
    assert dataset_column_keys([1, 2], "ids") == {}


# -- plan_settings ------------------------------------------------------------------------------


def test_plan_settings_are_the_fields_of_plan_config() -> None:
    assert {f.name for f in fields(PlanConfig)} == PLAN_SETTINGS
    every = {"max_tokens": np.int64(64), "tail": "drop", "seed": np.int32(3), "layout": "packed"}
    config = plan_config(every)
    assert (config.max_tokens, config.tail, config.seed, config.layout) == (64, "drop", 3, "packed")
    assert type(plain_settings(max_tokens=np.int64(8))["max_tokens"]) is int
    given = PlanConfig(max_tokens=8)
    assert plan_config({}, given) is given
    assert plan_config({"max_tokens": None}, given) is given
    with pytest.raises(SettingValueError, match="tail= was given with config") as info:
        plan_config({"max_tokens": None, "tail": "drop"}, given)
    assert info.value.setting == "tail"
    with pytest.raises(SettingTypeError) as info:
        plan_config({}, {"max_tokens": 8})  # type: ignore[arg-type]
    assert info.value.setting == "config"
    with pytest.raises(
        SettingTypeError, match="'max_token' \\(did you mean 'max_tokens'\\?\\)"
    ) as info:
        plan_config({"max_token": 8})
    assert info.value.setting == "max_token" and info.value.value == 8
    reject_unknown("f", ["seed"], PLAN_SETTINGS)  # known: no error


@pytest.mark.parametrize(
    ("rank", "world", "kind", "setting"),
    [
        (2, 2, SettingValueError, "rank"),
        (-1, 2, SettingValueError, "rank"),
        (0, 0, SettingValueError, "world_size"),
        (True, 2, SettingTypeError, "rank"),
        (0, 1.5, SettingTypeError, "world_size"),
    ],
)
def test_check_topology_refuses_a_rank_outside_the_world(
    rank: object, world: object, kind: type, setting: str
) -> None:
    with pytest.raises(kind) as info:
        check_topology(rank, world)
    assert info.value.setting == setting


def test_check_topology_and_accumulate_accept_good_values() -> None:
    assert check_topology(np.int64(1), np.int64(2)) == (1, 2)
    assert check_topology(None, 4) == (None, 4) and check_topology(3, None) == (3, None)
    assert check_accumulate(np.int64(2)) == 2
    for bad in (0, -1, 1.5, True):
        with pytest.raises((SettingValueError, SettingTypeError)) as info:
            check_accumulate(bad)
        assert info.value.setting == "accumulate_grad_batches"


# -- sampler_state, sampler_resume ---------------------------------------------------------------


def _planner(n: int = 57, seed: int = 0, **settings: object) -> EpochPlanner:
    lengths = np.random.default_rng(seed).integers(1, 30, size=n)
    return EpochPlanner(lengths, PlanConfig(max_tokens=60, seed=4, **settings))  # type: ignore[arg-type]


def _equal(world: int) -> tuple[int, ...]:
    return (60,) * world


def _save(planner: EpochPlanner, position: EpochPosition, world: int, acc: int) -> dict:
    """The state a sampler of this topology saves at ``position`` (its plan's ledger)."""
    position.budgets = _equal(world)
    plan = planner.plan_resumed(position.epoch, world, acc, position.history, rank_budgets=None)
    total = plan.num_micro_batches_per_rank
    ledger = consumed_ledger(plan, position.consumed) if position.consumed <= total else (0, 0)
    return save_state(position, planner, world, acc, lengths_digest(planner), ledger)


def _resume(
    planner: EpochPlanner, state: dict, topology: tuple[int, int], **kw: object
) -> EpochPosition:
    saved = read_state(json.loads(json.dumps(state)), _equal)  # plain values: any checkpoint
    position = EpochPosition()
    resume_position(
        position,
        planner,
        saved,
        state_differences(saved, planner, lengths_digest(planner)),
        restart=bool(kw.get("restart", False)),
        topology=topology,
        memory=_equal(topology[0]),
    )
    return position


def test_the_state_round_trips() -> None:
    planner = _planner()
    position = EpochPosition(epoch=3, consumed=2, history=[(4, 1, 3, None)], offset=1)
    state = save_state(position, planner, 2, 2, lengths_digest(planner), (7, 11))
    saved = read_state(state, _equal)
    assert (saved.epoch, saved.consumed, saved.topology, saved.offset) == (3, 2, (2, 2), 1)
    assert saved.history == [(4, 1, 3, _equal(4))]  # equal budgets, as a version-2 state said
    assert saved.counted == 1 + 3 + 2 and saved.ledger == (7, 11)
    assert state_differences(saved, planner, lengths_digest(planner)) == {}
    assert position.counted_before == 4 and position.steps_before == 3
    position.start(4)
    assert (position.epoch, position.consumed, position.history, position.offset) == (4, 0, [], 0)


@pytest.mark.parametrize("tail", ["spread", "drop", "pad"])
@pytest.mark.parametrize(
    ("before", "after"), [((1, 1), (1, 1)), ((2, 1), (3, 1)), ((3, 2), (1, 1)), ((2, 2), (2, 1))]
)
def test_an_elastic_resume_plans_exactly_the_unconsumed_examples(
    tail: str, before: tuple[int, int], after: tuple[int, int]
) -> None:
    planner = _planner(tail=tail)
    epoch = 2
    plan = planner.plan(epoch, *before)
    for consumed in sorted(
        {0, 1, plan.num_micro_batches_per_rank // 2, plan.num_micro_batches_per_rank}
    ):
        state = _save(planner, EpochPosition(epoch, consumed), *before)
        position = _resume(planner, state, after)
        assert position.epoch == epoch and position.restored
        rest = planner.plan_resumed(epoch, *after, position.history)
        done = plan.consumed_ids(consumed).tolist()
        if after == before:
            assert position.consumed == consumed and position.history == []
            _, left = plan.consumed_micro_batches(consumed)
            assert rest.example_ids().tolist() == plan.example_ids().tolist()
            left_ids = plan.ids_of_micro_batches(left).tolist()
        else:
            assert position.consumed == 0
            assert position.history == (
                [(*before, consumed, _equal(before[0]))] if consumed else []
            )
            left_ids = rest.example_ids().tolist()
        assert not set(done) & set(left_ids)  # nothing consumed is planned again
        trained = np.bincount(done + left_ids, minlength=planner.num_examples)
        # every example once over the two topologies, but what the tail policy counts
        assert int((trained == 0).sum()) == rest.num_dropped
        assert int(np.maximum(trained - 1, 0).sum()) == rest.num_duplicated
        if tail == "spread":
            assert rest.num_dropped == rest.num_duplicated == 0
        if tail == "drop":
            assert trained.max() <= 1  # a drop never repeats, also after a re-plan


def test_two_topology_changes_in_one_epoch_still_cover_the_epoch_once() -> None:
    planner = _planner()
    first = planner.plan(0, 2, 1)
    position = _resume(planner, _save(planner, EpochPosition(0, 3), 2, 1), (3, 1))
    second = planner.plan_resumed(0, 3, 1, position.history)
    position.consumed = 2
    position = _resume(planner, _save(planner, position, 3, 1), (1, 2))
    assert position.history == [(2, 1, 3, _equal(2)), (3, 1, 2, _equal(3))]
    third = planner.plan_resumed(0, 1, 2, position.history)
    ids = (
        first.consumed_ids(3).tolist()
        + second.consumed_ids(2).tolist()
        + third.example_ids().tolist()
    )
    assert sorted(ids) == list(range(planner.num_examples))


@pytest.mark.parametrize(
    ("now", "changed"),
    [
        ({"seed": 5}, ["seed"]),
        ({"max_tokens": 61}, ["max_tokens"]),
        ({"tail": "drop"}, ["tail"]),
        ({"lengths_seed": 1}, ["lengths"]),
        ({"n": 58}, ["num_examples"]),
    ],
)
def test_a_state_for_other_data_or_settings_is_refused_or_restarts(
    now: dict, changed: list
) -> None:
    old = _planner()
    state = _save(old, EpochPosition(1, 2), 1, 1)
    seed = now.pop("lengths_seed", 0)
    n = now.pop("n", 57)
    lengths = np.random.default_rng(seed).integers(1, 30, size=n)
    planner = EpochPlanner(lengths, PlanConfig(**({"max_tokens": 60, "seed": 4} | now)))
    saved = read_state(state, _equal)
    differences = state_differences(saved, planner, lengths_digest(planner))
    assert sorted(differences) == sorted(changed)
    with pytest.raises(ResumeMismatchError) as info:
        _resume(planner, state, (1, 1))
    assert info.value.changed == changed
    with pytest.warns(UserWarning, match="Starting epoch 1 afresh"):
        position = _resume(planner, state, (1, 1), restart=True)
    assert (position.epoch, position.consumed, position.history, position.offset) == (1, 0, [], 2)


def test_a_consumed_part_planned_otherwise_is_refused_by_its_ledger() -> None:
    """A change no setting names (here: a forged ledger) is caught by the epoch's ledger."""
    planner = _planner()
    state = _save(planner, EpochPosition(0, 2), 1, 1)
    state["ledger"]["digest"] = f"{int(state['ledger']['digest'], 16) ^ 1:016x}"
    with pytest.raises(ResumeMismatchError, match="plan other examples") as info:
        _resume(planner, state, (1, 1))
    assert info.value.changed == ["consumed"]


def test_more_consumed_than_the_epoch_has_is_refused_or_restarts() -> None:
    planner = _planner()
    total = planner.plan(0).num_micro_batches_per_rank
    state = _save(planner, EpochPosition(0, total + 1), 1, 1)
    with pytest.raises(ResumeMismatchError) as info:
        _resume(planner, state, (1, 1))
    assert info.value.changed == ["consumed"]
    with pytest.warns(UserWarning, match="afresh"):
        position = _resume(planner, state, (1, 1), restart=True)
    assert position.consumed == 0 and position.offset == total + 1


def test_a_version_one_state_resumes_with_a_warning_or_restarts() -> None:
    planner = _planner()
    state = _save(planner, EpochPosition(0, 2), 1, 1)
    for key in ("lengths_digest", "restart_offset", "settings", "rank_budgets", "ledger"):
        del state[key]
    state["version"] = 1
    with pytest.warns(UserWarning, match="cannot prove that the lengths are unchanged"):
        position = _resume(planner, state, (1, 1))
    assert position.consumed == 2
    with pytest.warns(UserWarning, match="afresh"):
        position = _resume(planner, state, (1, 1), restart=True)
    assert position.consumed == 0 and position.offset == 2


@pytest.mark.parametrize(
    ("change", "kind", "message"),
    [
        (lambda s: [s], TypeError, "expects the dict"),
        (
            lambda s: {k: v for k, v in s.items() if k != "epoch"},
            ValueError,
            r"missing keys \['epoch'\]",
        ),
        (lambda s: s | {"extra": 1}, ValueError, r"unknown keys \['extra'\]"),
        (lambda s: s | {"version": 4}, ValueError, "has version 4"),
        (lambda s: s | {"epoch": -1}, ValueError, "damaged: epoch is -1"),
        (lambda s: s | {"consumed": True}, ValueError, "damaged: consumed is True"),
        (lambda s: s | {"world_size": 0}, ValueError, "damaged: world_size is 0"),
        (lambda s: s | {"consumed": 1.0}, ValueError, "damaged: consumed is 1.0"),
        (lambda s: s | {"history": "abc"}, ValueError, "damaged: history is 'abc'"),
        (lambda s: s | {"history": [[1, 2]]}, ValueError, r"damaged: history\[0\] has 2 items"),
        (lambda s: s | {"rank_budgets": [60, 0]}, ValueError, "damaged: rank_budgets entry"),
        (lambda s: s | {"rank_budgets": [60, 60]}, ValueError, "2 entries for 1 ranks"),
        (lambda s: s | {"ledger": {"examples": 3}}, ValueError, "damaged: ledger is"),
        (lambda s: s | {"ledger": {"examples": 3, "digest": "zz"}}, ValueError, "hexadecimal"),
    ],
)
def test_a_damaged_state_is_refused(change, kind: type, message: str) -> None:  # type: ignore[no-untyped-def]
    planner = _planner()
    state = _save(planner, EpochPosition(0, 1), 1, 1)
    with pytest.raises(kind, match=message):
        read_state(change(state), _equal)


def test_the_lengths_digest_sees_every_length_but_not_the_dtype() -> None:
    lengths = np.random.default_rng(0).integers(1, 30, size=40)
    config = PlanConfig(max_tokens=60)
    digest = lengths_digest(EpochPlanner(lengths, config))
    assert lengths_digest(EpochPlanner(lengths.astype(np.int32), config)) == digest
    assert lengths_digest(EpochPlanner(lengths.astype(np.float64), config)) == digest
    for i in (0, 17, 39):
        changed = lengths.copy()
        changed[i] += 1
        assert lengths_digest(EpochPlanner(changed, config)) != digest
    shifted = PlanConfig(max_tokens=60, loss_offset=1)  # other loss lengths
    assert lengths_digest(EpochPlanner(lengths, shifted)) != digest
