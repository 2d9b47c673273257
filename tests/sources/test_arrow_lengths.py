"""Lengths read from Arrow columns equal a plain Python count of every row, for every column kind.

The reference is a loop over ``ds[i]`` (the rows as a user sees them); the family covers every
integer width of a length column, every Arrow list type of a token-id column, pairs, datasets
whose rows are remapped (select/shuffle/filter/sort), several chunks and files on disk.
"""

from __future__ import annotations

from pathlib import Path

import datasets
import numpy as np
import pyarrow as pa
import pytest

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner import DataSource
from lightning_varbatch.sources import column_lengths
from lightning_varbatch.sources.arrow_lengths import (
    arrow_table_of,
    is_column_spec,
    source_with_column_lengths,
)

RNG = np.random.default_rng(0)
N = 257
IDS = [RNG.integers(0, 30000, RNG.integers(1, 40)).tolist() for _ in range(N)]
TGT = [RNG.integers(0, 30000, RNG.integers(1, 25)).tolist() for _ in range(N)]


def reference(ds: datasets.Dataset, *columns: str) -> np.ndarray:
    rows = [ds[i] for i in range(len(ds))]
    per = [[r[c] if isinstance(r[c], int) else len(r[c]) for r in rows] for c in columns]
    return np.array(per[0]) if len(per) == 1 else np.array(per).T


INT_TYPES = [
    pa.int8(),
    pa.int16(),
    pa.int32(),
    pa.int64(),
    pa.uint8(),
    pa.uint16(),
    pa.uint32(),
    pa.uint64(),
]


@pytest.mark.parametrize("kind", INT_TYPES, ids=str)
def test_length_column_of_every_integer_width(kind: pa.DataType) -> None:
    values = [len(x) for x in IDS]
    table = pa.table({"n": pa.array(values, type=kind)})
    ds = datasets.Dataset(table)
    got = column_lengths(ds, "n")
    assert got.tolist() == reference(ds, "n").tolist()
    assert np.issubdtype(got.dtype, np.integer)


LIST_TYPES = {
    "list": lambda v: pa.array(v, type=pa.list_(pa.int32())),
    "large_list": lambda v: pa.array(v, type=pa.large_list(pa.int64())),
    "list_uint16": lambda v: pa.array(v, type=pa.list_(pa.uint16())),
}


@pytest.mark.parametrize("kind", sorted(LIST_TYPES))
def test_token_id_column_of_every_list_type(kind: str) -> None:
    ds = datasets.Dataset(pa.table({"ids": LIST_TYPES[kind](IDS)}))
    assert column_lengths(ds, "ids").tolist() == reference(ds, "ids").tolist()


def test_fixed_size_list_column() -> None:
    table = pa.table({"ids": pa.FixedSizeListArray.from_arrays(pa.array(range(12)), 4)})
    assert column_lengths(table, "ids").tolist() == [4, 4, 4]


def test_pairs_of_columns_mix_kinds() -> None:
    ds = datasets.Dataset.from_dict({"src": IDS, "tgt_len": [len(t) for t in TGT]})
    got = column_lengths(ds, ("src", "tgt_len"))
    assert got.shape == (N, 2)
    assert got.tolist() == reference(ds, "src", "tgt_len").tolist()


REMAPS = {
    "select": lambda d: d.select(range(N - 1, -1, -3)),
    "shuffle": lambda d: d.shuffle(seed=3),
    "filter": lambda d: d.filter(lambda r: len(r["src"]) % 2 == 0),
    "sort": lambda d: d.sort("key"),
    "shuffle_select": lambda d: d.shuffle(seed=1).select(range(50)),
    "train_test_split": lambda d: d.train_test_split(test_size=0.3, seed=0)["test"],
}


@pytest.mark.parametrize("remap", sorted(REMAPS))
def test_remapped_rows_keep_the_datasets_order(remap: str) -> None:
    base = datasets.Dataset.from_dict({"src": IDS, "tgt": TGT, "key": RNG.permutation(N).tolist()})
    ds = REMAPS[remap](base)
    assert column_lengths(ds, ("src", "tgt")).tolist() == reference(ds, "src", "tgt").tolist()


def test_several_chunks_and_files_on_disk(tmp_path: Path) -> None:
    parts = [datasets.Dataset.from_dict({"src": IDS[i::3]}) for i in range(3)]
    joined = datasets.concatenate_datasets(parts)
    assert joined.data.column("src").num_chunks >= 3
    joined.save_to_disk(str(tmp_path / "ds"), max_shard_size="10KB")
    loaded = datasets.load_from_disk(str(tmp_path / "ds"))
    assert len(loaded.cache_files) > 1
    for ds in (joined, loaded, loaded.shuffle(seed=2)):
        assert column_lengths(ds, "src").tolist() == reference(ds, "src").tolist()


def test_a_pyarrow_table_is_accepted_and_reads_no_token() -> None:
    table = pa.table({"ids": pa.array(IDS, type=pa.list_(pa.int32()))})
    assert column_lengths(table, "ids").tolist() == [len(x) for x in IDS]
    assert arrow_table_of(table) == (table, None)


def test_column_spec_detection() -> None:
    assert is_column_spec("n") and is_column_spec(("a", "b")) and is_column_spec(["a", "b"])
    assert (
        not is_column_spec([3, 4])
        and not is_column_spec(np.array([3]))
        and not (is_column_spec(None))
    )


def test_a_data_source_reads_its_own_columns() -> None:
    ds = datasets.Dataset.from_dict({"src": IDS, "tgt": TGT})
    source = DataSource(("src", "tgt"), dataset=ds, loss_lengths="tgt", name="wmt")
    resolved = source_with_column_lengths(source, "train_dataset[0]")
    assert resolved.lengths.tolist() == reference(ds, "src", "tgt").tolist()
    assert resolved.loss_lengths.tolist() == [len(t) for t in TGT]
    assert resolved.dataset is ds and resolved.name == "wmt"
    plain = DataSource(np.array([3, 4]))
    assert source_with_column_lengths(plain, "x") is plain


def test_nulls_the_dataset_filtered_out_are_not_its_rows() -> None:
    """The filter the null message gives must then be accepted (null rows and null ids)."""
    ds = datasets.Dataset.from_dict({"ids": [[1, 2], None, [3], [7, None], [4, 5, 6]]})
    with pytest.raises(SettingValueError, match=r"row 1 of column 'ids' is null") as caught:
        column_lengths(ds, "ids", "train_lengths")
    assert caught.value.setting == "train_lengths"
    fix = "ds = ds.filter(lambda r: r['ids'] is not None and None not in r['ids'])"
    assert fix in str(caught.value)
    kept = ds.filter(lambda r: r["ids"] is not None and None not in r["ids"])
    assert column_lengths(kept, "ids").tolist() == [2, 1, 3]


def test_a_null_is_named_by_the_datasets_own_row_after_a_select() -> None:
    ds = datasets.Dataset.from_dict({"ids": [[1, 2], None, [3], [4]]}).select([3, 0, 2, 1])
    with pytest.raises(SettingValueError, match=r"row 3 of column 'ids' is null \(1 row"):
        column_lengths(ds, "ids")
    inside = datasets.Dataset.from_dict({"ids": [[1, 2], [3, None], [4]]}).select([2, 1, 0])
    with pytest.raises(SettingTypeError, match=r"row 1 of column 'ids' holds a null token id"):
        column_lengths(inside, "ids")
