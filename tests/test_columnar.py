"""A Hugging Face dataset's micro-batches: one batched Arrow read, padded like the item path.

The twin reference is the same items as a list of dicts through the same sampler and collate:
every batch must be identical (tensors, masks, counts, other columns), for every padded field
layout (pairs, a single tokens field), every integer width of token ids, Arrow list types,
alignment, truncation and loss offsets, with and without worker processes. And the read is
batched: one dataset call per micro-batch, never one per row.
"""

from __future__ import annotations

from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import ConcatDataset

from lightning_varbatch import (
    DataSource,
    PaddingCollate,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    token_budget_dataloader,
)
from lightning_varbatch.data.collate import attach_plan
from lightning_varbatch.data.columnar import ColumnarItems, fetch_rows


def assert_same_batches(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b, strict=True):
        assert x.keys() == y.keys()
        for key in x:
            if isinstance(x[key], torch.Tensor):
                assert x[key].dtype == y[key].dtype, key
                assert torch.equal(x[key], y[key]), key
            else:
                assert x[key] == y[key], key


def make_rows(rng: np.random.Generator, n: int, pairs: bool) -> list[dict[str, Any]]:
    rows = []
    for i in range(n):
        row: dict[str, Any] = {"id": i, "text": f"row {i}"}
        if pairs:
            row["source"] = rng.integers(1, 120, rng.integers(1, 30)).tolist()
            row["target"] = rng.integers(1, 120, rng.integers(2, 30)).tolist()
        else:
            row["tokens"] = rng.integers(1, 120, rng.integers(2, 40)).tolist()
        rows.append(row)
    return rows


def lengths_of(rows: list[dict[str, Any]], pairs: bool) -> np.ndarray:
    if pairs:
        return np.array([[len(r["source"]), len(r["target"])] for r in rows])
    return np.array([len(r["tokens"]) for r in rows])


def batches(data: Any, lengths: np.ndarray, collate: PaddingCollate, **kw: Any) -> list[Any]:
    sampler = TokenBudgetBatchSampler(lengths, 160, rank=0, world_size=1, seed=5, **kw)
    return list(token_budget_dataloader(data, sampler, collate_fn=collate))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 10_000),
    pairs=st.booleans(),
    multiple=st.sampled_from([1, 8]),
    truncate=st.sampled_from([None, 12]),
    offset=st.sampled_from([0, 1]),
    width=st.sampled_from(["int16", "int32", "int64", "uint16", "uint32"]),
)
def test_hf_batches_equal_the_list_path(
    seed: int, pairs: bool, multiple: int, truncate: int | None, offset: int, width: str
) -> None:
    rng = np.random.default_rng(seed)
    rows = make_rows(rng, 60, pairs)
    lengths = lengths_of(rows, pairs)
    fields = ("source", "target") if pairs else ("tokens",)
    kind = pa.list_(pa.from_numpy_dtype(np.dtype(width)))
    table = pa.table(
        {
            **{f: pa.array([r[f] for r in rows], type=kind) for f in fields},
            "id": [r["id"] for r in rows],
            "text": [r["text"] for r in rows],
        }
    )
    ds = datasets.Dataset(table)
    kw: dict[str, Any] = {"pad_to_multiple_of": multiple}
    if truncate:
        kw.update(oversize="truncate")
        lengths = np.minimum(lengths, truncate)  # the collate cuts every row to `truncate`
    loss_field = lengths[:, 1] if pairs else lengths
    kw["loss_lengths"] = np.maximum(loss_field - offset, 0)
    collate = PaddingCollate(pad_to_multiple_of=multiple, loss_offset=offset, truncate_to=truncate)
    got = batches(ds, lengths, collate, **kw)
    want = batches(rows, lengths, collate, **kw)
    assert_same_batches(got, want)
    if not truncate:
        assert sum(int(b["nexamples"]) for b in got) == len(rows)


@pytest.mark.parametrize(
    "kind", [pa.list_(pa.int64()), pa.large_list(pa.int32())], ids=["list", "large_list"]
)
def test_a_hand_checked_batch(kind: pa.DataType) -> None:
    ds = datasets.Dataset(pa.table({"tokens": pa.array([[5, 6, 7], [8], [9, 9]], type=kind)}))
    items = attach_plan(fetch_rows(ds, [2, 0], columnar=True), [2, 0])
    assert isinstance(items, ColumnarItems)
    batch = PaddingCollate(pad_to_multiple_of=4)(items)
    assert batch["tokens"].tolist() == [[9, 9, 0, 0], [5, 6, 7, 0]]
    assert batch["tokens_mask"].sum().item() == 5
    assert [int(batch[k]) for k in ("ntokens", "nexamples", "padded_tokens")] == [5, 2, 8]


class CountingDataset(datasets.Dataset):
    calls = 0

    def __getitem__(self, key: Any) -> Any:
        type(self).calls += 1
        return super().__getitem__(key)


@pytest.mark.parametrize("columnar", [True, False], ids=["padding_collate", "own_collate"])
def test_one_read_per_micro_batch(columnar: bool) -> None:
    rows = make_rows(np.random.default_rng(1), 80, pairs=False)
    ds = CountingDataset(datasets.Dataset.from_list(rows).data)
    sampler = TokenBudgetBatchSampler(lengths_of(rows, False), 120, rank=0, world_size=1)

    def own(items: list[dict[str, Any]]) -> int:
        assert all(isinstance(i, dict) for i in items)
        return len(items)

    collate = PaddingCollate() if columnar else own
    loader = token_budget_dataloader(ds, sampler, collate_fn=collate)
    CountingDataset.calls = 0
    got = list(loader)
    assert CountingDataset.calls == len(got) == len(sampler)
    total = sum(int(b["nexamples"]) for b in got) if columnar else sum(got)
    assert total == len(rows)


def test_several_hf_datasets_are_read_part_by_part() -> None:
    rng = np.random.default_rng(2)
    a_rows, b_rows = make_rows(rng, 40, False), make_rows(rng, 30, False)
    a, b = datasets.Dataset.from_list(a_rows), datasets.Dataset.from_list(b_rows)
    concat = ConcatDataset([a, b])
    assert isinstance(fetch_rows(concat, [41, 45], columnar=True), pa.Table)
    assert fetch_rows(concat, [39, 40], columnar=True) == [a_rows[39], b_rows[0]]
    hf = TokenBudgetDataModule(
        [DataSource("tokens", dataset=a, name="a"), DataSource("tokens", dataset=b, name="b")],
        max_tokens=120,
        mixing="per_batch",
        seed=3,
    )
    plain = TokenBudgetDataModule(
        [
            DataSource(lengths_of(a_rows, False), dataset=a_rows, name="a"),
            DataSource(lengths_of(b_rows, False), dataset=b_rows, name="b"),
        ],
        max_tokens=120,
        mixing="per_batch",
        seed=3,
    )
    assert_same_batches(list(hf.train_dataloader()), list(plain.train_dataloader()))


@pytest.mark.parametrize("workers", [0, 2])
def test_datamodule_with_column_names_and_workers(workers: int) -> None:
    rows = make_rows(np.random.default_rng(3), 120, pairs=True)
    ds = datasets.Dataset.from_list(rows).shuffle(seed=1)
    listed = [ds[i] for i in range(len(ds))]
    loss = np.array([len(r["target"]) - 1 for r in listed])
    hf = TokenBudgetDataModule(
        ds,
        ("source", "target"),
        200,
        train_loss_lengths=loss,
        num_workers=workers,
        collate=PaddingCollate(loss_offset=1),
        val_dataset=ds,
        val_lengths=("source", "target"),
        val_loss_lengths=loss,
    )
    plain = TokenBudgetDataModule(
        listed,
        lengths_of(listed, True),
        200,
        train_loss_lengths=loss,
        num_workers=workers,
        collate=PaddingCollate(loss_offset=1),
        val_dataset=listed,
        val_lengths=lengths_of(listed, True),
        val_loss_lengths=loss,
    )
    assert_same_batches(list(hf.train_dataloader()), list(plain.train_dataloader()))
    assert_same_batches(list(hf.val_dataloader()), list(plain.val_dataloader()))


def test_a_bad_column_names_the_field_and_the_item() -> None:
    ds = datasets.Dataset.from_dict({"tokens": [[1, 2], None, [3]]})
    items = attach_plan(fetch_rows(ds, [0, 1], columnar=True), [0, 1])
    with pytest.raises(ValueError, match=r"Field 'tokens' of dataset item 1 is null"):
        PaddingCollate()(items)
    # a null inside a row names that row's item, not the micro-batch's first
    holes = datasets.Dataset.from_dict({"tokens": [[1, 2], [3], [4, None]]})
    items = attach_plan(fetch_rows(holes, [0, 2], columnar=True), [0, 2])
    with pytest.raises(TypeError, match=r"'tokens' of dataset item 2 holds a null token id"):
        PaddingCollate()(items)
    text = datasets.Dataset.from_dict({"tokens": ["a b", "c"]})
    items = attach_plan(fetch_rows(text, [1], columnar=True), [1])
    with pytest.raises(TypeError, match=r"Field 'tokens' of dataset item 1 is text"):
        PaddingCollate()(items)
