"""Run the plan's most demanding micro-batches first, so that an OOM happens in minute one.

:class:`WorstBatchCheck` finds, among this rank's micro-batches of the current epoch plan, the
one with the most padded tokens (examples x longest), the one with the most examples and the
one with the largest attention term (examples x longest²), and runs forward and backward on
each before the first real training step. It reports their peak memory and, when one runs out
of memory (or exceeds ``memory_limit_bytes``), raises an error that names the batch's shape,
the rank and the settings to lower. :func:`measure_peak` is the measurement it uses.

Example:
    >>> check = WorstBatchCheck(kinds=("padded_tokens", "attention"))
    >>> check.kinds
    ('padded_tokens', 'attention')
"""

from __future__ import annotations

import gc
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal, TypeVar

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

from lightning_varbatch.callbacks.batch_counts import log_rank_zero
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.planner.diagnostics import tile_figures

__all__ = ["KINDS", "WorstBatch", "WorstBatchCheck", "format_report", "measure_peak", "worst_tiles"]

Kind = Literal["padded_tokens", "examples", "attention"]
KINDS: tuple[str, ...] = ("padded_tokens", "examples", "attention")
_SETTING = {
    "padded_tokens": "max_tokens",
    "examples": "max_examples",
    "attention": "max_tokens (or cost='quadratic' / 'flops', which budget the attention term)",
}
T = TypeVar("T")


def _proc_status_bytes(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def _reset_rss_peak() -> bool:
    """Reset the process's VmHWM to its current RSS (Linux ``/proc/self/clear_refs``)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _cpu_peak() -> int:
    peak = _proc_status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource  # not on Windows; there /proc is missing too

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measure_peak(
    fn: Callable[[], T], device: torch.device | str | None = None
) -> tuple[T, int, str]:
    """Run ``fn()`` and measure the peak memory it needed.

    On a CUDA device: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
    (everything allocated on the device, weights and optimizer state included), source
    ``"cuda_max_allocated"``. Elsewhere: the process's peak resident set (Linux ``VmHWM`` of
    ``/proc/self/status``, reset to the current RSS through ``/proc/self/clear_refs`` first),
    source ``"cpu_vmhwm"``; where it cannot be reset, the peak since the process started
    (``"cpu_vmhwm_unreset"``, or ``"cpu_ru_maxrss"`` without ``/proc``). CPU figures include
    everything the process holds (the Python runtime, the dataset), and memory that
    ``malloc`` keeps after one probe is counted by the next one too.

    Args:
        fn: what to measure.
        device: the device ``fn`` computes on (default: CPU).

    Returns:
        ``(fn's result, peak bytes, source)``.

    Example:
        >>> _, peak, source = measure_peak(lambda: torch.ones(1 << 20).sum())
        >>> peak > 0, source.startswith("cpu")
        (True, True)
    """
    dev = torch.device("cpu" if device is None else device)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        result = fn()
        torch.cuda.synchronize(dev)
        return result, int(torch.cuda.max_memory_allocated(dev)), "cuda_max_allocated"
    reset = _reset_rss_peak()
    result = fn()
    peak = _cpu_peak()
    has_proc = _proc_status_bytes("VmHWM") is not None
    if not has_proc:
        source = "cpu_ru_maxrss"
    else:
        source = "cpu_vmhwm" if reset else "cpu_vmhwm_unreset"
    return result, peak, source


@dataclass(frozen=True)
class WorstBatch:
    """One selected micro-batch and, once run, its peak memory.

    Attributes:
        kind: ``"padded_tokens"``, ``"examples"`` or ``"attention"``: what it is the largest of.
        position: its index among this rank's micro-batches of the epoch (run order).
        tile: its tile id in the epoch plan.
        examples: examples in it.
        longest: its longest padded planning length.
        padded_tokens: its token slots after padding (examples x longest; a packed row's
            tokens for ``layout="packed"``).
        attention: its attention term, examples x longest² (Σ length² for a packed row).
        peak_bytes: peak memory of its forward and backward (``None`` before it is run).
        memory: how ``peak_bytes`` was measured (see :func:`measure_peak`).
        rank: the rank that ran it.
    """

    kind: str
    position: int
    tile: int
    examples: int
    longest: int
    padded_tokens: int
    attention: int
    peak_bytes: int | None = None
    memory: str | None = None
    rank: int = 0

    def shape(self) -> str:
        """``"<examples> examples x <longest> tokens"``."""
        return f"{self.examples} examples x {self.longest} tokens"

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python values."""
        return asdict(self)


def worst_tiles(sampler: TokenBudgetBatchSampler, kinds: Sequence[str] = KINDS) -> list[WorstBatch]:
    """This rank's most demanding micro-batches of the sampler's current epoch plan.

    Ties go to the one that runs first. Empty micro-batches are never chosen; a rank without
    any gets an empty list.

    Args:
        sampler: the training sampler, set to this rank.
        kinds: what to maximise, each of :data:`KINDS`.

    Returns:
        One :class:`WorstBatch` per kind, in the order of ``kinds``.

    Example:
        >>> s = TokenBudgetBatchSampler([2, 2, 2, 8], 8, rank=0, world_size=1,
        ...                             shuffle=False)
        >>> [(w.kind, w.examples, w.longest) for w in worst_tiles(s)]
        [('padded_tokens', 1, 8), ('examples', 3, 2), ('attention', 1, 8)]
    """
    planner, plan = sampler.planner, sampler.plan
    tiles = tile_figures(planner, plan)
    slots = tiles.slots.astype(np.int64)
    if planner.config.layout == "packed":
        attention = np.rint(tiles.squares).astype(np.int64)
    else:
        attention = tiles.rows * tiles.longest * tiles.longest
    mine = plan.rank_tiles(sampler.rank).astype(np.int64)
    run = np.flatnonzero(tiles.size[mine] > 0)
    if run.size == 0:
        return []
    score = {"padded_tokens": slots, "examples": tiles.size, "attention": attention}
    picks = [(kind, int(run[int(np.argmax(score[kind][mine[run]]))])) for kind in kinds]
    shapes = getattr(planner, "shapes", None)
    if plan.tile_shape is not None and shapes is not None:
        # One per static shape of the plan (the same list on every rank, so every rank runs
        # as many passes): this rank's fullest micro-batch of that shape, or its largest
        # micro-batch when it has none of that shape.
        for rows, length in shapes.tolist():
            of_shape = run[(tiles.rows[mine[run]] == rows) & (tiles.longest[mine[run]] == length)]
            pool = of_shape if of_shape.size else run
            key = tiles.size if of_shape.size else slots
            picks.append((f"shape {rows}x{length}", int(pool[int(np.argmax(key[mine[pool]]))])))
    out = []
    for kind, position in picks:
        t = int(mine[position])
        out.append(
            WorstBatch(
                kind=kind,
                position=position,
                tile=t,
                examples=int(tiles.size[t]),
                longest=int(tiles.longest[t]),
                padded_tokens=int(slots[t]),
                attention=int(attention[t]),
                rank=sampler.rank,
            )
        )
    return out


def check_names(sampler: TokenBudgetBatchSampler, kinds: Sequence[str] = KINDS) -> list[str]:
    """The kinds :func:`worst_tiles` returns, in order: ``kinds``, then one per static shape.

    The same on every rank (the shapes are the plan's), so gathered reports line up.

    Example:
        >>> s = TokenBudgetBatchSampler([2, 2, 8], 8, rank=0, world_size=1, max_shapes=2)
        >>> check_names(s, ("examples",))
        ['examples', 'shape 4x2', 'shape 1x8']
    """
    shapes = getattr(sampler.planner, "shapes", None)
    if sampler.plan.tile_shape is None or shapes is None:
        return list(kinds)
    return [*kinds, *(f"shape {rows}x{length}" for rows, length in shapes.tolist())]


def _is_oom(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, (RuntimeError, MemoryError)) and (
        isinstance(error, MemoryError)
        or "out of memory" in text
        or "can't allocate memory" in text
        or "not enough memory" in text
    )


class _RestoreState:
    """Keep buffers, gradients and RNG states of a module as they were; restore on exit."""

    def __init__(self, module: torch.nn.Module, optimizers: Sequence[Any]) -> None:
        self.module, self.optimizers = module, optimizers

    def __enter__(self) -> _RestoreState:
        self.buffers = {n: b.detach().clone() for n, b in self.module.named_buffers()}
        self.grads = {
            n: None if p.grad is None else p.grad.detach().clone()
            for n, p in self.module.named_parameters()
        }
        self.rng: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),  # noqa: NPY002  (the legacy global state)
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.rng["cuda"] = torch.cuda.get_rng_state_all()
        return self

    def __exit__(self, *exc: object) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, p in self.module.named_parameters():
                saved = self.grads.get(n)
                p.grad = saved
            for n, b in self.module.named_buffers():
                if n in self.buffers:
                    b.copy_(self.buffers[n])
        torch.set_rng_state(self.rng["torch"])
        np.random.set_state(self.rng["numpy"])  # noqa: NPY002
        random.setstate(self.rng["python"])
        if "cuda" in self.rng:
            torch.cuda.set_rng_state_all(self.rng["cuda"])


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
        ValueError: for an unknown kind, an empty ``kinds`` or a bad limit.
        RuntimeError: (in ``setup``) under manual optimization or DeepSpeed (ZeRO keeps
            accumulated gradients where the check cannot discard them); (in
            ``on_train_start``) when the training loader has no token-budget sampler, and
            when a checked micro-batch runs out of memory or exceeds ``memory_limit_bytes``:
            the message names its shape (examples x longest), the rank and the settings to
            lower (``max_tokens``, ``max_examples``).

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
        owner = type(self).__name__
        if isinstance(kinds, str):
            kinds = (kinds,)
        kinds = tuple(kinds)
        unknown = [k for k in kinds if k not in KINDS]
        if unknown or not kinds:
            raise ValueError(
                f"{owner}(kinds=...) must be a non-empty sequence of {', '.join(map(repr, KINDS))}"
                f", got {kinds!r}."
            )
        if memory_limit_bytes is not None and (
            isinstance(memory_limit_bytes, bool)
            or not isinstance(memory_limit_bytes, (int, np.integer))
            or memory_limit_bytes <= 0
        ):
            raise ValueError(
                f"{owner}(memory_limit_bytes=...) must be a positive integer (bytes) or None, "
                f"got {memory_limit_bytes!r}."
            )
        if not isinstance(verbose, bool):
            raise TypeError(f"{owner}(verbose=...) must be a bool, got {verbose!r}.")
        self.kinds: tuple[str, ...] = kinds
        self.memory_limit_bytes = None if memory_limit_bytes is None else int(memory_limit_bytes)
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
        dataset, collate = loader.dataset, loader.collate_fn
        worst = worst_tiles(sampler, self.kinds)
        self._names = check_names(sampler, self.kinds)
        device = trainer.strategy.root_device
        optimizers = list(trainer.optimizers)
        report: list[WorstBatch] = []
        pl_module.log = _no_log  # type: ignore[method-assign]
        pl_module.log_dict = _no_log  # type: ignore[method-assign]
        try:
            with _RestoreState(pl_module, optimizers), torch.enable_grad():
                for w in worst:
                    peak, source = self._run(trainer, sampler, dataset, collate, w, device)
                    report.append(_with(w, peak, source))
        finally:
            del pl_module.log, pl_module.log_dict
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
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
                f"the shapes): lower max_tokens (now {sampler.config.max_tokens}) or "
                f"max_examples (now {sampler.config.max_examples})."
            )
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
                    f"{x['kind']} {x['examples']} x {x['longest']}: {_gib(x['peak_bytes'])}"
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

        def step() -> None:
            items = (
                dataset.__getitems__(mb)
                if hasattr(dataset, "__getitems__")
                else [dataset[i] for i in mb]
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

        try:
            _, peak, source = measure_peak(step, device)
        except Exception as error:  # only memory errors are translated
            if not _is_oom(error):
                raise
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
        return peak, source

    def _limit_message(self, sampler: TokenBudgetBatchSampler, w: WorstBatch) -> str:
        limit = self.memory_limit_bytes
        assert limit is not None and w.peak_bytes is not None
        return _message(
            sampler,
            w,
            f"needs {_gib(w.peak_bytes)} ({w.peak_bytes} bytes, {w.memory}), over "
            f"memory_limit_bytes={limit} ({_gib(limit)})",
            "",
        )


def _with(w: WorstBatch, peak: int, source: str) -> WorstBatch:
    d = w.to_dict()
    d.update(peak_bytes=int(peak), memory=source)
    return WorstBatch(**d)


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def _message(sampler: TokenBudgetBatchSampler, w: WorstBatch, what: str, detail: str) -> str:
    cfg = sampler.config
    return (
        f"WorstBatchCheck: on rank {w.rank}, the micro-batch with the most {w.kind} "
        f"({w.shape()} = {w.padded_tokens} padded tokens, attention term {w.attention}; "
        f"micro-batch {w.position} of epoch {sampler.plan.epoch}) {what}{detail}. Training "
        f"would fail when it reaches this batch. Lower {_SETTING.get(w.kind, 'max_tokens')} "
        f"(now max_tokens="
        f"{cfg.max_tokens}, max_examples={cfg.max_examples}) — find_max_tokens can pick "
        "max_tokens for a memory limit — or use less memory per token (activation "
        "checkpointing, a smaller model or precision, FSDP/DeepSpeed sharding)."
    )


def format_report(report: Sequence[Mapping[str, Any]], limit: int | None = None) -> str:
    """The report of :class:`WorstBatchCheck` as a small table.

    Example:
        >>> print(format_report([{"kind": "examples", "examples": 4, "longest": 2,
        ...     "padded_tokens": 8, "attention": 16, "peak_bytes": 2**30, "rank": 0,
        ...     "memory": "cpu_vmhwm"}]))  # doctest: +NORMALIZE_WHITESPACE
        worst micro-batches (rank 0, cpu_vmhwm):
          examples       4 x 2 tokens   8 padded tokens   peak 1.00 GiB
    """
    if not report:
        return "worst micro-batches: none (this rank has no micro-batches)"
    head = f"worst micro-batches (rank {report[0]['rank']}, {report[0]['memory']}"
    head += f", limit {_gib(limit)}):" if limit is not None else "):"
    lines = [head]
    for r in report:
        peak = "?" if r["peak_bytes"] is None else _gib(int(r["peak_bytes"]))
        lines.append(
            f"  {r['kind']:<14} {r['examples']} x {r['longest']} tokens   "
            f"{r['padded_tokens']} padded tokens   peak {peak}"
        )
    return "\n".join(lines)
