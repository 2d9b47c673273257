"""What a shard's rows become: per-row lengths of python items, and items with numpy token ids.

Shards of python items take their lengths with :func:`row_lengths`, checked by :func:`lengths_array`
(the planner's rules); every shard hands its items over through :func:`numpy_fields` or
:func:`table_items`, so token ids arrive as 1-D ``int64`` numpy arrays whatever the format.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.lengths import as_int_lengths
from lightning_varbatch.sources.arrow_lengths import STREAM_TEXT_FIX, is_list_type

__all__ = ["lengths_array", "numpy_fields", "row_lengths", "table_items"]


def _length_of(value: Any, column: str, where: str, row: int) -> int:
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value)
    if value is None:
        raise SettingValueError(
            f"{where}: row {row} has a null {column!r}, not a length or token ids; every "
            "example needs a length: fill or filter that row out of the shard.",
            setting="columns",
            value=column,
        )
    if isinstance(value, (list, tuple, np.ndarray)):
        first = value[0] if len(value) else 0
        bad = isinstance(first, (bool, np.bool_)) or not isinstance(first, (int, np.integer))
        if bad or (isinstance(value, list) and None in value):
            shown = "a null token id" if None in list(value) else repr(first)
            raise SettingTypeError(
                f"{where}: row {row} field {column!r} is a list holding {shown}, not token ids "
                "(integers): write integer token ids (tokenize text first), or name a length "
                "or token-id field in columns.",
                setting="columns",
                value=column,
            )
        return len(value)
    if isinstance(value, str):
        raise SettingTypeError(
            f"{where}: row {row} field {column!r} is text ({value[:30]!r}), not token ids or a "
            f"length: {STREAM_TEXT_FIX}.",
            setting="columns",
            value=column,
        )
    raise TypeError(
        f"{where}: row {row} field {column!r} is {type(value).__name__}, not a length (int) or "
        "a list of token ids: name a length or token-id field in columns."
    )


def row_lengths(
    items: Sequence[Mapping[str, Any]] | Any, names: Sequence[str], where: str
) -> list[tuple[int, ...]]:
    """Per-item lengths of python items (dicts): an int field as it is, a list field's len.

    Raises:
        SettingValueError: when an item lacks a named field (its fields are listed) or it is
            null; the row is named, ``.setting`` is ``columns``.
        SettingTypeError: when a named field is text or a list holding anything but integer
            token ids (a null, floats); the row is named, ``.setting`` is ``columns``.
        TypeError: for a field of another type (neither an int nor a list).

    Example:
        >>> row_lengths([{"ids": [1, 2], "n": 5}], ("ids", "n"), "shard")
        [(2, 5)]
    """
    out: list[tuple[int, ...]] = []
    for item in items:
        row = len(out)
        try:
            out.append(tuple(_length_of(item[c], c, where, row) for c in names))
        except KeyError as error:
            raise SettingValueError(
                f"{where}: row {row} has no field {error.args[0]!r}; its fields are "
                f"{sorted(item)}: change columns to name one of them.",
                setting="columns",
                value=list(names),
            ) from None
    return out


def lengths_array(rows: list[tuple[int, ...]], names: Sequence[str], where: str) -> np.ndarray:
    """``(n,)`` or ``(n, 2)`` lengths from per-row tuples, checked with the planner's rules.

    Example:
        >>> lengths_array([(2, 5), (1, 1)], ("a", "b"), "shard").tolist()
        [[2, 5], [1, 1]]
    """
    table = np.asarray(rows, dtype=np.int64).reshape(len(rows), len(names))
    checked = [
        as_int_lengths(table[:, i], f"{where} (column {c!r})") if len(rows) else table[:, i]
        for i, c in enumerate(names)
    ]
    return checked[0] if len(names) == 1 else np.stack(checked, axis=1)


def numpy_fields(item: Mapping[str, Any]) -> dict[str, Any]:
    """``item`` with its lists of integers (token ids) as 1-D ``int64`` numpy arrays.

    Example:
        >>> numpy_fields({"ids": [1, 2], "text": "hi", "n": 2})["ids"]
        array([1, 2])
    """
    out = dict(item)
    for key, value in out.items():
        if isinstance(value, list) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            out[key] = np.asarray(value, dtype=np.int64)
    return out


def table_items(table: Any) -> list[dict[str, Any]]:
    """The rows of a pyarrow table (or record batch) as dicts; numeric lists as numpy arrays.

    Example:
        >>> import pyarrow as pa
        >>> table_items(pa.table({"ids": [[1, 2], [3]], "s": ["a", "b"]}))[1]
        {'ids': array([3]), 's': 'b'}
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    columns: dict[str, list[Any]] = {}
    for name in table.column_names:
        col = table.column(name)
        arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
        kind = arr.type
        plain = is_list_type(kind) and not arr.null_count and pa.types.is_primitive(kind.value_type)
        if plain and arr.flatten().null_count == 0:  # a null stays None, not NaN
            values = arr.flatten().to_numpy(zero_copy_only=False)
            sizes = pc.list_value_length(arr).to_numpy(zero_copy_only=False)
            columns[name] = np.split(values, np.cumsum(sizes)[:-1]) if len(arr) else []
        else:
            columns[name] = arr.to_pylist()
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]
