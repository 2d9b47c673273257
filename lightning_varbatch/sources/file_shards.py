r"""Shards over files: parquet, Arrow IPC and JSON lines, read front to back.

Parquet and Arrow shards know their row counts and blocks (row groups, record batches) from
metadata; ``read(rows)`` reads only the blocks that hold the rows, only the ``fields`` columns.
A JSON-lines shard indexes every line's byte offset in one pass, then seeks forward to the
lines it needs. Lengths are cached on disk (:mod:`~lightning_varbatch.sources.shard_index`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.sources.arrow_lengths import Columns, column_lengths
from lightning_varbatch.sources.shard_base import FileBackedShard
from lightning_varbatch.sources.shard_index import CacheDir, column_names
from lightning_varbatch.sources.shard_items import (
    lengths_array,
    numpy_fields,
    row_lengths,
    table_items,
)

__all__ = ["ArrowShard", "JsonlShard", "ParquetShard"]


def _spec(names: tuple[str, ...]) -> Columns:
    return names[0] if len(names) == 1 else (names[0], names[1])


class _FileShard(FileBackedShard):
    """What the file shards add to :class:`FileBackedShard`: the path check, fields, errors."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        columns: Columns,
        *,
        fields: Sequence[str] | None = None,
        cache_dir: CacheDir = True,
    ) -> None:
        if not Path(path).is_file():
            raise SettingValueError(
                f"paths: {str(path)!r} does not exist or is not a file: check the path (or "
                "copy the shard there).",
                setting="paths",
                value=path,
            )
        column_names(columns)  # checked before fields, as the settings are listed
        if fields is not None and (isinstance(fields, str) or not fields):
            raise TypeError(f"fields must be a non-empty list of column names, got {fields!r}.")
        super().__init__(path, columns, cache_dir=cache_dir)
        self.path = Path(path)
        self.fields = None if fields is None else list(fields)
        self._read_metadata()

    def _read_metadata(self) -> None:
        """Read what the file's metadata gives (row counts, column names), if anything."""

    def _corrupt(self, error: BaseException, what: str) -> ValueError:
        return ValueError(
            f"paths: {self.name} is damaged or not a valid {self.kind} file: {what} failed "
            f"({type(error).__name__}: {error}). Re-write or re-copy it, or remove it from "
            "paths."
        )

    def _check_names(self, available: Sequence[str]) -> None:
        for setting, names in (("columns", self.columns), ("fields", self.fields or ())):
            missing = [c for c in names if c not in available]
            if missing:
                raise SettingValueError(
                    f"{setting}: {self.name} has no column {missing[0]!r}; its columns are "
                    f"{list(available)}: change {setting} to name one of them.",
                    setting=setting,
                    value=list(names),
                )

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self.path)!r}, columns={_spec(self.columns)!r})"


class _BlockShard(_FileShard):
    """A shard stored as blocks of rows (row groups, record batches)."""

    _block_rows: np.ndarray  # rows per block

    def _read_metadata(self) -> None:
        sizes, names = self._open()
        self._block_rows = np.array(sizes, dtype=np.int64)
        self._check_names(names)

    def _open(self) -> tuple[list[int], list[str]]:
        """The rows of each block and the column names (from the file's metadata)."""
        raise NotImplementedError

    @property
    def num_rows(self) -> int:
        """Rows in the file (from its metadata)."""
        return int(self._block_rows.sum())

    def _known_rows(self) -> int | None:
        return self.num_rows

    def _blocks(self, needed: list[int]) -> Iterator[tuple[int, Any]]:
        raise NotImplementedError

    def _table(self) -> Any:
        raise NotImplementedError

    def _build_index(self) -> dict[str, np.ndarray]:
        self.stats.opens += 1
        self.stats.rows_decoded += self.num_rows
        if self.num_rows == 0:
            return {"lengths": np.zeros((0,) if len(self.columns) == 1 else (0, 2), np.int32)}
        try:
            table = self._table()
        except (OSError, ValueError) as error:  # pyarrow's ArrowInvalid is a ValueError
            raise self._corrupt(error, f"reading columns {list(self.columns)}") from None
        return {"lengths": column_lengths(table, _spec(self.columns), self._where(), shard=True)}

    def _read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """The items of ``rows``, reading only the blocks that hold them."""
        if not rows.size:
            return
        starts = np.concatenate([[0], np.cumsum(self._block_rows)])
        block_of = np.searchsorted(starts, rows, side="right") - 1
        needed = np.unique(block_of).tolist()
        self.stats.opens += 1
        blocks = self._blocks(needed)
        while True:
            try:
                block, data = next(blocks)
            except StopIteration:
                return
            except (OSError, ValueError) as error:
                raise self._corrupt(error, f"reading rows {rows[0]}..{rows[-1]}") from None
            local = rows[block_of == block] - starts[block]
            self.stats.rows_decoded += len(data)
            items = table_items(data.take(local))
            self.stats.rows_read += len(items)
            yield from items


class ParquetShard(_BlockShard):
    """One parquet file; its row groups are the blocks.

    Args:
        path: the file.
        columns: a length column, a token-id list column, or a (source, target) pair.
        fields: the columns read into items (``None``: all).
        cache_dir: the lengths' cache (``True``: default folder; ``None``: none).

    Raises:
        ValueError: for a missing file, or ``columns``/``fields`` the file lacks.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> path = tempfile.mkdtemp() + "/a.parquet"
        >>> pq.write_table(pa.table({"n": [3, 1, 2], "s": ["a", "b", "c"]}), path, row_group_size=2)
        >>> shard = ParquetShard(path, "n", fields=["s"], cache_dir=None)
        >>> shard.num_rows, list(shard.read([2])), shard.stats.rows_decoded
        (3, [{'s': 'c'}], 1)
    """

    kind = "parquet"

    def _open(self) -> tuple[list[int], list[str]]:
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(self.path).metadata  # footer only: no data is read
        except (OSError, ValueError) as error:
            raise self._corrupt(error, "reading its footer") from None
        sizes = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        return sizes, meta.schema.to_arrow_schema().names

    def _table(self) -> Any:
        import pyarrow.parquet as pq

        return pq.ParquetFile(self.path).read(columns=list(self.columns))

    def _blocks(self, needed: list[int]) -> Iterator[tuple[int, Any]]:
        import pyarrow.parquet as pq

        with pq.ParquetFile(self.path) as file:
            for group in needed:
                yield group, file.read_row_group(group, columns=self.fields)


class ArrowShard(_BlockShard):
    """One Arrow IPC file (``.arrow``/``.feather``), memory-mapped; record batches are blocks.

    The file format has random access to its batches; the stream format (``save_to_disk``'s) is read
    walking forward. Arguments as for :class:`ParquetShard`.

    Example:
        >>> import tempfile, pyarrow as pa
        >>> path = tempfile.mkdtemp() + "/a.arrow"
        >>> table = pa.table({"ids": [[1, 2], [3], [4, 5, 6]]})
        >>> with pa.ipc.new_file(path, table.schema) as writer:
        ...     writer.write_table(table, max_chunksize=2)
        >>> shard = ArrowShard(path, "ids", cache_dir=None)
        >>> shard.lengths().tolist(), [it["ids"].tolist() for it in shard.read([0, 2])]
        ([2, 1, 3], [[1, 2], [4, 5, 6]])
    """

    kind = "arrow"

    def _open(self) -> tuple[list[int], list[str]]:
        import pyarrow as pa

        source = pa.memory_map(str(self.path))
        try:
            reader = pa.ipc.open_file(source)
            self._stream = False
            try:
                sizes = [reader.get_batch(i).num_rows for i in range(reader.num_record_batches)]
            except (OSError, ValueError) as error:
                raise self._corrupt(error, "reading its record batches") from None
        except pa.ArrowInvalid:
            try:
                reader = pa.ipc.open_stream(pa.memory_map(str(self.path)))
            except pa.ArrowInvalid as error:
                raise ValueError(
                    f"paths: {self.name} is damaged or not an Arrow IPC file or stream "
                    f"({error}): re-copy it if it was cut short, else write it with "
                    "pyarrow.ipc.new_file or pyarrow.feather.write_feather."
                ) from None
            self._stream = True
            try:
                sizes = [batch.num_rows for batch in reader]  # memory-mapped: no copy
            except (OSError, ValueError) as error:  # a truncated stream
                raise self._corrupt(error, "reading its record batches") from None
        return sizes, reader.schema.names

    def _reader(self) -> Any:
        import pyarrow as pa

        source = pa.memory_map(str(self.path))
        return pa.ipc.open_stream(source) if self._stream else pa.ipc.open_file(source)

    def _table(self) -> Any:
        return self._reader().read_all().select(list(self.columns))

    def _blocks(self, needed: list[int]) -> Iterator[tuple[int, Any]]:
        reader = self._reader()
        if self._stream:
            wanted = set(needed)
            for i, batch in enumerate(reader):
                if i in wanted:
                    yield i, batch if self.fields is None else batch.select(self.fields)
                if i >= needed[-1]:
                    return
        else:
            for i in needed:
                batch = reader.get_batch(i)
                yield i, batch if self.fields is None else batch.select(self.fields)


class JsonlShard(_FileShard):
    r"""One JSON-lines file (one object per line; token ids as lists of ints).

    Blank lines are skipped; the index is cached. Arguments as for :class:`ParquetShard`
    (``columns`` and ``fields`` name keys).

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/a.jsonl"
        >>> with open(path, "w") as f:
        ...     _ = f.write('{"src": [1, 2], "tgt": [3]}\n{"src": [4], "tgt": [5, 6, 7]}\n')
        >>> JsonlShard(path, ("src", "tgt"), cache_dir=None).lengths().tolist()
        [[2, 1], [1, 3]]
    """

    kind = "jsonl"
    index_names = ("lengths", "offsets")

    def _parse(self, line: bytes, where: str) -> Any:
        try:
            item = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(
                f"paths: {where} of {self.name} is not JSON ({error}); a .jsonl or "
                ".json shard must hold one JSON object per line (JSON lines)."
            ) from None
        if not isinstance(item, dict):
            raise ValueError(
                f"paths: {where} of {self.name} is a {type(item).__name__}, not a "
                "JSON object: each line must be one object of fields."
            )
        return item

    def _build_index(self) -> dict[str, np.ndarray]:
        offsets: list[int] = []
        self.stats.opens += 1

        def items() -> Iterator[Any]:
            position = 0
            with open(self.path, "rb") as file:
                for line_no, line in enumerate(file):
                    if line.strip():
                        offsets.append(position)
                        self.stats.rows_decoded += 1
                        yield self._parse(line, f"line {line_no + 1}")
                    position += len(line)

        per_row = row_lengths(items(), self.columns, self._where())
        return {
            "lengths": lengths_array(per_row, self.columns, self._where()),
            "offsets": np.asarray(offsets, dtype=np.int64),
        }

    def _read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """The items of ``rows``: forward seeks, only those lines parsed."""
        if not rows.size:
            return
        offsets = self._index_array("offsets")
        self.stats.opens += 1
        with open(self.path, "rb") as file:
            for row in rows.tolist():
                file.seek(int(offsets[row]))
                item = self._parse(file.readline(), f"row {row}")
                self.stats.rows_decoded += 1
                if self.fields is not None:
                    missing = [f for f in self.fields if f not in item]
                    if missing:
                        raise ValueError(
                            f"fields: row {row} of {self.name} has no field {missing[0]!r}; "
                            f"its fields are {sorted(item)}: change fields."
                        )
                    item = {f: item[f] for f in self.fields}
                self.stats.rows_read += 1
                yield numpy_fields(item)
