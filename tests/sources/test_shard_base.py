"""The cached shard base: every shard kind gets its lengths index once and counts its reads."""

from __future__ import annotations

import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_varbatch.sources.file_shards import ArrowShard, JsonlShard, ParquetShard
from lightning_varbatch.sources.hf_iterable import HFIterableShard
from lightning_varbatch.sources.litdata_shards import LitdataShard
from lightning_varbatch.sources.shard_base import CachedShard, FileBackedShard
from lightning_varbatch.sources.shard_index import file_key
from lightning_varbatch.sources.shards import ShardedSource
from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning


class Counting(FileBackedShard):
    """A shard over a text file of one integer per line, counting how often it is built."""

    kind = "counting"
    index_names = ("lengths", "squares")

    def __init__(self, path: Path, cache_dir: Any) -> None:
        super().__init__(path, "n", cache_dir=cache_dir)
        self.builds = 0

    def _build_index(self) -> dict[str, np.ndarray]:
        self.builds += 1
        values = np.array([int(v) for v in Path(self._file).read_text().split()], np.int64)
        return {"lengths": values, "squares": values**2}

    def _read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        squares = self._index_array("squares")
        for row in rows.tolist():
            self.stats.rows_read += 1
            yield {"n": int(self.lengths()[row]), "square": int(squares[row])}


@pytest.fixture
def numbers(tmp_path: Path) -> Path:
    path = tmp_path / "data" / "numbers.txt"
    path.parent.mkdir()
    path.write_text("3\n1\n4\n1\n5\n")
    return path


def test_every_shipped_shard_kind_is_a_cached_shard() -> None:
    for kind in (ParquetShard, ArrowShard, JsonlShard, LitdataShard):
        assert issubclass(kind, FileBackedShard)
    assert issubclass(HFIterableShard, CachedShard)


def test_the_index_is_built_once_and_a_fresh_shard_loads_it_from_the_disk_cache(
    numbers: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    first = Counting(numbers, cache)
    assert first.num_rows == 5 and first.lengths().tolist() == [3, 1, 4, 1, 5]
    assert first.builds == 1
    assert sorted(p.name.split(".")[1] for p in cache.iterdir()) == ["lengths", "squares"]
    fresh = Counting(numbers, cache)
    assert [item["square"] for item in fresh.read([1, 4])] == [1, 25]
    assert fresh.builds == 0  # both arrays of the index came from the cache


def test_a_changed_file_gets_a_new_key_and_is_indexed_again(numbers: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    Counting(numbers, cache).lengths()
    before = file_key(numbers, "counting", ("n",))
    numbers.write_text("2\n7\n")
    changed = Counting(numbers, cache)
    assert changed.lengths().tolist() == [2, 7] and changed.builds == 1
    assert file_key(numbers, "counting", ("n",)) != before


def test_without_a_cache_the_index_is_kept_in_memory_after_one_build(numbers: Path) -> None:
    shard = Counting(numbers, None)
    assert shard.lengths() is shard.lengths()
    list(shard.read([0, 2]))
    assert shard.builds == 1 and shard.cache_dir is None


def test_an_unwritable_cache_warns_and_keeps_the_index_in_memory(
    numbers: Path, tmp_path: Path
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    shard = Counting(numbers, blocked / "cache")
    with pytest.warns(LengthCacheWarning, match="could not write"):
        assert shard.lengths().tolist() == [3, 1, 4, 1, 5]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        shard.lengths()
    assert shard.builds == 1 and shard.cache_dir is None


def test_reads_are_checked_and_a_read_before_the_last_one_ends_is_a_backward_seek(
    numbers: Path,
) -> None:
    shard = Counting(numbers, None)
    assert [item["n"] for item in shard.read([0, 2])] == [3, 4]
    list(shard.read([3]))
    assert shard.stats.backward_seeks == 0
    list(shard.read([1]))
    assert shard.stats.backward_seeks == 1 and shard.stats.rows_read == 4
    with pytest.raises(ValueError, match=r"read \(.*numbers.txt\): rows must be strictly"):
        shard.read([2, 2])
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 5\)"):
        shard.read([5])


def test_a_file_backed_shard_has_the_same_content_identity_in_another_folder(
    numbers: Path, tmp_path: Path
) -> None:
    copy = tmp_path / "copy" / numbers.name
    copy.parent.mkdir()
    shutil.copy(numbers, copy)
    here, there = (ShardedSource([Counting(p, None)], "n") for p in (numbers, copy))
    assert here.shards[0].name == os.path.abspath(numbers)
    assert here.content_fingerprint() == there.content_fingerprint()
    assert here.fingerprint() != there.fingerprint()
    assert here.identity()["shards"][0]["bytes"] == numbers.stat().st_size


def test_real_kinds_load_their_lengths_from_the_cache_without_reading_data(
    tmp_path: Path,
) -> None:
    path = tmp_path / "a.parquet"
    pq.write_table(pa.table({"ids": [[1, 2, 3], [4], [5, 6]]}), path)
    cache = tmp_path / "cache"
    assert ParquetShard(path, "ids", cache_dir=cache).lengths().tolist() == [3, 1, 2]
    again = ParquetShard(path, "ids", cache_dir=cache)
    assert again.lengths().tolist() == [3, 1, 2]
    assert again.stats.opens == 0 and again.stats.rows_decoded == 0
