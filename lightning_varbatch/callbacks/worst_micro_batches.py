"""Which micro-batches :class:`~lightning_varbatch.callbacks.WorstBatchCheck` runs.

Among this rank's micro-batches of the sampler's current epoch plan, :func:`worst_micro_batches`
picks the one with the most padded tokens (examples x longest; for pairs in the two-sided order,
of those the one whose two padded tensors are largest), the one with the most examples and the one
with the largest attention term (examples x longest², a packed row's Σ length²), plus one per
shape of a static-shape plan. :class:`WorstBatch` describes a pick (and, once run, its peak
memory); :func:`check_names` lists every rank's picks, in order, so gathered reports line up.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import numpy as np

from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.planner.diagnostics import MicroBatchFigures, micro_batch_figures

__all__ = ["KINDS", "Kind", "WorstBatch", "check_names", "worst_micro_batches", "worst_tiles"]

Kind = Literal["padded_tokens", "examples", "attention"]
KINDS: tuple[str, ...] = ("padded_tokens", "examples", "attention")
"""What a worst micro-batch can be the largest of."""


@dataclass(frozen=True)
class WorstBatch:
    """One selected micro-batch and, once run, its peak memory.

    Attributes:
        kind: ``"padded_tokens"``, ``"examples"`` or ``"attention"``: what it is the largest of.
        position: its index among this rank's micro-batches of the epoch (run order).
        micro_batch: its micro-batch id in the epoch plan (``tile``, its old name, still reads it).
        examples: examples in it.
        longest: its longest padded planning length.
        padded_tokens: its token slots after padding (examples x longest; packed: the row's).
        attention: its attention term, examples x longest² (Σ length² for a packed row).
        peak_bytes: peak memory of its forward and backward (``None`` before it is run).
        memory: what ``peak_bytes`` measured (:func:`~lightning_varbatch.peak_memory.measure_peak`).
        rank: the rank that ran it.
        rows: its padded rows under ``max_shapes`` (the shape's, masked ones too), else ``None``.
    """

    kind: str
    position: int
    micro_batch: int
    examples: int
    longest: int
    padded_tokens: int
    attention: int
    peak_bytes: int | None = None
    memory: str | None = None
    rank: int = 0
    rows: int | None = None

    def shape(self) -> str:
        """How many examples of how many tokens, and under a shape budget in how many rows.

        ``"E examples x L tokens"``, or under a shape budget ``"E examples in R rows x L tokens"``.

        Example:
            >>> WorstBatch("examples", 0, 0, 11, 17, 510, 8670, rows=30).shape()
            '11 examples in 30 rows x 17 tokens'
        """
        if self.rows is None or self.rows == self.examples:
            return f"{self.examples} examples x {self.longest} tokens"
        return f"{self.examples} examples in {self.rows} rows x {self.longest} tokens"

    @property
    def tile(self) -> int:
        """The old name of :attr:`micro_batch` (micro-batches were once called tiles); warns."""
        warnings.warn(
            "WorstBatch.tile is deprecated: use WorstBatch.micro_batch (micro-batches were "
            "once called tiles).",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.micro_batch

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python values, plus ``tile`` (the old key of ``micro_batch``)."""
        return {**asdict(self), "tile": self.micro_batch}


def worst_micro_batches(
    sampler: TokenBudgetBatchSampler, kinds: Sequence[str] = KINDS
) -> list[WorstBatch]:
    """This rank's most demanding micro-batches of the sampler's current epoch plan.

    Ties go to the first to run; empty micro-batches are never picked (none: an empty list).

    Args:
        sampler: the training sampler, set to this rank.
        kinds: what to maximise, each of :data:`KINDS`.

    Returns:
        One :class:`WorstBatch` per kind, in the order of ``kinds``.

    Example:
        >>> s = TokenBudgetBatchSampler([2, 2, 2, 8], 8, rank=0, world_size=1, shuffle=False)
        >>> [(w.kind, w.examples, w.longest) for w in worst_micro_batches(s)]
        [('padded_tokens', 1, 8), ('examples', 3, 2), ('attention', 1, 8)]
    """
    planner, plan = sampler.planner, sampler.plan
    figures = micro_batch_figures(planner, plan)
    slots = figures.slots.astype(np.int64)
    attention = np.rint(figures.attention).astype(np.int64)
    mine = plan.rank_micro_batches(sampler.rank).astype(np.int64)
    run = np.flatnonzero(figures.size[mine] > 0)
    if run.size == 0:
        return []
    score = {"padded_tokens": slots, "examples": figures.size, "attention": attention}
    picks = [(kind, int(run[int(np.argmax(score[kind][mine[run]]))])) for kind in kinds]
    if plan.micro_batch_work is not None and planner.config.layout == "padded":
        # pairs in the two-sided order: of the fullest, the one whose two sides pad most
        both = plan.micro_batch_work[mine[run]]
        first = run[np.lexsort((run, -both, -slots[mine[run]]))[0]]
        picks = [(k, int(first) if k == "padded_tokens" else p) for k, p in picks]
    picks += _shape_picks(sampler, figures, mine, run)
    return [
        WorstBatch(
            kind=kind,
            position=position,
            micro_batch=int(mine[position]),
            examples=int(figures.size[mine[position]]),
            longest=int(figures.longest[mine[position]]),
            padded_tokens=int(slots[mine[position]]),
            attention=int(attention[mine[position]]),
            rank=sampler.rank,
            rows=None if plan.micro_batch_shape is None else int(figures.rows[mine[position]]),
        )
        for kind, position in picks
    ]


def _shape_picks(
    sampler: TokenBudgetBatchSampler,
    figures: MicroBatchFigures,
    mine: np.ndarray,
    run: np.ndarray,
) -> list[tuple[str, int]]:
    """One pick per static shape of the plan: ``(kind, position)``; none without shapes.

    The same list of shapes on every rank (so every rank runs as many passes): this rank's
    fullest micro-batch of that shape, or its largest micro-batch when it has none of it.
    """
    shapes = getattr(sampler.planner, "shapes", None)
    if sampler.plan.micro_batch_shape is None or shapes is None:
        return []
    slots = figures.slots.astype(np.int64)
    picks = []
    for rows, length in shapes.tolist():
        same = (figures.rows[mine[run]] == rows) & (figures.longest[mine[run]] == length)
        of_shape = run[same]
        pool = of_shape if of_shape.size else run
        key = figures.size if of_shape.size else slots
        picks.append((f"shape {rows}x{length}", int(pool[int(np.argmax(key[mine[pool]]))])))
    return picks


def worst_tiles(sampler: TokenBudgetBatchSampler, kinds: Sequence[str] = KINDS) -> list[WorstBatch]:
    """Old name (tiles: micro-batches) of :func:`worst_micro_batches`; a DeprecationWarning."""
    warnings.warn(
        "worst_tiles is deprecated: use worst_micro_batches (micro-batches were once called "
        "tiles).",
        DeprecationWarning,
        stacklevel=2,
    )
    return worst_micro_batches(sampler, kinds)


def check_names(sampler: TokenBudgetBatchSampler, kinds: Sequence[str] = KINDS) -> list[str]:
    """What :func:`worst_micro_batches` returns, in order: ``kinds``, then one per static shape.

    The same on every rank (the shapes are the plan's), so gathered reports line up.

    Example:
        >>> s = TokenBudgetBatchSampler([2, 2, 8], 8, rank=0, world_size=1, max_shapes=2)
        >>> check_names(s, ("examples",))
        ['examples', 'shape 4x2', 'shape 1x8']
    """
    shapes = getattr(sampler.planner, "shapes", None)
    if sampler.plan.micro_batch_shape is None or shapes is None:
        return list(kinds)
    return [*kinds, *(f"shape {rows}x{length}" for rows, length in shapes.tolist())]
