"""Run the plan's most demanding micro-batches first, so that an OOM happens in minute one.

:class:`WorstBatchCheck` finds, among this rank's micro-batches of the current epoch plan, the
one with the most padded tokens (examples x longest), the one with the most examples and the
one with the largest attention term (examples x longest²), and runs forward and backward on
each before the first real training step. It reports their peak memory and, when one runs out
of memory (or exceeds ``memory_limit_bytes``), raises an error that names the batch's shape,
the rank and the settings to lower.

The pieces live in one module each, and stay importable from here:
:mod:`~lightning_varbatch.callbacks.worst_tiles` picks the micro-batches (:func:`worst_tiles`,
:func:`check_names`, :class:`WorstBatch`, :data:`KINDS`),
:mod:`lightning_varbatch.peak_memory` measures them (:func:`measure_peak`),
:mod:`~lightning_varbatch.callbacks.training_state` keeps the model's state through the check
and :mod:`~lightning_varbatch.callbacks.worst_report` words the result (:func:`advice`,
:func:`format_report`).

Example:
    >>> check = WorstBatchCheck(kinds=("padded_tokens", "attention"))
    >>> check.kinds
    ('padded_tokens', 'attention')
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_varbatch.callbacks.batch_counts import log_rank_zero
from lightning_varbatch.callbacks.training_state import KeepTrainingState
from lightning_varbatch.callbacks.worst_report import advice, format_report, gib
from lightning_varbatch.callbacks.worst_tiles import (
    KINDS,
    WorstBatch,
    check_names,
    worst_tiles,
)
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
    "worst_tiles",
]

#: What :class:`WorstBatchCheck` reports as "ran out of memory", by type only:
#: ``torch.OutOfMemoryError`` (CUDA and the other devices whose allocator raises it) and
#: Python's ``MemoryError``. torch's CPU allocator raises a plain ``RuntimeError`` ("can't
#: allocate memory"), which is not told apart from other errors: it propagates unchanged, with
#: a note naming the micro-batch that raised it and the settings that shrink it.
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


def _no_log(*args: Any, **kwargs: Any) -> None:
    return None


class WorstBatchCheck(Callback):
    """Run the plan's most demanding micro-batches before training and report their memory.

    In ``on_train_start`` every rank picks, among its own micro-batches of the current epoch
    plan (its slice of the training sampler's plan), the largest of each ``kind``:

    - ``"padded_tokens"``: examples x longest padded length (a packed row's tokens),
    - ``"examples"``: the most examples,
    - ``"attention"``: examples x longest² (a packed row's Σ length²),

    fetches it through the training loader's dataset and collate, moves it to the device
    (the LightningModule's batch-transfer hooks run) and runs ``training_step`` through the
    strategy (DDP/FSDP wrappers, the precision plugin's autocast) and the strategy's backward,
    measuring peak memory with :func:`measure_peak`. Each rank checks its own worst batches
    (tested under DDP and FSDP; DeepSpeed is refused, see ``Raises``), and every rank runs
    exactly ``len(kinds)`` forward/backward passes (also when one micro-batch is the worst of
    several kinds), so collectives inside them stay matched.

    Why ``on_train_start``: only then are the model wrapped by the strategy, the optimizers
    and the precision plugin set up, the checkpoint (and the sampler's position) restored and
    the training loader built, and no optimizer step has run yet. (``on_fit_start`` comes
    before the strategy's setup and before the loader exists.)

    Nothing changes for training: no optimizer steps; gradients are cleared (the optimizers'
    ``zero_grad(set_to_none=True)``, then every parameter's gradient set back to what it
    was), buffers (BatchNorm statistics) and the torch / CUDA / numpy / Python RNG states are
    restored, and ``self.log`` of the LightningModule is a no-op during the check. The
    ``on_before_backward`` / ``on_after_backward`` hooks are not called. Manual optimization
    (``automatic_optimization = False``) is refused: its ``training_step`` steps optimizers.

    Args:
        kinds: which worst micro-batches to run, each of ``"padded_tokens"``,
            ``"examples"``, ``"attention"``.
        memory_limit_bytes: raise when a peak exceeds it (compared with the figure of
            :func:`measure_peak`: device memory allocated on CUDA, the process's resident set
            on CPU). ``None``: only an out-of-memory error raises.
        verbose: print the report on global rank 0.

    Raises:
        SettingValueError: for an unknown kind, an empty ``kinds`` or a limit below 1.
        SettingTypeError: for a setting of the wrong type (``memory_limit_bytes="1e9"``,
            ``verbose="yes"``).
        RuntimeError: (in ``setup``) under manual optimization or DeepSpeed (ZeRO keeps
            accumulated gradients where the check cannot discard them); (in
            ``on_train_start``) when the training loader has no token-budget sampler, and
            when a checked micro-batch runs out of memory (one of :data:`OUT_OF_MEMORY`, told
            apart by type) or exceeds ``memory_limit_bytes``: the message names its shape
            (examples x longest), the rank and the settings that shrink it (:func:`advice`).
            Any other error of a checked micro-batch (torch's CPU allocation failure, a plain
            ``RuntimeError``, among them) propagates with its own type and a note naming the
            micro-batch and the same settings.

    After the check, :attr:`report` holds this rank's results (one dict per kind: ``kind``,
    ``examples``, ``longest``, ``padded_tokens``, ``attention``, ``peak_bytes``, ``memory``,
    ``rank``, ``position``, ``tile``) and :attr:`all_reports` every rank's (``kind``,
    ``examples``, ``longest``, ``peak_bytes``, ``over``; one all-gather on every rank, so
    when one rank is over ``memory_limit_bytes`` every rank raises instead of waiting for
    it). Global rank 0 prints them and logs, for each kind, the rank with the largest peak:

    =======================================  ===========================================
    Key                                      Meaning
    =======================================  ===========================================
    ``memory/worst/<kind>/peak_bytes``       largest peak over ranks of the worst
                                             ``<kind>`` micro-batch
    ``memory/worst/<kind>/examples``         that micro-batch's examples
    ``memory/worst/<kind>/longest``          its longest padded length
    =======================================  ===========================================

    A micro-batch that runs out of memory raises on its rank only; under DDP the other ranks
    then wait in a collective until the launcher stops them (or the process group's timeout).

    Example:
        >>> from lightning.pytorch import Trainer
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
        worst = worst_tiles(sampler, self.kinds)
        self._names = check_names(sampler, self.kinds)
        device = trainer.strategy.root_device
        optimizers = list(trainer.optimizers)
        report: list[WorstBatch] = []
        pl_module.log = _no_log  # type: ignore[method-assign]
        pl_module.log_dict = _no_log  # type: ignore[method-assign]
        try:
            with KeepTrainingState(pl_module, optimizers), torch.enable_grad():
                for w in worst:
                    peak, source = self._run(trainer, sampler, dataset, collate, w, device)
                    report.append(replace(w, peak_bytes=int(peak), memory=source))
        finally:
            del pl_module.log, pl_module.log_dict
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
        return report

    def _publish(self, trainer: Trainer) -> None:
        """Log each kind's largest peak over ranks (rank 0) and print the report (verbose)."""
        metrics: dict[str, float] = {}
        for i, kind in enumerate(self._names):
            rows = [rows[i] for rows in self.all_reports if len(rows) > i]
            if not rows:
                continue
            top = max(rows, key=lambda x: x["peak_bytes"])
            base = f"memory/worst/{kind.replace(' ', '_')}"
            metrics[f"{base}/peak_bytes"] = float(top["peak_bytes"])
            metrics[f"{base}/examples"] = float(top["examples"])
            metrics[f"{base}/longest"] = float(top["longest"])
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
        limit = self.memory_limit_bytes
        return limit is not None and w.peak_bytes is not None and w.peak_bytes > limit

    def _gather(self, trainer: Trainer, report: list[WorstBatch]) -> list[list[dict[str, Any]]]:
        """Every rank's (kind, examples, longest, peak_bytes, over): one all-gather."""
        rows = [[w.examples, w.longest, w.peak_bytes or 0, float(self._over(w))] for w in report]
        if int(trainer.world_size) < 2:
            gathered = [rows]
        else:
            rows += [[0, 0, 0, 0.0]] * (len(self._names) - len(rows))  # a rank without batches
            local = torch.tensor(rows, dtype=torch.float64, device=trainer.strategy.root_device)
            out = trainer.strategy.all_gather(local).reshape(-1, len(self._names), 4)
            gathered = out.cpu().tolist()
        return [
            [
                {
                    "kind": kind,
                    "examples": int(r[0]),
                    "longest": int(r[1]),
                    "peak_bytes": int(r[2]),
                    "over": bool(r[3]),
                }
                for kind, r in zip(self._names, ranks, strict=False)
                if r[0] > 0
            ]
            for ranks in gathered
        ]

    def _run(
        self,
        trainer: Trainer,
        sampler: TokenBudgetBatchSampler,
        dataset: Any,
        collate: Callable[[Any], Any] | None,
        w: WorstBatch,
        device: torch.device,
    ) -> tuple[int, str]:
        mb = sampler.micro_batch(w.position)
        try:
            _, peak, source = measure_peak(
                lambda: _step_once(trainer, dataset, collate, mb, w), device
            )
        except OUT_OF_MEMORY as error:  # by type only; see OUT_OF_MEMORY
            for opt in trainer.optimizers:
                opt.zero_grad(set_to_none=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()
            raise RuntimeError(
                _message(
                    sampler,
                    w,
                    "ran out of memory",
                    f" ({type(error).__name__}: "
                    f"{str(error).splitlines()[0][:200] if str(error) else ''})",
                )
            ) from error
        except Exception as error:  # anything else keeps its type; say where it happened
            error.add_note(
                _message(
                    sampler, w, f"raised {type(error).__name__} in its forward or backward", ""
                )
                + " If this is an allocation failure (torch's CPU allocator raises a plain "
                "RuntimeError), the same advice applies."
            )
            raise
        return peak, source

    def _limit_message(self, sampler: TokenBudgetBatchSampler, w: WorstBatch) -> str:
        limit = self.memory_limit_bytes
        assert limit is not None and w.peak_bytes is not None
        return _message(
            sampler,
            w,
            f"needs {gib(w.peak_bytes)} ({w.peak_bytes} bytes, {w.memory}), over "
            f"memory_limit_bytes={limit} ({gib(limit)})",
            "",
        )


def _step_once(
    trainer: Trainer,
    dataset: Any,
    collate: Callable[[Any], Any] | None,
    mb: Sequence[int],
    w: WorstBatch,
) -> None:
    """Fetch, collate and move micro-batch ``mb``, run its step and backward, drop the grads."""
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


def _message(sampler: TokenBudgetBatchSampler, w: WorstBatch, what: str, detail: str) -> str:
    return (
        f"WorstBatchCheck: on rank {w.rank}, the micro-batch with the most {w.kind} "
        f"({w.shape()} = {w.padded_tokens} padded tokens, attention term {w.attention}; "
        f"micro-batch {w.position} of epoch {sampler.plan.epoch}) {what}{detail}. Training "
        f"would fail when it reaches this batch: {advice(w.kind, sampler.config)} (a setting "
        "of the DataModule or sampler; find_max_tokens can pick max_tokens for a memory "
        "limit), or use less memory per token (activation checkpointing, a smaller model or "
        "precision, FSDP/DeepSpeed sharding)."
    )
