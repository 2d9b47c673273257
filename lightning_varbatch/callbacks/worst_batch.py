"""Run the plan's most demanding micro-batches first, so that an OOM happens in minute one.

:class:`WorstBatchCheck`'s pieces, all importable from here: ``worst_micro_batches`` picks
(:func:`worst_micro_batches`, :func:`check_names`, :class:`WorstBatch`, :data:`KINDS`),
``worst_batch_run`` runs (:data:`OUT_OF_MEMORY`), ``training_state`` keeps the model's state,
``worst_ranks`` gathers, ``worst_report`` words (:func:`advice`, :func:`format_report`) and
:mod:`lightning_varbatch.peak_memory` measures (:func:`measure_peak`).
"""

from __future__ import annotations

import gc
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_varbatch.callbacks.batch_counts import log_rank_zero
from lightning_varbatch.callbacks.training_state import KeepTrainingState
from lightning_varbatch.callbacks.worst_batch_run import (
    OUT_OF_MEMORY,
    failure_message,
    run_micro_batch,
)
from lightning_varbatch.callbacks.worst_micro_batches import (
    KINDS,
    WorstBatch,
    check_names,
    worst_micro_batches,
    worst_tiles,
)
from lightning_varbatch.callbacks.worst_ranks import gather_reports, over_limit, worst_metrics
from lightning_varbatch.callbacks.worst_report import advice, format_report, gib
from lightning_varbatch.checks import check_choice, check_count, check_flag
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.peak_memory import measure_peak

__all__ = [
    "KINDS",
    "OUT_OF_MEMORY",
    "WorstBatch",
    "WorstBatchCheck",
    "advice",
    "check_names",
    "format_report",
    "measure_peak",
    "worst_micro_batches",
    "worst_tiles",
]


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


class WorstBatchCheck(Callback):
    """Run the plan's most demanding micro-batches before training and report their memory.

    In ``on_train_start`` every rank picks each ``kind``'s largest of its micro-batches in the plan:

    - ``"padded_tokens"``: examples x longest padded length (a packed row's tokens),
    - ``"examples"``: the most examples,
    - ``"attention"``: examples x longest² (a packed row's Σ length²),

    fetches it through the training loader's dataset and collate, moves it to the device
    (batch-transfer hooks run) and runs ``training_step`` and backward through the strategy
    (DDP/FSDP wrappers, the precision plugin's autocast), measuring peak memory with
    :func:`measure_peak`. Tested under DDP and FSDP. Every rank runs exactly ``len(kinds)``
    forward/backward passes (even when one micro-batch is the worst of several kinds), so
    collectives inside them stay matched.

    Why ``on_train_start``: only then are the model wrapped, the optimizers and precision plugin
    set up, the checkpoint (and sampler position) restored and the loader built, before any step.

    Nothing changes for training: no optimizer steps; gradients (cleared, then set back),
    buffers (BatchNorm statistics) and the torch / CUDA / numpy / Python RNG states are
    restored, and ``self.log`` of the LightningModule is a no-op during the check. The
    ``on_before_backward`` / ``on_after_backward`` hooks are not called.

    Args:
        kinds: the worst micro-batches to run: ``"padded_tokens"``, ``"examples"``, ``"attention"``.
        memory_limit_bytes: raise when a peak exceeds it (:func:`measure_peak`'s figure: device
            memory allocated on CUDA, resident set on CPU); ``None``: only out-of-memory raises.
        verbose: print the report on global rank 0.

    Raises:
        SettingValueError, SettingTypeError: for a bad setting.
        RuntimeError: (in ``setup``) under manual optimization or DeepSpeed (ZeRO keeps
            accumulated gradients where the check cannot discard them); (in
            ``on_train_start``) without a token-budget sampler, or when a checked micro-batch
            runs out of memory (:data:`OUT_OF_MEMORY`) or exceeds ``memory_limit_bytes``,
            naming its shape, the rank and the settings that shrink it (:func:`advice`). Any
            other error of a checked micro-batch propagates with a note naming the same.

    After the check, :attr:`report` holds this rank's results (one dict per kind: ``kind``,
    ``examples``, ``longest``, ``padded_tokens``, ``attention``, ``peak_bytes``, ``memory``,
    ``rank``, ``position``, ``micro_batch`` and ``tile``, its old name) and :attr:`all_reports`
    every rank's (``kind``, ``examples``, ``longest``, ``peak_bytes``, ``over``; one all-gather on
    every rank, so when one rank is over ``memory_limit_bytes`` every rank raises instead of waiting
    for it). Global rank 0 prints them and logs, for each kind, the rank with the largest peak:

    =======================================  ===========================================
    Key                                      Meaning
    =======================================  ===========================================
    ``memory/worst/<kind>/peak_bytes``       the worst ``<kind>`` micro-batch's peak, max over ranks
    ``memory/worst/<kind>/examples``         that micro-batch's examples
    ``memory/worst/<kind>/longest``          its longest padded length
    =======================================  ===========================================

    A micro-batch that runs out of memory raises on its rank only; under DDP the other ranks
    then wait in a collective until the launcher stops them (or the process group's timeout).

    Example:
        >>> check = WorstBatchCheck(memory_limit_bytes=70 * 2**30)
        >>> trainer = Trainer(callbacks=[check])  # doctest: +SKIP
    """

    def __init__(
        self,
        kinds: Sequence[str] = KINDS,
        memory_limit_bytes: int | None = None,
        verbose: bool = True,
    ) -> None:
        if isinstance(kinds, str):
            kinds = (kinds,)
        if not isinstance(kinds, Sequence):
            raise SettingTypeError(
                f"kinds must be a sequence of {', '.join(map(repr, KINDS))}, got {kinds!r} "
                f"({type(kinds).__name__}).",
                setting="kinds",
                value=kinds,
            )
        kinds = tuple(check_choice("kinds", k, KINDS) for k in kinds)
        if not kinds:
            raise SettingValueError(
                f"kinds must name at least one of {', '.join(map(repr, KINDS))}, got an empty "
                "sequence; leave kinds unset to check all three.",
                setting="kinds",
                value=kinds,
            )
        memory_limit_bytes = check_count(
            "memory_limit_bytes", memory_limit_bytes, allow_none=True, what=" (bytes)"
        )
        verbose = check_flag("verbose", verbose)
        self.kinds: tuple[str, ...] = kinds
        self.memory_limit_bytes = memory_limit_bytes
        self.verbose = verbose
        self._names: list[str] = list(kinds)
        self.report: list[dict[str, Any]] = []
        self.all_reports: list[list[dict[str, Any]]] = []

    @override
    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        from lightning.pytorch.strategies import DeepSpeedStrategy

        if isinstance(trainer.strategy, DeepSpeedStrategy):
            raise RuntimeError(
                "WorstBatchCheck does not support DeepSpeed yet: ZeRO accumulates gradients in "
                "its own partitions until the optimizer step, where the check cannot discard "
                "them, so training after the check would differ. Remove the callback, run it "
                "once under DDP or FSDP (same model, same data settings), or pick max_tokens "
                "with find_max_tokens."
            )
        if not pl_module.automatic_optimization:
            raise RuntimeError(
                "WorstBatchCheck needs automatic optimization: under manual optimization "
                "training_step steps the optimizers itself, so running it would change the "
                "weights. Remove the callback or check memory with find_max_tokens."
            )

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        loader = trainer.train_dataloader
        sampler = getattr(loader, "batch_sampler", None)
        if not isinstance(sampler, TokenBudgetBatchSampler):
            raise RuntimeError(
                "WorstBatchCheck needs a training loader driven by a TokenBudgetBatchSampler "
                "(TokenBudgetDataModule or token_budget_dataloader), got "
                f"{type(loader).__name__} with batch_sampler {type(sampler).__name__}."
            )
        assert loader is not None
        report = self._measure_all(trainer, pl_module, sampler, loader)
        self.report = [w.to_dict() for w in report]
        self.all_reports = self._gather(trainer, report)
        failed = [r for r, rows in enumerate(self.all_reports) if any(x["over"] for x in rows)]
        mine = [w for w in report if self._over(w)]
        if mine:
            raise RuntimeError(self._limit_message(sampler, mine[0]))
        if failed:  # another rank is over the limit: every rank stops, none waits for it
            raise RuntimeError(
                f"WorstBatchCheck: rank(s) {failed} need more than memory_limit_bytes="
                f"{self.memory_limit_bytes} for their worst micro-batches (their errors name "
                f"the shapes and what to change; now max_tokens={sampler.config.max_tokens}, "
                f"max_examples={sampler.config.max_examples})."
            )
        self._publish(trainer)

    def _measure_all(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        sampler: TokenBudgetBatchSampler,
        loader: Any,
    ) -> list[WorstBatch]:
        """Run this rank's worst micro-batches, the module's state kept and its logging off."""
        dataset, collate = loader.dataset, loader.collate_fn
        worst = worst_micro_batches(sampler, self.kinds)
        self._names = check_names(sampler, self.kinds)
        device = trainer.strategy.root_device
        optimizers = list(trainer.optimizers)
        report: list[WorstBatch] = []
        pl_module.log = _no_log  # type: ignore[method-assign]
        pl_module.log_dict = _no_log  # type: ignore[method-assign]
        try:
            with KeepTrainingState(pl_module, optimizers), torch.enable_grad():
                for w in worst:
                    peak, source = run_micro_batch(trainer, sampler, dataset, collate, w, device)
                    report.append(replace(w, peak_bytes=int(peak), memory=source))
        finally:
            del pl_module.log, pl_module.log_dict
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        return report

    def _publish(self, trainer: Trainer) -> None:
        """Log each kind's largest peak over ranks (rank 0) and print the report (verbose)."""
        metrics = worst_metrics(self.all_reports, self._names)
        if metrics:
            log_rank_zero(trainer, metrics, trainer.global_step)
        if self.verbose and trainer.is_global_zero:
            print(format_report(self.report, self.memory_limit_bytes))
            for rank, rows in enumerate(self.all_reports[1:], start=1):
                shown = ", ".join(
                    f"{x['kind']} {x['examples']} x {x['longest']}: {gib(x['peak_bytes'])}"
                    for x in rows
                )
                print(f"  rank {rank}: {shown or 'no micro-batches'}")

    def _over(self, w: WorstBatch) -> bool:
        return over_limit(w, self.memory_limit_bytes)

    def _gather(self, trainer: Trainer, report: list[WorstBatch]) -> list[list[dict[str, Any]]]:
        """Every rank's (kind, examples, longest, peak_bytes, over): one all-gather."""
        return gather_reports(trainer, report, self._names, self.memory_limit_bytes)

    def _limit_message(self, sampler: TokenBudgetBatchSampler, w: WorstBatch) -> str:
        limit = self.memory_limit_bytes
        assert limit is not None and w.peak_bytes is not None
        return failure_message(
            sampler,
            w,
            f"needs {gib(w.peak_bytes)} ({w.peak_bytes} bytes, {w.memory}), over "
            f"memory_limit_bytes={limit} ({gib(limit)})",
            "",
        )
