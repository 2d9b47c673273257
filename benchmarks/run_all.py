"""Run every CPU benchmark, one after the other, and draw the plots.

Run from the repository root (venv active)::

    python -m benchmarks                        # every CPU benchmark at its defaults
    python -m benchmarks --stale                # only those whose result file is stale
    python -m benchmarks --quick                # every smoke test (writes no result file)
    python -m benchmarks --only planning.epoch training.straggler

The benchmarks, by the question each answers (:data:`BENCHMARKS`): ``planning.*`` (plan time
and quality against the floor and the anchors), ``peers.*`` (the same training with every
peer's batching), ``training.*`` (throughput, warm-up, schedule, shares, packing, shapes, the
callbacks' cost, the translation example), ``sources.*`` (Hugging Face datasets, streams).
The GPU scripts (``benchmarks/gpu/``) run on a GPU machine through ``benchmarks/gpu/session.sh``.

Each benchmark runs as ``python -m benchmarks.<folder>.<name> [--quick]`` in its own process;
its output is shown live and saved to ``<out>/<name>.txt`` (default ``--out benchmarks/runs``,
not committed), its raw numbers to ``<out>/<name>.json`` where it takes ``--json``. A full (not
``--quick``) run writes its committed result file ``benchmarks/results/<result>.json``
(:mod:`benchmarks.results`); ``python -m benchmarks.render`` then renders the documents'
figures from it. ``--stale`` reruns exactly the benchmarks whose result is stale (a module it
measured changed), each with the arguments its result file recorded. Afterwards
:mod:`benchmarks.plots` draws the PNGs from the JSON files (``--no-plots`` skips them).
``uptime`` is printed before and after each benchmark: the machine's load is part of the result.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from benchmarks.harness import ROOT, uptime

BENCHMARKS: dict[str, tuple[str, ...]] = {
    "planning.epoch": ("planning",),
    "planning.pair_plan": ("pair_plan",),
    "planning.pair_shapes": ("pair_shapes",),
    "planning.length_warmup": ("length_warmup",),
    "planning.remainder_guard": ("remainder_guard",),
    "planning.batch_schedule": ("batch_schedule",),
    "peers.seeds": ("peer_seeds",),
    "peers.training": ("training_peers", "training_peers_ours"),
    "training.throughput": ("training_throughput",),
    "training.straggler": ("straggler",),
    "training.callback_overhead": ("callback_overhead",),
    "training.packing": ("packing",),
    "training.batch_schedule": ("batch_schedule_training",),
    "training.compile_shapes": ("compile_shapes",),
    "training.rank_shares": ("rank_shares",),
    "training.length_warmup": (),
    "training.translation_example": ("translation_example",),
    "sources.hf_datasets": ("hf_datasets",),
    "sources.streaming": ("streaming",),
}
"""Every CPU benchmark (``benchmarks.<key>``) and the result files its full run writes."""


def _takes_json(module: str) -> bool:
    path = os.path.join(ROOT, "benchmarks", *module.split(".")) + ".py"
    with open(path) as f:
        return '"--json"' in f.read()


def stale_commands() -> list[tuple[str, list[str]]]:
    """``(module, extra arguments)`` for each stale result, as its file recorded them."""
    from benchmarks.results import load_result, stale_results

    runs = []
    for name in stale_results():
        module = next((m for m, names in BENCHMARKS.items() if name in names), None)
        if module is None:
            raise SystemExit(f"no benchmark in BENCHMARKS writes the result {name!r}")
        recorded = str(load_result(name)["provenance"].get("command", "")).split()
        extra = recorded[3:] if recorded[:2] == ["python", "-m"] else []
        if "--json" in extra:  # the recorded run's own output path (gone on another machine):
            at = extra.index("--json")  # run_one writes into --out instead
            del extra[at : at + 2]
        runs.append((module, extra))
    return runs


def run_one(module: str, quick: bool, out_dir: str, root: str, extra: Sequence[str] = ()) -> int:
    """Run ``benchmarks.<module>`` in its own process, its output shown and logged."""
    cmd = [sys.executable, "-m", f"benchmarks.{module}", *extra]
    name = module.replace(".", "_")
    if quick:
        cmd.append("--quick")
    if _takes_json(module) and "--json" not in extra:
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
    p.add_argument("--only", nargs="+", choices=sorted(BENCHMARKS), default=None)
    p.add_argument("--stale", action="store_true", help="rerun the stale results only")
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
    runs = stale_commands() if args.stale else [(m, []) for m in args.only or BENCHMARKS]
    for module, extra in runs:
        if run_one(module, args.quick, out_dir, root, extra) != 0:
            failed.append(module)
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
