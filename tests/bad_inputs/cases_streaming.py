"""Streaming from shards: shard files, the stream, its saved position, its DataModule.

Example:
    >>> len(CASES) >= 14
    True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning_varbatch import StreamingBatches, StreamingDataModule, shards_from_files
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from lightning_varbatch.sources.shards import ShardedSource
from tests.bad_inputs.case import Case, error

AREA = "streaming"
SHARDS = "lightning_varbatch/sources/shards.py"
FILES = "lightning_varbatch/sources/file_shards.py"
STREAM = "lightning_varbatch/data/streaming.py"
WINDOWS = "lightning_varbatch/planner/windows.py"
MODULE = "lightning_varbatch/data/streaming_datamodule.py"


def _lines(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _source(tmp: Path) -> ShardedSource:
    shard = _lines(tmp / "a.jsonl", [{"tokens": [1, 2, 3]}, {"tokens": [4]}])
    return shards_from_files(shard, "tokens", cache_dir=None)


def _stream(tmp: Path, max_tokens: int = 8, **kwargs: Any) -> StreamingBatches:
    return StreamingBatches(_source(tmp), max_tokens, rank=0, world_size=1, **kwargs)


def _suffix(tmp: Path) -> None:
    (tmp / "b.txt").write_text("x")
    shards_from_files(tmp / "b.txt", "tokens", cache_dir=None)


def _json_array(tmp: Path) -> None:
    (tmp / "arr.json").write_text(json.dumps([{"tokens": [1]}]))
    shards_from_files(tmp / "arr.json", "tokens", cache_dir=None)


def _missing_column(tmp: Path) -> None:
    shard = _lines(tmp / "a.jsonl", [{"tokens": [1, 2, 3]}])
    shards_from_files(shard, "ids", cache_dir=None)


def _mixed(tmp: Path) -> None:
    one = _lines(tmp / "a.jsonl", [{"src": [1], "tgt": [2]}])
    two = _lines(tmp / "b.jsonl", [{"src": [1], "tgt": [2]}])
    ShardedSource(
        [
            *shards_from_files(one, "src", cache_dir=None).shards,
            *shards_from_files(two, ("src", "tgt"), cache_dir=None).shards,
        ]
    )


def _other_settings(tmp: Path) -> None:
    saved = _stream(tmp).state_dict()
    _stream(tmp, max_tokens=9).load_state_dict(saved)


CASES: list[Case] = [
    error(
        "stream-files-no-match",
        AREA,
        "shards_from_files('nothing*.jsonl', ...)",
        lambda tmp: shards_from_files(str(tmp / "nothing*.jsonl"), "tokens", cache_dir=None),
        "paths",
        "matches no files",
        fix_in=SHARDS,
        raises=SettingValueError,
    ),
    error(
        "stream-files-suffix",
        AREA,
        "shards_from_files('b.txt', ...)",
        _suffix,
        "paths",
        ".txt",
        ".parquet",
        fix_in=SHARDS,
        raises=SettingValueError,
    ),
    error(
        "stream-files-json-array",
        AREA,
        "a JSON array file instead of JSON lines",
        _json_array,
        "paths",
        "one object",
        fix_in=FILES,
        raises=ValueError,
    ),
    error(
        "stream-files-missing-column",
        AREA,
        "shards_from_files(..., columns='ids') without an 'ids' field",
        _missing_column,
        "columns",
        "'ids'",
        "tokens",
        fix_in=FILES,
        raises=SettingValueError,
    ),
    error(
        "stream-source-mixed-columns",
        AREA,
        "ShardedSource of a 1-D shard and a (source, target) shard",
        _mixed,
        "shards[1]",
        "same columns",
        fix_in=SHARDS,
        raises=ValueError,
    ),
    error(
        "stream-read-descending",
        AREA,
        "source.read(0, [1, 0])",
        lambda tmp: list(_source(tmp).read(0, [1, 0])),
        "rows",
        "ascending",
        fix_in=FILES,
        raises=ValueError,
    ),
    error(
        "stream-not-a-source",
        AREA,
        "StreamingBatches([1, 2], 8)",
        lambda tmp: StreamingBatches([1, 2], 8),  # type: ignore[arg-type]
        "source",
        "ShardedSource",
        "shards_from_files",
        raises=SettingTypeError,
        fix_in=STREAM,
    ),
    error(
        "stream-max-shapes",
        AREA,
        "StreamingBatches(..., max_shapes=2)",
        lambda tmp: _stream(tmp, max_shapes=2),
        "max_shapes",
        "Unset max_shapes",
        fix_in=WINDOWS,
        raises=SettingValueError,
    ),
    error(
        "stream-window-zero",
        AREA,
        "StreamingBatches(..., window=0)",
        lambda tmp: _stream(tmp, window=0),
        "window",
        "positive",
        fix_in=WINDOWS,
        raises=SettingValueError,
        setting="window",
    ),
    error(
        "stream-over-budget",
        AREA,
        "StreamingBatches(..., max_tokens=2) with an example of 3 tokens",
        lambda tmp: list(_stream(tmp, max_tokens=2)),
        "max_tokens=2",
        "oversize",
        fix_in=STREAM,
        setting="max_tokens",
        raises=SettingValueError,
    ),
    error(
        "stream-state-other-settings",
        AREA,
        "load_state_dict of a stream saved with max_tokens=8 into max_tokens=9",
        _other_settings,
        "max_tokens: saved 8, now 9",
        fix_in=STREAM,
        raises=ResumeMismatchError,
    ),
    error(
        "stream-state-damaged",
        AREA,
        "load_state_dict({'epoch': 0})",
        lambda tmp: _stream(tmp).load_state_dict({"epoch": 0}),
        "StreamingBatches state",
        "window",
        fix_in=STREAM,
        raises=ValueError,
    ),
    error(
        "stream-dm-world-size",
        AREA,
        "StreamingDataModule(..., world_size=2)",
        lambda tmp: StreamingDataModule(_source(tmp), 8, world_size=2),
        "world_size",
        "Trainer",
        raises=SettingTypeError,
        fix_in=MODULE,
    ),
    error(
        "stream-dm-collate",
        AREA,
        "StreamingDataModule(..., collate=3)",
        lambda tmp: StreamingDataModule(_source(tmp), 8, collate=3),  # type: ignore[arg-type]
        "collate",
        "callable",
        setting="collate",
        raises=SettingTypeError,
        fix_in=MODULE,
    ),
    error(
        "stream-dm-val-without-lengths",
        AREA,
        "StreamingDataModule(..., val_dataset=...) without val_lengths",
        lambda tmp: StreamingDataModule(_source(tmp), 8, val_dataset=[{"tokens": [1]}]),
        "val_dataset",
        "val_lengths",
        fix_in=MODULE,
        raises=SettingValueError,
        setting="val_lengths",
    ),
]
