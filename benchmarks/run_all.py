"""Run every CPU benchmark, one after the other, and draw the plots.

Run from the repository root (venv active)::

    python -m benchmarks                        # all CPU benchmarks, defaults (~30 min on 2
                                                # shared cores: planning 7, training 2,
                                                # straggler 3, callback_overhead 18)
    python -m benchmarks --quick                # every smoke test (~2.5 min; callback 2)
    python -m benchmarks --only planning training_throughput straggler   # issue 6's (~12 min)
    python -m benchmarks --only hf_datasets     # issue 14's (~15 min busy; quick ~1 min)
    python -m benchmarks --only packing         # issue 16 (~4-5 min; quick ~25 s)
    python -m benchmarks --only streaming       # issue 15 (~6 min busy; quick ~50 s)
    python -m benchmarks --only compile_shapes  # issue 17 (~8 min, inductor; quick ~20 s)
    python -m benchmarks --only training_peers  # issue 25 (~7 min quiet; peers: the bench extra)
    python -m benchmarks --only length_warmup   # issue 24's planner figures
    python -m benchmarks --only remainder_guard # issue 31: what the resume check costs
    python -m benchmarks --only batch_schedule  # issue 32: the schedule's plan time (~1 min)
    python -m benchmarks --only batch_schedule_training  # issue 32 (~10 min busy; quick ~10 s)

Each benchmark runs as ``python -m benchmarks.<name> [--quick] --json <out>/<name>.json`` in its
own process; its output is shown live and saved to ``<out>/<name>.txt`` (default
``--out benchmarks/runs``, not committed). A full (not ``--quick``) run of a benchmark that
writes a result file (:mod:`benchmarks.results`) also replaces its committed
``benchmarks/results/<name>.json``; ``python -m benchmarks.render`` then renders the documents'
figures from it. Every benchmark prints its own table with ratios
against baselines measured in the same run. Afterwards :mod:`benchmarks.plots` draws the PNGs
from the JSON files (``--plots-dir``, default ``benchmarks/``, or the ``--out`` folder with
``--quick`` so that smoke tests never overwrite the committed plots; ``--no-plots`` skips them).
``uptime`` is printed before and after each benchmark: the machine's load is part of the result.
The GPU benchmark (:mod:`benchmarks.gpu.throughput`) is not run here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks.harness import ROOT, uptime

BENCHMARKS = (
    "planning",
    "training_throughput",
    "straggler",
    "callback_overhead",
    "hf_datasets",
    "packing",
    "streaming",
    "compile_shapes",
    "training_peers",
    "length_warmup",
    "remainder_guard",
    "batch_schedule",
    "batch_schedule_training",
)
WITH_JSON = (
    "planning",
    "training_throughput",
    "straggler",
    "hf_datasets",
    "packing",
    "streaming",
    "compile_shapes",
    "training_peers",
    "remainder_guard",
    "batch_schedule",
    "batch_schedule_training",
)


def run_one(name: str, quick: bool, out_dir: str, root: str) -> int:
    cmd = [sys.executable, "-m", f"benchmarks.{name}"]
    if quick:
        cmd.append("--quick")
    if name in WITH_JSON:
        cmd += ["--json", os.path.join(out_dir, f"{name}.json")]
    log_path = os.path.join(out_dir, f"{name}.txt")
    print(f"\n===== {' '.join(cmd[1:])}\nuptime before: {uptime()}", flush=True)
    t0 = time.perf_counter()
    with open(log_path, "w") as log:
        log.write(f"$ python {' '.join(cmd[1:])}\nuptime before: {uptime()}\n")
        proc = subprocess.Popen(
            cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            log.write(line)
        rc = proc.wait()
        after = uptime()
        log.write(f"uptime after: {after}\nexit code {rc}, {time.perf_counter() - t0:.0f} s\n")
    print(f"uptime after: {after}\n===== {name}: exit code {rc}, {time.perf_counter() - t0:.0f} s")
    return rc


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Run all CPU benchmarks (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="each benchmark's --quick smoke test")
    p.add_argument("--only", nargs="+", choices=BENCHMARKS, default=None)
    p.add_argument("--out", default=os.path.join("benchmarks", "runs"))
    p.add_argument(
        "--plots-dir",
        default=None,
        help="where the PNGs go (default: benchmarks/, or --out with --quick)",
    )
    p.add_argument("--no-plots", action="store_true")
    args = p.parse_args(argv)
    root = ROOT
    out_dir = os.path.join(root, args.out) if not os.path.isabs(args.out) else args.out
    os.makedirs(out_dir, exist_ok=True)
    failed = []
    for name in args.only or BENCHMARKS:
        if run_one(name, args.quick, out_dir, root) != 0:
            failed.append(name)
    if not args.no_plots:
        from benchmarks.plots import draw_all

        plots_dir = args.plots_dir or (out_dir if args.quick else os.path.join(root, "benchmarks"))
        plots_dir = plots_dir if os.path.isabs(plots_dir) else os.path.join(root, plots_dir)
        for path in draw_all(out_dir, plots_dir):
            print(f"plot: {os.path.relpath(path, root)} ({os.path.getsize(path) // 1024} KB)")
    if failed:
        print(f"failed: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
