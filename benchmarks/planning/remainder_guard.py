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

Ratios: the guard over the re-plan it guards, and over a fresh plan.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

from benchmarks.harness import uptime
from lightning_varbatch import EpochPlanner, PlanConfig
from lightning_varbatch.planner import rank_budgets, wmt_like_lengths
from lightning_varbatch.planner.remainder_guard import consumed_ledger, guard_remainder

WORLD, BUDGET = 8, 16384


def _time(fn: Callable[[], Any], repeats: int) -> float:
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def measure(n: int, repeats: int) -> dict[str, float]:
    lengths = wmt_like_lengths(n, seed=0)
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=BUDGET))
    planner.plan(0, WORLD)  # sort and cut cached, as from a run's second epoch on
    fresh = planner.plan(1, WORLD)
    half = fresh.num_micro_batches_per_rank // 2
    history = [(WORLD, 1, half)]

    def replan() -> Any:
        planner._last = None  # plan_resumed caches its last plan: time a real re-plan
        return planner.plan_resumed(1, 6, 1, history)

    rest = replan()
    shares = rank_budgets(BUDGET, WORLD, [1.0, 0.8] * (WORLD // 2))
    lanes = planner.plan(1, WORLD, rank_budgets=shares)
    out = {
        "examples": float(n),
        "fresh plan": _time(lambda: planner.plan(1, WORLD), repeats),
        "elastic re-plan": _time(replan, repeats),
        "guard, elastic": _time(lambda: guard_remainder(planner, rest), repeats),
        "guard, same topology": _time(lambda: guard_remainder(planner, fresh, half), repeats),
        "guard, same topology, shares": _time(
            lambda: guard_remainder(planner, lanes, lanes.num_micro_batches_per_rank // 2),
            repeats,
        ),
        "ledger at a checkpoint": _time(lambda: consumed_ledger(fresh, half), repeats),
    }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="300k pairs instead of 4.5M")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", default=None, help="write the figures here")
    args = p.parse_args(argv)
    n = 300_000 if args.quick else 4_500_000
    print(f"uptime: {uptime()}")
    got = measure(n, args.repeats)
    print(f"\n{n:,} WMT-like pairs, {WORLD} ranks, max_tokens={BUDGET}, median of {args.repeats}")
    print(f"{'':34s} {'seconds':>9s}")
    for name, value in got.items():
        if name != "examples":
            print(f"{name:34s} {value:9.3f}")
    guard = got["guard, elastic"]
    print(
        f"\nguard / elastic re-plan: {guard / got['elastic re-plan']:.2f}"
        f"   guard (same topology) / fresh plan: "
        f"{got['guard, same topology'] / got['fresh plan']:.2f}"
    )
    print(f"uptime: {uptime()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(got, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
