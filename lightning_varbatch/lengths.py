"""Validation of per-example lengths and the oversize policy.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.config import PlanConfig
    >>> from lightning_varbatch.lengths import prepare_lengths
    >>> prep = prepare_lengths(np.array([[3, 4], [9, 2]]), PlanConfig(max_tokens=16))
    >>> prep.key.tolist(), prep.loss.tolist()
    ([4, 9], [4, 2])
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lightning_varbatch.config import PlanConfig


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


def _as_int_lengths(lengths: npt.ArrayLike, name: str) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)
    ):
        raise TypeError(f"{name} must be an integer array, got dtype {arr.dtype}.")
    if arr.ndim not in (1, 2) or (arr.ndim == 2 and arr.shape[1] != 2):
        raise ValueError(
            f"{name} must have shape (num_examples,) or (num_examples, 2) for "
            f"(source, target) pairs, got shape {arr.shape}."
        )
    if arr.shape[0] == 0:
        raise ValueError(
            f"{name} is empty: the dataset has no examples; check the data path or split."
        )
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr)
        if bad.any():
            i = int(np.flatnonzero(bad.reshape(arr.shape[0], -1).any(axis=1))[0])
            raise ValueError(f"{name}[{i}] is {arr[i].tolist()}: lengths must be finite integers.")
        frac = arr != np.floor(arr)
        if frac.any():
            i = int(np.flatnonzero(frac.reshape(arr.shape[0], -1).any(axis=1))[0])
            raise ValueError(
                f"{name}[{i}] = {arr[i].tolist()} is not an integer: lengths are token counts."
            )
    low = arr < 1
    if low.any():
        i = int(np.flatnonzero(low.reshape(arr.shape[0], -1).any(axis=1))[0])
        raise ValueError(
            f"{name}[{i}] = {arr[i].tolist()}: every length must be >= 1 (count EOS/BOS in "
            "the length, or filter empty examples out of the dataset)."
        )
    if arr.max() >= 2**31:
        raise ValueError(f"{name} holds a length >= 2**31; lengths are token counts.")
    if np.issubdtype(arr.dtype, np.floating):
        return arr.astype(np.int32)
    return arr


def _largest_fitting_length(config: PlanConfig, upper: int) -> int:
    """Longest length whose single example fits the budget (cost assumed monotone in length)."""
    if isinstance(config.cost, str):
        upper = min(upper, config.max_tokens)  # every built-in costs at least its length
    cand = np.arange(1, min(upper, 2**22) + 1, dtype=np.int64)
    p = config.pad_to_multiple_of
    cost = config.cost_fn(np.ones_like(cand), -(-cand // p) * p, cand)
    fits = np.flatnonzero(cost <= config.max_tokens)
    return int(fits[-1] + 1) if fits.size and fits[0] == 0 else 0


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
        ValueError: for empty, negative, zero, NaN, non-integer or mis-shaped lengths, and for an
            example over the budget under ``oversize="error"``; the message names the example,
            its length, the budget and the setting to change.
        TypeError: for a non-numeric array.

    Example:
        >>> import numpy as np
        >>> from lightning_varbatch.config import PlanConfig
        >>> p = prepare_lengths(np.array([5, 50]), PlanConfig(max_tokens=20, oversize="skip"))
        >>> p.kept.tolist(), p.num_skipped
        ([0], 1)
    """
    arr = _as_int_lengths(lengths, "lengths")
    pairs = arr.ndim == 2
    key = np.maximum(arr[:, 0], arr[:, 1]) if pairs else arr
    if loss_lengths is None:
        loss = arr[:, 1] if pairs else arr
    else:
        loss = _as_int_lengths(loss_lengths, "loss_lengths")
        if loss.shape != key.shape:
            raise ValueError(
                f"loss_lengths has shape {loss.shape} but lengths describe {key.shape[0]} "
                "examples; pass one loss length per example."
            )
    p = config.pad_to_multiple_of
    kmax = int(key.max())
    fit_len = _largest_fitting_length(config, kmax)
    over = key > fit_len
    num_skipped = num_truncated = 0
    truncate_to: int | None = None
    kept: np.ndarray | None = None
    if over.any():
        i = int(np.flatnonzero(over)[0])
        if config.oversize == "error" or fit_len == 0:
            longest = np.array([-(-int(key[i]) // p) * p])
            single = float(config.cost_fn(np.ones(1), longest, key[i : i + 1])[0])
            raise ValueError(
                f"Example {i} has length {int(key[i])} (cost {single:g} on its own) but the "
                f"budget is max_tokens={config.max_tokens}: raise max_tokens, or set "
                "oversize='skip' to leave such examples out or oversize='truncate' to cut "
                f"them ({int(over.sum())} example(s) are over the budget)."
            )
        if config.oversize == "skip":
            if over.all():
                raise ValueError(
                    f"Every example is over the budget max_tokens={config.max_tokens} (the "
                    f"shortest has length {int(key.min())}), so oversize='skip' would leave "
                    "nothing to train on: raise max_tokens."
                )
            kept = np.flatnonzero(~over).astype(np.int32 if key.shape[0] < 2**31 else np.int64)
            num_skipped = int(over.sum())
        else:
            num_truncated = int(over.sum())
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


def _compact(arr: np.ndarray, dtype: type[np.integer]) -> np.ndarray:
    """Reuse the caller's memory where the dtype allows (no copy of millions of lengths)."""
    if arr.dtype in (np.uint16, np.int16, np.int32, np.uint32) and arr.dtype.itemsize <= 4:
        if dtype is np.uint16 and arr.dtype == np.int16:
            return arr.view(np.uint16) if arr.flags.c_contiguous else arr.astype(np.uint16)
        if arr.dtype == dtype or dtype is np.int32:
            return arr
    return arr.astype(dtype)
