"""The shape budget: every micro-batch padded to one of at most ``max_shapes`` static shapes.

For ``torch.compile`` and CUDA graphs: :func:`choose_shape_lengths` picks the ``K`` padded
lengths that pad least (an exact dynamic programme), :func:`shape_rows` gives each the most
rows within the budget; every micro-batch is padded to the shape of its longest example.

Example:
    >>> choose_shape_lengths(np.array([3, 3, 4, 9, 10, 10]), 2, 1).tolist()
    [4, 10]
    >>> shape_rows(np.array([4, 10]), PlanConfig(max_tokens=40, max_shapes=2)).tolist()
    [10, 4]
"""

from __future__ import annotations

import numpy as np

from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sorted_cut import full_batch_sizes

__all__ = ["MAX_CANDIDATES", "choose_shape_lengths", "shape_rows"]

#: The partition runs over at most this many candidate lengths (quantiles above it).
MAX_CANDIDATES = 1024


def _candidates(padded: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct padded lengths (or quantiles of them) and how many examples each stands for.

    Each example counts at the smallest candidate holding it; the longest is always a candidate.
    """
    values, counts = np.unique(padded, return_counts=True)
    if values.size <= MAX_CANDIDATES:
        return values, counts
    cum = np.cumsum(counts)
    picks = np.searchsorted(cum, np.linspace(0, cum[-1], MAX_CANDIDATES + 1)[1:], side="left")
    cand = np.unique(np.append(values[np.minimum(picks, values.size - 1)], values[-1]))
    slot = np.searchsorted(cand, values, side="left")
    return cand, np.bincount(slot, weights=counts, minlength=cand.size).astype(np.int64)


def choose_shape_lengths(key: np.ndarray, max_shapes: int, pad_to_multiple_of: int) -> np.ndarray:
    """The at most ``max_shapes`` padded lengths that pad ``key`` least, ascending.

    Args:
        key: planning length of every planned example (``max(source, target)`` for pairs).
        max_shapes: the number of lengths to choose (fewer for fewer distinct lengths).
        pad_to_multiple_of: every chosen length is a multiple of this.

    Returns:
        ``(k,)`` int64 lengths, ascending; the last is the longest (rounded) length.
    """
    p = int(pad_to_multiple_of)
    padded = -(-np.asarray(key, dtype=np.int64) // p) * p
    if padded.size == 0:
        return np.zeros(0, dtype=np.int64)
    values, counts = _candidates(padded)
    v = values.size
    if v <= max_shapes:
        return values.astype(np.int64)
    cum = np.concatenate(([0], np.cumsum(counts))).astype(np.float64)
    val = values.astype(np.float64)
    # span[i, j]: the examples of candidates i..j padded to candidate j (inf when i > j).
    i = np.arange(v)[:, None]
    j = np.arange(v)[None, :]
    span = np.where(i <= j, (cum[1:][None, :] - cum[:-1][:, None]) * val[None, :], np.inf)
    # best[j]: least padded total of candidates 0..j with at most k + 1 lengths, the last at
    # j; back[k, j]: where the last length's candidates start (-1: k lengths were enough).
    best = span[0].copy()
    back = np.full((max_shapes, v), -1, dtype=np.int64)
    for k in range(1, max_shapes):
        total = np.concatenate(([0.0], best[:-1]))[1:, None] + span[1:]  # cut before i >= 1
        first = np.argmin(total, axis=0)
        split = total[first, np.arange(v)]
        better = split < best
        back[k] = np.where(better, first + 1, -1)
        best = np.where(better, split, best)
    chosen = [v - 1]
    last = v - 1
    for k in range(max_shapes - 1, 0, -1):
        if back[k, last] >= 0:
            last = int(back[k, last]) - 1
            chosen.append(last)
    return values[np.array(sorted(chosen))].astype(np.int64)


def shape_rows(lengths: np.ndarray, config: PlanConfig) -> np.ndarray:
    """Rows of every shape: the most examples of each padded length within the budget."""
    lengths = np.asarray(lengths, dtype=np.int64)
    cap = config.max_examples or int(config.max_tokens)
    return full_batch_sizes(lengths, cap, config)
