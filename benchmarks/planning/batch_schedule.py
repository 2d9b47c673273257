"""What the batch-size schedule costs the planner, and what its steps hold (issue 32).

Under ``PlanConfig.batch_schedule`` the planner plans the epoch as without one, then plans the
examples of the steps before the schedule reaches 1 again, level by level, at each level's
fraction of every rank's budget (``docs/batch-schedule.md``). This benchmark times that against
the same planner without a schedule, in the same run, and prints each stage's steps and fill.

Run from the repository root::

    python -m benchmarks.planning.batch_schedule            # 4.5M WMT-like pairs, 8 ranks
    python -m benchmarks.planning.batch_schedule --quick    # 300k pairs
    python -m benchmarks.planning.batch_schedule --profile  # and cProfile the ramp's epoch 0

Configurations: ``none`` (no schedule), ``thresholds`` (``"0:0.25 2M:0.5 8M:1"``) and
``ramp`` (``"ramp:0.25:8M"``), all with ``max_tokens=16384`` on 8 ranks. Rows (median of
``--repeats``, seconds, the configurations measured in turn within each repeat):

* **first plan**: a new planner's ``plan(0, 8)``: lengths prepared, sorted and cut, the epoch
  planned, and under a schedule its first steps re-planned;
* **epoch 0, cached**: ``plan(0, 8)`` again (sort and cut cached): the schedule's own cost;
* **later epoch**: ``plan(1, 8)``, cached; the schedule has reached 1 in epoch 0, so the epoch
  plans as without one.

Ratios: each row against ``none``, computed per repeat (the configurations run seconds apart)
and shown as the median with its range over the repeats; the target is at most 1.5 for the
first plan and a later epoch. Per stage
(:func:`lightning_varbatch.planner.schedule_report.schedule_report` of epoch 0): steps,
micro-batch budget, tokens per step and fill (planned cost over scheduled budget).
A full run writes ``benchmarks/results/batch_schedule.json`` (``--quick`` writes nothing unless
``--result PATH``).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
from functools import partial
from typing import Any

from benchmarks.harness import machine_line, print_table, timed, uptime, write_json
from benchmarks.results import Run, add_result_option, result_path
from lightning_varbatch import EpochPlanner, PlanConfig
from lightning_varbatch.planner import schedule_report, wmt_like_lengths

WORLD, BUDGET, TARGET = 8, 16384, 1.5
SCHEDULES: dict[str, str | None] = {
    "none": None,
    "thresholds": "0:0.25 2M:0.5 8M:1",
    "ramp": "ramp:0.25:8M",
}
ROWS = {"first": "first plan", "cached": "epoch 0, cached", "later": "later epoch"}
"""The timed rows: result keys and what they are called."""
MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.schedule_report",
    "lightning_varbatch.planner.synthetic",
]
"""The package code the figures measure (with its imports; :mod:`benchmarks.results`)."""


def _config(schedule: str | None) -> PlanConfig:
    return PlanConfig(max_tokens=BUDGET, batch_schedule=schedule)


def measure(n: int, repeats: int) -> dict[str, Any]:
    """Seconds per configuration and row, ratios against ``none``, and epoch 0's stages."""
    lengths = wmt_like_lengths(n, seed=0)
    runs: dict[str, dict[str, list[float]]] = {c: {r: [] for r in ROWS} for c in SCHEDULES}
    planners: dict[str, EpochPlanner] = {}
    for _ in range(repeats):
        for name, schedule in SCHEDULES.items():
            first_s, planner = timed(partial(_first, lengths, schedule))
            runs[name]["first"].append(first_s)
            runs[name]["cached"].append(timed(partial(planner.plan, 0, WORLD))[0])
            runs[name]["later"].append(timed(partial(planner.plan, 1, WORLD))[0])
            planners[name] = planner
    seconds = {c: {r: statistics.median(v) for r, v in rows.items()} for c, rows in runs.items()}
    per_repeat = {
        c: {r: [a / b for a, b in zip(runs[c][r], runs["none"][r], strict=True)] for r in ROWS}
        for c in SCHEDULES
        if c != "none"
    }
    out: dict[str, Any] = {
        "examples": n,
        "world_size": WORLD,
        "max_tokens": BUDGET,
        "repeats": repeats,
        "target": TARGET,
        "epoch_tokens": planners["none"].epoch_tokens,
        "schedules": {c: text for c, text in SCHEDULES.items() if text},
        "seconds": seconds,
        "ratios": {
            c: {r: statistics.median(v) for r, v in rows.items()} for c, rows in per_repeat.items()
        },
        "ratio_range": {
            c: {r: {"min": min(v), "max": max(v)} for r, v in rows.items()}
            for c, rows in per_repeat.items()
        },
        "runs": runs,
        "steps": {c: p.plan(0, WORLD).num_steps for c, p in planners.items()},
        "stages": {},
    }
    for name, planner in planners.items():
        report = schedule_report(planner, planner.plan(0, WORLD))
        if report is not None:
            out["stages"][name] = report.to_dict()["stages"]
            print(f"\n{name}, epoch 0:\n{report.format()}")
    return out


def _first(lengths: Any, schedule: str | None) -> EpochPlanner:
    planner = EpochPlanner(lengths, _config(schedule))
    planner.plan(0, WORLD)
    return planner


def _profile(n: int) -> None:
    """cProfile of the ramp's epoch 0 on a planner whose sort and cut are cached."""
    planner = EpochPlanner(wmt_like_lengths(n, seed=0), _config(SCHEDULES["ramp"]))
    planner.plan(0, WORLD)
    profile = cProfile.Profile()
    profile.runcall(planner.plan, 0, WORLD)
    print("\ncProfile of the ramp's epoch 0, cached (top 20 by cumulative time):")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(20)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="300k pairs instead of 4.5M")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--profile", action="store_true", help="cProfile the ramp's epoch 0")
    p.add_argument("--json", default=None, help="write the figures here")
    add_result_option(p, "batch_schedule")
    args = p.parse_args(argv)
    run = Run(
        "batch_schedule",
        settings=vars(args),
        package=MEASURED,
        bench=["benchmarks.planning.batch_schedule"],
    )
    n = 300_000 if args.quick else 4_500_000
    print(f"{machine_line('numpy')}\nuptime: {uptime()}")
    got = measure(n, args.repeats)
    print(
        f"\n{n:,} WMT-like pairs ({got['epoch_tokens']:,} planning tokens an epoch), {WORLD} "
        f"ranks, max_tokens={BUDGET}, median of {args.repeats} (seconds; x: over none)"
    )
    rows = []
    for name in SCHEDULES:
        cells = [name, f"{got['steps'][name]:,}"]
        for row in ROWS:
            ratio = got["ratios"].get(name, {}).get(row)
            span = got["ratio_range"].get(name, {}).get(row, {})
            shown = "" if ratio is None else f" ({ratio:.2f}x, {span['min']:.2f}-{span['max']:.2f})"
            cells.append(f"{got['seconds'][name][row]:.3f}{shown}")
        rows.append(cells)
    print_table(["schedule", "steps, epoch 0", *ROWS.values()], rows)
    worst = max(got["ratios"][c][r] for c in got["ratios"] for r in ("first", "later"))
    verdict = "met" if worst <= TARGET else "MISSED"
    got["worst_ratio"], got["verdict"] = worst, verdict
    print(f"\nworst ratio (first plan, later epoch): {worst:.2f}x, target <= {TARGET}: {verdict}")
    print(f"uptime: {uptime()}")
    if args.profile:
        _profile(n)
    write_json(args.json, got)
    run.write(got, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
