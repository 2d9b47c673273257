"""Callback overhead: what BatchSizeLRScaler + TokenThroughputMonitor cost per optimizer step.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.training.callback_overhead            # full run, ~3 min on 2 idle cores
    python -m benchmarks.training.callback_overhead --quick    # smoke test, < 1 min

A full run writes ``benchmarks/results/callback_overhead.json`` (:mod:`benchmarks.results`;
``--quick`` only with ``--result PATH``); ``benchmarks.training.tables`` renders its table.

Target: the per-step overhead of both callbacks together is <= 1 % of the step time.

Workload: the translation example's model (:class:`examples.translation.model.TranslationModel`:
pre-norm encoder-decoder, ``d_model=128``, 2 + 2 layers, 4 heads, FFN 512, dropout 0.1,
vocabulary 8000, tied embeddings, label-smoothed summed cross entropy normalised by the step's
tokens, Adam lr 5e-4 with its inverse-sqrt warm-up), one torch thread (``--threads``). Data:
random token ids with WMT-like (source, target) lengths
(:func:`lightning_varbatch.planner.wmt_like_lengths`) served by
:class:`lightning_varbatch.TokenBudgetDataModule` (``--max-tokens``, default 1024, fixed seed:
every run trains the same batches in the same order; one micro-batch per optimizer step).
Trainer: ``accelerator="cpu", devices=1``, ``CSVLogger`` in a temporary directory,
``log_every_n_steps=50``, no progress bar, no checkpointing; the module logs its loss every step
in every configuration. A small step makes the overhead's share large: GPU steps are longer.

Configurations, one fresh ``Trainer`` each, interleaved ``A B C`` then ``C B A`` ... for
``--rounds`` rounds (a round's three runs are a paired measurement):

* **A baseline**: no callback of ours.
* **B every step**: ``BatchSizeLRScaler(rule="sqrt", log_every_n_steps=1)`` +
  ``TokenThroughputMonitor(log_every_n_steps=1)`` (worst case: both log every step).
* **C every 50**: both with their defaults (the Trainer's ``log_every_n_steps=50``).

Measurements, over the ``--measured`` steps after ``--warmup`` untimed ones (a multiple of 50 in
a full run, so that C's window holds its share of logging steps):

* **step time**: ``perf_counter`` at every ``on_train_batch_end`` of a timing callback that runs
  after ours; a step is the difference of two stamps.
* **direct overhead** (the headline): the time spent inside our callbacks' per-step hooks (every
  Lightning ``on_train_batch_*``/``on_before_*``/``on_after_*`` hook the class overrides, and
  the LR scaler's torch optimizer step pre/post hooks), wrapped with ``perf_counter``, per
  measured step, over the median step of A *in the same round*. It includes the callbacks'
  logging calls (``logger.log_metrics``, ``pl_module.log``), not Lightning's later processing of
  the extra progress-bar entry.
* **end-to-end overhead**: mean step of B (or C) / mean step of A in the same round, - 1: every
  cost, but with the machine's noise (a few % on shared cores, more than the target).

Each figure is given as the median over the rounds and the min..max range. Verdict (judged
when there are at least 3 rounds): PASS when the direct overhead's whole range is <= 1 % in B
and C, and the end-to-end range is not wholly above 1 % (an overhead the hooks miss).
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import statistics
import tempfile
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from time import perf_counter
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.loggers import CSVLogger
from torch import Tensor

from benchmarks.harness import command_line, print_table, torch_machine_line, write_json
from benchmarks.results import Run, add_result_option, result_path
from examples.translation.model import TranslationModel
from lightning_varbatch import BatchSizeLRScaler, TokenBudgetDataModule, TokenThroughputMonitor
from lightning_varbatch.planner import wmt_like_lengths

MODULE = "benchmarks.training.callback_overhead"
MEASURED = [
    "examples.translation.model",
    "lightning_varbatch.callbacks.lr_scaling",
    "lightning_varbatch.callbacks.trainer_adapters",
    "lightning_varbatch.callbacks.throughput",
    "lightning_varbatch.data.datamodule",
    "lightning_varbatch.loss",
    "lightning_varbatch.planner.synthetic",
]
"""The package modules the runs measure (their import closure is fingerprinted)."""
CONFIGS = ("A", "B", "C")
NAMES = {"A": "A baseline", "B": "B both, log every step", "C": "C both, log every 50"}
STEP_HOOKS = tuple(
    name
    for name in dir(Callback)
    if name.startswith(("on_train_batch_", "on_before_", "on_after_"))
)
"""The Lightning hooks that run once per micro-batch or optimizer step."""
OPTIMIZER_HOOKS = {"BatchSizeLRScaler": ("_before_update", "_after_update")}
"""Methods a callback registers as torch optimizer step hooks (timed as well)."""
TARGET = 0.01

FIRST_WORD, VOCAB = 4, 8000


class StepTimer(Callback):
    """``perf_counter`` and the hooks' time so far at every ``on_train_batch_end``."""

    def __init__(self, totals: dict[str, float]) -> None:
        self.totals = totals
        self.stamps: list[float] = []
        self.snapshots: list[dict[str, float]] = []

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        self.stamps.append(perf_counter())
        self.snapshots.append(dict(self.totals))

    def window(self, warmup: int) -> tuple[list[float], list[float], dict[str, float]]:
        """Step times, our hooks' time per step and per hook (summed) after ``warmup``."""
        hooks = [sum(s.values()) for s in self.snapshots]
        first, last = self.snapshots[warmup], self.snapshots[-1]
        per_hook = {k: last[k] - first.get(k, 0.0) for k in last}
        return _diffs(self.stamps[warmup:]), _diffs(hooks[warmup:]), per_hook


def _diffs(xs: list[float]) -> list[float]:
    return [b - a for a, b in itertools.pairwise(xs)]


def timed_methods(callback: Callback) -> list[str]:
    """The per-step hooks ``callback``'s class overrides, and its optimizer hooks."""
    cls = type(callback)
    names = [h for h in STEP_HOOKS if getattr(cls, h) is not getattr(Callback, h)]
    for name in OPTIMIZER_HOOKS.get(cls.__name__, ()):
        if not callable(getattr(callback, name, None)):
            raise RuntimeError(f"{cls.__name__} has no method {name}: update OPTIMIZER_HOOKS")
        names.append(name)
    return names


def wrap_hooks(callback: Callback, totals: dict[str, float]) -> None:
    """Replace the callback's timed methods by wrappers that add their time to ``totals``."""
    for hook in timed_methods(callback):
        inner: Callable[..., Any] = getattr(callback, hook)
        key = f"{type(callback).__name__}.{hook}"
        totals.setdefault(key, 0.0)

        def timed(*args: Any, _inner: Callable[..., Any] = inner, _key: str = key) -> Any:
            start = perf_counter()
            try:
                return _inner(*args)
            finally:
                totals[_key] += perf_counter() - start

        setattr(callback, hook, timed)


def make_data(n: int, seed: int) -> tuple[list[dict[str, Tensor]], np.ndarray]:
    lengths = wmt_like_lengths(n, seed=seed).astype(np.int64)
    gen = torch.Generator().manual_seed(seed)
    data = [
        {
            "source": torch.randint(FIRST_WORD, VOCAB, (int(s),), generator=gen),
            "target": torch.randint(FIRST_WORD, VOCAB, (int(t),), generator=gen),
        }
        for s, t in lengths
    ]
    return data, lengths


@dataclass
class RunTimes:
    """One run's measured steps: step times and our hooks' time per step (seconds)."""

    config: str
    round: int
    times: list[float]
    hook_times: list[float]
    hooks: dict[str, float] = field(default_factory=dict)  # seconds per hook, measured steps

    @property
    def median(self) -> float:
        return statistics.median(self.times)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.times)

    @property
    def hook_per_step(self) -> float:
        return statistics.fmean(self.hook_times)


def callbacks_for(config: str) -> list[Callback]:
    if config == "B":
        return [
            BatchSizeLRScaler(rule="sqrt", log_every_n_steps=1),
            TokenThroughputMonitor(log_every_n_steps=1),
        ]
    if config == "C":
        return [BatchSizeLRScaler(rule="sqrt"), TokenThroughputMonitor()]
    return []


def run_once(
    config: str, rnd: int, data: list[dict[str, Tensor]], lengths: np.ndarray, a: Any
) -> RunTimes:
    torch.manual_seed(0)
    model = TranslationModel(
        VOCAB, d_model=128, nhead=4, dim_feedforward=512, lr=5e-4, decode_batches=0
    )
    dm = TokenBudgetDataModule(data, lengths, a.max_tokens, seed=0)
    totals: dict[str, float] = {}
    callbacks = callbacks_for(config)
    for cb in callbacks:
        wrap_hooks(cb, totals)
    timer = StepTimer(totals)
    # Stamps at the end of steps 1..max_steps; warmup + measured + 1 of them give the window.
    with tempfile.TemporaryDirectory() as tmp:
        trainer = Trainer(
            accelerator="cpu",
            devices=1,
            max_steps=a.warmup + a.measured + 1,
            logger=CSVLogger(tmp),
            log_every_n_steps=50,
            callbacks=[*callbacks, timer],
            enable_progress_bar=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            num_sanity_val_steps=0,
        )
        trainer.fit(model, datamodule=dm)
    return RunTimes(config, rnd, *timer.window(a.warmup))


def summary(runs: Sequence[RunTimes]) -> dict[str, Any]:
    """Per configuration: per-round figures against A of the same round, medians and ranges."""
    base = {r.round: r for r in runs if r.config == "A"}
    out: dict[str, Any] = {}
    for config in CONFIGS:
        mine = [r for r in runs if r.config == config]
        c: dict[str, Any] = {
            "label": NAMES[config],
            "step_median_ms": [1e3 * r.median for r in mine],
            "step_mean_ms": [1e3 * r.mean for r in mine],
            "steps": len(mine[0].times) if mine else 0,
        }
        if config != "A":
            direct = [r.hook_per_step / base[r.round].median for r in mine]
            e2e = [r.mean / base[r.round].mean - 1 for r in mine]
            hook_us = [1e6 * r.hook_per_step for r in mine]
            n = sum(len(r.times) for r in mine)
            keys_ = mine[0].hooks
            c.update(
                hook_us=hook_us,
                hook_us_median=statistics.median(hook_us),
                direct=direct,
                direct_median=statistics.median(direct),
                direct_min=min(direct),
                direct_max=max(direct),
                e2e=e2e,
                e2e_median=statistics.median(e2e),
                e2e_min=min(e2e),
                e2e_max=max(e2e),
                hooks_us={k: 1e6 * sum(r.hooks[k] for r in mine) / n for k in keys_},
                max_hook_us=1e6 * max(max(r.hook_times) for r in mine),
            )
        c["step_median_ms_all"] = statistics.median(c["step_median_ms"]) if mine else math.nan
        out[config] = c
    return out


def report(configs: dict[str, Any], rounds: int) -> bool:
    """Print the table and the verdict; return whether the target is met."""
    rows = []
    for config in CONFIGS:
        c = configs[config]
        row = [c["label"], f"{c['step_median_ms_all']:.1f}"]
        if config == "A":
            row += ["-", "-", "-"]
        else:
            row += [
                f"{c['hook_us_median']:.0f}",
                f"{c['direct_median']:.3%} ({c['direct_min']:.3%}..{c['direct_max']:.3%})",
                f"{c['e2e_median']:+.2%} ({c['e2e_min']:+.2%}..{c['e2e_max']:+.2%})",
            ]
        rows.append(row)
    headers = ["configuration", "step ms (median)", "hooks us/step", "direct overhead"]
    print_table([*headers, "end-to-end overhead"], rows)
    for config in "BC":
        parts = configs[config]["hooks_us"]
        print(f"  {config} us/step by hook: " + ", ".join(f"{k} {v:.1f}" for k, v in parts.items()))
    ok = all(configs[k]["direct_max"] <= TARGET and configs[k]["e2e_min"] <= TARGET for k in "BC")
    verdict = "PASS" if ok else "FAIL"
    if rounds < 3:
        verdict = f"not judged ({rounds} round(s); at least 3 needed)"
    print(
        f"\nTarget (direct overhead <= {TARGET:.0%} of A's median step in every round, B and C; "
        f"end-to-end range not wholly above it): {verdict}"
    )
    return ok


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Callback overhead (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test: few steps, one round")
    p.add_argument("--measured", type=int, default=50, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per run")
    p.add_argument("--rounds", type=int, default=5, help="interleaved rounds (A B C each)")
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--examples", type=int, default=20000)
    p.add_argument("--threads", type=int, default=1, help="torch threads")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "callback_overhead")
    args = p.parse_args(argv)
    if args.quick:
        args.measured, args.warmup, args.rounds, args.examples = 10, 2, 1, 4000
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "result", "no_result")}
    run = Run("callback_overhead", settings=settings, package=MEASURED, bench=[MODULE])
    warnings.filterwarnings("ignore")
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    logging.getLogger("lightning.fabric").setLevel(logging.ERROR)
    torch.set_num_threads(args.threads)
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    data, lengths = make_data(args.examples, seed=0)
    print(
        f"threads {torch.get_num_threads()}, max_tokens {args.max_tokens}, {args.measured} "
        f"measured steps after {args.warmup} per run, {args.rounds} rounds"
    )
    runs: list[RunTimes] = []
    for rnd in range(args.rounds):
        for config in CONFIGS if rnd % 2 == 0 else CONFIGS[::-1]:
            r = run_once(config, rnd, data, lengths, args)
            runs.append(r)
            print(
                f"  round {rnd} {config}: median {r.median * 1e3:7.2f} ms, mean "
                f"{r.mean * 1e3:7.2f} ms, hooks {r.hook_per_step * 1e6:7.1f} us/step",
                flush=True,
            )
    configs = summary(runs)
    print()
    passed = report(configs, args.rounds)
    print("machine after:", torch_machine_line())
    numbers = {"configs": configs, "target": TARGET, "rounds": args.rounds, "passed": passed}
    numbers["runs"] = [asdict(r) for r in runs]
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
