"""The base every shard kind subclasses: its lengths index cached once, its reads counted.

:class:`CachedShard` holds what every shard kind (parquet, Arrow, JSON lines, ``litdata`` chunks,
Hugging Face stream shards) shares: the one path to its per-row lengths (the index, loaded from the
disk cache under the shard's key, else built from the data once; re-read on each call with a disk
cache, so a stream holds only the lengths of the shards it is planning), the checked ``columns`` and
its :class:`~.shard_index.ReadStats` (a read starting before the previous one ended is a backward
seek). :class:`FileBackedShard` adds what a one-file shard has: its path as its name, its name and
size as its content identity, its path, size and mtime as its cache key.

A new shard kind implements ``name``, ``_cache_key``, ``_build_index`` and ``_read``.

Example:
    >>> class Squares(CachedShard):
    ...     def __init__(self, n: int) -> None:
    ...         super().__init__("n", cache_dir=None)
    ...         self.n = n
    ...     @property
    ...     def name(self) -> str:
    ...         return f"squares-{self.n}"
    ...     def _cache_key(self) -> str:
    ...         return self.name
    ...     def _build_index(self) -> dict[str, np.ndarray]:
    ...         self.stats.opens += 1
    ...         return {"lengths": np.arange(1, self.n + 1) ** 2}
    ...     def _read(self, rows: np.ndarray) -> Iterator[dict[str, int]]:
    ...         yield from ({"n": int(r + 1) ** 2} for r in rows)
    >>> shard = Squares(3)
    >>> shard.num_rows, shard.lengths().tolist(), list(shard.read([0, 2]))
    (3, [1, 4, 9], [{'n': 1}, {'n': 9}])
    >>> shard.lengths() is shard.lengths(), shard.stats.opens  # built once, kept in memory
    (True, 1)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from lightning_varbatch.sources.arrow_lengths import Columns
from lightning_varbatch.sources.shard_index import (
    CacheDir,
    ReadStats,
    check_rows,
    column_names,
    file_key,
    load_index,
    save_index,
)
from lightning_varbatch.sources.tokenized_lengths import cache_folder

__all__ = ["CachedShard", "FileBackedShard"]


class CachedShard:
    r"""A shard whose index (its per-row lengths, and more) is built once and cached.

    Subclasses knowing their row count from metadata also override ``num_rows``, ``_known_rows``.

    Args:
        columns: a length column/field, a token-id one, or a (source, target) pair.
        cache_dir: the index's cache (``True``: the default folder; ``None``/``False``: in memory).

    Attributes:
        columns: the one or two column names.
        cache_dir: the cache folder (``None``: none, or it could not be written).
        stats: what reading the shard cost so far.

    Example:
        >>> import json, tempfile
        >>> from lightning_varbatch.sources.file_shards import JsonlShard
        >>> folder = tempfile.mkdtemp()
        >>> with open(folder + "/a.jsonl", "w") as f:
        ...     f.writelines(json.dumps({"ids": [7] * k}) + "\n" for k in (2, 3))
        >>> first = JsonlShard(folder + "/a.jsonl", "ids", cache_dir=folder + "/cache")
        >>> first.index_names, first.lengths().tolist(), first.stats.opens
        (('lengths', 'offsets'), [2, 3], 1)
        >>> again = JsonlShard(folder + "/a.jsonl", "ids", cache_dir=folder + "/cache")
        >>> again.lengths().tolist(), again.stats.opens  # from the cache: the file is not read
        ([2, 3], 0)
    """

    #: The arrays of the index; the first is always ``"lengths"``.
    index_names: ClassVar[tuple[str, ...]] = ("lengths",)

    def __init__(self, columns: Columns, *, cache_dir: CacheDir = True) -> None:
        self.columns = column_names(columns)
        self.cache_dir = cache_folder(cache_dir, "shards")
        self.stats = ReadStats()
        self._kept: dict[str, np.ndarray] | None = None
        self._num_rows: int | None = None
        self._end = 0

    @property
    def name(self) -> str:
        """A stable id of the shard (e.g. its file's path); it goes into fingerprints."""
        raise NotImplementedError

    @property
    def num_rows(self) -> int:
        """Rows in the shard (from the index, unless the subclass knows them from metadata)."""
        if self._num_rows is None:
            self._num_rows = int(self.lengths().shape[0])
        return self._num_rows

    def lengths(self) -> np.ndarray:
        """Per-row lengths (re-read from the disk cache on each call; else kept in memory)."""
        return self._index_array("lengths")

    def read(self, rows: Any) -> Iterator[dict[str, Any]]:
        """The items of ``rows`` (strictly ascending, within ``[0, num_rows)``), in order.

        Raises:
            TypeError: for rows that are not integers.
            ValueError: for rows out of range or not strictly ascending.
        """
        checked = check_rows(rows, self.num_rows, f"read ({self.name})")
        if checked.size:
            self.stats.note_read(int(checked[0]), self._end)
            self._end = int(checked[-1]) + 1
        return self._read(checked)

    def _where(self) -> str:
        """How messages about the lengths name the shard."""
        return f"columns (shard {self.name})"

    def _known_rows(self) -> int | None:
        """The rows the shard's metadata gives (``None``: known from the index only)."""
        return None

    def _cache_key(self) -> str:
        """The key of the index on disk (``""`` when the shard is never cached)."""
        raise NotImplementedError

    def _build_index(self) -> dict[str, np.ndarray]:
        """Read the data once and return the arrays named by ``index_names``."""
        raise NotImplementedError

    def _read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """The items of checked ``rows`` (a strictly ascending ``int64`` array)."""
        raise NotImplementedError

    def _index_array(self, name: str) -> np.ndarray:
        """One array of the index: kept in memory, else loaded from the cache, else built."""
        if self._kept is not None:
            return self._kept[name]
        key = self._cache_key()
        index = load_index(self.cache_dir, key, self.index_names, self._known_rows())
        if index is None:
            index = self._build_index()
            if not save_index(self.cache_dir, key, index):
                self.cache_dir = None  # unwritable (warned): keep the index in memory
        if self.cache_dir is None:
            self._kept = index
        return index[name]


class FileBackedShard(CachedShard):
    """A :class:`CachedShard` backed by one file: named by its path, identified by its content.

    Args:
        file: the file (a parquet or Arrow file, a JSON-lines file, a ``litdata`` chunk).
        columns: a length column/field, a token-id one, or a (source, target) pair.
        cache_dir: where the index is cached (``True``: the default folder; ``None``: none).

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> from lightning_varbatch.sources.file_shards import ParquetShard
        >>> path = tempfile.mkdtemp() + "/a.parquet"
        >>> pq.write_table(pa.table({"n": [3, 1]}), path)
        >>> shard = ParquetShard(path, "n", cache_dir=None)
        >>> shard.content_name, shard.size_bytes > 0, shard.name == os.path.abspath(path)
        ('a.parquet', True, True)
    """

    #: The kind of file, part of its cache key (and of messages about a damaged file).
    kind = "file"

    def __init__(
        self, file: str | os.PathLike[str], columns: Columns, *, cache_dir: CacheDir = True
    ) -> None:
        super().__init__(columns, cache_dir=cache_dir)
        self._file = Path(file)

    @property
    def name(self) -> str:
        """The file's absolute path."""
        return os.path.abspath(self._file)

    @property
    def content_name(self) -> str:
        """The file's name without its folder: shards copied to another folder still resume."""
        return self._file.name

    @property
    def size_bytes(self) -> int:
        """The file's size in bytes."""
        return int(os.path.getsize(self._file))

    def _key_extra(self) -> tuple[Any, ...]:
        """What else goes into the cache key besides the file, its kind and the columns."""
        return ()

    def _cache_key(self) -> str:
        return file_key(self._file, self.kind, self.columns, *self._key_extra())
