"""Global token throughput, padding efficiency, effective batch size and rank imbalance.

Lightning's ``ThroughputMonitor`` multiplies rank 0's counts by the world size, wrong when ranks
carry different loads; :class:`TokenThroughputMonitor` gathers every rank's counts and times.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from time import perf_counter
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_varbatch import keys
from lightning_varbatch.callbacks.batch_counts import (
    CountFn,
    as_number,
    check_count_fns,
    check_positive,
    check_state_keys,
    is_step_boundary,
    length_cap,
    log_rank_zero,
    rank_shares_in_force,
    read_count,
    read_schedule,
)
from lightning_varbatch.callbacks.compute_clock import ComputeClock
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

__all__ = ["TokenThroughputMonitor", "length_cap", "rank_metrics", "rank_shares_in_force"]

PaddingFn = Callable[[Any], "tuple[int | float | torch.Tensor, int | float | torch.Tensor]"]


def _gather(trainer: Trainer, window: RankWindow) -> list[RankWindow]:
    """Every rank's ``window``, in rank order: one all-gather, which every rank must call."""
    local = torch.tensor(window.to_vector(), dtype=torch.float64)
    rows = trainer.strategy.all_gather(local.to(trainer.strategy.root_device))
    return [RankWindow.from_vector(row) for row in rows.reshape(-1, local.numel()).tolist()]


class TokenThroughputMonitor(Callback):
    """Log global throughput, padding, effective batch size and imbalance per optimizer steps.

    Each rank's micro-batch counts (from :mod:`lightning_varbatch.keys` or ``tokens_fn`` /
    ``examples_fn`` / ``padding_fn``) are summed over ``log_every_n_steps`` optimizer steps
    (real steps, under every strategy); at the window's last step every rank all-gathers it and
    rank 0 logs at the step index of Lightning's ``self.log``. Rates use the window's (slowest
    rank's) wall time. A rank's compute time sums its forward and loss (``on_train_batch_start``
    -> ``on_before_backward``): under DDP a fast rank waits in the backward for the slowest, so
    one of two ranks twice as slow reads 2 / 1.5, not 1.00. FLOPs per loss token:
    ``flops_per_token`` or the LightningModule's attribute.

    Args:
        log_every_n_steps: window / log interval in optimizer steps (default: the Trainer's).
        tokens_fn: ``fn(batch)`` -> loss tokens of the micro-batch on this rank.
        examples_fn: ``fn(batch)`` -> examples of the micro-batch on this rank.
        padding_fn: ``fn(batch)`` -> ``(real tokens, padded slots)`` over every padded field;
            without it (and without the batch keys) the padding metrics are not logged.
        flops_per_token: model FLOPs (forward + backward) per loss token.
        peak_flops: peak FLOP/s of one device, for ``train/mfu``.
        prog_bar: show ``tokens_per_sec`` in the progress bar.
        dataset_names: names of the mixed datasets, for the per-dataset metrics (batches'
            ``keys.DATASET`` indexes them). Default: the training sampler's
            (:class:`~lightning_varbatch.MixturePlanner`), else no per-dataset metrics.

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
    ``train/total_tokens``              loss tokens since the start of training (exact in
                                        checkpoints with the ``step_*`` batch keys; else
                                        counted up to the last logged window)
    ``train/flops_per_sec``             FLOP/s, all ranks (with FLOPs per token)
    ``train/device/flops_per_sec``      the same per device
    ``train/mfu``                       device FLOP/s / ``peak_flops`` (0-1)
    ``train/dataset/<name>/tokens_per_sec``  the dataset's loss tokens / s, all ranks
    ``train/dataset/<name>/token_share``     its share of the window's loss tokens (0-1)
    ``train/dataset/<name>/batch_share``     its share of the window's micro-batches (0-1;
                                             under per-step mixing, its share of steps)
    ``train/dataset/<name>/total_tokens``    its loss tokens since the start of training
    ``train/length_cap``                the longest example the window's last step could hold
                                        under the length warm-up (docs/length-warmup.md),
                                        read from the plan
    ``train/rank/<r>/tokens_per_sec``   rank ``r``'s loss tokens / s of the window's wall
                                        time (the ranks' rates add up to
                                        ``train/tokens_per_sec``)
    ``train/rank/<r>/share``            rank ``r``'s share in force: the training sampler's
                                        ``rank_shares`` of this epoch (largest 1)
    ``train/schedule/budget_tokens``    the steps' token budget under the batch-size
                                        schedule (``keys.STEP_BUDGET``), window mean
    ``train/schedule/cost_tokens``      their planned cost, same unit (``keys.STEP_COST``)
    ``train/schedule/fill``             cost / budget of the window's steps (0-1)
    ==================================  ================================================

    The ``train/dataset/...`` keys appear only when several datasets are mixed,
    ``train/length_cap`` only during a length warm-up, the ``train/rank/...`` keys only with
    more than one rank, the shares only when the training sampler has ``rank_shares``, and
    the ``train/schedule/...`` keys only when the batches carry ``keys.STEP_BUDGET`` and
    ``keys.STEP_COST`` (a batch-size schedule, ``batch_schedule``).

    When training ends (``on_train_end``, a collective on every rank) the run's totals go into
    ``trainer.callback_metrics`` on every rank (not to the loggers), where a script reads them
    after ``fit`` (the ``train/run/...`` counts are this ``fit`` call's, from its first training
    micro-batch; the padding keys only when every micro-batch had padding counts):

    ==================================  ================================================
    Key                                 Meaning
    ==================================  ================================================
    ``train/total_tokens``              loss tokens since the start of training (as logged)
    ``train/total_examples``            examples since the start of training (likewise)
    ``train/run/loss_tokens``           loss tokens of the run, all ranks
    ``train/run/examples``              examples of the run, all ranks
    ``train/run/seconds``               wall seconds from the first training micro-batch
                                        to the end of training (this rank's clock)
    ``train/run/input_tokens``          real tokens of every padded field, all ranks
    ``train/run/padded_tokens``         token slots after padding, all ranks
    ``train/run/input_tokens_per_sec``  real tokens / ``train/run/seconds``
    ``train/run/padding_efficiency``    real tokens / padded slots of the run (0-1)
    ==================================  ================================================

    Example:
        >>> from lightning.pytorch import Trainer
        >>> monitor = TokenThroughputMonitor(log_every_n_steps=50, peak_flops=989e12)
        >>> trainer = Trainer(callbacks=[monitor])  # doctest: +SKIP
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
        # The step's global counts from the batch keys (exact at every step, no collective);
        # None: counted per window from the gathered per-rank counts instead.
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

    def _padding(self, batch: Any) -> tuple[float, float] | None:
        if self.padding_fn is not None:
            real, padded = self.padding_fn(batch)
            return as_number(real, "padding_fn()[0]"), as_number(padded, "padding_fn()[1]")
        if (
            isinstance(batch, Mapping)
            and keys.PADDED_TOKENS in batch
            and keys.INPUT_TOKENS in batch
        ):
            return as_number(batch[keys.INPUT_TOKENS], "input"), as_number(
                batch[keys.PADDED_TOKENS], "pad"
            )
        return None

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        names = self.dataset_names
        if names is None:
            sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
            found = getattr(getattr(sampler, "planner", None), "names", None)
            names = list(found) if found is not None and len(found) > 1 else []
        self._names = names
        if len(self.dataset_tokens) != len(names):
            self.dataset_tokens = [0.0] * len(names)
        self._window = RankWindow.empty(len(names))
        self._schedule = ScheduleWindow()
        self._run = RankWindow()
        self._run_start = None
        self._clock = ComputeClock(trainer.strategy.root_device)

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
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
        padding = self._padding(batch)
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

    @override
    def on_before_backward(
        self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor
    ) -> None:
        if self._compute_start is None:  # one interval per micro-batch, however many backwards
            return
        self._window.compute += self._clock.interval(self._compute_start, self._clock.mark())
        self._compute_start = None

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        now = perf_counter()
        if not is_step_boundary(trainer):
            return
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
        every = self.log_every_n_steps or int(getattr(trainer, "log_every_n_steps", 50))
        if trainer.global_step % every:
            return
        assert self._window_start is not None
        self._window.elapsed = now - self._window_start
        self._window.compute += self._clock.collect()
        windows = _gather(trainer, self._window)  # every rank is at the same optimizer step
        flops = self.flops_per_token
        if flops is None:
            flops = getattr(pl_module, "flops_per_token", None)
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
        cap = length_cap(trainer, trainer.global_step - 1)
        if cap is not None:
            metrics["train/length_cap"] = float(cap)
        metrics.update(rank_metrics(windows, rank_shares_in_force(trainer)))
        metrics.update(self._schedule.metrics())
        self._schedule = ScheduleWindow()
        log_rank_zero(trainer, metrics, trainer.global_step - 1)
        if self.prog_bar:
            pl_module.log(
                "tokens_per_sec",
                metrics["train/tokens_per_sec"],
                prog_bar=True,
                logger=False,
                on_step=True,
                on_epoch=False,
            )
        self._run.add_counts(self._window)
        self._window = RankWindow.empty(len(self._names))
        self._steps_in_window = 0
        self._window_start = now

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        now = perf_counter()
        run = RankWindow()
        run.add_counts(self._run)
        run.add_counts(self._window)  # the micro-batches since the last logged window
        seconds = now - (now if self._run_start is None else self._run_start)
        totals = run_metrics(_gather(trainer, run), seconds)  # every rank ends training together
        totals["train/total_tokens"] = self.total_tokens
        totals["train/total_examples"] = self.total_examples
        trainer.callback_metrics.update(
            {key: torch.tensor(value, dtype=torch.float64) for key, value in totals.items()}
        )

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "total_tokens": self.total_tokens,
            "total_examples": self.total_examples,
            "dataset_tokens": list(self.dataset_tokens),
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_keys(type(self).__name__, state_dict, self.state_dict())
        self.steps = int(state_dict["steps"])
        self.total_tokens = float(state_dict["total_tokens"])
        self.total_examples = float(state_dict["total_examples"])
        self.dataset_tokens = [float(t) for t in state_dict["dataset_tokens"]]
