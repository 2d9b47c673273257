"""The shards' on-disk index cache, their read counts, and the checks of the rows asked for.

A shard's index (per-row lengths; for JSON lines also every line's byte offset) is saved as
``.npy`` files keyed by the file's absolute path, size, modification time and the columns spec,
written to a temporary name and moved into place. A damaged cache file gives a
:class:`~.tokenized_lengths.LengthCacheWarning` and is rebuilt; an unwritable folder gives one and
the run goes on uncached. Shards copied elsewhere are indexed again: the cache never refuses data.

Example:
    >>> import tempfile
    >>> folder = tempfile.mkdtemp()
    >>> save_index(folder, "k", {"lengths": np.array([3, 1])})
    True
    >>> load_index(folder, "k", ("lengths",))["lengths"].tolist()
    [3, 1]
    >>> load_index(folder, "other", ("lengths",)) is None
    True
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.sources.arrow_lengths import Columns, is_column_spec
from lightning_varbatch.sources.tokenized_lengths import warn_damaged, warn_unwritable

__all__ = [
    "CacheDir",
    "ReadStats",
    "check_rows",
    "column_names",
    "file_key",
    "load_index",
    "save_index",
    "text_key",
]

_INDEX_VERSION = "1"

#: Where shard indexes are cached: a folder, ``True`` (the default) or ``None``/``False`` (none).
CacheDir = str | os.PathLike[str] | bool | None


@dataclass
class ReadStats:
    """What reading shards cost, to check that reads are sequential and not wasteful.

    Attributes:
        opens: times a file (or stream) was opened, for reading data or for building an index.
        rows_read: rows yielded to the caller.
        rows_decoded: rows materialised, skipped ones of a read block and index builds included.
        backward_seeks: reads starting before their shard's previous read ended (a restart: 1).

    Example:
        >>> a, b = ReadStats(opens=1, rows_read=4), ReadStats(opens=2, backward_seeks=1)
        >>> a.merge(b)
        ReadStats(opens=3, rows_read=4, rows_decoded=0, backward_seeks=1)
    """

    opens: int = 0
    rows_read: int = 0
    rows_decoded: int = 0
    backward_seeks: int = 0

    def merge(self, other: ReadStats) -> ReadStats:
        """The sum of these and ``other``'s counts (e.g. across shards, workers or ranks)."""
        return ReadStats(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    def note_read(self, first_row: int, end: int) -> int:
        """Count a backward seek if ``first_row`` is before ``end`` (the previous read's end)."""
        if first_row < end:
            self.backward_seeks += 1
        return end


def column_names(columns: Columns, name: str = "columns") -> tuple[str, ...]:
    """The one or two column names of a columns spec, checked.

    Example:
        >>> column_names("input_ids"), column_names(["src", "tgt"])
        (('input_ids',), ('src', 'tgt'))
    """
    if not is_column_spec(columns):
        raise TypeError(
            f"{name} must name one column (lengths or token ids) or a (source, target) pair "
            f"of columns, got {columns!r}."
        )
    names = (columns,) if isinstance(columns, str) else tuple(columns)
    if len(names) > 2 or len(set(names)) != len(names) or not all(names):
        raise ValueError(
            f"{name}={columns!r}: give one column (lengths or token ids) or two distinct "
            "ones, (source, target)."
        )
    return names


def file_key(path: str | os.PathLike[str], kind: str, columns: Sequence[str], *extra: Any) -> str:
    """Cache key of a file's index: absolute path, size, ``mtime_ns``, kind, columns and extra.

    Example:
        >>> import tempfile
        >>> f = tempfile.NamedTemporaryFile(suffix=".jsonl", delete=False).name
        >>> file_key(f, "jsonl", ["n"]) == file_key(f, "jsonl", ["m"])
        False
    """
    stat = os.stat(path)
    parts = [_INDEX_VERSION, os.path.abspath(path), stat.st_size, stat.st_mtime_ns, kind]
    return text_key([*parts, list(columns), *extra])


def text_key(parts: Sequence[Any]) -> str:
    """A sha1 of ``parts`` (JSON-encoded; anything not JSON is written with ``str``).

    Example:
        >>> len(text_key(["a", 1]))
        40
    """
    text = json.dumps(list(parts), sort_keys=True, default=str)
    return hashlib.sha1(text.encode()).hexdigest()


def load_index(
    folder: str | os.PathLike[str] | None,
    key: str,
    names: Sequence[str],
    rows: int | None = None,
) -> dict[str, np.ndarray] | None:
    """The cached arrays ``names`` under ``key``, or ``None`` when any is missing or damaged.

    A file that cannot be read, holds no integers, or whose arrays disagree on the number of rows
    (or with ``rows``, when known) is damaged: a :class:`~.tokenized_lengths.LengthCacheWarning`
    names it and ``None`` is returned, so the caller rebuilds and overwrites the index.

    Example:
        >>> load_index(None, "k", ("lengths",)) is None
        True
    """
    if folder is None:
        return None
    out = {}
    for name in names:
        path = Path(folder) / f"{key}.{name}.npy"
        if not path.exists():
            return None
        try:
            out[name] = np.load(path, allow_pickle=False)
        except (OSError, ValueError, EOFError) as error:
            warn_damaged(path, f"unreadable: {error}", "shard index")
            return None
    sizes = {name: array.shape[0] if array.ndim else -1 for name, array in out.items()}
    for name, array in out.items():
        path = Path(folder) / f"{key}.{name}.npy"
        problem = f"it holds {array.dtype} of shape {array.shape}"
        if array.dtype.kind not in "iu" or array.ndim not in (1, 2):
            warn_damaged(path, f"{problem}, expected integers", "shard index")
            return None
        if rows is not None and sizes[name] != rows:
            warn_damaged(path, f"{problem}, expected the file's {rows} rows", "shard index")
            return None
    if len(set(sizes.values())) > 1:  # the arrays of one index disagree: name them all
        files = " and ".join(f"{key}.{n}.npy ({sizes[n]} rows)" for n in names)
        warn_damaged(Path(folder) / f"{key}.*.npy", f"{files} disagree", "shard index")
        return None
    return out


def save_index(
    folder: str | os.PathLike[str] | None, key: str, arrays: Mapping[str, np.ndarray]
) -> bool:
    """Save ``arrays`` under ``key`` atomically (temporary file, then ``os.replace``).

    Returns:
        Whether they were saved: an unwritable folder gives ``False`` (the caller keeps the index
        in memory) and one :class:`~.tokenized_lengths.LengthCacheWarning` per folder.

    Example:
        >>> save_index(None, "k", {"lengths": np.array([1])})  # no folder: nothing is saved
        False
    """
    if folder is None:
        return False
    for name, values in arrays.items():
        path = Path(folder) / f"{key}.{name}.npy"
        tmp = Path(folder) / f"{key}.{name}.{os.getpid()}.tmp.npy"
        try:
            Path(folder).mkdir(parents=True, exist_ok=True)
            np.save(tmp, np.asarray(values))
            os.replace(tmp, path)
        except OSError as error:
            if str(folder) not in _UNWRITABLE:
                _UNWRITABLE.add(str(folder))
                warn_unwritable(Path(folder), error, "shard indexes")
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)
            return False
    return True


#: Cache folders already warned about (one warning per folder, not one per shard).
_UNWRITABLE: set[str] = set()


def check_rows(rows: Any, num_rows: int, where: str) -> np.ndarray:
    """``rows`` as a strictly ascending ``int64`` array within ``[0, num_rows)``.

    Raises:
        TypeError: for non-integer rows.
        ValueError: for a 2-D array, rows out of range, or rows not strictly ascending.

    Example:
        >>> check_rows([0, 2, 5], 6, "shard").tolist()
        [0, 2, 5]
        >>> check_rows([2, 1], 6, "shard")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: shard: rows must be strictly ascending ...
    """
    array = np.asarray(rows)
    if array.size == 0:
        return np.zeros(0, dtype=np.int64)
    if array.ndim != 1 or not np.issubdtype(array.dtype, np.integer):
        raise TypeError(
            f"{where}: rows must be a 1-D array of integer row numbers, got dtype {array.dtype} "
            f"and shape {array.shape}."
        )
    array = array.astype(np.int64, copy=False)
    if array[0] < 0 or array[-1] >= num_rows or array.min() < 0 or array.max() >= num_rows:
        raise ValueError(
            f"{where}: rows must lie in [0, {num_rows}) (the shard's rows), got values from "
            f"{int(array.min())} to {int(array.max())}."
        )
    bad = np.flatnonzero(np.diff(array) <= 0)
    if bad.size:
        i = int(bad[0])
        raise ValueError(
            f"{where}: rows must be strictly ascending (shards are read front to back), got "
            f"rows[{i}]={int(array[i])} then rows[{i + 1}]={int(array[i + 1])}; sort them "
            "(np.unique) and read a shard again from the start for an earlier row."
        )
    return array
