"""How the example budgets its batches: planning lengths, loss counts, the collate's checks.

The collate pads every item's ``source`` and its whole ``target`` (``BOS ... EOS``), so the
planner gets those two lengths (after ``data.max_length``): with the default cost model
(``"padded"``, :mod:`lightning_varbatch.planner.costs`) a micro-batch of ``n`` pairs costs
``n x max(padded source width, padded target width)``, i.e. *each* padded field holds at most
``data.max_tokens`` slots (source and target together at most twice that).

The loss predicts ``target[1:]`` (teacher forcing), one token fewer than the target: those
counts go to the planner as loss lengths (:func:`loss_lengths`; ``train_loss_lengths`` ... of
the DataModule for one corpus, each ``DataSource``'s ``loss_lengths`` for several) so that
``step_ntokens`` is the exact number of loss tokens of the optimizer step. The collate is the
library's ``PaddingCollate(loss_offset=1)``: its width check (every field against the plan)
stays on, and its loss-count check compares the plan's count with the real target tokens
minus one per example.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

__all__ = ["OversizeReport", "fitting_length", "loss_lengths", "oversize_counts"]


def loss_lengths(lengths: np.ndarray, truncate_to: int | None = None) -> np.ndarray:
    """Loss tokens per pair: the target length minus BOS, after an ``oversize`` cut.

    Args:
        lengths: ``(n, 2)`` padded (source, target) lengths, specials included.
        truncate_to: the length ``oversize="truncate"`` cuts every field to (``None``: none).

    Example:
        >>> loss_lengths(np.array([[4, 6], [3, 2]])).tolist()
        [5, 1]
        >>> loss_lengths(np.array([[4, 6], [3, 2]]), truncate_to=4).tolist()
        [3, 1]
    """
    target = lengths[:, 1] if truncate_to is None else np.minimum(lengths[:, 1], truncate_to)
    return np.asarray(target - 1, dtype=np.int64)


def fitting_length(budget: int, pad_to_multiple_of: int) -> int:
    """The longest field one example may have under the padded cost: what truncation cuts to.

    The loss lengths must be known before the planner runs, while the planner makes its own
    cut public only afterwards (``sampler.truncate_to``), so the example computes it here for
    the padded cost it uses.

    Example:
        >>> fitting_length(100, 8), fitting_length(100, 1)
        (96, 100)
    """
    return (budget // pad_to_multiple_of) * pad_to_multiple_of


def oversize_counts(planner: Any, plan: Any) -> dict[str, int]:
    """The examples ``plan`` leaves out (``skip``) or cuts (``truncate``), and its size.

    Args:
        planner: the split's planner (``TokenBudgetDataModule.planner(stage)`` or a
            sampler's ``planner``).
        plan: its plan (``TokenBudgetDataModule.check()[stage]`` or a sampler's ``plan``).
    """
    return {
        "examples": int(planner.num_examples),
        "skipped": int(plan.num_skipped),
        "truncated": int(plan.num_truncated),
        "truncate_to": int(planner.truncate_to or 0),
    }


def describe_oversize(split: str, counts: Mapping[str, int]) -> str:
    """One line: how many of a split's examples were skipped or truncated."""
    n = max(counts["examples"], 1)
    parts = []
    if counts["skipped"]:
        parts.append(f"skipped {counts['skipped']:,} ({counts['skipped'] / n:.1%})")
    if counts["truncated"]:
        parts.append(
            f"truncated {counts['truncated']:,} ({counts['truncated'] / n:.1%}) to "
            f"{counts['truncate_to']} tokens per side"
        )
    return f"{split}: of {counts['examples']:,} examples, " + (
        ", ".join(parts) if parts else "none skipped or truncated"
    )


class OversizeReport(Callback):
    """Log, every training epoch, how many examples the plan skipped or truncated.

    Logs ``train/examples_skipped`` and ``train/examples_truncated`` (counts) to the loggers
    and prints one line on rank 0 at the start of every epoch.
    """

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dm = trainer.datamodule
        sampler = getattr(dm, "samplers", {}).get("train")
        if sampler is None:
            return
        counts = oversize_counts(sampler.planner, sampler.plan)
        rank_zero_info(
            f"Epoch {trainer.current_epoch}: "
            + describe_oversize("training split", counts)
            + f" (data.oversize={sampler.config.oversize})."
        )
        if trainer.is_global_zero:
            for logger in trainer.loggers:
                logger.log_metrics(
                    {
                        "train/examples_skipped": float(counts["skipped"]),
                        "train/examples_truncated": float(counts["truncated"]),
                    },
                    step=trainer.global_step,
                )
