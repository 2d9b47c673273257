"""Shard files and the stream over them: damaged files, bad rows, resumes, impossible settings.

Damaged files (cut short, empty, not their format), nulls, text or floats where token ids
belong and rows over the budget name the file and the row; a resume after the same shards were
reordered or changed says which (and what changed), while identical shards under another folder
(node-local disk) resume; stream settings the data cannot meet name the setting and the value
that works; a damaged or unwritable index cache warns and the lengths are right either way.

Example:
    >>> len(CASES) >= 20
    True
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from lightning_varbatch import StreamingBatches, shards_from_files
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning
from tests.bad_inputs.case import Case, accepted, error

AREA = "streaming"
FILES = "lightning_varbatch/sources/file_shards.py"
INDEX = "lightning_varbatch/sources/shard_index.py"
SHARDS = "lightning_varbatch/sources/shards.py"
HF = "lightning_varbatch/sources/hf_iterable.py"
STREAM = "lightning_varbatch/data/streaming.py"
LENGTHS = "lightning_varbatch/sources/arrow_lengths.py"
WINDOWS = "lightning_varbatch/planner/windows.py"

ROWS = [[1 + (i * 7) % 11] * (1 + (i * 5) % 9) for i in range(40)]  # lengths 1..9


def _write(folder: Path, kind: str = "jsonl", parts: int = 4) -> list[Path]:
    """``parts`` shards of ``ROWS`` (10 rows each) as ``kind`` files: part-0, part-1, ..."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for s in range(parts):
        rows = [{"tokens": r, "id": 10 * s + i} for i, r in enumerate(ROWS[10 * s : 10 * s + 10])]
        path = folder / f"part-{s}.{kind}"
        if kind == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        elif kind == "parquet":
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=3)
        else:
            table = pa.Table.from_pylist(rows)
            with pa.ipc.new_file(str(path), table.schema) as writer:
                writer.write_table(table, max_chunksize=3)
        paths.append(path)
    return paths


def _stream(paths: Any, **kwargs: Any) -> StreamingBatches:
    settings = {"max_tokens": 24, "window": 20, "rank": 0, "world_size": 2, **kwargs}
    return StreamingBatches(shards_from_files(paths, "tokens", cache_dir=None), **settings)


def _damaged(kind: str, how: str) -> Any:
    def run(tmp: Path) -> None:
        paths = _write(tmp / "data", kind)
        data = paths[2].read_bytes()
        paths[2].write_bytes(b"" if how == "empty" else data[: len(data) // 2])
        shards_from_files(tmp / "data", "tokens", cache_dir=None).lengths()

    return run


def _arrow_stream_cut(tmp: Path) -> None:
    table = pa.Table.from_pylist([{"tokens": r} for r in ROWS])
    path = tmp / "s.arrow"
    with pa.ipc.new_stream(str(path), table.schema) as writer:
        writer.write_table(table, max_chunksize=5)
    path.write_bytes(path.read_bytes()[:-300])
    shards_from_files(path, "tokens", cache_dir=None)


def _jsonl_line(tmp: Path) -> None:
    paths = _write(tmp / "data")
    paths[1].write_text(paths[1].read_text() + '{"tokens": [1, 2\n')
    shards_from_files(tmp / "data", "tokens", cache_dir=None)


def _bad_row(kind: str, value: Any) -> Any:
    def run(tmp: Path) -> None:
        rows = [{"tokens": [1, 2]}, {"tokens": [3]}, {"tokens": value}, {"tokens": [4]}]
        path = tmp / f"bad.{kind}"
        if kind == "jsonl":
            path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        else:
            pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=2)
        shards_from_files(path, "tokens", cache_dir=None)

    return run


def _text_column(tmp: Path) -> None:
    pq.write_table(pa.table({"tokens": ["a b c", "d"]}), tmp / "text.parquet")
    shards_from_files(tmp / "text.parquet", "tokens", cache_dir=None)


def _hf_damaged(tmp: Path) -> None:
    import datasets

    from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable

    paths = _write(tmp / "data", "parquet")
    paths[3].write_bytes(paths[3].read_bytes()[:100])
    files = [str(p) for p in paths]
    ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
    shards_from_hf_iterable(ds, "tokens", cache_dir=None)


def _hf_text(tokenize: bool) -> Any:
    """A streaming HF dataset of text; with ``tokenize``, the fix its error gives (ds.map)."""

    def run(tmp: Path) -> None:
        import datasets

        from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable

        pq.write_table(pa.table({"text": ["a b c", "d", "e f"]}), tmp / "text.parquet")
        ds = datasets.load_dataset("parquet", data_files=str(tmp / "text.parquet"), streaming=True)
        ds = ds["train"]
        if not tokenize:
            shards_from_hf_iterable(ds, "text", cache_dir=None)
            return
        words = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "f": 6}
        ids = ds.map(lambda b: {"input_ids": [[words[w] for w in t.split()] for t in b["text"]]},
                     batched=True)  # fmt: skip
        source = shards_from_hf_iterable(ids, "input_ids", cache_dir=None)
        batches = list(StreamingBatches(source, 8, rank=0, world_size=1))
        assert sum(int(b["nexamples"]) for b in batches) == 3

    return run


def _over_budget(tmp: Path) -> None:
    paths = _write(tmp / "data", "parquet")
    rows = [{"tokens": [1] * 3, "id": 0}, {"tokens": [2] * 40, "id": 1}]
    pq.write_table(pa.Table.from_pylist(rows), paths[1])
    list(_stream(tmp / "data", world_size=1))


def _saved(tmp: Path) -> dict[str, Any]:
    _write(tmp / "data")
    return _stream(tmp / "data").state_dict(trained=2)


def _reordered(tmp: Path) -> None:
    state = _saved(tmp)
    files = sorted((tmp / "data").glob("*.jsonl"))
    _stream([files[1], files[0], *files[2:]]).load_state_dict(state)


def _changed(tmp: Path) -> None:
    state = _saved(tmp)
    victim = tmp / "data" / "part-2.jsonl"
    victim.write_text(victim.read_text() + json.dumps({"tokens": [5, 5], "id": 99}) + "\n")
    _stream(tmp / "data").load_state_dict(state)


def _missing(tmp: Path) -> None:
    state = _saved(tmp)
    (tmp / "data" / "part-3.jsonl").unlink()
    _stream(tmp / "data").load_state_dict(state)


def _copied(tmp: Path) -> None:
    state = _saved(tmp)
    full = list(_stream(tmp / "data"))
    shutil.copytree(tmp / "data", tmp / "node-local")  # another folder, same files
    moved = _stream(tmp / "node-local")
    moved.load_state_dict(state)
    rest = list(moved)
    assert [b["id"].tolist() for b in rest] == [b["id"].tolist() for b in full[2:]]


def _old_checkpoint(tmp: Path) -> None:
    state = _saved(tmp)
    old = {k: v for k, v in state.items() if k != "shard_identity"}  # the earlier format
    full = list(_stream(tmp / "data"))
    again = _stream(tmp / "data")
    again.load_state_dict(old)
    assert [b["id"].tolist() for b in again] == [b["id"].tolist() for b in full[2:]]


def _window_small(tmp: Path) -> None:
    _write(tmp / "data")
    list(_stream(tmp / "data", window=5, world_size=4, accumulate_grad_batches=2))


def _drop_small(tmp: Path) -> None:
    _write(tmp / "data")
    list(_stream(tmp / "data", window=5, max_tokens=512, tail="drop", world_size=2))


def _too_few(tmp: Path) -> None:
    _write(tmp / "data", parts=1)
    list(_stream(tmp / "data", world_size=16))


def _index_damaged(tmp: Path) -> None:
    _write(tmp / "data")
    want = shards_from_files(tmp / "data", "tokens", cache_dir=tmp / "cache").lengths()
    for f in (tmp / "cache").glob("*.lengths.npy"):
        f.write_bytes(f.read_bytes()[:70])
    got = shards_from_files(tmp / "data", "tokens", cache_dir=tmp / "cache").lengths()
    assert np.array_equal(got, want)


def _index_unwritable(tmp: Path) -> None:
    _write(tmp / "data")
    (tmp / "blocker").write_text("a file where the cache folder should be")
    source = shards_from_files(tmp / "data", "tokens", cache_dir=tmp / "blocker" / "cache")
    assert source.lengths().tolist() == [len(r) for r in ROWS]


CASES: list[Case] = [
    error(
        "streaming-shard-parquet-truncated",
        AREA,
        "a parquet shard cut short (an interrupted copy)",
        _damaged("parquet", "cut"),
        "part-2.parquet",
        "damaged",
        "re-copy",
        raises=ValueError,
        fix_in=FILES,
    ),
    error(
        "streaming-shard-parquet-empty",
        AREA,
        "an empty (0-byte) parquet shard",
        _damaged("parquet", "empty"),
        "part-2.parquet",
        "0 bytes",
        raises=ValueError,
        fix_in=FILES,
    ),
    error(
        "streaming-shard-arrow-truncated",
        AREA,
        "an Arrow IPC file shard cut short",
        _damaged("arrow", "cut"),
        "part-2.arrow",
        "damaged",
        raises=ValueError,
        fix_in=FILES,
    ),
    error(
        "streaming-shard-arrow-stream-truncated",
        AREA,
        "an Arrow IPC stream shard whose last batch is cut short",
        _arrow_stream_cut,
        "s.arrow",
        "damaged",
        "record batches",
        raises=ValueError,
        fix_in=FILES,
    ),
    error(
        "streaming-shard-jsonl-invalid-line",
        AREA,
        "a JSON-lines shard whose last line is cut short",
        _jsonl_line,
        "part-1.jsonl",
        "line 11",
        "not JSON",
        raises=ValueError,
        fix_in=FILES,
    ),
    error(
        "streaming-shard-null-row",
        AREA,
        "a JSON-lines shard with a null token list at row 2",
        _bad_row("jsonl", None),
        "bad.jsonl",
        "row 2",
        "null",
        raises=SettingValueError,
        setting="columns",
        fix_in="lightning_varbatch/sources/shard_items.py",
    ),
    error(
        "streaming-shard-null-row-parquet",
        AREA,
        "a parquet shard with a null token list at row 2",
        _bad_row("parquet", None),
        "bad.parquet",
        "row 2",
        "is null",
        raises=SettingValueError,
        setting="columns",
        fix_in=LENGTHS,
    ),
    error(
        "streaming-shard-token-null-inside-parquet",
        AREA,
        "a parquet shard with a null inside row 2's token ids",
        _bad_row("parquet", [1, None, 3]),
        "shard",
        "bad.parquet",
        "row 2",
        "null token id",
        raises=SettingTypeError,
        setting="columns",
        fix_in=LENGTHS,
        not_blame=("float64",),
    ),
    error(
        "streaming-shard-text-row",
        AREA,
        "a JSON-lines shard with text instead of token ids at row 2",
        _bad_row("jsonl", "the cat sat"),
        "bad.jsonl",
        "row 2",
        "text",
        "token-id column",
        "ds.map",
        raises=SettingTypeError,
        setting="columns",
        fix_in="lightning_varbatch/sources/shard_items.py",
        not_blame=("tokenized_lengths",),
    ),
    error(
        "streaming-shard-text-column",
        AREA,
        "a parquet shard whose token column holds text",
        _text_column,
        "text.parquet",
        "holds text",
        "token-id column",
        "ds.map",
        raises=SettingTypeError,
        setting="columns",
        fix_in=LENGTHS,
        not_blame=("tokenized_lengths",),
    ),
    error(
        "streaming-shard-float-ids",
        AREA,
        "a JSON-lines shard with float token ids at row 2",
        _bad_row("jsonl", [1.5, 2.5]),
        "bad.jsonl",
        "row 2",
        "1.5",
        "integer",
        raises=SettingTypeError,
        setting="columns",
        fix_in="lightning_varbatch/sources/shard_items.py",
    ),
    error(
        "streaming-shard-token-null-inside",
        AREA,
        "a JSON-lines shard with a null inside row 2's token ids",
        _bad_row("jsonl", [1, None, 3]),
        "bad.jsonl",
        "row 2",
        "null token id",
        raises=SettingTypeError,
        setting="columns",
        fix_in="lightning_varbatch/sources/shard_items.py",
    ),
    error(
        "streaming-shard-hf-damaged",
        AREA,
        "a streaming HF dataset over a parquet file cut short",
        _hf_damaged,
        "part-3.parquet",
        "damaged",
        "data_files",
        raises=ValueError,
        fix_in=HF,
    ),
    error(
        "streaming-shard-hf-text",
        AREA,
        "a streaming HF dataset whose column holds text",
        _hf_text(tokenize=False),
        "row 0",
        "text",
        "token-id column",
        "ds.map",
        raises=SettingTypeError,
        setting="columns",
        fix_in="lightning_varbatch/sources/shard_items.py",
        not_blame=("tokenized_lengths",),
    ),
    accepted(
        "streaming-shard-hf-text-tokenized",
        AREA,
        "the same text tokenized with ds.map, as the error advises, then streamed",
        _hf_text(tokenize=True),
        fix_in="lightning_varbatch/sources/shard_items.py",
    ),
    error(
        "streaming-shard-row-over-budget",
        AREA,
        "a 40-token row (shard part-1, row 1) with max_tokens=24",
        _over_budget,
        "part-1.parquet",
        "row 1",
        "max_tokens >= 40",
        "oversize",
        raises=SettingValueError,
        setting="max_tokens",
        fix_in=WINDOWS,
    ),
    error(
        "streaming-resume-reordered",
        AREA,
        "a resume with the same shards in another order",
        _reordered,
        "another order",
        "part-0.jsonl was shards[0], now shards[1]",
        raises=ResumeMismatchError,
        fix_in=STREAM,
        not_blame=("part-2.jsonl",),
    ),
    error(
        "streaming-resume-changed-shard",
        AREA,
        "a resume after a row was appended to part-2.jsonl",
        _changed,
        "part-2.jsonl changed",
        "10 rows saved, 11 now",
        raises=ResumeMismatchError,
        fix_in=STREAM,
        not_blame=("part-0.jsonl", "part-1.jsonl"),
    ),
    error(
        "streaming-resume-missing-shard",
        AREA,
        "a resume after part-3.jsonl was removed",
        _missing,
        "part-3.jsonl is missing",
        raises=ResumeMismatchError,
        fix_in=STREAM,
    ),
    accepted(
        "streaming-resume-ok-copied-folder",
        AREA,
        "a resume from identical shards copied to another folder (node-local disk)",
        _copied,
        fix_in=STREAM,
    ),
    accepted(
        "streaming-resume-ok-old-checkpoint",
        AREA,
        "a position saved before shard identities (same shards, same path)",
        _old_checkpoint,
        fix_in=STREAM,
    ),
    error(
        "streaming-window-too-small",
        AREA,
        "window=5 with world_size=4 x accumulate_grad_batches=2 (8 micro-batches a step)",
        _window_small,
        "window=5",
        "window >= 8",
        raises=SettingValueError,
        setting="window",
        fix_in=WINDOWS,
        not_blame=("more data",),
    ),
    error(
        "streaming-tail-drop-window-too-small",
        AREA,
        "tail='drop' with window=5: one micro-batch a window for 2 ranks",
        _drop_small,
        "window=5",
        "drop them all",
        "tail='spread'",
        raises=SettingValueError,
        setting="window",
        fix_in=WINDOWS,
        not_blame=("more data",),
    ),
    error(
        "streaming-too-few-examples",
        AREA,
        "10 examples for world_size=16",
        _too_few,
        "only 10 examples",
        "tail='pad'",
        "world_size <= 10",
        raises=SettingValueError,
        setting="tail",
        fix_in=WINDOWS,
        not_blame=("more data",),
    ),
    error(
        "streaming-shard-index-damaged",
        AREA,
        "cached shard indexes cut short",
        _index_damaged,
        "damaged",
        ".lengths.npy",
        "rebuilding",
        raises=LengthCacheWarning,
        warn_ok=True,
        fix_in=INDEX,
    ),
    error(
        "streaming-shard-index-unwritable",
        AREA,
        "a shard-index cache folder that cannot be created",
        _index_unwritable,
        "could not write",
        "blocker",
        "cache_dir=",
        raises=LengthCacheWarning,
        warn_ok=True,
        fix_in=INDEX,
    ),
]
