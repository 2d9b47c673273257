"""What identifies a shard's content for a resume, wherever the shard lies, and what changed.

A stream saves :func:`shard_identity` of every shard with its position; a resume compares the saved
list with the shards given now (:func:`identity_changes`), not their paths: copies on node-local
disk resume; reordered, changed, added or missing shards are named.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

__all__ = ["identity_changes", "shard_identity"]


def _digest(lengths: np.ndarray) -> str:
    """A 64-bit digest of a shard's lengths (shape and values)."""
    array = np.ascontiguousarray(lengths, dtype=np.int64)
    digest = hashlib.blake2b(str(array.shape).encode(), digest_size=8)
    digest.update(array.tobytes())
    return digest.hexdigest()


class _Identified(Protocol):
    """What :func:`shard_identity` reads of a :class:`~lightning_varbatch.sources.shards.Shard`."""

    @property
    def name(self) -> str: ...
    @property
    def num_rows(self) -> int: ...
    def lengths(self) -> np.ndarray: ...


def shard_identity(shard: _Identified, lengths: np.ndarray | None = None) -> dict[str, Any]:
    """What identifies a shard's content for a resume, wherever the shard lies.

    ``file``: its ``content_name`` (the file's name without its folder; a shard without one
    gives its ``name``), ``rows``, ``bytes`` (its ``size_bytes``, ``None`` when unknown) and
    ``lengths``: a digest of its per-row lengths. A copy in another folder has the same identity.

    Example:
        >>> import tempfile, pyarrow as pa, pyarrow.parquet as pq
        >>> from lightning_varbatch.sources.file_shards import ParquetShard
        >>> path = tempfile.mkdtemp() + "/a.parquet"
        >>> pq.write_table(pa.table({"n": [3, 1]}), path)
        >>> ident = shard_identity(ParquetShard(path, "n", cache_dir=None))
        >>> ident["file"], ident["rows"], len(ident["lengths"])
        ('a.parquet', 2, 16)
    """
    values = np.asarray(shard.lengths() if lengths is None else lengths)
    size = getattr(shard, "size_bytes", None)
    return {
        "file": str(getattr(shard, "content_name", None) or shard.name),
        "rows": int(shard.num_rows),
        "bytes": None if size is None else int(size),
        "lengths": _digest(values),
    }


def _ident_key(ident: Mapping[str, Any]) -> tuple[Any, ...]:
    return (ident.get("file"), ident.get("rows"), ident.get("bytes"), ident.get("lengths"))


def _what_changed(old: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    parts = []
    if old.get("rows") != new.get("rows"):
        parts.append(f"{old.get('rows')} rows saved, {new.get('rows')} now")
    elif old.get("lengths") != new.get("lengths"):
        parts.append("the same number of rows with other lengths")
    if old.get("bytes") != new.get("bytes"):
        parts.append(f"{old.get('bytes')} bytes saved, {new.get('bytes')} now")
    return ", ".join(parts) or "other content"


def identity_changes(saved: Sequence[Mapping[str, Any]], now: Sequence[Mapping[str, Any]]) -> str:
    """How the shards ``now`` differ from ``saved`` (:func:`shard_identity` lists), or ``""``.

    Says whether the same shards were reordered (which moved), or which files changed (and
    what: rows, lengths, size), were added or are missing. Paths do not matter.

    Example:
        >>> a = {"file": "a.jsonl", "rows": 2, "bytes": 30, "lengths": "x"}
        >>> b = {"file": "b.jsonl", "rows": 1, "bytes": 9, "lengths": "y"}
        >>> identity_changes([a, b], [a, b])
        ''
        >>> identity_changes([a, b], [b, a])
        'the same 2 shards in another order: a.jsonl was shards[0], now shards[1]; b.jsonl was shards[1], now shards[0]'
    """  # noqa: E501
    old_keys = [_ident_key(i) for i in saved]
    new_keys = [_ident_key(i) for i in now]
    if old_keys == new_keys:
        return ""
    if sorted(old_keys, key=repr) == sorted(new_keys, key=repr):
        moved = []
        for i, key in enumerate(old_keys):
            if new_keys[i] != key:
                j = new_keys.index(key)
                moved.append(f"{key[0]} was shards[{i}], now shards[{j}]")
        more = f" (and {len(moved) - 5} more)" if len(moved) > 5 else ""
        return f"the same {len(old_keys)} shards in another order: " + "; ".join(moved[:5]) + more
    old_by_name = {str(i.get("file")): i for i in saved}
    new_by_name = {str(i.get("file")): i for i in now}
    notes = []
    if len(old_by_name) == len(saved) and len(new_by_name) == len(now):
        for name, old in old_by_name.items():
            new = new_by_name.get(name)
            if new is None:
                notes.append(f"{name} is missing")
            elif _ident_key(new) != _ident_key(old):
                notes.append(f"{name} changed ({_what_changed(old, new)})")
        notes += [f"{name} was added" for name in new_by_name if name not in old_by_name]
        if not notes:
            notes.append("the same files in another order")
    else:  # names repeat (chunks of several folders): compare position by position
        for i in range(max(len(saved), len(now))):
            old_i = saved[i] if i < len(saved) else None
            new_i = now[i] if i < len(now) else None
            if old_i is None:
                notes.append(f"shards[{i}] ({new_i and new_i.get('file')}) was added")
            elif new_i is None:
                notes.append(f"shards[{i}] ({old_i.get('file')}) is missing")
            elif _ident_key(old_i) != _ident_key(new_i):
                notes.append(f"shards[{i}] ({old_i.get('file')}) changed")
    more = f" (and {len(notes) - 5} more)" if len(notes) > 5 else ""
    return "; ".join(notes[:5]) + more
