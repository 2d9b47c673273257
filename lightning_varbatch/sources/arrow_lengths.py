"""Lengths read from Arrow columns: a Hugging Face dataset's, a pyarrow table's, vectorised.

A length column (``num_tokens``) is read as it is; a token-id column (``input_ids``, a list
column) gives its list lengths from the Arrow offsets (``pyarrow.compute.list_value_length``),
without decoding a single token and without a Python loop over rows. A pair of columns gives
``(n, 2)`` (source, target) lengths. The lengths are then checked with the planner's rules
(:func:`~lightning_varbatch.planner.lengths.as_int_lengths`), with messages that name the column.

A Hugging Face ``datasets.Dataset`` after ``select``/``shuffle``/``filter`` keeps its rows in
the original table plus an indices mapping; the lengths are computed on the table and then
gathered through the mapping, so they are in the dataset's own row order.

Example:
    >>> import pyarrow as pa
    >>> table = pa.table({"src": [[5, 6, 7], [8]], "tgt": [[1], [2, 3]], "n": [3, 1]})
    >>> column_lengths(table, "n").tolist(), column_lengths(table, ("src", "tgt")).tolist()
    ([3, 1], [[3, 1], [1, 2]])
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeGuard

import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.lengths import as_int_lengths
from lightning_varbatch.planner.mixture_datasets import DataSource

__all__ = [
    "Columns",
    "arrow_table_of",
    "column_lengths",
    "is_arrow_table",
    "is_column_spec",
    "source_with_column_lengths",
]

#: One column name (lengths, or token ids whose list lengths are the lengths) or a
#: (source, target) pair of them.
Columns = str | tuple[str, str] | list[str]


def is_column_spec(value: object) -> TypeGuard[Columns]:
    """Whether ``value`` names columns (a string, or a pair of strings) rather than lengths.

    Example:
        >>> is_column_spec("num_tokens"), is_column_spec(("src", "tgt")), is_column_spec([3, 4])
        (True, True, False)
    """
    if isinstance(value, str):
        return True
    return (
        isinstance(value, (tuple, list))
        and len(value) > 0
        and all(isinstance(v, str) for v in value)
    )


def arrow_table_of(data: Any, name: str = "dataset") -> tuple[Any, np.ndarray | None]:
    """The Arrow table behind ``data`` and its row mapping (``None``: rows in table order).

    Accepts a Hugging Face ``datasets.Dataset`` (its memory-mapped table and, after
    ``select``/``shuffle``/``filter``, its indices mapping) or a ``pyarrow.Table``.

    Raises:
        TypeError: for anything else (a ``DatasetDict``, a streaming dataset, a list), with
            what to pass instead.

    Example:
        >>> import pyarrow as pa
        >>> table, rows = arrow_table_of(pa.table({"n": [1, 2]}))
        >>> table.num_rows, rows
        (2, None)
    """
    if is_arrow_table(data):
        return data, None
    kind = type(data).__name__
    if kind in ("DatasetDict", "IterableDatasetDict"):
        raise TypeError(f"{name} is a {kind} (several splits); pass one split, e.g. ds['train'].")
    if kind == "IterableDataset" and type(data).__module__.startswith("datasets"):
        raise TypeError(
            f"{name} is a streaming Hugging Face IterableDataset: its rows cannot be read by "
            "index, so their lengths cannot be planned up front. Load it without "
            "streaming=True (Arrow on disk, memory-mapped) or pass a map-style dataset."
        )
    table = getattr(data, "data", None)
    if table is not None and hasattr(data, "_indices"):  # datasets.Dataset
        inner = getattr(table, "table", table)
        if is_arrow_table(inner):
            mapping = data._indices
            rows = None
            if mapping is not None:
                rows = mapping.column(0).to_numpy()  # uint64 row ids, < 2**63: view them
                rows = rows.view(np.int64) if rows.dtype == np.uint64 else rows
            return inner, rows
    raise TypeError(
        f"{name} ({kind}) is not Arrow-backed: column names as lengths need a Hugging Face "
        "datasets.Dataset or a pyarrow.Table. For other datasets pass the lengths themselves "
        "(one integer per item, or (n, 2) source/target pairs)."
    )


def is_arrow_table(value: object) -> bool:
    """Whether ``value`` is a ``pyarrow.Table`` (checked without importing pyarrow).

    Example:
        >>> is_arrow_table([{"tokens": [1]}])
        False
    """
    kind = type(value)
    return kind.__name__ == "Table" and kind.__module__.startswith("pyarrow")


def _column_names(columns: object, name: str) -> list[str]:
    names = [columns] if isinstance(columns, str) else columns
    if not isinstance(names, (list, tuple)) or not all(isinstance(c, str) for c in names):
        raise SettingTypeError(
            f"{name} must name one column or a (source, target) pair of columns (strings), "
            f"got {columns!r}: pass a column name (or two).",
            setting=name,
            value=columns,
        )
    if not names or not all(names):
        raise SettingValueError(
            f"{name} must name one column or a (source, target) pair of columns, got "
            f"{columns!r}: pass a column name (or two).",
            setting=name,
            value=columns,
        )
    if len(names) > 2:
        raise SettingValueError(
            f"{name} names {len(names)} columns {list(names)}: give one column (lengths or "
            "token ids) or two, (source, target); for more fields reduce them to one length "
            "per example first (e.g. their maximum).",
            setting=name,
            value=columns,
        )
    if len(names) == 2 and names[0] == names[1]:
        raise SettingValueError(
            f"{name} names the column {names[0]!r} twice; give two different columns.",
            setting=name,
            value=columns,
        )
    return list(names)


def _one_column(
    table: Any, column: str, where: str, rows: np.ndarray | None, setting: str
) -> np.ndarray:
    """The lengths of ``column`` in the dataset's row order (``rows``: its indices mapping)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if column not in table.column_names:
        raise SettingValueError(
            f"{where}: the dataset has no column {column!r}; its columns are "
            f"{table.column_names}: pass one of them (a column of lengths or of token ids).",
            setting=setting,
            value=column,
        )
    col = table.column(column)
    if col.null_count:
        nulls = pc.is_null(col).to_numpy(zero_copy_only=False)
        mine = nulls if rows is None else nulls[rows]  # the dataset's own rows
        if mine.any():
            first = int(np.flatnonzero(mine)[0])
            raise ValueError(
                f"{where}: row {first} of column {column!r} is null ({int(mine.sum())} null "
                "row(s)): every example needs a length; fill them or filter them out "
                "(ds.filter(lambda r: r[...] is not None))."
            )
        # the nulls lie in rows the dataset left out (filtered): read only its own rows
        col, rows = col.take(pa.array(rows)), None
    values = _column_values(col, column, where)
    return values if rows is None else values[rows]


def _column_values(col: Any, column: str, where: str) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = col.type
    if (
        pa.types.is_list(kind)
        or pa.types.is_large_list(kind)
        or pa.types.is_fixed_size_list(kind)
        or (hasattr(pa.types, "is_list_view") and pa.types.is_list_view(kind))
        or (hasattr(pa.types, "is_large_list_view") and pa.types.is_large_list_view(kind))
    ):
        inner = kind.value_type
        if not pa.types.is_integer(inner):
            raise TypeError(
                f"{where}: column {column!r} is a list of {inner}, not of integer token ids "
                f"(type {kind}): pass a token-id column (list of ints) or a length column."
            )
        return np.asarray(pc.list_value_length(col).to_numpy())  # int32/int64, not widened
    if pa.types.is_integer(kind):
        values = np.asarray(col.to_numpy())
        if values.dtype in (np.int32, np.int64):
            return values
        # narrow ints widen to int32; uint32/uint64 go to int64 (as_int_lengths refuses >= 2**31)
        return values.astype(np.int32 if values.dtype.itemsize < 4 else np.int64)
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind):
        raise TypeError(
            f"{where}: column {column!r} holds text ({kind}), not token counts: count the "
            "tokens first with lightning_varbatch.sources.tokenized_lengths(ds, tokenizer, "
            f"{column!r}), or pass a token-id or length column instead."
        )
    if pa.types.is_floating(kind):
        raise TypeError(
            f"{where}: column {column!r} holds float values ({kind}); lengths must be integer "
            f"token counts: cast it (ds = ds.cast_column({column!r}, datasets.Value('int32'))) "
            "after checking that every value is a whole number."
        )
    raise TypeError(
        f"{where}: column {column!r} has type {kind}; expected integer lengths or a list of "
        "integer token ids."
    )


def column_lengths(data: Any, columns: Columns, name: str = "lengths") -> np.ndarray:
    """One length per row from Arrow columns, vectorised, checked with the planner's rules.

    Args:
        data: a Hugging Face ``datasets.Dataset`` or a ``pyarrow.Table``.
        columns: a column of integer lengths, a column of token ids (list of ints: their
            list lengths), or a (source, target) pair of such columns for ``(n, 2)`` lengths.
        name: the setting the columns were given as, for error messages.

    Returns:
        ``(n,)`` or ``(n, 2)`` integer lengths in the dataset's row order.

    Raises:
        TypeError: for a dataset that is not Arrow-backed, or a column of text, floats,
            lists of non-integers or another type.
        ValueError: for an unknown column (the columns are listed), nulls, or lengths that
            break the planner's rules (zeros, negatives...); the column is named.

    Example:
        >>> import pyarrow as pa
        >>> column_lengths(pa.table({"ids": [[1, 2], [3, 4, 5], [6]]}), "ids").tolist()
        [2, 3, 1]
        >>> column_lengths(pa.table({"n": [2, 0]}), "n", "train_lengths")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        lightning_varbatch.errors.SettingValueError: train_lengths (column 'n')[1] = 0: ...
    """
    names = _column_names(columns, name)
    table, rows = arrow_table_of(data, f"the dataset of {name}")
    per_column = [_one_column(table, c, f"{name} (column {c!r})", rows, name) for c in names]
    checked = [
        as_int_lengths(values, f"{name} (column {column!r})")
        for column, values in zip(names, per_column, strict=True)
    ]
    return checked[0] if len(checked) == 1 else np.stack(checked, axis=1)


def source_with_column_lengths(source: DataSource, name: str) -> DataSource:
    """``source`` with its ``lengths``/``loss_lengths`` read from its dataset's columns.

    A :class:`~lightning_varbatch.DataSource` whose ``lengths`` (or ``loss_lengths``) name
    columns of its Arrow-backed ``dataset`` gets the arrays instead; others are returned as
    they are.

    Raises:
        ValueError: when columns are named but the source has no ``dataset``.

    Example:
        >>> import pyarrow as pa
        >>> src = DataSource("ids", dataset=pa.table({"ids": [[1, 2], [3]]}), name="wmt")
        >>> source_with_column_lengths(src, "sources[0]").lengths.tolist()
        [2, 1]
    """
    changes: dict[str, Any] = {}
    for field in ("lengths", "loss_lengths"):
        given = getattr(source, field)
        if not is_column_spec(given):
            continue
        if source.dataset is None:
            raise SettingValueError(
                f"{name}: {field}={given!r} names columns, but the DataSource has no dataset "
                "to read them from: pass DataSource(..., dataset=ds).",
                setting=field,
                value=given,
            )
        changes[field] = column_lengths(source.dataset, given, f"{name} {field}")
    return dataclasses.replace(source, **changes) if changes else source
