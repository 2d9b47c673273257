"""Names of the bookkeeping entries our collate puts on every batch.

Every batch produced by :class:`~lightning_varbatch.data.collate.PaddingCollate` (and so by
:class:`~lightning_varbatch.data.datamodule.TokenBudgetDataModule`) is a ``dict`` holding the
model inputs plus these 0-dim ``torch.long`` tensors. Callbacks and the loss helpers read them;
user code can too.

Example:
    >>> from lightning_varbatch import keys
    >>> keys.STEP_NTOKENS
    'step_ntokens'
"""

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

DATASET = "dataset"
"""Index of the dataset the micro-batch came from (0 when there is only one)."""

PLAN_WORLD_SIZE = "plan_world_size"
"""Number of ranks the batch's plan was made for (``step_ntokens`` sums over them)."""

PLAN_ACCUMULATE = "plan_accumulate_grad_batches"
"""Micro-batches per rank per optimizer step the batch's plan was made for."""
