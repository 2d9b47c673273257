"""Shard sources: parquet, Arrow IPC, JSON lines, HF IterableDataset, litdata folders."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import re
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError
from lightning_varbatch.sources.file_shards import ArrowShard, JsonlShard, ParquetShard
from lightning_varbatch.sources.shard_index import check_rows
from lightning_varbatch.sources.shards import ReadStats, Shard, ShardedSource, shards_from_files

SHARD_ROWS = (20, 13, 25)
KINDS = ["parquet", "arrow", "arrow_stream", "jsonl", "hf_parquet", "hf_jsonl", "litdata"]


def make_item(i: int) -> dict:
    """Row ``i`` of the test corpus, deterministic."""
    rng = np.random.default_rng(i)
    n_src, n_tgt = int(rng.integers(1, 30)), int(rng.integers(1, 20))
    return {
        "src": rng.integers(0, 1000, n_src).tolist(),
        "tgt": rng.integers(0, 1000, n_tgt).tolist(),
        "n": n_src,
        "text": f"row {i}",
    }


def litdata_item(i: int) -> dict:
    item = make_item(i)
    return {**item, "src": np.asarray(item["src"], dtype=np.int64)}


def shard_items(s: int) -> list[dict]:
    start = sum(SHARD_ROWS[:s])
    return [make_item(i) for i in range(start, start + SHARD_ROWS[s])]


ALL_ITEMS = [make_item(i) for i in range(sum(SHARD_ROWS))]


def write_files(folder: Path, kind: str) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(len(SHARD_ROWS)):
        items = shard_items(s)
        table = pa.Table.from_pylist(items)
        if kind == "parquet":
            path = folder / f"part-{s}.parquet"
            pq.write_table(table, path, row_group_size=7)
        elif kind in ("arrow", "arrow_stream"):
            path = folder / f"part-{s}.arrow"
            new = pa.ipc.new_file if kind == "arrow" else pa.ipc.new_stream
            with new(str(path), table.schema) as writer:
                writer.write_table(table, max_chunksize=6)
        else:
            path = folder / f"part-{s}.jsonl"
            lines = [json.dumps(item) + "\n" for item in items]
            path.write_text("".join(lines[:3]) + "\n" + "".join(lines[3:]))  # a blank line
        paths.append(path)
    return paths


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default cache folder (cache_dir=True) in tmp_path, never the user's."""
    monkeypatch.setenv("LIGHTNING_VARBATCH_CACHE", str(tmp_path / "default-cache"))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("shards")
    for kind in ("parquet", "arrow", "arrow_stream", "jsonl"):
        write_files(root / kind, kind)
    return root


@pytest.fixture(scope="module")
def litdata_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import litdata  # the streaming extra: installed by the test command, never skipped

    out = tmp_path_factory.mktemp("litdata") / "optimized"
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(
            fn=litdata_item,
            inputs=list(range(len(ALL_ITEMS))),
            output_dir=str(out),
            chunk_size=16,
            num_workers=1,
            verbose=False,
            start_method="fork",  # its default, spawn, re-imports torch in a fresh process
        )
    finally:  # optimize sets the process-wide start method: later DataLoader workers slow
        multiprocessing.set_start_method(method, force=True)
    return out


def build(kind: str, data_root: Path, litdata_dir_fn, columns, cache_dir=None) -> ShardedSource:
    if kind in ("parquet", "arrow", "arrow_stream", "jsonl"):
        return shards_from_files(data_root / kind, columns, cache_dir=cache_dir)
    if kind.startswith("hf_"):
        import datasets  # the hf extra: installed by the test command, never skipped

        from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable

        fmt = kind[3:]
        files = sorted(str(p) for p in (data_root / fmt).iterdir())
        ds = datasets.load_dataset(
            "json" if fmt == "jsonl" else fmt, data_files=files, split="train", streaming=True
        )
        return shards_from_hf_iterable(ds, columns, cache_dir=cache_dir)
    from lightning_varbatch.sources.litdata_shards import shards_from_litdata

    return shards_from_litdata(litdata_dir_fn(), columns, cache_dir=cache_dir)


@pytest.fixture
def make(data_root: Path, request: pytest.FixtureRequest):
    def _make(kind: str, columns, cache_dir=None) -> ShardedSource:
        return build(
            kind, data_root, lambda: request.getfixturevalue("litdata_dir"), columns, cache_dir
        )

    return _make


def reference_lengths(columns) -> np.ndarray:
    def one(item: dict, c: str) -> int:
        return item[c] if c == "n" else len(item[c])

    if isinstance(columns, str):
        return np.array([one(it, columns) for it in ALL_ITEMS])
    return np.array([[one(it, c) for c in columns] for it in ALL_ITEMS])


def check_items(got: list[dict], rows: np.ndarray) -> None:
    assert len(got) == len(rows)
    for item, row in zip(got, rows.tolist(), strict=True):
        want = ALL_ITEMS[row]
        assert isinstance(item["src"], np.ndarray) and item["src"].ndim == 1
        assert np.issubdtype(item["src"].dtype, np.integer)
        assert item["src"].tolist() == want["src"]
        assert np.asarray(item["tgt"]).tolist() == want["tgt"]
        assert item["n"] == want["n"] and item["text"] == want["text"]


@pytest.mark.parametrize("kind", KINDS)
def test_lengths_reads_forward_and_cache(kind: str, make, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    source = make(kind, "src", cache_dir=cache)
    assert isinstance(source.shards[0], Shard)
    assert source.num_rows == len(ALL_ITEMS)
    np.testing.assert_array_equal(source.lengths(), reference_lengths("src"))
    if kind != "litdata":
        assert source.offsets.tolist() == np.cumsum((0, *SHARD_ROWS)).tolist()
    rng = np.random.default_rng(0)
    for s in range(source.num_shards):
        n = int(source.offsets[s + 1] - source.offsets[s])
        before = source.shards[s].stats.backward_seeks
        rows = np.sort(rng.choice(n, size=max(1, n // 2), replace=False))
        halves = (rows[: len(rows) // 2], rows[len(rows) // 2 :])  # two forward reads
        got = [item for part in halves for item in source.read(s, part)]
        check_items(got, rows + source.offsets[s])
        assert source.shards[s].stats.backward_seeks == before == 0
        list(source.read(s, rows[:1]))  # reading again from the front: one backward seek
        assert source.shards[s].stats.backward_seeks == 1
    stats = source.stats
    assert stats.rows_read >= len(ALL_ITEMS) // 2 and stats.opens > 0
    assert stats.rows_decoded >= stats.rows_read
    # a fresh source over the same unchanged files: lengths from the cache, no data read
    again = make(kind, "src", cache_dir=cache)
    np.testing.assert_array_equal(again.lengths(), reference_lengths("src"))
    assert again.stats.rows_decoded == 0 and again.stats.opens == 0
    assert again.fingerprint() == source.fingerprint()
    assert make(kind, "n", cache_dir=cache).fingerprint() != source.fingerprint()


@pytest.mark.parametrize("kind", KINDS)
def test_pair_and_length_columns(kind: str, make) -> None:
    pairs = make(kind, ("src", "tgt"))
    assert pairs.pairs
    np.testing.assert_array_equal(pairs.lengths(), reference_lengths(("src", "tgt")))
    by_count = make(kind, "n")
    np.testing.assert_array_equal(by_count.lengths(), reference_lengths("n"))


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl"])
def test_fields_and_block_reads(kind: str, data_root: Path) -> None:
    source = shards_from_files(data_root / kind, "src", fields=["text"], cache_dir=None)
    assert list(source.read(2, [1, 24])) == [{"text": "row 34"}, {"text": "row 57"}]
    stats = source.shards[2].stats
    assert stats.rows_read == 2
    if kind == "jsonl":
        assert stats.rows_decoded == 25 + 2  # the index pass, then only the 2 lines read
    else:  # the two blocks holding rows 1 and 24, not the whole file (25 rows)
        assert 2 < stats.rows_decoded - 25 < 25


@pytest.mark.parametrize("kind", KINDS)
def test_pickles_for_worker_processes(kind: str, make) -> None:
    source = make(kind, "src")
    list(source.read(1, [0]))
    copy = pickle.loads(pickle.dumps(source))
    check_items(list(copy.read(1, [2, 5])), np.array([2, 5]) + source.offsets[1])
    assert copy.fingerprint() == source.fingerprint()


def test_glob_list_and_single_file(data_root: Path) -> None:
    files = sorted((data_root / "parquet").glob("*.parquet"))
    by_glob = shards_from_files(str(data_root / "parquet" / "*.parquet"), "src", cache_dir=None)
    by_list = shards_from_files(files, "src", cache_dir=None)
    assert [s.name for s in by_glob.shards] == [s.name for s in by_list.shards]
    assert shards_from_files(files[1], "src", cache_dir=None).num_rows == SHARD_ROWS[1]
    assert len(list(by_list.read(0, []))) == 0


def test_default_cache_dir_from_env(data_root: Path, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("LIGHTNING_VARBATCH_CACHE", str(tmp_path))
    shards_from_files(data_root / "jsonl", "src").lengths()
    assert len(list((tmp_path / "lengths" / "shards").glob("*.offsets.npy"))) == 3


def test_cache_invalidated_when_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"ids": [1, 2]}\n')
    assert JsonlShard(path, "ids", cache_dir=tmp_path / "c").lengths().tolist() == [2]
    path.write_text('{"ids": [1, 2, 3]}\n{"ids": [4]}\n')
    shard = JsonlShard(path, "ids", cache_dir=tmp_path / "c")
    assert shard.lengths().tolist() == [3, 1] and shard.stats.rows_decoded == 2


def test_read_stats_merge() -> None:
    total = ReadStats(1, 2, 3, 0).merge(ReadStats(1, 1, 1, 1))
    assert total == ReadStats(opens=2, rows_read=3, rows_decoded=4, backward_seeks=1)


# ------------------------------------------------------------------ bad inputs


@pytest.mark.parametrize("kind", KINDS)
def test_missing_column(kind: str, make) -> None:
    with pytest.raises(ValueError, match=r"no (column|field) 'nope'.*change columns"):
        make(kind, ("src", "nope"))


def test_missing_field(data_root: Path) -> None:
    with pytest.raises(ValueError, match=r"fields: .*no column 'nope'"):
        shards_from_files(data_root / "parquet", "src", fields=["nope"], cache_dir=None)
    source = shards_from_files(data_root / "jsonl", "src", fields=["nope"], cache_dir=None)
    with pytest.raises(ValueError, match=r"fields: row 0 .* no field 'nope'"):
        list(source.read(0, [0]))


def test_bad_paths(data_root: Path, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="matches no files"):
        shards_from_files(str(tmp_path / "*.parquet"), "src")
    (tmp_path / "x.csv").write_text("a\n1\n")
    with pytest.raises(ValueError, match=r"suffix '\.csv'; supported are"):
        shards_from_files([tmp_path / "x.csv"], "src")
    with pytest.raises(ValueError, match=r"no .* files"):
        shards_from_files(tmp_path, "src")
    with pytest.raises(ValueError, match="does not exist"):
        shards_from_files([tmp_path / "gone.parquet"], "src")
    (tmp_path / "bad.jsonl").write_text('{"src": [1]}\n[1, 2]\n')
    with pytest.raises(ValueError, match=r"line 2 .* not a JSON object"):
        shards_from_files([tmp_path / "bad.jsonl"], "src", cache_dir=None)
    with pytest.raises(TypeError, match="columns must name one column"):
        shards_from_files(data_root / "parquet", [1, 2])
    with pytest.raises(ValueError, match=r"columns=.*two distinct"):
        shards_from_files(data_root / "parquet", ("src", "src"))


@pytest.mark.parametrize("kind", ["parquet", "jsonl", "hf_parquet"])
def test_rows_must_ascend(kind: str, make) -> None:
    source = make(kind, "src")
    with pytest.raises(ValueError, match=r"strictly ascending .* rows\[0\]=3 then rows\[1\]=1"):
        source.read(0, [3, 1])
    with pytest.raises(ValueError, match=r"rows must lie in \[0, 20\)"):
        source.read(0, [5, 20])
    with pytest.raises(TypeError, match="integer row numbers"):
        source.read(0, [0.5])
    with pytest.raises(IndexError, match="shard must be in"):
        source.read(3, [0])


def test_check_rows_accepts_empty_and_numpy() -> None:
    assert check_rows(np.array([], dtype=np.int32), 0, "x").dtype == np.int64
    assert check_rows(np.array([0, 4], dtype=np.uint8), 5, "x").tolist() == [0, 4]


def test_mismatched_shards(data_root: Path) -> None:
    a, b = sorted((data_root / "parquet").iterdir())[:2]
    with pytest.raises(
        ValueError, match=r"shards\[1\] .* \(source, target\) pairs but shards\[0\]"
    ):
        ShardedSource(
            [
                ParquetShard(a, "src", cache_dir=None),
                ParquetShard(b, ("src", "tgt"), cache_dir=None),
            ]
        )
    with pytest.raises(ValueError, match="at least one shard"):
        ShardedSource([])
    with pytest.raises(TypeError, match=r"shards\[0\] \(object\) is not a Shard"):
        ShardedSource([object()])  # type: ignore[list-item]

    class Wrong(ParquetShard):
        def lengths(self) -> np.ndarray:
            return np.ones(3, dtype=np.int32)

    with pytest.raises(ValueError, match=r"shards\[0\] .*shape \(3,\), expected \(20,\)"):
        ShardedSource([Wrong(a, "src", cache_dir=None)])


def test_arrow_not_ipc(tmp_path: Path) -> None:
    (tmp_path / "x.arrow").write_bytes(b"not arrow at all")
    with pytest.raises(ValueError, match="not an Arrow IPC file or stream"):
        ArrowShard(tmp_path / "x.arrow", "src")


def test_hf_refuses_map_style_and_others() -> None:
    import datasets  # the hf extra: installed by the test command, never skipped

    from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable

    ds = datasets.Dataset.from_dict({"src": [[1, 2]]})
    with pytest.raises(TypeError, match=r"map-style datasets.Dataset.*column_lengths"):
        shards_from_hf_iterable(ds, "src")
    with pytest.raises(TypeError, match=r"datasets.IterableDataset"):
        shards_from_hf_iterable([{"src": [1]}], "src")


def test_hf_transformed_not_cached(data_root: Path, tmp_path: Path) -> None:
    import datasets  # the hf extra: installed by the test command, never skipped

    from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable

    files = sorted(str(p) for p in (data_root / "parquet").iterdir())
    ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    doubled = ds.map(lambda row: {"src": row["src"] * 2})
    source = shards_from_hf_iterable(doubled, "src", cache_dir=tmp_path)
    np.testing.assert_array_equal(source.lengths(), 2 * reference_lengths("src"))
    assert "MappedExamplesIterable" in source.shards[0].name
    assert not list(tmp_path.iterdir())  # a transform: no cache (it could go stale)


def test_litdata_errors(tmp_path: Path, litdata_dir: Path) -> None:
    from lightning_varbatch.sources.litdata_shards import shards_from_litdata

    with pytest.raises(ValueError, match=r"no index.json"):
        shards_from_litdata(tmp_path, "src")
    source = shards_from_litdata(litdata_dir, "src", cache_dir=None)
    assert source.num_shards == 4 and source.shards[-1].num_rows == len(ALL_ITEMS) - 48


# ------------------------------------------------------------------ damaged files (issue 22)


def _truncate(path: Path, keep: float = 0.5) -> Path:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    return path


def _copy(data_root: Path, kind: str, tmp_path: Path) -> Path:
    import shutil

    out = tmp_path / kind
    shutil.copytree(data_root / kind, out)
    return out


@pytest.mark.parametrize(
    ("kind", "damage"),
    [
        ("parquet", "truncate"),
        ("parquet", "empty"),
        ("parquet", "garbage"),
        ("arrow", "truncate"),
        ("arrow_stream", "truncate"),
        ("arrow", "empty"),
    ],
)
def test_a_damaged_file_is_named_with_what_to_do(
    kind: str, damage: str, data_root: Path, tmp_path: Path
) -> None:
    folder = _copy(data_root, kind, tmp_path)
    victim = sorted(folder.iterdir())[1]
    if damage == "truncate":
        _truncate(victim)
    elif damage == "empty":
        victim.write_bytes(b"")
    else:
        victim.write_bytes(b"PAR1" + bytes(range(256)) * 4 + b"PAR1")
    with pytest.raises(ValueError) as caught:
        shards_from_files(folder, "src", cache_dir=None).lengths()
    text = str(caught.value)
    assert type(caught.value) is ValueError
    assert str(victim) in text and "damaged" in text and "re-copy" in text.lower()


def test_a_jsonl_line_cut_short_names_the_file_and_line(data_root: Path, tmp_path: Path) -> None:
    folder = _copy(data_root, "jsonl", tmp_path)
    victim = folder / "part-2.jsonl"
    victim.write_bytes(victim.read_bytes()[:-25])  # the last line loses its end
    with pytest.raises(ValueError, match=r"line 26 of .*part-2\.jsonl is not JSON"):
        shards_from_files(folder, "src", cache_dir=None)


def _bad_rows(kind: str, path: Path, value: object) -> Path:
    rows = [{"src": [1, 2]}, {"src": [3]}, {"src": value}, {"src": [4]}]
    if kind == "jsonl":
        path = path.with_suffix(".jsonl")
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        return path
    table = pa.Table.from_pylist(rows)
    if kind == "parquet":
        path = path.with_suffix(".parquet")
        pq.write_table(table, path, row_group_size=2)
    else:
        path = path.with_suffix(".arrow")
        with pa.ipc.new_file(str(path), table.schema) as writer:
            writer.write_table(table, max_chunksize=2)
    return path


@pytest.mark.parametrize(
    ("kind", "value", "error", "named", "row"),
    [
        *[(k, None, SettingValueError, r"null", True) for k in ("jsonl", "parquet", "arrow")],
        # a null token id inside a row: never read as float64 values (issue 31)
        *[(k, [1, None], SettingTypeError, r"null token id", True) for k in ("parquet", "arrow")],
        ("jsonl", [1, None], SettingTypeError, r"holding a null token id", True),
        ("jsonl", "a b c", SettingTypeError, r"is text .*token-id column", True),
        ("jsonl", [1.5, 2.0], SettingTypeError, r"holding 1\.5, not token ids", True),
        # an Arrow column has one type for all rows: the column is named, not a row
        ("parquet", [1.5, 2.0], TypeError, r"list of double, not of integer token ids", False),
        ("arrow", [1.5, 2.0], TypeError, r"list of double, not of integer token ids", False),
    ],
)
def test_nulls_text_and_floats_where_token_ids_belong_name_the_file_and_row(
    kind: str, value: object, error: type, named: str, row: bool, tmp_path: Path
) -> None:
    path = _bad_rows(kind, tmp_path / "bad", value)
    with pytest.raises(error) as caught:
        shards_from_files(path, "src", cache_dir=None).lengths()
    text = str(caught.value)
    assert type(caught.value) is error
    assert str(path) in text and ("row 2" in text or not row), text
    assert re.search(named, text), text
    if issubclass(error, SettingError):
        assert caught.value.setting == "columns"


def test_a_text_column_in_a_parquet_shard_says_to_tokenize(tmp_path: Path) -> None:
    pq.write_table(pa.table({"src": ["a b", "c"]}), tmp_path / "t.parquet")
    with pytest.raises(TypeError, match=r"t\.parquet.*holds text.*tokenize") as caught:
        shards_from_files(tmp_path / "t.parquet", "src", cache_dir=None)
    assert "a token-id column" in str(caught.value)  # counting tokens cannot stream text


def test_token_ids_with_a_null_inside_name_the_row(tmp_path: Path) -> None:
    path = tmp_path / "n.jsonl"
    path.write_text('{"src": [1, 2]}\n{"src": [3, null]}\n')
    with pytest.raises(TypeError, match=r"n\.jsonl\): row 1 field 'src' is a list holding a null"):
        shards_from_files(path, "src", cache_dir=None)


# ------------------------------------------------------------------ the index cache


@pytest.mark.parametrize("kind", ["parquet", "jsonl"])
@pytest.mark.parametrize("damage", ["truncate", "garbage", "other_rows"])
def test_a_damaged_index_cache_is_rebuilt_with_a_warning(
    kind: str, damage: str, data_root: Path, tmp_path: Path
) -> None:
    from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning

    cache = tmp_path / "cache"
    want = shards_from_files(data_root / kind, "src", cache_dir=cache).lengths()
    victim = sorted(cache.glob("*.lengths.npy"))[0]
    if damage == "truncate":
        _truncate(victim, 0.6)
    elif damage == "garbage":
        victim.write_bytes(b"not numpy at all")
    else:
        np.save(victim, np.ones(3, dtype=np.int64))
    shown = str(victim) if kind == "parquet" or damage != "other_rows" else victim.name
    with pytest.warns(LengthCacheWarning, match=re.escape(shown)):
        again = shards_from_files(data_root / kind, "src", cache_dir=cache)
        got = again.lengths()
    np.testing.assert_array_equal(got, want)
    assert again.stats.rows_decoded > 0  # rebuilt from the data
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and repaired: the next run reads it quietly
        np.testing.assert_array_equal(
            shards_from_files(data_root / kind, "src", cache_dir=cache).lengths(), want
        )


def test_an_unwritable_index_cache_warns_and_still_gives_the_lengths(
    data_root: Path, tmp_path: Path
) -> None:
    from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning

    blocker = tmp_path / "file"
    blocker.write_text("a file where the cache folder should be")
    with pytest.warns(LengthCacheWarning, match=r"could not write .*cache_dir") as caught:
        source = shards_from_files(data_root / "jsonl", "src", cache_dir=blocker / "cache")
        np.testing.assert_array_equal(source.lengths(), reference_lengths("src"))
    assert str(blocker) in str(caught[0].message)
    assert len(caught) == 1  # one warning for the folder, not one per shard
    decoded = source.stats.rows_decoded
    np.testing.assert_array_equal(source.lengths(), reference_lengths("src"))
    assert source.stats.rows_decoded == decoded  # kept in memory, not rebuilt per call
    check_items(list(source.read(1, [0, 4])), np.array([0, 4]) + source.offsets[1])


@pytest.mark.parametrize("kind", ["parquet", "arrow", "jsonl"])
def test_copied_shards_rebuild_the_cache_and_keep_their_identity(
    kind: str, data_root: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    here = shards_from_files(data_root / kind, "src", cache_dir=cache)
    copy = shards_from_files(_copy(data_root, kind, tmp_path), "src", cache_dir=cache)
    np.testing.assert_array_equal(copy.lengths(), here.lengths())
    assert copy.content_fingerprint() == here.content_fingerprint()
    assert [i["file"] for i in copy.identity()["shards"]] == [
        f"part-{s}.{'arrow' if kind == 'arrow' else kind}" for s in range(3)
    ]
    other = shards_from_files(data_root / kind, "n", cache_dir=cache)
    assert other.content_fingerprint() != here.content_fingerprint()
