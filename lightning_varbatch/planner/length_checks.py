"""The one check of a lengths array: positive whole numbers, ``(n,)`` or ``(n, 2)``.

Every layer that takes lengths from a user (the planner, the Arrow and shard sources, the
memory-budget finder) checks them with :func:`as_int_lengths`, so one bad value gives one error type
and message everywhere: the message names the argument, the first bad item and what to pass instead.

Example:
    >>> as_int_lengths([[3, 4], [9, 2]], "lengths").tolist()
    [[3, 4], [9, 2]]
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = ["as_int_lengths", "shown_length"]

_ALLOWED = (
    "a sequence or array of positive whole numbers, shape (num_examples,) or "
    "(num_examples, 2) for (source, target) pairs"
)


def _first_bad(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask.reshape(mask.shape[0], -1).any(axis=1))[0])


def _ragged_message(lengths: object, name: str, err: Exception) -> str:
    """Say which item of a ragged or mixed sequence breaks the array."""
    detail = ""
    if isinstance(lengths, (list, tuple)) and lengths:
        first = lengths[0]
        width = len(first) if isinstance(first, (list, tuple, np.ndarray)) else None
        for i, item in enumerate(lengths):
            w = len(item) if isinstance(item, (list, tuple, np.ndarray)) else None
            if w != width:
                detail = (
                    f" {name}[0] is {first!r} but {name}[{i}] is {item!r}: every item must "
                    "have the same shape (one number, or one (source, target) pair)."
                )
                break
    return (
        f"{name} must be {_ALLOWED}, got a ragged or mixed {type(lengths).__name__} that is "
        f"not one rectangular numeric array ({err}).{detail} Give every example the same "
        "number of lengths."
    )


def as_int_lengths(
    lengths: npt.ArrayLike, name: str, minimum: int = 1, *, setting: str | None = None
) -> np.ndarray:
    """``lengths`` (``(n,)`` or ``(n, 2)``) as an integer array, or an error naming ``name``.

    ``minimum``: the smallest allowed value (0 for loss lengths); ``name``: how the message
    names the lengths; ``setting``: the error's ``.setting`` (default: ``name``).

    Raises:
        SettingTypeError: for anything but an array of numbers (also a ``TypeError``).
        SettingValueError: for a ragged, empty or mis-shaped array, or lengths not whole and >= 1.
    """
    setting = name if setting is None else setting
    if lengths is None or isinstance(lengths, (str, bytes, dict, set)):
        column = (
            " (to read a column of a Hugging Face dataset or pyarrow table, pass the name to "
            "TokenBudgetDataModule or a DataSource with its dataset, or use "
            "lightning_varbatch.sources.column_lengths(ds, name))"
            if isinstance(lengths, str)
            else ""
        )
        raise SettingTypeError(
            f"{name} must be {_ALLOWED}, got {type(lengths).__name__} {lengths!r:.60}; pass "
            f"e.g. a numpy array of token counts{column}.",
            setting=setting,
            value=lengths,
        )
    try:
        arr = np.asarray(lengths)
    except (ValueError, TypeError) as err:
        raise SettingValueError(
            _ragged_message(lengths, name, err), setting=setting, value=lengths
        ) from None
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        where = ""
        if arr.ndim >= 1 and arr.size:
            flat = arr.reshape(-1)
            i = next(
                (
                    j
                    for j, v in enumerate(flat.tolist())
                    if isinstance(v, bool) or not isinstance(v, (int, float))
                ),
                0,
            )
            row = i // (arr.size // arr.shape[0]) if arr.shape[0] else 0
            where = f"; {name}[{row}] is {arr.reshape(arr.shape[0], -1)[row].tolist()!r}"
        raise SettingTypeError(
            f"{name} must be an integer array, got dtype {arr.dtype}{where}; "
            f"{name} must be {_ALLOWED} (convert token ids to lengths with len(), and strings "
            "to numbers).",
            setting=setting,
            value=lengths,
        )
    if arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[1] != 2):
        hint = (
            "a single number is not a dataset: pass one length per example"
            if arr.ndim == 0
            else "for (source, target) pairs pass two columns; for other costs reduce the "
            "columns to one planning length per example first (e.g. their maximum)"
        )
        raise SettingValueError(
            f"{name} must have shape (num_examples,) or (num_examples, 2) for "
            f"(source, target) pairs, got shape {arr.shape} ({arr.ndim}-d): {hint}.",
            setting=setting,
            value=lengths,
        )
    if arr.shape[0] == 0:
        raise SettingValueError(
            f"{name} is empty: the dataset has no examples; check the data path or split.",
            setting=setting,
            value=lengths,
        )
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr)
        if bad.any():
            i = _first_bad(bad)
            raise SettingValueError(
                f"{name}[{i}] is {shown_length(arr[i])}: lengths must be finite integers >= 1 "
                "(token counts); fix or drop that example.",
                setting=setting,
                value=lengths,
            )
        frac = arr != np.floor(arr)
        if frac.any():
            i = _first_bad(frac)
            raise SettingValueError(
                f"{name}[{i}] = {shown_length(arr[i])} is not an integer: lengths are token counts "
                "(whole numbers >= 1); pass the number of tokens of each example.",
                setting=setting,
                value=lengths,
            )
    low = arr < minimum
    if low.any():
        i = _first_bad(low)
        hint = (
            "count EOS/BOS in the length, or filter empty examples out of the dataset"
            if minimum
            else "a loss length counts the example's loss tokens, 0 or more"
        )
        raise SettingValueError(
            f"{name}[{i}] = {shown_length(arr[i])}: every length must be >= {minimum} ({hint}).",
            setting=setting,
            value=lengths,
        )
    high = arr >= 2**31
    if high.any():
        i = _first_bad(high)
        raise SettingValueError(
            f"{name}[{i}] = {shown_length(arr[i])}: lengths must be < 2**31 = 2147483648 tokens "
            "(they are token counts; check that you passed lengths, not token ids or bytes).",
            setting=setting,
            value=lengths,
        )
    if np.issubdtype(arr.dtype, np.floating) or arr.dtype in (np.uint32, np.uint64):
        return arr.astype(np.int32)
    return arr


def shown_length(value: np.ndarray) -> str:
    """A length or pair as a user would write it (``nan``, ``2.5``, ``[4, 0]``)."""
    listed = value.tolist()
    if isinstance(listed, float) and listed.is_integer():
        return str(int(listed))
    return str(listed)
