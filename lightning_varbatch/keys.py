"""Names of the bookkeeping entries our collate puts on every batch.

Every batch of :class:`~lightning_varbatch.PaddingCollate` (and so of
:class:`~lightning_varbatch.TokenBudgetDataModule`) is a ``dict`` of the model inputs plus these
0-dim ``torch.long`` tensors, which callbacks, the loss helpers and user code read.

Example:
    >>> from lightning_varbatch import keys
    >>> keys.STEP_NTOKENS
    'step_ntokens'
"""

from __future__ import annotations

from typing import NamedTuple

NTOKENS = "ntokens"
"""Real (non-pad) loss tokens in this micro-batch on this rank (target tokens for pairs)."""

NEXAMPLES = "nexamples"
"""Examples in this micro-batch on this rank."""

PADDED_TOKENS = "padded_tokens"
"""Token slots after padding in this micro-batch on this rank (source + target for pairs)."""

INPUT_TOKENS = "input_tokens"
"""Real tokens of every field in this micro-batch (source + target for pairs)."""

STEP_NTOKENS = "step_ntokens"
"""Real loss tokens of the whole optimizer step: all ranks, all accumulation micro-batches."""

STEP_NEXAMPLES = "step_nexamples"
"""Examples of the whole optimizer step: all ranks, all accumulation micro-batches."""

STEP_BUDGET = "step_budget"
"""Under a batch-size schedule, the optimizer step's token budget: every rank's micro-batch
budget at the step's fraction, times the accumulation, summed over ranks (planning tokens)."""

STEP_COST = "step_cost"
"""Under a batch-size schedule, the planned cost of the optimizer step's micro-batches (the
budget's unit), summed over ranks and micro-batches: what the step realised of its budget."""

DATASET = "dataset"
"""Index of the dataset the micro-batch came from (0 when there is only one)."""

PLAN_WORLD_SIZE = "plan_world_size"
"""Number of ranks the batch's plan was made for (``step_ntokens`` sums over them)."""

PLAN_ACCUMULATE = "plan_accumulate_grad_batches"
"""Micro-batches per rank per optimizer step the batch's plan was made for."""


class PlanCount(NamedTuple):
    """One count of the plan that travels with a micro-batch, from the sampler to the batch.

    :class:`~lightning_varbatch.data.micro_batch.MicroBatch` holds it as ``attribute``; the loader's
    dataset wrapper copies it into the micro-batch's ``info`` dict and
    :class:`~lightning_varbatch.data.collate.PaddingCollate` puts it on the batch under ``key`` as a
    0-dim long tensor (``key`` ``None``: in ``info`` only, for the collate's checks and messages).

    Attributes:
        attribute: the :class:`~lightning_varbatch.data.micro_batch.MicroBatch` attribute.
        key: the batch key, or ``None`` when it does not go on the batch.
        doc: what it counts.
        required: a micro-batch without it carries no plan (a plain list of indices).
        default: its value when the attribute is missing; ``None`` (unknown) is left off the batch.
    """

    attribute: str
    key: str | None
    doc: str
    required: bool = False
    default: int | None = None


PLAN_COUNTS: tuple[PlanCount, ...] = (
    PlanCount("epoch", None, "the epoch", required=True),
    PlanCount("step", None, "optimizer step within the epoch's plan", required=True),
    PlanCount("micro", None, "micro-batch within the optimizer step", required=True),
    PlanCount("ntokens", None, "the plan's loss tokens (checked by the collate)", required=True),
    PlanCount("step_ntokens", STEP_NTOKENS, "loss tokens of the optimizer step", required=True),
    PlanCount("step_nexamples", STEP_NEXAMPLES, "examples of the optimizer step", required=True),
    PlanCount("dataset", DATASET, "index of the dataset of a mixture", default=0),
    PlanCount("truncate_to", None, "length oversize='truncate' cuts to (None: none)"),
    PlanCount("world_size", PLAN_WORLD_SIZE, "ranks the plan was made for"),
    PlanCount("accumulate_grad_batches", PLAN_ACCUMULATE, "accumulation of the plan"),
    PlanCount("pad_rows", None, "rows of the static shape (max_shapes; None: free shapes)"),
    PlanCount("pad_length", None, "padded length of the static shape (max_shapes)"),
    PlanCount("step_budget", STEP_BUDGET, "the step's token budget under a batch schedule"),
    PlanCount("step_cost", STEP_COST, "the step's planned cost under a batch schedule"),
)
"""The single table of the plan's per-micro-batch counts: adding one is one line here (plus
the :class:`~lightning_varbatch.data.micro_batch.MicroBatch` attribute the sampler fills)."""
