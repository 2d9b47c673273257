"""Shards of a local ``litdata`` optimised folder (made by ``litdata.optimize``).

Each chunk of the folder's ``index.json`` is a shard, its rows numbered after the previous chunks'
(the global index of ``litdata.StreamingDataset``). The lengths take one pass over a chunk's items
and are cached on disk. ``litdata`` (which imports torch) is imported only when used.

Example:
    >>> import tempfile, numpy as np, litdata
    >>> folder = tempfile.mkdtemp()
    >>> def item(i):
    ...     return {"ids": np.arange(i + 1)}
    >>> litdata.optimize(item, list(range(5)), folder, chunk_size=3, num_workers=1,
    ...                  verbose=False)  # doctest: +SKIP
    >>> source = shards_from_litdata(folder, "ids", cache_dir=None)  # doctest: +SKIP
    >>> source.num_shards, source.lengths().tolist()  # doctest: +SKIP
    (2, [1, 2, 3, 4, 5])
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.sources.arrow_lengths import Columns
from lightning_varbatch.sources.shard_base import FileBackedShard
from lightning_varbatch.sources.shard_index import CacheDir, column_names
from lightning_varbatch.sources.shard_items import lengths_array, numpy_fields, row_lengths
from lightning_varbatch.sources.shards import ShardedSource

__all__ = ["LitdataShard", "shards_from_litdata"]


class _Opener:
    """One ``StreamingDataset`` per folder, created on first use (and after unpickling)."""

    def __init__(self, input_dir: str) -> None:
        self.input_dir = input_dir
        self._dataset: Any = None

    def get(self) -> Any:
        if self._dataset is None:
            from litdata import StreamingDataset

            self._dataset = StreamingDataset(self.input_dir)
        return self._dataset

    def __getstate__(self) -> dict[str, Any]:
        return {"input_dir": self.input_dir, "_dataset": None}


class LitdataShard(FileBackedShard):
    """One chunk of a ``litdata`` folder; lengths cached by chunk file, columns and offset.

    Args:
        opener: gives the folder's ``StreamingDataset``.
        chunk: the chunk file's path.
        offset: the global index of the chunk's first item.
        num_rows: items in the chunk (from ``index.json``).
        columns: a length field, a token-id field, or a (source, target) pair of them.
        cache_dir: where the lengths are cached (``True``: the default folder; ``None``: none).
    """

    kind = "litdata"

    def __init__(
        self,
        opener: _Opener,
        chunk: Path,
        offset: int,
        num_rows: int,
        columns: Columns,
        *,
        cache_dir: CacheDir = True,
    ) -> None:
        super().__init__(chunk, columns, cache_dir=cache_dir)
        self._opener = opener
        self.chunk = chunk
        self.offset = offset
        self._num_rows = num_rows

    @property
    def num_rows(self) -> int:
        """Items in the chunk (from ``index.json``)."""
        return int(self._num_rows or 0)

    def _known_rows(self) -> int | None:
        return self.num_rows

    def _key_extra(self) -> tuple[Any, ...]:
        return (self.offset,)

    def _items(self, rows: list[int]) -> Iterator[dict[str, Any]]:
        dataset = self._opener.get()
        self.stats.opens += 1
        for row in rows:
            item = dataset[self.offset + row]
            self.stats.rows_decoded += 1
            if not isinstance(item, dict):
                raise TypeError(
                    f"{self.name}: item {self.offset + row} is a {type(item).__name__}, not a "
                    "dict of fields: make litdata.optimize's fn return a dict (e.g. "
                    "{'input_ids': ids}) so columns can name a field."
                )
            yield item

    def _build_index(self) -> dict[str, np.ndarray]:
        """One pass over the chunk's items."""
        items = self._items(list(range(self.num_rows)))
        try:
            per_row = row_lengths(items, self.columns, self._where())
        except (OSError, RuntimeError, EOFError) as error:  # a damaged chunk
            raise ValueError(
                f"input_dir: the chunk {self.name} is damaged: reading its items failed "
                f"({type(error).__name__}: {error}). Re-run litdata.optimize or re-copy "
                "the folder."
            ) from None
        return {"lengths": lengths_array(per_row, self.columns, self._where())}

    def _read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """The items of ``rows``, read in order from the chunk."""
        if not rows.size:
            return
        for item in self._items(rows.tolist()):
            self.stats.rows_read += 1
            yield numpy_fields(item)

    def __repr__(self) -> str:
        return f"LitdataShard({self.name!r}, offset={self.offset}, num_rows={self.num_rows})"


def shards_from_litdata(
    input_dir: str | os.PathLike[str], columns: Columns, *, cache_dir: CacheDir = True
) -> ShardedSource:
    """A :class:`~lightning_varbatch.sources.shards.ShardedSource` over a local litdata folder.

    Args:
        input_dir: a local folder written by ``litdata.optimize`` (with ``index.json``).
        columns: a length field, a token-id field, or a (source, target) pair of them.
        cache_dir: where the lengths are cached (``True``: the default folder; ``None``: none).

    Raises:
        ValueError: for a folder without ``index.json`` or one that lists no chunks.

    Example:
        >>> import tempfile
        >>> shards_from_litdata(tempfile.mkdtemp(), "ids")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: input_dir=...: no index.json: ...
    """
    folder = Path(input_dir)
    index_path = folder / "index.json"
    if not index_path.is_file():
        raise ValueError(
            f"input_dir={str(input_dir)!r}: no index.json: point input_dir at a local folder "
            "written by litdata.optimize(..., output_dir=...)."
        )
    column_names(columns)
    with open(index_path) as file:
        chunks = json.load(file).get("chunks") or []
    if not chunks:
        raise ValueError(f"input_dir={str(input_dir)!r}: index.json lists no chunks.")
    opener = _Opener(str(folder))
    shards = []
    offset = 0
    for chunk in chunks:
        size = int(chunk["chunk_size"])
        shards.append(
            LitdataShard(
                opener, folder / chunk["filename"], offset, size, columns, cache_dir=cache_dir
            )
        )
        offset += size
    return ShardedSource(shards, columns)
