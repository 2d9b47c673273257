"""Global token throughput, padding efficiency, effective batch size and rank imbalance.

Lightning's ``ThroughputMonitor`` scales rank 0's counts by the world size, wrong for unequal ranks;
:class:`TokenThroughputMeter` gathers every rank's counts (callback: ``TokenThroughputMonitor``).
"""

from __future__ import annotations

from collections.abc import Mapping
from time import perf_counter
from typing import Any

import torch

from lightning_varbatch import keys
from lightning_varbatch.callbacks.batch_counts import (
    CountFn,
    PaddingFn,
    as_number,
    check_count_fns,
    check_positive,
    check_state_keys,
    length_cap,
    log_rank_zero,
    rank_shares_in_force,
    read_count,
    read_padding,
    read_schedule,
)
from lightning_varbatch.callbacks.compute_clock import ComputeClock
from lightning_varbatch.callbacks.loop_context import LoopContext
from lightning_varbatch.callbacks.throughput_window import (
    RankWindow,
    ScheduleWindow,
    dataset_metrics,
    rank_metrics,
    run_metrics,
    window_metrics,
)
from lightning_varbatch.checks import check_flag
from lightning_varbatch.errors import SettingTypeError

__all__ = [
    "TokenThroughputMeter",
    "length_cap",
    "rank_metrics",
    "rank_shares_in_force",
]


def _gather(loop: LoopContext, window: RankWindow) -> list[RankWindow]:
    """Every rank's ``window``, in rank order: one all-gather, which every rank must call."""
    local = torch.tensor(window.to_vector(), dtype=torch.float64)
    rows = loop.gather(local)
    return [RankWindow.from_vector(row) for row in rows.reshape(-1, local.numel()).tolist()]


class TokenThroughputMeter:
    """Log global throughput, padding, effective batch size and imbalance per optimizer steps.

    A loop calls :meth:`start`, :meth:`on_micro_batch` (before each forward),
    :meth:`before_backward`, :meth:`on_micro_batch_end` (after the optimizer step) and :meth:`end`
    (:class:`~lightning_varbatch.TokenBudgetLoop` in Fabric or ``torchrun``, or
    :class:`TokenThroughputMonitor` under a Trainer). Each rank's counts are summed over
    ``log_every_n_steps`` optimizer steps, then all-gathered; rank 0 logs at the step index of
    Lightning's ``self.log``. Rates use the window's (slowest rank's) wall time. A rank's compute
    time sums its forwards and losses: under DDP a fast rank waits in the backward for the
    slowest, so one of two ranks twice as slow reads 2 / 1.5, not 1.00.

    Args:
        log_every_n_steps: window / log interval in optimizer steps (default: the loop's).
        tokens_fn: ``fn(batch)`` -> loss tokens of the micro-batch on this rank.
        examples_fn: ``fn(batch)`` -> examples of the micro-batch on this rank.
        padding_fn: ``fn(batch)`` -> ``(real tokens, padded slots)`` over every padded field;
            without it (and without the batch keys) the padding metrics are not logged.
        flops_per_token: model FLOPs (forward + backward) per loss token; default: the loop's.
        peak_flops: peak FLOP/s of one device, for ``train/mfu``.
        prog_bar: show ``tokens_per_sec`` in the Trainer's progress bar.
        dataset_names: the mixed datasets' names (``keys.DATASET`` indexes them), for per-dataset
            metrics; default: the sampler's (:class:`~lightning_varbatch.MixturePlanner`), or none.

    Raises:
        ValueError: for a non-positive interval, ``flops_per_token`` or ``peak_flops``.
        TypeError: when a batch cannot be read (the message names ``tokens_fn``/``examples_fn``).

    Logged metrics (rates per second of wall time, ``device`` = mean per device):

    ==================================  ================================================
    Key                                 Meaning
    ==================================  ================================================
    ``train/tokens_per_sec``            loss tokens / s, all ranks
    ``train/device/tokens_per_sec``     the same per device
    ``train/padded_tokens_per_sec``     token slots after padding / s, all ranks
    ``train/device/padded_tokens_per_sec``  the same per device
    ``train/padding_efficiency``        real tokens / padded slots (0-1)
    ``train/examples_per_sec``          examples / s, all ranks
    ``train/batch/examples``            examples per optimizer step (window mean)
    ``train/batch/tokens``              loss tokens per optimizer step (window mean)
    ``train/imbalance``                 max / mean over ranks of window loss tokens
    ``train/step_time_imbalance``       max / mean over ranks of their own compute time
                                        (1 = even; FSDP / ZeRO-3 pull it towards 1)
    ``train/step_time``                 wall seconds per optimizer step
    ``train/total_tokens``              loss tokens since training started (exact in checkpoints
                                        with the ``step_*`` batch keys, else to the last window)
    ``train/flops_per_sec``             FLOP/s, all ranks (with FLOPs per token)
    ``train/device/flops_per_sec``      the same per device
    ``train/mfu``                       device FLOP/s / ``peak_flops`` (0-1)
    ``train/dataset/<name>/tokens_per_sec``  the dataset's loss tokens / s, all ranks
    ``train/dataset/<name>/token_share``     its share of the window's loss tokens (0-1)
    ``train/dataset/<name>/batch_share``     its share of the window's micro-batches (0-1;
                                             under per-step mixing, its share of steps)
    ``train/dataset/<name>/total_tokens``    its loss tokens since the start of training
    ``train/length_cap``                the longest example the window's last step could hold
                                        under the length warm-up (docs/length-warmup.md)
    ``train/rank/<r>/tokens_per_sec``   rank ``r``'s loss tokens / s (the ranks' rates add up
                                        to ``train/tokens_per_sec``)
    ``train/rank/<r>/share``            rank ``r``'s share in force: the training sampler's
                                        ``rank_shares`` of this epoch (largest 1)
    ``train/schedule/budget_tokens``    the steps' token budget under the batch-size
                                        schedule (``keys.STEP_BUDGET``), window mean
    ``train/schedule/cost_tokens``      their planned cost, same unit (``keys.STEP_COST``)
    ``train/schedule/fill``             cost / budget of the window's steps (0-1)
    ==================================  ================================================

    Only some runs log: ``train/dataset/...`` (several datasets mixed), ``train/length_cap``
    (during a length warm-up), ``train/rank/...`` (several ranks; the shares: when the sampler
    has ``rank_shares``), ``train/schedule/...`` (batches with ``keys.STEP_BUDGET`` and
    ``keys.STEP_COST``: a batch-size schedule, ``batch_schedule``).

    :meth:`end` (a collective) returns the run's totals on every rank, not to the loggers (the
    callback: into ``trainer.callback_metrics``). The ``train/run/...`` counts are this run's
    (``fit`` call's), the padding keys only when every micro-batch had padding counts:

    ==================================  ================================================
    Key                                 Meaning
    ==================================  ================================================
    ``train/total_tokens``              loss tokens since the start of training (as logged)
    ``train/total_examples``            examples since the start of training (likewise)
    ``train/run/loss_tokens``           loss tokens of the run, all ranks
    ``train/run/examples``              examples of the run, all ranks
    ``train/run/seconds``               wall seconds, first training micro-batch to the end
                                        of training (this rank's clock)
    ``train/run/input_tokens``          real tokens of every padded field, all ranks
    ``train/run/padded_tokens``         token slots after padding, all ranks
    ``train/run/input_tokens_per_sec``  real tokens / ``train/run/seconds``
    ``train/run/padding_efficiency``    real tokens / padded slots of the run (0-1)
    ==================================  ================================================

    Example:
        >>> meter = TokenThroughputMeter(log_every_n_steps=50, peak_flops=989e12)
    """

    def __init__(
        self,
        log_every_n_steps: int | None = None,
        tokens_fn: CountFn | None = None,
        examples_fn: CountFn | None = None,
        padding_fn: PaddingFn | None = None,
        flops_per_token: float | None = None,
        peak_flops: float | None = None,
        prog_bar: bool = True,
        dataset_names: list[str] | None = None,
    ) -> None:
        owner = type(self).__name__
        every = check_positive("log_every_n_steps", log_every_n_steps, integer=True)
        flops_per_token = check_positive("flops_per_token", flops_per_token)
        peak_flops = check_positive("peak_flops", peak_flops)
        check_count_fns(owner, tokens_fn=tokens_fn, examples_fn=examples_fn, padding_fn=padding_fn)
        prog_bar = check_flag("prog_bar", prog_bar)
        if dataset_names is not None and (
            isinstance(dataset_names, str) or not all(isinstance(n, str) for n in dataset_names)
        ):
            raise SettingTypeError(
                f"{owner}(dataset_names=...) must be a list of strings, got {dataset_names!r}.",
                setting="dataset_names",
                value=dataset_names,
            )
        self.log_every_n_steps = None if every is None else int(every)
        self.tokens_fn, self.examples_fn, self.padding_fn = tokens_fn, examples_fn, padding_fn
        self.flops_per_token, self.peak_flops = flops_per_token, peak_flops
        self.prog_bar = prog_bar
        self.dataset_names = None if dataset_names is None else [str(n) for n in dataset_names]
        self.total_tokens = 0.0
        self.total_examples = 0.0
        # The step's exact global counts from batch keys (no collective); None: counted per window.
        self._step_counts: tuple[float, float] | None = None
        self._step_schedule: tuple[float, float] | None = None  # the step's budget and cost
        self._schedule = ScheduleWindow()
        self._window_totals = True
        self.dataset_tokens: list[float] = []
        self.steps = 0
        self._window = RankWindow.empty(0)
        self._steps_in_window = 0
        self._window_start: float | None = None
        self._clock = ComputeClock(torch.device("cpu"))
        self._compute_start: Any = None  # this micro-batch's clock mark, until its backward
        self._names: list[str] = []
        # this fit call's counts on this rank (the windows logged so far) and its start
        self._run = RankWindow()
        self._run_start: float | None = None

    def start(self, loop: LoopContext) -> None:
        """At the start of training: the datasets' names, fresh windows, the device's clock."""
        names = self.dataset_names
        if names is None:
            sampler = getattr(loop.train_dataloader, "batch_sampler", None)
            found = getattr(getattr(sampler, "planner", None), "names", None)
            names = list(found) if found is not None and len(found) > 1 else []
        self._names = names
        if len(self.dataset_tokens) != len(names):
            self.dataset_tokens = [0.0] * len(names)
        self._window = RankWindow.empty(len(names))
        self._schedule = ScheduleWindow()
        self._run = RankWindow()
        self._run_start = None
        self._clock = ComputeClock(loop.device)

    def on_micro_batch(self, batch: Any) -> None:
        """Count a micro-batch before its forward and start its compute clock."""
        now = perf_counter()
        if self._window_start is None:
            self._window_start = now
        if self._run_start is None:
            self._run_start = now
        name = type(self).__name__
        w = self._window
        if (
            self.tokens_fn is None
            and self.examples_fn is None
            and isinstance(batch, Mapping)
            and keys.STEP_NTOKENS in batch
            and keys.STEP_NEXAMPLES in batch
        ):
            self._step_counts = (
                as_number(batch[keys.STEP_NTOKENS], f"batch[{keys.STEP_NTOKENS!r}]"),
                as_number(batch[keys.STEP_NEXAMPLES], f"batch[{keys.STEP_NEXAMPLES!r}]"),
            )
        self._step_schedule = read_schedule(batch, name) or self._step_schedule
        tokens = read_count(batch, keys.NTOKENS, self.tokens_fn, "tokens_fn", name)
        w.tokens += tokens
        w.examples += read_count(batch, keys.NEXAMPLES, self.examples_fn, "examples_fn", name)
        padding = read_padding(batch, self.padding_fn)
        if padding is None:
            w.no_padding = 1.0
        else:
            w.real += padding[0]
            w.padded += padding[1]
        if self._names:
            d = int(batch[keys.DATASET]) if isinstance(batch, Mapping) else 0
            if not 0 <= d < len(self._names):
                raise RuntimeError(
                    f"A batch says it is from dataset {d} but {name} knows "
                    f"{len(self._names)} datasets ({self._names}): set dataset_names."
                )
            w.dataset_tokens[d] += tokens
            w.dataset_batches[d] += 1.0
        self._compute_start = self._clock.mark()

    def before_backward(self) -> None:
        """Stop the micro-batch's compute clock (its forward and loss are done)."""
        if self._compute_start is None:  # one interval per micro-batch, however many backwards
            return
        self._window.compute += self._clock.interval(self._compute_start, self._clock.mark())
        self._compute_start = None

    def on_micro_batch_end(
        self, loop: LoopContext, boundary: bool, steps_done: int
    ) -> dict[str, float] | None:
        """After the micro-batch: at a window's last step, gather and log (a collective).

        Args:
            loop: the loop.
            boundary: whether the micro-batch ended an optimizer step.
            steps_done: optimizer steps taken, this one included.

        Returns:
            The metrics logged (on every rank), or ``None`` when the window goes on.
        """
        now = perf_counter()
        if not boundary:
            return None
        self.steps += 1
        self._steps_in_window += 1
        if self._step_counts is not None:  # totals exact at every step: a checkpoint anywhere
            self.total_tokens += self._step_counts[0]  # holds all of them
            self.total_examples += self._step_counts[1]
            self._window_totals = False
        self._step_counts = None
        if self._step_schedule is not None:
            self._schedule.add(*self._step_schedule)
            self._step_schedule = None
        every = self.log_every_n_steps or int(loop.log_every_n_steps)
        if steps_done % every:
            return None
        assert self._window_start is not None
        self._window.elapsed = now - self._window_start
        self._window.compute += self._clock.collect()
        windows = _gather(loop, self._window)  # every rank is at the same optimizer step
        flops = self.flops_per_token if self.flops_per_token is not None else loop.flops_per_token
        metrics = window_metrics(windows, self._steps_in_window, flops, self.peak_flops)
        if self._window_totals:
            self.total_tokens += sum(w.tokens for w in windows)
            self.total_examples += sum(w.examples for w in windows)
        self._window_totals = True
        metrics["train/total_tokens"] = self.total_tokens
        metrics.update(
            dataset_metrics(
                windows, self._names, metrics["train/tokens_per_sec"], self.dataset_tokens
            )
        )
        cap = length_cap(loop, steps_done - 1)
        if cap is not None:
            metrics["train/length_cap"] = float(cap)
        metrics.update(rank_metrics(windows, rank_shares_in_force(loop)))
        metrics.update(self._schedule.metrics())
        self._schedule = ScheduleWindow()
        log_rank_zero(loop, metrics, steps_done - 1)
        self._run.add_counts(self._window)
        self._window = RankWindow.empty(len(self._names))
        self._steps_in_window = 0
        self._window_start = now
        return metrics

    def end(self, loop: LoopContext) -> dict[str, float]:
        """The run's totals (the table above), on every rank: a collective at the end."""
        now = perf_counter()
        run = RankWindow()
        run.add_counts(self._run)
        run.add_counts(self._window)  # the micro-batches since the last logged window
        seconds = now - (now if self._run_start is None else self._run_start)
        totals = run_metrics(_gather(loop, run), seconds)  # every rank ends training together
        totals["train/total_tokens"] = self.total_tokens
        totals["train/total_examples"] = self.total_examples
        return totals

    def state_dict(self) -> dict[str, Any]:
        """The run's totals so far (for a checkpoint)."""
        return {
            "steps": self.steps,
            "total_tokens": self.total_tokens,
            "total_examples": self.total_examples,
            "dataset_tokens": list(self.dataset_tokens),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s totals."""
        check_state_keys(type(self).__name__, state_dict, self.state_dict())
        self.steps = int(state_dict["steps"])
        self.total_tokens = float(state_dict["total_tokens"])
        self.total_examples = float(state_dict["total_examples"])
        self.dataset_tokens = [float(t) for t in state_dict["dataset_tokens"]]
