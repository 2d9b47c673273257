"""Lengths read from Arrow columns: a Hugging Face dataset's, a pyarrow table's, vectorised.

A length column (``num_tokens``) is read as is; a token-id list column (``input_ids``) gives its
list lengths from the Arrow offsets (``pyarrow.compute.list_value_length``): no token decoded, no
Python loop over rows. A pair of columns gives ``(n, 2)`` (source, target) lengths. They are
checked by the planner's rules (:func:`~.lengths.as_int_lengths`), the messages naming the column.

A ``datasets.Dataset`` after ``select``/``shuffle``/``filter`` keeps the original table plus an
indices mapping: lengths are computed on the table, then gathered into the dataset's row order.

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
    "is_list_type",
    "null_rows",
    "source_with_column_lengths",
]

#: One column name (of lengths, or of token ids: their list lengths) or a (source, target) pair.
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
        TypeError: for anything else (a ``DatasetDict``, a stream, a list), saying what to pass.

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


def is_list_type(kind: Any) -> bool:
    """Whether an Arrow type is a list of any kind (list, large, fixed-size, view)."""
    import pyarrow as pa

    kinds = ("list", "large_list", "fixed_size_list", "list_view", "large_list_view")
    return any(getattr(pa.types, f"is_{k}", lambda _: False)(kind) for k in kinds)


def null_rows(column: Any) -> np.ndarray | None:
    """Per row of an Arrow column: whether it is null or (a list column) holds a null value.

    ``None`` when no row does, known from the null counts without a pass over the rows.

    Example:
        >>> import pyarrow as pa
        >>> null_rows(pa.chunked_array([[[1], [2, None], None]])).tolist()
        [False, True, True]
    """
    import pyarrow.compute as pc

    inner = pc.list_flatten(column) if is_list_type(column.type) else None
    if not column.null_count and (inner is None or not inner.null_count):
        return None
    bad = np.array(pc.is_null(column).to_numpy(zero_copy_only=False), dtype=bool)
    if inner is not None and inner.null_count:
        parents = np.asarray(pc.list_parent_indices(column).to_numpy(zero_copy_only=False))
        bad[parents[np.asarray(pc.is_null(inner).to_numpy(zero_copy_only=False))]] = True
    return bad


def _one_column(
    table: Any, column: str, where: str, rows: np.ndarray | None, setting: str, shard: bool
) -> np.ndarray:
    """The lengths of ``column`` in the dataset's row order (``rows``: its indices mapping)."""
    import pyarrow as pa

    if column not in table.column_names:
        raise SettingValueError(
            f"{where}: the dataset has no column {column!r}; its columns are "
            f"{table.column_names}: pass one of them (a column of lengths or of token ids).",
            setting=setting,
            value=column,
        )
    col = table.column(column)
    bad = null_rows(col)
    if bad is not None:
        mine = bad if rows is None else bad[rows]  # the dataset's own rows
        if mine.any():
            first = int(np.flatnonzero(mine)[0])
            whole = not col[first if rows is None else int(rows[first])].is_valid
            inside = f" and None not in r[{column!r}]" if is_list_type(col.type) else ""
            raise (SettingValueError if whole else SettingTypeError)(
                f"{where}: row {first} of column {column!r} "
                f"{'is null' if whole else 'holds a null token id'} ({int(mine.sum())} row(s) "
                "null or holding a null): every example needs its length or integer token ids."
                f" Fill or drop those rows{' and re-write the shard' if shard else ''} (e.g. ds "
                f"= ds.filter(lambda r: r[{column!r}] is not None{inside})).",
                setting=setting,
                value=column,
            )
        # the nulls lie in rows the dataset left out (filtered): read only its own rows
        col, rows = col.take(pa.array(rows)), None
    values = _column_values(col, column, where, setting, shard)
    return values if rows is None else values[rows]


#: What makes text streamable (counting its tokens is not enough).
STREAM_TEXT_FIX = (
    "a stream reads the token ids from its shards, so counting tokens cannot make text "
    "streamable: tokenize it into a token-id column first and name that column in columns, "
    "e.g. ds = ds.map(lambda b: {'input_ids': tok(b['text'])['input_ids']}, batched=True) "
    "for a Hugging Face dataset (ds.to_parquet(...) writes it as a shard), or write the "
    "token ids when you make the shard files"
)


def _column_values(col: Any, column: str, where: str, setting: str, shard: bool) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    kind = col.type
    if is_list_type(kind):
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
        count = "count the tokens with lightning_varbatch.sources.tokenized_lengths(ds, "
        count += f"tokenizer, {column!r}) first"
        fix = STREAM_TEXT_FIX if shard else f"{count}, or pass a token-id or length column"
        raise SettingTypeError(
            f"{where}: column {column!r} holds text ({kind}), not token ids or lengths: {fix}.",
            setting=setting,
            value=column,
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


def column_lengths(
    data: Any, columns: Columns, name: str = "lengths", *, shard: bool = False
) -> np.ndarray:
    """One length per row from Arrow columns, vectorised, checked with the planner's rules.

    Args:
        data: a Hugging Face ``datasets.Dataset`` or a ``pyarrow.Table``.
        columns: a column of lengths or token ids (their list lengths), or a (source, target) pair.
        name: the setting the columns were given as, for error messages.
        shard: the columns of a stream's shard (``name`` then names the shard): errors
            name the setting ``columns`` and say what makes text streamable.

    Returns:
        ``(n,)`` or ``(n, 2)`` integer lengths in the dataset's row order.

    Raises:
        TypeError: for a non-Arrow dataset, or a column of text, floats, lists of non-integers or
            another type (text and a null token id inside a row: ``SettingTypeError``).
        ValueError: for an unknown column (listing them), a null row (``SettingValueError``) or
            lengths breaking the planner's rules (zeros, negatives...), naming column and row.

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
    setting = "columns" if shard else name
    per_column = [
        _one_column(table, c, f"{name} (column {c!r})", rows, setting, shard) for c in names
    ]
    checked = [
        as_int_lengths(values, f"{name} (column {column!r})")
        for column, values in zip(names, per_column, strict=True)
    ]
    return checked[0] if len(checked) == 1 else np.stack(checked, axis=1)


def source_with_column_lengths(source: DataSource, name: str) -> DataSource:
    """``source`` with its ``lengths``/``loss_lengths`` read from its dataset's columns.

    A :class:`~lightning_varbatch.DataSource` whose ``lengths`` (or ``loss_lengths``) name columns
    of its Arrow-backed ``dataset`` gets the arrays instead; others are returned as they are.

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
