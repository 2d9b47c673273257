"""Run one checked micro-batch of :class:`~lightning_varbatch.callbacks.WorstBatchCheck`.

:func:`run_micro_batch` fetches a micro-batch through the training loader's dataset and collate,
moves it to the device, runs ``training_step`` and the strategy's backward and measures the peak
memory (:func:`~lightning_varbatch.peak_memory.measure_peak`). An out-of-memory error (one of
:data:`OUT_OF_MEMORY`, by type) becomes a ``RuntimeError`` naming the micro-batch and the settings
that shrink it (:func:`failure_message`); any other error keeps its type and gets them as a note.

Example:
    >>> s = TokenBudgetBatchSampler([2, 2, 2, 8], 8, rank=0, world_size=1, shuffle=False)
    >>> w = WorstBatch("examples", position=0, micro_batch=0, examples=3, longest=2,
    ...                padded_tokens=6, attention=12)
    >>> failure_message(s, w, "ran out of memory", "")[:72]
    'WorstBatchCheck: on rank 0, the micro-batch with the most examples (3 ex'
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from lightning.pytorch import Trainer

from lightning_varbatch.callbacks.worst_micro_batches import WorstBatch
from lightning_varbatch.callbacks.worst_report import advice
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.peak_memory import measure_peak

__all__ = ["OUT_OF_MEMORY", "failure_message", "run_micro_batch", "step_once"]

#: What :class:`~lightning_varbatch.callbacks.WorstBatchCheck` reports as "ran out of memory":
#: the types of :data:`lightning_varbatch.memory.OUT_OF_MEMORY` (the layers keep apart). A plain
#: ``RuntimeError`` of torch's CPU allocator propagates, with a note naming the micro-batch.
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


def run_micro_batch(
    trainer: Trainer,
    sampler: TokenBudgetBatchSampler,
    dataset: Any,
    collate: Callable[[Any], Any] | None,
    w: WorstBatch,
    device: torch.device,
) -> tuple[int, str]:
    """Run micro-batch ``w`` forward and backward; its peak bytes and how they were measured.

    Raises:
        RuntimeError: out of memory (:data:`OUT_OF_MEMORY`), naming its shape, rank and the fixes.
        Exception: any other error of its forward or backward, keeping its type, with a note.
    """
    mb = sampler.micro_batch(w.position)
    try:
        _, peak, source = measure_peak(lambda: step_once(trainer, dataset, collate, mb, w), device)
    except OUT_OF_MEMORY as error:  # by type only; see OUT_OF_MEMORY
        for opt in trainer.optimizers:
            opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        first = str(error).splitlines()[0][:200] if str(error) else ""
        raise RuntimeError(
            failure_message(sampler, w, "ran out of memory", f" ({type(error).__name__}: {first})")
        ) from error
    except Exception as error:  # anything else keeps its type; say where it happened
        error.add_note(
            failure_message(
                sampler, w, f"raised {type(error).__name__} in its forward or backward", ""
            )
            + " If this is an allocation failure (torch's CPU allocator raises a plain "
            "RuntimeError), the same advice applies."
        )
        raise
    return peak, source


def step_once(
    trainer: Trainer,
    dataset: Any,
    collate: Callable[[Any], Any] | None,
    mb: Sequence[int],
    w: WorstBatch,
) -> None:
    """Fetch, collate and move micro-batch ``mb``, run its step and backward, drop the grads.

    Raises:
        RuntimeError: when ``training_step`` returns no loss tensor.
    """
    items = (
        dataset.__getitems__(mb) if hasattr(dataset, "__getitems__") else [dataset[i] for i in mb]
    )
    batch = items if collate is None else collate(items)
    batch = trainer.strategy.batch_to_device(batch)
    output = trainer.strategy.training_step(batch, 0)
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, torch.Tensor):
        raise RuntimeError(
            "WorstBatchCheck: training_step returned no loss tensor for the check "
            f"batch ({w.shape()}); return the loss (or a dict with 'loss')."
        )
    strategy = trainer.strategy
    strategy.pre_backward(loss)
    strategy.precision_plugin.backward(loss, trainer.lightning_module, None)
    strategy.post_backward(loss)
    for opt in trainer.optimizers:
        opt.zero_grad(set_to_none=True)


def failure_message(sampler: TokenBudgetBatchSampler, w: WorstBatch, what: str, detail: str) -> str:
    """Why training would fail at micro-batch ``w`` (``what`` it did) and what to change."""
    return (
        f"WorstBatchCheck: on rank {w.rank}, the micro-batch with the most {w.kind} "
        f"({w.shape()} = {w.padded_tokens} padded tokens, attention term {w.attention}; "
        f"micro-batch {w.position} of epoch {sampler.plan.epoch}) {what}{detail}. Training "
        f"would fail when it reaches this batch: {advice(w.kind, sampler.config)} (a setting "
        "of the DataModule or sampler; find_max_tokens can pick max_tokens for a memory "
        "limit), or use less memory per token (activation checkpointing, a smaller model or "
        "precision, FSDP/DeepSpeed sharding)."
    )
