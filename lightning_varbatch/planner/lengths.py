"""Validation of per-example lengths and the oversize policy.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> from lightning_varbatch.planner.lengths import prepare_lengths
    >>> prep = prepare_lengths(np.array([[3, 4], [9, 2]]), PlanConfig(max_tokens=16))
    >>> prep.key.tolist(), prep.loss.tolist()
    ([4, 9], [4, 2])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.search import largest_true
from lightning_varbatch.planner.settings import PlanConfig


@dataclass(frozen=True)
class PreparedLengths:
    """Lengths as the planner uses them.

    Attributes:
        key: planning length of every example (``max(src, tgt)`` for pairs, fairseq's rule),
            after truncation; unsigned 16-bit when it fits, else 32-bit.
        loss: loss tokens of every example (the target column for pairs), after truncation.
        kept: ids of the examples that take part in the plan, ``None`` when all do (nothing
            was skipped).
        num_skipped: examples left out by ``oversize="skip"``.
        num_truncated: examples cut by ``oversize="truncate"``.
        truncate_to: the length examples were cut to (``None`` when nothing was cut).
        pairs: whether the lengths were given as (source, target) pairs.
    """

    key: np.ndarray
    loss: np.ndarray
    kept: np.ndarray | None
    num_skipped: int
    num_truncated: int
    truncate_to: int | None
    pairs: bool

    @property
    def num_examples(self) -> int:
        """Number of examples in the dataset (skipped ones included)."""
        return int(self.key.shape[0])

    @classmethod
    def concat(cls, preps: list[PreparedLengths], truncate_to: int | None) -> PreparedLengths:
        """Several datasets' lengths as one, in global id order (dataset after dataset).

        ``truncate_to`` is the common truncation length (``None`` when the datasets differ).
        """
        kept = None
        if any(p.kept is not None for p in preps):
            offsets = np.cumsum([0] + [p.num_examples for p in preps]).tolist()
            kept = np.concatenate(
                [
                    (np.arange(p.num_examples) if p.kept is None else p.kept) + off
                    for p, off in zip(preps, offsets, strict=False)
                ]
            )
        wide = any(p.key.dtype != np.uint16 for p in preps)
        return cls(
            key=np.concatenate([p.key.astype(np.int32 if wide else np.uint16) for p in preps]),
            loss=np.concatenate([p.loss.astype(np.int32) for p in preps]),
            kept=kept,
            num_skipped=sum(p.num_skipped for p in preps),
            num_truncated=sum(p.num_truncated for p in preps),
            truncate_to=truncate_to,
            pairs=all(p.pairs for p in preps),
        )


#: ``oversize="truncate"`` / ``"skip"`` refuse to cut or leave out more than this fraction of
#: the examples: a budget below most examples is a wrong ``max_tokens``, not a data cleanup.
MAX_OVERSIZE_FRACTION = 0.5

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

    ``minimum`` is the smallest allowed value (0 for loss lengths: an example may carry no
    loss token, e.g. a one-token document under next-token prediction). ``name`` is how the
    message names the lengths (``"train_lengths (column 'n')"``); ``setting`` is the setting
    the error carries as ``.setting`` (default: ``name``; e.g. ``"train_lengths"``).

    Raises:
        SettingTypeError: for something that is not an array of numbers (``.setting`` is
            ``setting``; also a ``TypeError``).
        SettingValueError: for a ragged, empty or badly shaped array, or lengths that are not
            whole numbers >= 1.
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
                f"{name}[{i}] is {_shown(arr[i])}: lengths must be finite integers >= 1 "
                "(token counts); fix or drop that example.",
                setting=setting,
                value=lengths,
            )
        frac = arr != np.floor(arr)
        if frac.any():
            i = _first_bad(frac)
            raise SettingValueError(
                f"{name}[{i}] = {_shown(arr[i])} is not an integer: lengths are token counts "
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
            f"{name}[{i}] = {_shown(arr[i])}: every length must be >= {minimum} ({hint}).",
            setting=setting,
            value=lengths,
        )
    high = arr >= 2**31
    if high.any():
        i = _first_bad(high)
        raise SettingValueError(
            f"{name}[{i}] = {_shown(arr[i])}: lengths must be < 2**31 = 2147483648 tokens "
            "(they are token counts; check that you passed lengths, not token ids or bytes).",
            setting=setting,
            value=lengths,
        )
    if np.issubdtype(arr.dtype, np.floating) or arr.dtype in (np.uint32, np.uint64):
        return arr.astype(np.int32)
    return arr


def _shown(value: np.ndarray) -> str:
    """A length or pair as a user would write it (``nan``, ``2.5``, ``[4, 0]``)."""
    listed = value.tolist()
    if isinstance(listed, float) and listed.is_integer():
        return str(int(listed))
    return str(listed)


def single_cost(config: PlanConfig, length: int) -> float:
    """The cost of a micro-batch holding one example of ``length`` (padded as planned).

    Example:
        >>> single_cost(PlanConfig(max_tokens=64, pad_to_multiple_of=8), 5)
        8.0
    """
    p = config.pad_to_multiple_of
    padded = np.array([-(-length // p) * p], dtype=np.int64)
    return float(config.cost_fn(np.ones(1), padded, np.array([length], dtype=np.int64))[0])


def largest_fitting_length(config: PlanConfig, upper: int) -> int:
    """Longest length ``<= upper`` whose single example fits the budget (0 if none).

    Bisection, so any length a budget can hold is allowed (the cost is assumed
    non-decreasing in the length, as :mod:`lightning_varbatch.planner.costs` requires).

    Example:
        >>> largest_fitting_length(PlanConfig(max_tokens=20, pad_to_multiple_of=8), 100)
        16
    """
    if isinstance(config.cost, str):
        upper = min(upper, config.max_tokens)  # every built-in costs at least its length
    if single_cost(config, 1) > config.max_tokens:
        return 0
    fits = largest_true(lambda n: single_cost(config, int(n)) <= config.max_tokens, 1, upper)
    return int(fits)


#: Old private name, kept until ``lightning_varbatch/plan.py`` imports :func:`as_int_lengths`.
_as_int_lengths = as_int_lengths


def prepare_lengths(
    lengths: npt.ArrayLike, config: PlanConfig, loss_lengths: npt.ArrayLike | None = None
) -> PreparedLengths:
    """Validate lengths and apply the oversize policy.

    Args:
        lengths: ``(n,)`` lengths or ``(n, 2)`` (source, target) lengths.
        config: the planner settings.
        loss_lengths: loss tokens per example when they differ from the default (the lengths
            themselves, or the target column for pairs).

    Returns:
        The prepared lengths.

    Raises:
        SettingValueError: for empty, negative, zero, NaN, non-integer or mis-shaped lengths
            (``.setting``: ``"lengths"`` or ``"loss_lengths"``), and for an example over the
            budget under ``oversize="error"`` (``.setting``: ``"max_tokens"``); the message
            names the example, its length, the budget and the setting to change.
        SettingTypeError: for a non-numeric array.

    Example:
        >>> import numpy as np
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> p = prepare_lengths(np.array([5, 50]), PlanConfig(max_tokens=20, oversize="skip"))
        >>> p.kept.tolist(), p.num_skipped
        ([0], 1)
    """
    arr = as_int_lengths(lengths, "lengths")
    pairs = arr.ndim == 2
    key = np.maximum(arr[:, 0], arr[:, 1]) if pairs else arr
    if loss_lengths is None:
        loss = arr[:, 1] if pairs else arr
    else:
        loss = as_int_lengths(loss_lengths, "loss_lengths", minimum=0)
        if loss.shape != key.shape:
            raise SettingValueError(
                f"loss_lengths has shape {loss.shape} but lengths describe {key.shape[0]} "
                "examples; pass one loss length per example.",
                setting="loss_lengths",
                value=loss_lengths,
            )
        more = loss > key
        if more.any():
            i = int(np.flatnonzero(more)[0])
            raise SettingValueError(
                f"loss_lengths[{i}] = {int(loss[i])} is more than the {int(key[i])} tokens "
                f"the planner budgets for example {i} (lengths[{i}] = {_shown(arr[i])}): an "
                "example cannot have more loss tokens than tokens, so the lengths understate "
                "it and its micro-batch would exceed the budget. Pass the padded widths the "
                f"collate produces as lengths ({int(more.sum())} example(s) affected).",
                setting="loss_lengths",
                value=loss_lengths,
            )
    p = config.pad_to_multiple_of
    kmax = int(key.max())
    fit_len = largest_fitting_length(config, kmax)
    over = key > fit_len
    num_skipped = num_truncated = 0
    truncate_to: int | None = None
    kept: np.ndarray | None = None
    if over.any():
        i = int(np.flatnonzero(over)[0])
        if config.oversize == "error" or fit_len == 0:
            longest = np.array([-(-int(key[i]) // p) * p])
            single = float(config.cost_fn(np.ones(1), longest, key[i : i + 1])[0])
            raise SettingValueError(
                f"Example {i} has length {int(key[i])} (cost {single:g} on its own) but the "
                f"budget is max_tokens={config.max_tokens}: raise max_tokens, or set "
                "oversize='skip' to leave such examples out or oversize='truncate' to cut "
                f"them ({int(over.sum())} example(s) are over the budget).",
                setting="max_tokens",
                value=config.max_tokens,
            )
        num_over = int(over.sum())
        _check_oversize_share(config, key, num_over, fit_len)
        if config.oversize == "skip":
            kept = np.flatnonzero(~over).astype(np.int32 if key.shape[0] < 2**31 else np.int64)
            num_skipped = num_over
        else:
            num_truncated = num_over
            truncate_to = fit_len
            key = np.minimum(key, fit_len)
            loss = np.minimum(loss, fit_len)
    return PreparedLengths(
        key=_compact(key, np.uint16 if int(key.max()) < 2**16 else np.int32),
        loss=_compact(loss, np.int32),
        kept=kept,
        num_skipped=num_skipped,
        num_truncated=num_truncated,
        truncate_to=truncate_to,
        pairs=pairs,
    )


def _check_oversize_share(config: PlanConfig, key: np.ndarray, num_over: int, fit: int) -> None:
    """The one place that decides whether skipping / truncating over-budget examples is sane.

    Any example skipped or truncated gives a :class:`UserWarning` with the counts; more than
    :data:`MAX_OVERSIZE_FRACTION` of the examples, or all of them, is refused: the budget is
    then wrong, not the data.
    """
    n = int(key.shape[0])
    action = "left out" if config.oversize == "skip" else f"cut to length {fit}"
    counts = (
        f"{num_over} of {n} examples ({100 * num_over / n:.1f} %) are longer than {fit}, the "
        f"longest length that fits max_tokens={config.max_tokens} on its own (the longest "
        f"example has length {int(key.max())}, the shortest {int(key.min())})"
    )
    if num_over == n and config.oversize == "skip":
        raise SettingValueError(
            f"Every example is over the budget max_tokens={config.max_tokens} (the shortest "
            f"has length {int(key.min())}), so oversize='skip' would leave nothing to train "
            "on: raise max_tokens.",
            setting="max_tokens",
            value=config.max_tokens,
        )
    if num_over > MAX_OVERSIZE_FRACTION * n:
        raise SettingValueError(
            f"oversize={config.oversize!r} would leave {num_over} of {n} examples "
            f"{action}, more than the {MAX_OVERSIZE_FRACTION:.0%} this library allows: "
            f"{counts}. max_tokens={config.max_tokens} is probably too small for this data: "
            f"raise max_tokens (to at least the cost of one example of length "
            f"{int(np.sort(key)[n // 2])} to keep half of them), or cut the data to a shorter "
            "max_length before planning.",
            setting="max_tokens",
            value=config.max_tokens,
        )
    warnings.warn(
        f"oversize={config.oversize!r}: {counts}; they are {action} "
        f"(num_{'skipped' if config.oversize == 'skip' else 'truncated'}={num_over}). Raise "
        "max_tokens to keep them whole.",
        UserWarning,
        stacklevel=4,
    )


def _compact(arr: np.ndarray, dtype: type[np.integer]) -> np.ndarray:
    """Reuse the caller's memory where the dtype allows (no copy of millions of lengths)."""
    if arr.dtype in (np.uint16, np.int16, np.int32, np.uint32) and arr.dtype.itemsize <= 4:
        if dtype is np.uint16 and arr.dtype == np.int16:
            return arr.view(np.uint16) if arr.flags.c_contiguous else arr.astype(np.uint16)
        if arr.dtype == dtype or dtype is np.int32:
            return arr
    return arr.astype(dtype)
