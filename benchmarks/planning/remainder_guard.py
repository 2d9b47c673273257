"""What the remainder guard costs: resuming an epoch with and without the one check.

Every resume or re-plan of a partly consumed epoch passes
:func:`lightning_varbatch.planner.remainder_guard.guard_remainder` (issue 31): it recounts the
epoch's examples (consumed part and remainder) and recomputes every remaining micro-batch's cost
from the lengths before anything is yielded. This benchmark times it against what a resume
does anyway, on the same plans.

Run from the repository root::

    python -m benchmarks.planning.remainder_guard            # 4.5M WMT-like pairs, 8 ranks
    python -m benchmarks.planning.remainder_guard --quick    # 300k pairs

Rows (median of ``--repeats``, seconds):

* **fresh plan**: ``plan(epoch, 8)`` of a planner whose sort and cut are cached (a later epoch);
* **elastic re-plan**: ``plan_resumed`` of the rest of the epoch after 8 ranks ran half of it,
  on 6 ranks (the history's plan, the exclude mask, the remainder's plan; the guard inside);
* **guard, elastic**: the guard alone on that remainder;
* **guard, same topology**: the guard on a fresh plan resumed at its half (what a sampler's
  ``load_state_dict`` runs), with per-rank budgets (``rank_shares``) as a second case;
* **ledger at a checkpoint**: ``consumed_ledger`` at the half (what every ``state_dict`` adds).

The rows are measured in turn within each repeat (interleaved), so a ratio is computed per
repeat, between rows timed seconds apart; the tables show its median and its range over the
repeats: the guard over the re-plan it guards, the same-topology guard and the ledger over a
fresh plan. A full run writes ``benchmarks/results/remainder_guard.json`` (``--quick`` writes
nothing unless ``--result PATH``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import uptime, write_json
from benchmarks.results import Run, add_result_option, result_path
from lightning_varbatch import EpochPlanner, PlanConfig
from lightning_varbatch.planner import rank_budgets, wmt_like_lengths
from lightning_varbatch.planner.remainder_guard import consumed_ledger, guard_remainder

WORLD, RESUMED_WORLD, BUDGET = 8, 6, 16384
ROWS = {
    "fresh": "fresh plan",
    "replan": "elastic re-plan",
    "guard_elastic": "guard, elastic",
    "guard_same": "guard, same topology",
    "guard_shares": "guard, same topology, shares",
    "ledger": "ledger at a checkpoint",
}
"""The timed rows: result keys and what they are called."""
RATIOS = {
    "guard_over_replan": ("guard_elastic", "replan"),
    "guard_over_fresh": ("guard_same", "fresh"),
    "shares_over_fresh": ("guard_shares", "fresh"),
    "ledger_over_fresh": ("ledger", "fresh"),
}
"""Each ratio's numerator and denominator rows, computed per repeat."""
MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.remainder_guard",
    "lightning_varbatch.planner.rank_shares",
    "lightning_varbatch.planner.synthetic",
]
"""The package code the figures measure (with its imports; :mod:`benchmarks.results`)."""


def _seconds(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(n: int, repeats: int) -> dict[str, Any]:
    """Every row's seconds per repeat (rows in turn within a repeat), medians and ratios."""
    lengths = wmt_like_lengths(n, seed=0)
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=BUDGET))
    planner.plan(0, WORLD)  # sort and cut cached, as from a run's second epoch on
    fresh = planner.plan(1, WORLD)
    half = fresh.num_micro_batches_per_rank // 2
    history = [(WORLD, 1, half)]

    def replan() -> Any:
        planner._last = None  # plan_resumed caches its last plan: time a real re-plan
        return planner.plan_resumed(1, RESUMED_WORLD, 1, history)

    rest = replan()
    shares = rank_budgets(BUDGET, WORLD, [1.0, 0.8] * (WORLD // 2))
    lanes = planner.plan(1, WORLD, rank_budgets=shares)
    lanes_half = lanes.num_micro_batches_per_rank // 2
    work: dict[str, Callable[[], Any]] = {
        "fresh": lambda: planner.plan(1, WORLD),
        "replan": replan,
        "guard_elastic": lambda: guard_remainder(planner, rest),
        "guard_same": lambda: guard_remainder(planner, fresh, half),
        "guard_shares": lambda: guard_remainder(planner, lanes, lanes_half),
        "ledger": lambda: consumed_ledger(fresh, half),
    }
    runs: dict[str, list[float]] = {row: [] for row in ROWS}
    for _ in range(repeats):
        for row in ROWS:
            runs[row].append(_seconds(work[row]))
    per_repeat = {
        name: [a / b for a, b in zip(runs[top], runs[bottom], strict=True)]
        for name, (top, bottom) in RATIOS.items()
    }
    return {
        "examples": n,
        "world_size": WORLD,
        "resumed_world_size": RESUMED_WORLD,
        "max_tokens": BUDGET,
        "repeats": repeats,
        "micro_batches_per_rank": fresh.num_micro_batches_per_rank,
        "consumed_per_rank": half,
        "seconds": {row: _spread(v) for row, v in runs.items()},
        "runs": runs,
        "ratios": {name: _spread(v) for name, v in per_repeat.items()},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="300k pairs instead of 4.5M")
    p.add_argument("--repeats", type=int, default=9)
    p.add_argument("--json", default=None, help="write the medians here (flat)")
    add_result_option(p, "remainder_guard")
    args = p.parse_args(argv)
    run = Run(
        "remainder_guard",
        settings=vars(args),
        package=MEASURED,
        bench=["benchmarks.planning.remainder_guard"],
    )
    n = 300_000 if args.quick else 4_500_000
    print(f"uptime: {uptime()}")
    got = measure(n, args.repeats)
    print(f"\n{n:,} WMT-like pairs, {WORLD} ranks, max_tokens={BUDGET}, median of {args.repeats}")
    print(f"{'':34s} {'seconds':>9s} {'min':>9s} {'max':>9s}")
    for row, s in got["seconds"].items():
        print(f"{ROWS[row]:34s} {s['median']:9.3f} {s['min']:9.3f} {s['max']:9.3f}")
    print()
    for name, r in got["ratios"].items():
        print(f"{name:34s} {r['median']:9.3f} {r['min']:9.3f} {r['max']:9.3f}")
    print(f"uptime: {uptime()}")
    flat = {"examples": float(n), **{ROWS[r]: s["median"] for r, s in got["seconds"].items()}}
    write_json(args.json, flat)
    run.write(got, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
