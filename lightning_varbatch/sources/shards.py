"""Shards: data too large to index in memory, read front to back, with cheap per-row lengths.

A :class:`Shard` (a file, chunk or stream partition) knows its row count and per-row lengths
without handing over the data, and reads the rows asked for strictly front to back. A
:class:`ShardedSource` lists shards with global row offsets; :func:`shards_from_files` builds
one from parquet, Arrow IPC or JSON-lines files (streaming Hugging Face datasets and ``litdata``
folders have their own builders); anything else implements :class:`Shard` (and a ``stats``).

Example:
    >>> import os, tempfile, pyarrow as pa, pyarrow.parquet as pq
    >>> folder = tempfile.mkdtemp()
    >>> for i in range(2):
    ...     table = pa.table({"ids": [[1, 2, 3], [4]][i:] + [[5, 6]]})
    ...     pq.write_table(table, os.path.join(folder, f"part-{i}.parquet"))
    >>> source = shards_from_files(folder, "ids", cache_dir=None)
    >>> source.num_shards, source.offsets.tolist(), source.shard_lengths(1).tolist()
    (2, [0, 3, 5], [1, 2])
    >>> [item["ids"].tolist() for item in source.read(0, [0, 2])]
    [[1, 2, 3], [5, 6]]
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.sources.arrow_lengths import Columns
from lightning_varbatch.sources.content_identity import identity_changes, shard_identity
from lightning_varbatch.sources.shard_index import CacheDir, ReadStats, column_names

__all__ = [
    "SHARD_SUFFIXES",
    "ReadStats",
    "Shard",
    "ShardedSource",
    "identity_changes",
    "shard_identity",
    "shards_from_files",
]

#: File suffixes :func:`shards_from_files` reads, and the shard class of each.
SHARD_SUFFIXES = {
    ".parquet": "ParquetShard",
    ".arrow": "ArrowShard",
    ".feather": "ArrowShard",
    ".jsonl": "JsonlShard",
    ".json": "JsonlShard",
}


@runtime_checkable
class Shard(Protocol):
    """One part of a dataset, read front to back; it counts its reads in ``stats: ReadStats``.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> from lightning_varbatch.sources.file_shards import ParquetShard
        >>> path = tempfile.mkdtemp() + "/a.parquet"
        >>> pq.write_table(pa.table({"n": [3, 1]}), path)
        >>> isinstance(ParquetShard(path, "n", cache_dir=None), Shard)
        True
    """

    @property
    def name(self) -> str:
        """A stable id of the shard (e.g. its file's path); it goes into fingerprints."""
        ...

    @property
    def num_rows(self) -> int:
        """Number of rows in the shard."""
        ...

    def lengths(self) -> np.ndarray:
        """Per-row planning lengths, ``(num_rows,)`` or ``(num_rows, 2)`` (source, target)."""
        ...

    def read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """One item (a dict of the row's fields) per row of ``rows``, read front to back.

        ``rows`` ascends strictly within ``[0, num_rows)``; token ids come as 1-D int arrays.
        """
        ...


def _checked_lengths(i: int, shard: Any) -> tuple[np.ndarray, int]:
    """``shards[i]``'s lengths and row count, checked to be a :class:`Shard` that agrees."""
    if not isinstance(shard, Shard):
        raise TypeError(
            f"shards[{i}] ({type(shard).__name__}) is not a Shard: it needs name, "
            "num_rows, lengths() and read(rows) (see lightning_varbatch.sources.shards)."
        )
    lengths = np.asarray(shard.lengths())
    rows = int(shard.num_rows)
    if (
        lengths.ndim not in (1, 2)
        or lengths.shape[0] != rows
        or (lengths.ndim == 2 and lengths.shape[1] != 2)
    ):
        raise ValueError(
            f"shards[{i}] ({shard.name}): lengths() has shape {lengths.shape}, expected "
            f"({rows},) or ({rows}, 2) for its {rows} rows."
        )
    return lengths, rows


class ShardedSource:
    """A dataset as an ordered sequence of shards, rows numbered globally shard after shard.

    Args:
        shards: the shards, in order.
        columns: the columns spec their lengths come from (goes into the fingerprint).

    Raises:
        ValueError: no shards, lengths not one per row, or shards mixing single lengths and pairs.
        TypeError: for a shard that does not implement :class:`Shard`.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> from lightning_varbatch.sources.file_shards import ParquetShard
        >>> path = tempfile.mkdtemp() + "/a.parquet"
        >>> pq.write_table(pa.table({"n": [3, 1, 2]}), path)
        >>> source = ShardedSource([ParquetShard(path, "n", cache_dir=None)], "n")
        >>> source.num_rows, source.lengths().tolist(), len(source.fingerprint())
        (3, [3, 1, 2], 40)
    """

    def __init__(self, shards: Sequence[Shard], columns: Columns | None = None) -> None:
        shards = list(shards)
        if not shards:
            raise ValueError(
                "ShardedSource needs at least one shard, got none: check the paths or glob "
                "given (e.g. shards_from_files's paths)."
            )
        ndim = None
        counts = []
        identity = []
        for i, shard in enumerate(shards):
            lengths, rows = _checked_lengths(i, shard)
            if ndim is None:
                ndim = lengths.ndim
            elif lengths.ndim != ndim:
                kinds = {1: "single lengths", 2: "(source, target) pairs"}
                raise ValueError(
                    f"shards[{i}] ({shard.name}) has {kinds[lengths.ndim]} but shards[0] "
                    f"({shards[0].name}) has {kinds[ndim]}: give every shard the same columns "
                    "(one column, or the same pair)."
                )
            counts.append(rows)
            identity.append(shard_identity(shard, lengths))
        self.shards = shards
        self.columns = columns
        self._identity = identity
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)

    @property
    def num_shards(self) -> int:
        """Number of shards."""
        return len(self.shards)

    @property
    def num_rows(self) -> int:
        """Number of rows in all shards together."""
        return int(self.offsets[-1])

    @property
    def pairs(self) -> bool:
        """Whether the lengths are (source, target) pairs."""
        return bool(np.asarray(self.shards[0].lengths()).ndim == 2)

    def shard_lengths(self, shard: int) -> np.ndarray:
        """The lengths of shard ``shard``'s rows."""
        return np.asarray(self.shards[self._index(shard)].lengths())

    def lengths(self) -> np.ndarray:
        """The lengths of all rows, shard after shard (global row order)."""
        return np.concatenate([self.shard_lengths(s) for s in range(self.num_shards)])

    def read(self, shard: int, rows: Any) -> Iterator[dict[str, Any]]:
        """Shard ``shard``'s rows ``rows`` (strictly ascending, shard-local), front to back."""
        return self.shards[self._index(shard)].read(rows)

    @property
    def stats(self) -> ReadStats:
        """The read counts of all shards, merged."""
        total = ReadStats()
        for shard in self.shards:
            total = total.merge(getattr(shard, "stats", ReadStats()))
        return total

    def identity(self) -> dict[str, Any]:
        """The shards' content identity: the columns spec and :func:`shard_identity` per shard.

        Saved with a stream's position: a resume compares it (not paths), so shards copied to
        another folder resume and reordered, changed, added or missing shards are named.

        Example:
            >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
            >>> from lightning_varbatch.sources.file_shards import ParquetShard
            >>> path = tempfile.mkdtemp() + "/a.parquet"
            >>> pq.write_table(pa.table({"n": [3, 1]}), path)
            >>> ShardedSource([ParquetShard(path, "n", cache_dir=None)], "n").identity()["columns"]
            'n'
        """
        spec = list(self.columns) if isinstance(self.columns, (list, tuple)) else self.columns
        return {"columns": spec, "shards": [dict(i) for i in self._identity]}

    def content_fingerprint(self) -> str:
        """A sha1 of :meth:`identity`: equal for the same shard contents in any folder.

        Example:
            >>> import os, tempfile, shutil, pyarrow as pa, pyarrow.parquet as pq
            >>> from lightning_varbatch.sources.file_shards import ParquetShard
            >>> a, b = tempfile.mkdtemp(), tempfile.mkdtemp()
            >>> pq.write_table(pa.table({"n": [3, 1]}), a + "/x.parquet")
            >>> _ = shutil.copy(a + "/x.parquet", b)
            >>> one, two = (ShardedSource([ParquetShard(f + "/x.parquet", "n", cache_dir=None)])
            ...             for f in (a, b))
            >>> one.content_fingerprint() == two.content_fingerprint(), one.fingerprint() == two.fingerprint()
            (True, False)
        """  # noqa: E501
        text = json.dumps(self.identity(), sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()

    def fingerprint(self) -> str:
        """A sha1 of shard paths, row counts and columns (checked for states without identity)."""
        spec = [self.columns] if isinstance(self.columns, str) else self.columns
        text = json.dumps([[s.name for s in self.shards], self.offsets.tolist(), spec], default=str)
        return hashlib.sha1(text.encode()).hexdigest()

    def _index(self, shard: int) -> int:
        if not isinstance(shard, (int, np.integer)) or not 0 <= shard < self.num_shards:
            raise IndexError(f"shard must be in [0, {self.num_shards}), got {shard!r}.")
        return int(shard)

    def __repr__(self) -> str:
        return (
            f"ShardedSource(num_shards={self.num_shards}, num_rows={self.num_rows}, "
            f"columns={self.columns!r})"
        )


def _expand(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[Path]:
    if isinstance(paths, (str, os.PathLike)):
        given = str(paths)
        if Path(given).is_dir():
            found = sorted(
                p for p in Path(given).iterdir() if p.is_file() and p.suffix in SHARD_SUFFIXES
            )
            if not found:
                raise SettingValueError(
                    f"paths={given!r} is a folder with no {sorted(SHARD_SUFFIXES)} files: "
                    "point paths at the shards (a folder, a glob or a list of files).",
                    setting="paths",
                    value=paths,
                )
            return found
        if glob.has_magic(given):
            found = sorted(Path(p) for p in glob.glob(given, recursive=True) if Path(p).is_file())
            if not found:
                raise SettingValueError(
                    f"paths={given!r} matches no files: check the glob pattern (relative "
                    f"to {os.getcwd()}).",
                    setting="paths",
                    value=paths,
                )
            return found
        return [Path(given)]
    if isinstance(paths, Sequence) and not isinstance(paths, bytes):
        return [Path(p) for p in paths]
    raise SettingTypeError(
        f"paths must be a folder, a glob or a list of files, got {type(paths).__name__}: "
        "pass one of those.",
        setting="paths",
        value=paths,
    )


def shards_from_files(
    paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
    columns: Columns,
    *,
    fields: Sequence[str] | None = None,
    cache_dir: CacheDir = True,
) -> ShardedSource:
    """A :class:`ShardedSource` of parquet, Arrow IPC (``.arrow``/``.feather``) or JSON-lines files.

    Args:
        paths: a folder (its files, sorted), a glob (``"data/*.parquet"``) or files, in shard order.
        columns: the lengths' source (as ``column_lengths``): a length/token-id column, or a pair.
        fields: the columns read into items (``None``: all).
        cache_dir: where shard indexes (lengths, line offsets) are cached; ``None``/``False``:
            nowhere; ``True``: ``$LIGHTNING_VARBATCH_CACHE`` or ``~/.cache/lightning_varbatch``.

    Raises:
        SettingValueError: no or missing files, an unknown suffix (listed), missing columns/fields.
        ValueError: for a damaged file (named, with what failed), nulls in its lengths.
        TypeError: for text or floats where token ids belong (the file and row are named).

    Example:
        >>> import tempfile
        >>> shards_from_files(tempfile.mkdtemp() + "/*.parquet", "n")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_varbatch.errors.SettingValueError: paths='...*.parquet' matches no files: ...
    """
    from lightning_varbatch.sources import file_shards

    column_names(columns)
    files = _expand(paths)
    if not files:
        raise SettingValueError(
            "paths is an empty list: give at least one shard file.", setting="paths", value=paths
        )
    shards: list[Shard] = []
    for path in files:
        kind = SHARD_SUFFIXES.get(path.suffix.lower())
        if kind is None:
            raise SettingValueError(
                f"paths: {str(path)!r} has suffix {path.suffix!r}; supported are "
                f"{sorted(SHARD_SUFFIXES)}: convert it or implement the Shard protocol.",
                setting="paths",
                value=paths,
            )
        if not path.is_file():
            raise SettingValueError(
                f"paths: {str(path)!r} does not exist or is not a file: check the path (or "
                "copy the shard there).",
                setting="paths",
                value=paths,
            )
        cls = getattr(file_shards, kind)
        shards.append(cls(path, columns, fields=fields, cache_dir=cache_dir))
    return ShardedSource(shards, columns)
