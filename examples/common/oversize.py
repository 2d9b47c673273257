"""What ``data.oversize`` left out (``skip``) or cut (``truncate``), counted and reported.

Both examples plan on the padded cost (``n x`` the widest padded field of a micro-batch), under
which one example fits the budget when each field is at most :func:`fitting_length` long: the
length ``data.oversize=truncate`` cuts to. :func:`oversize_counts` reads a plan's counts,
:func:`describe_oversize` says them in one line, and :class:`OversizeReport`
(``callbacks.oversize_report`` in ``conf/``) logs them every training epoch.

Example:
    >>> counts = {"examples": 200, "skipped": 3, "truncated": 0, "truncate_to": 0}
    >>> describe_oversize("train", counts)
    'train: of 200 examples, skipped 3 (1.5%)'
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import rank_zero_info
from typing_extensions import override

__all__ = ["OversizeReport", "describe_oversize", "fitting_length", "oversize_counts"]


def fitting_length(budget: int, pad_to_multiple_of: int) -> int:
    """The longest field one example may have under the padded cost: what truncation cuts to.

    The loss lengths must be known before the planner runs, while the planner makes its own
    cut public only afterwards (``sampler.truncate_to``), so the examples compute it here for
    the padded cost they use.

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

    Example:
        >>> from types import SimpleNamespace as NS
        >>> planner = NS(num_examples=10, truncate_to=None)
        >>> oversize_counts(planner, NS(num_skipped=1, num_truncated=0))
        {'examples': 10, 'skipped': 1, 'truncated': 0, 'truncate_to': 0}
    """
    return {
        "examples": int(planner.num_examples),
        "skipped": int(plan.num_skipped),
        "truncated": int(plan.num_truncated),
        "truncate_to": int(planner.truncate_to or 0),
    }


def describe_oversize(split: str, counts: Mapping[str, int]) -> str:
    """One line: how many of a split's examples were skipped or truncated.

    Example:
        >>> describe_oversize("valid", {"examples": 10, "skipped": 0, "truncated": 0})
        'valid: of 10 examples, none skipped or truncated'
    """
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

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(callbacks=[OversizeReport()])  # doctest: +SKIP
    """

    @override
    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        dm = getattr(trainer, "datamodule", None)
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
