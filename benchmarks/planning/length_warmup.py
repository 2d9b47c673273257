"""Sequence-length warm-up benchmark: the planner's warm-up against the plan without it and
against truncating warm-ups (DeepSpeed ``curriculum_learning`` ``seqlen``, Composer
``SeqLengthWarmup``), on the same lengths and schedule.

Run from the repository root::

    python -m benchmarks.planning.length_warmup          # 4.5M WMT-like pairs + 1M LM docs
    python -m benchmarks.planning.length_warmup --quick  # 300k pairs + 100k docs

Workloads (8 ranks, ``accumulate_grad_batches=1``, ``max_tokens=16384``, seed 0):

* ``wmt``: :func:`lightning_varbatch.planner.synthetic.wmt_like_lengths` pairs, padded;
* ``lm``: long-tail LM documents, lognormal median 300 tokens, sigma 1.2, clipped to
  [8, 4096], planned ``padded`` and ``packed``.

The warm-up: ``length_warmup`` = a quarter of the epoch's steps, ``length_warmup_min=8``,
``"root"`` schedule (Li et al.'s) up to the longest example.

Definitions:

* **tokens/step**: real tokens (planning key: ``max(src, tgt)`` for pairs) per optimizer step;
  *warm-up mean / no-warm-up mean* compares the warm-up's steps with all steps of the plan
  without the schedule; **min step / budget**: the fewest real tokens of a warm-up step over the
  step's budget (``max_tokens × 8``).
* **padding per stage**: real / slot tokens over each quarter of the warm-up, and the steps
  after it; the plan without the schedule over all its steps.
* **cut**: tokens removed from examples (0 by construction; the coverage check asserts every
  example exactly once).
* **plan time**: median of ``--repeats`` constructions + ``plan(0, 8)``, with / without.
* **truncating warm-up**: the same number of optimizer steps per epoch with a fixed
  ``B = n / steps`` examples per step in random order (``B / 8`` per rank), each example cut
  to the step's cap (DeepSpeed ``seqlen`` / Composer ``truncate=True``), padded per rank to
  its longest cut example. Over the warm-up's steps: tokens discarded (share of the warm-up
  examples' tokens), padding efficiency, examples seen, tokens per step. For packed rows,
  Composer's setting: rows of the longest length from a concatenated stream, cut to the cap.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from typing import Any, Final

import numpy as np

from benchmarks.results import Run, add_result_option, result_path
from lightning_varbatch import EpochPlanner, PlanConfig
from lightning_varbatch.planner import warmup_report, wmt_like_lengths
from lightning_varbatch.planner.length_warmup import ScheduleName, scheduled_caps
from lightning_varbatch.planner.settings import LayoutName
from lightning_varbatch.planner.warmup_report import step_figures

WORLD, BUDGET, MIN_CAP = 8, 16384, 8
MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.warmup_report",
    "lightning_varbatch.planner.length_warmup",
    "lightning_varbatch.planner.synthetic",
]
"""The package code the figures measure (with its imports; :mod:`benchmarks.results`)."""
SCHEDULE: Final[ScheduleName] = "root"


def lm_lengths(n: int, seed: int = 0) -> np.ndarray:
    """Long-tail LM document lengths: lognormal, median 300, sigma 1.2, in [8, 4096]."""
    rng = np.random.default_rng(seed)
    return np.clip(np.rint(rng.lognormal(np.log(300), 1.2, n)), 8, 4096).astype(np.int64)


def _timed_plan(lengths: np.ndarray, config: PlanConfig, repeats: int) -> tuple[Any, Any, float]:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        planner = EpochPlanner(lengths, config)
        plan = planner.plan(0, WORLD)
        times.append(time.perf_counter() - start)
    return planner, plan, float(np.median(times))


def _truncating(key: np.ndarray, steps: int, caps: np.ndarray, packed: bool) -> dict[str, float]:
    """A truncating warm-up over ``len(caps)`` steps of a fixed-examples epoch of ``steps``."""
    rng = np.random.default_rng(0)
    w = caps.shape[0]
    if packed:  # Composer on a packed stream: rows of the longest length, cut to the cap
        kept = np.minimum(caps, int(key.max())).astype(np.float64)
        rows = BUDGET // int(key.max()) * WORLD
        return {
            "discarded": float(1 - kept.mean() / key.max()),
            "padding": 1.0,
            "examples": float("nan"),
            "tokens_per_step": float(kept.mean() * rows),
        }
    per_rank = max(1, round(key.size / steps / WORLD))
    ids = rng.permutation(key.size)[: w * WORLD * per_rank].reshape(w, WORLD, per_rank)
    full = key[ids].astype(np.int64)
    kept = np.minimum(full, caps[:, None, None])
    slots = kept.max(axis=2, keepdims=True) * per_rank
    return {
        "discarded": float(1 - kept.sum() / full.sum()),
        "padding": float(kept.sum() / slots.sum()),
        "examples": float(ids.size),
        "tokens_per_step": float(kept.sum() / w),
    }


def run_case(name: str, lengths: np.ndarray, layout: LayoutName, repeats: int) -> dict[str, Any]:
    """Plan one workload with and without the warm-up; the truncating warm-up beside it."""
    plain = PlanConfig(BUDGET, layout=layout)
    base_planner, base, t_base = _timed_plan(lengths, plain, repeats)
    warmup = max(1, base.num_steps // 4)
    config = PlanConfig(
        BUDGET,
        layout=layout,
        length_warmup=warmup,
        length_warmup_min=MIN_CAP,
        length_warmup_schedule=SCHEDULE,
    )
    planner, plan, t_warm = _timed_plan(lengths, config, repeats)
    counts = np.bincount(plan.example_ids(), minlength=lengths.shape[0])
    assert (counts == 1).all(), "every example exactly once"
    trace, report = plan.length_warmup, warmup_report(planner, plan)
    assert trace is not None and report is not None
    real = step_figures(planner, plan)["real"].astype(np.float64)
    base_fig = step_figures(base_planner, base)
    w = trace.num_steps
    key = lengths.max(axis=1) if lengths.ndim == 2 else lengths
    caps = scheduled_caps(SCHEDULE, warmup, MIN_CAP, int(key.max()), first=0)
    return {
        "name": name,
        "layout": layout,
        "examples": int(lengths.shape[0]),
        "steps": plan.num_steps,
        "warmup": warmup,
        "tokens_ratio": float(real[:w].mean() / base_fig["real"].mean()),
        "min_step": float(real[:w].min() / (BUDGET * WORLD)),
        "min_step_none": float(np.sort(base_fig["real"])[1] / (BUDGET * WORLD)),
        "stages": [(r.label, r.padding_efficiency, r.examples_per_step) for r in report.rows],
        "base_padding": float(base_fig["real"].sum() / base_fig["slots"].sum()),
        "advanced": int(trace.advanced.size),
        "advanced_by": int(trace.advanced_by.max(initial=0)),
        "examples_in_warmup": float(step_figures(planner, plan)["examples"][:w].sum()),
        "time_ratio": t_warm / t_base,
        "t_base": t_base,
        "truncating": _truncating(key, base.num_steps, caps, layout == "packed"),
    }


def _print(rows: list[dict[str, Any]]) -> None:
    print(
        "| workload | steps (warm-up) | tokens/step warm-up / none | min step / budget "
        "(none) | tokens cut | advanced | plan time (ratio) |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['name']} {r['layout']}, {r['examples']:,} | {r['steps']:,} ({r['warmup']}) | "
            f"{r['tokens_ratio']:.4f} | {r['min_step']:.3f} ({r['min_step_none']:.3f}) | 0 | "
            f"{r['advanced']} (max +{r['advanced_by']}) | "
            f"{r['t_base']:.2f} s ({r['time_ratio']:.2f}x) |"
        )
    print(
        "\n| workload | padding per warm-up quarter → after | without schedule | "
        "examples/step per quarter → after |"
    )
    print("|---|---|---|---|")
    for r in rows:
        pads = " / ".join(f"{p:.4f}" for _, p, _ in r["stages"])
        ex = " / ".join(f"{e:,.0f}" for _, _, e in r["stages"])
        print(f"| {r['name']} {r['layout']} | {pads} | {r['base_padding']:.4f} | {ex} |")
    print("\n| workload | warm-up | tokens discarded | padding | examples seen | tokens/step |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        t = r["truncating"]
        seen = "n/a (rows)" if np.isnan(t["examples"]) else f"{t['examples']:,.0f}"
        print(
            f"| {r['name']} {r['layout']} | truncating | {100 * t['discarded']:.1f} % | "
            f"{t['padding']:.4f} | {seen} | {t['tokens_per_step']:,.0f} |"
        )
        warm = [p for label, p, _ in r["stages"] if label != "after"]
        print(
            f"| {r['name']} {r['layout']} | this planner | 0 % | {min(warm):.4f}-{max(warm):.4f} "
            f"| {r['examples_in_warmup']:,.0f} | {r['tokens_ratio']:.4f}x of none |"
        )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark and print Markdown tables."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="300k pairs and 100k documents")
    p.add_argument("--repeats", type=int, default=3)
    add_result_option(p, "length_warmup")
    args = p.parse_args(argv)
    bench = ["benchmarks.planning.length_warmup"]
    run = Run("length_warmup", settings=vars(args), package=MEASURED, bench=bench)
    wmt = wmt_like_lengths(300_000 if args.quick else 4_500_000)
    lm = lm_lengths(100_000 if args.quick else 1_000_000)
    rows = [
        run_case("wmt", wmt, "padded", args.repeats),
        run_case("lm", lm, "padded", args.repeats),
        run_case("lm", lm, "packed", args.repeats),
    ]
    _print(rows)
    discarded = [r["truncating"]["discarded"] for r in rows]
    summary = {"discarded_min": min(discarded), "discarded_max": max(discarded)}
    run.write({"rows": rows, **summary}, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
