"""Validation of per-example lengths and the oversize policy.

Example:
    >>> prep = prepare_lengths(np.array([[3, 4], [9, 2]]), PlanConfig(max_tokens=16))
    >>> prep.key.tolist(), prep.loss.tolist()
    ([4, 9], [4, 2])
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.length_checks import as_int_lengths, shown_length
from lightning_varbatch.planner.search import largest_true
from lightning_varbatch.planner.settings import PlanConfig


@dataclass(frozen=True)
class PreparedLengths:
    """Lengths as the planner uses them.

    Attributes:
        key: every planning length (``max(src, tgt)`` for pairs), truncated; uint16 if it fits.
        loss: loss tokens of every example (the target column for pairs), after truncation.
        kept: ids of the examples that take part in the plan (``None``: all).
        num_skipped: examples left out by ``oversize="skip"``.
        num_truncated: examples cut by ``oversize="truncate"``.
        truncate_to: the length examples were cut to (``None`` when nothing was cut).
        pairs: whether the lengths were given as (source, target) pairs.
        diff: ``source - target`` per pair after truncation, int16 if it fits (both sides with
            :attr:`key`: :attr:`sides`); ``None`` for single lengths and under ``pair_order="max"``.
    """

    key: np.ndarray
    loss: np.ndarray
    kept: np.ndarray | None
    num_skipped: int
    num_truncated: int
    truncate_to: int | None
    pairs: bool
    diff: np.ndarray | None = None

    @property
    def sides(self) -> np.ndarray | None:
        """``(2, n)`` source, then target lengths as planned (``None`` without pairs).

        Example:
            >>> prepare_lengths(np.array([[3, 4], [9, 2]]), PlanConfig(16)).sides.tolist()
            [[3, 9], [4, 2]]
        """
        if self.diff is None:
            return None
        key = self.key.astype(np.int64)
        return np.stack((key + np.minimum(self.diff, 0), key - np.maximum(self.diff, 0)))

    @property
    def num_examples(self) -> int:
        """Number of examples in the dataset (skipped ones included)."""
        return int(self.key.shape[0])

    @property
    def planned_key(self) -> np.ndarray:
        """The planning lengths of the examples that take part (all but the skipped ones)."""
        return self.key if self.kept is None else self.key[self.kept]

    @classmethod
    def concat(cls, preps: list[PreparedLengths], truncate_to: int | None) -> PreparedLengths:
        """Several datasets' lengths as one, dataset after dataset; ``truncate_to``: common/None."""
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
            diff=(
                np.concatenate([p.diff for p in preps])  # type: ignore[misc]
                if all(p.diff is not None for p in preps)
                else None
            ),
        )


#: ``oversize="truncate"`` / ``"skip"`` refuse to cut or leave out more than this fraction of
#: the examples: a budget below most examples is a wrong ``max_tokens``, not a data cleanup.
MAX_OVERSIZE_FRACTION = 0.5


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
    """Longest length ``<= upper`` whose single example fits the budget (0 if none), bisected.

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


def prepare_lengths(
    lengths: npt.ArrayLike, config: PlanConfig, loss_lengths: npt.ArrayLike | None = None
) -> PreparedLengths:
    """Validate lengths and apply the oversize policy.

    Args:
        lengths: ``(n,)`` lengths or ``(n, 2)`` (source, target) lengths.
        config: the planner settings.
        loss_lengths: loss tokens per example, if not the lengths (or target column for pairs).

    Returns:
        The prepared lengths.

    Raises:
        SettingValueError: for empty, negative, zero, NaN, non-integer or mis-shaped lengths
            (``.setting``: ``"lengths"`` or ``"loss_lengths"``), and for an example over the
            budget under ``oversize="error"`` (``"max_tokens"``), naming the example.
        SettingTypeError: for a non-numeric array.

    Example:
        >>> p = prepare_lengths(np.array([5, 50]), PlanConfig(max_tokens=20, oversize="skip"))
        >>> p.kept.tolist(), p.num_skipped
        ([0], 1)
    """
    arr = as_int_lengths(lengths, "lengths")
    pairs = arr.ndim == 2
    key = np.maximum(arr[:, 0], arr[:, 1]) if pairs else arr
    target = arr[:, 1] if pairs else arr
    if loss_lengths is None:
        loss = target
    else:
        check_loss_lengths(config, loss_lengths)  # not both: loss_offset derives them
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
                f"the planner budgets for example {i} (lengths[{i}] = {shown_length(arr[i])}): an "
                "example cannot have more loss tokens than tokens, so the lengths understate "
                "it and its micro-batch would exceed the budget. Pass the padded widths the "
                f"collate produces as lengths ({int(more.sum())} example(s) affected).",
                setting="loss_lengths",
                value=loss_lengths,
            )
    fit_len = largest_fitting_length(config, int(key.max()))
    over = key > fit_len
    num_skipped = num_truncated = 0
    truncate_to: int | None = None
    kept: np.ndarray | None = None
    if over.any():
        i = int(np.flatnonzero(over)[0])
        if config.oversize == "error" or fit_len == 0:
            single = single_cost(config, int(key[i]))
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
    if config.loss_offset and loss_lengths is None:  # derived exactly, after truncation
        loss = loss_tokens(config, target, truncate_to)
    return PreparedLengths(
        key=_compact(key, np.uint16 if int(key.max()) < 2**16 else np.int32),
        loss=_compact(loss, np.int32),
        kept=kept,
        num_skipped=num_skipped,
        num_truncated=num_truncated,
        truncate_to=truncate_to,
        pairs=pairs,
        diff=_diff(arr, truncate_to) if pairs and config.pair_order == "two_sided" else None,
    )


def _diff(arr: np.ndarray, truncate_to: int | None) -> np.ndarray:
    """Pairs' ``source - target``, both cut to ``truncate_to``; int16 when it fits."""
    longest = int(arr.max()) if truncate_to is None else truncate_to
    diff = np.empty(arr.shape[0], dtype=np.int16 if longest < 2**15 else np.int64)
    chunk = 1 << 18  # bounded temporaries for millions of pairs
    for lo in range(0, arr.shape[0], chunk):
        part = arr[lo : lo + chunk].astype(np.int64)
        if truncate_to is not None:
            np.minimum(part, truncate_to, out=part)
        diff[lo : lo + chunk] = part[:, 0] - part[:, 1]
    return diff


def _check_oversize_share(config: PlanConfig, key: np.ndarray, num_over: int, fit: int) -> None:
    """Warn with the counts skipped or cut; refuse more than :data:`MAX_OVERSIZE_FRACTION`."""
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


def loss_tokens(
    config: PlanConfig, target: np.ndarray, truncate_to: int | None = None
) -> np.ndarray:
    """Every example's loss tokens, derived from its length with ``loss_offset``.

    The rule the collates count by: padded batches cut to ``truncate_to`` first, then
    predict all but ``loss_offset`` tokens, ``max(min(L, T) - k, 0)``; packed rows label
    each kept token with the next of the *whole* example, ``max(min(L - k, T), 0)``.

    Args:
        config: the planner settings (``loss_offset``, ``layout``).
        target: every example's loss-side length (the target's), before truncation.
        truncate_to: the length over-budget examples are cut to (``None``: none cut).

    Returns:
        ``int64`` loss tokens, one per example.

    Example:
        >>> lengths = np.array([1, 5, 9])
        >>> loss_tokens(PlanConfig(8, loss_offset=1), lengths, truncate_to=6).tolist()
        [0, 4, 5]
        >>> loss_tokens(PlanConfig(8, loss_offset=1, layout="packed"), lengths, 6).tolist()
        [0, 4, 6]
    """
    length = np.asarray(target).astype(np.int64)
    k = config.loss_offset
    if truncate_to is None:
        return np.maximum(length - k, 0)
    if config.layout == "packed":
        return np.maximum(np.minimum(length - k, truncate_to), 0)
    return np.maximum(np.minimum(length, truncate_to) - k, 0)


def check_loss_lengths(config: PlanConfig, loss_lengths: object) -> None:
    """Refuse ``loss_lengths`` with a ``loss_offset`` (offset subtracted twice, or collate differs).

    Raises:
        SettingValueError: (``.setting``: ``"loss_offset"``) when both are given.

    Example:
        >>> check_loss_lengths(PlanConfig(8, loss_offset=1), None)  # derived: fine
    """
    if loss_lengths is None or not config.loss_offset:
        return
    raise SettingValueError(
        f"loss_offset={config.loss_offset} derives every example's loss tokens from its "
        "length (after truncation), but loss_lengths were given too: pass one of them. "
        "For teacher forcing drop loss_lengths (e.g. lengths - 1) and keep "
        f"loss_offset={config.loss_offset}; for loss tokens counted another way keep "
        "loss_lengths and leave loss_offset=0.",
        setting="loss_offset",
        value=config.loss_offset,
    )
