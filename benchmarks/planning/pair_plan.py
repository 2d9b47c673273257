"""Pairs planned for the padding the collate makes (issue 33): ``pair_order`` by budget.

Run from the repository root::

    python -m benchmarks.planning.pair_plan            # about 1-2 min on 2 CPU cores
    python -m benchmarks.planning.pair_plan --quick    # smoke test, a few seconds

The padding collate pads each side of a pair to its own longest, so a micro-batch of ``n``
pairs allocates ``n * (longest source + longest target)`` slots. Every figure below is
recounted from the plan's ids and the raw lengths by :mod:`benchmarks.planning.pair_reference`
(written from the definitions, not from the planner).

* **(a) padding by budget**: 20,000 WMT-like pairs (:func:`~lightning_varbatch.planner.
  wmt_like_lengths`, data seeds 0-2), 2 ranks, budgets 256-16,384: the fraction of padding in
  both tensors for the max order (the planner with ``pair_order="max"``: pairs by
  ``max(source, target)``, fairseq's rule), the key in narrow geometric buckets (2 %, 5 %,
  10 %) then ``source - target`` (a reference, cut greedily under the same budget on each
  side), and ours (``pair_order="two_sided"``, the default); micro-batches per epoch.
* **(b) the exact optimum**: inputs of 10 pairs (random draws, and draws from a narrow band
  of planning lengths where the order within a length matters), budget 2-4 times the longest:
  our padded slots and the max order's over the least slots of any partition into as many
  micro-batches within the budget (:func:`~benchmarks.planning.pair_reference.optimum`).
* **(c) planning time**: 4.5M WMT-like pairs, 8 ranks, ``max_tokens=16384``: the first plan
  (sort, cut, deal) and a later epoch's, median of 3, both orders.
* **(d) the translation example**: its embedded corpus under its default settings
  (``conf/``), planned for 2 ranks in both orders: padding efficiency of both tensors.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import print_table
from benchmarks.planning.pair_reference import bucket_order, greedy_cut, optimum, padded_slots
from benchmarks.results import Run, add_result_option, result_path
from lightning_varbatch import EpochPlan, EpochPlanner, PlanConfig
from lightning_varbatch.planner import wmt_like_lengths

MEASURED = ["lightning_varbatch.planner.epoch_planner", "lightning_varbatch.planner.synthetic"]
"""The package code the figures measure (with its imports; :mod:`benchmarks.results`); (d)
also builds the translation example's data module, listed under ``EXAMPLE``."""
EXAMPLE = ["examples.translation.datamodule"]
BUDGETS = (256, 512, 1024, 2048, 4096, 8192, 16384)
WIDTHS = (0.02, 0.05, 0.1)


def batches_of(plan: EpochPlan) -> list[np.ndarray]:
    """The plan's micro-batches as ids."""
    starts, sizes = plan.micro_batch_start, plan.micro_batch_size
    return [plan.order[s : s + n] for s, n in zip(starts, sizes, strict=True)]


def padding(batches: list[np.ndarray], pairs: np.ndarray) -> float:
    """Fraction of padding in both padded tensors."""
    return 1 - sum(int(pairs[b].sum()) for b in batches) / padded_slots(batches, pairs)


def by_budget(pairs: np.ndarray, budgets: tuple[int, ...]) -> list[dict[str, Any]]:
    """(a) for one data set: every order's padding and micro-batches at every budget."""
    rows = []
    for budget in budgets:
        row: dict[str, Any] = {"budget": budget}
        for order in ("max", "two_sided"):
            plan = EpochPlanner(pairs, PlanConfig(budget, pair_order=order)).plan(0, 2)
            row[order] = padding(batches_of(plan), pairs)
            row[f"{order}_mbs"] = len(plan.micro_batch_size)
        for w in WIDTHS:
            cut = greedy_cut(bucket_order(pairs, w), pairs, budget)
            row[f"b{w}"], row[f"b{w}_mbs"] = padding(cut, pairs), len(cut)
        row["better_ref"] = min(row["max"], *(row[f"b{w}"] for w in WIDTHS))
        rows.append(row)
    return rows


def to_optimum(trials: int, n: int, band: tuple[int, int] | None) -> dict[str, float]:
    """(b): slots over the optimum, ours and the max order's, on ``trials`` inputs of ``n``."""
    pool = wmt_like_lengths(100_000, seed=3).astype(np.int64)
    if band is not None:
        key = pool.max(axis=1)
        pool = pool[(key >= band[0]) & (key <= band[1])]
    rng = np.random.default_rng(0)
    ratios: dict[str, list[float]] = {"two_sided": [], "max": []}
    for trial in range(trials):
        pairs = pool[rng.choice(len(pool), n, replace=False)]
        budget = int(pairs.max() * rng.integers(2, 5))
        plans = {
            o: EpochPlanner(pairs, PlanConfig(budget, pair_order=o, seed=trial)).plan(0)
            for o in ratios
        }
        best = optimum(pairs, budget, len(plans["two_sided"].micro_batch_size))
        for o, plan in plans.items():
            ratios[o].append(padded_slots(batches_of(plan), pairs) / best)
    return {
        **{f"{o}_mean": float(np.mean(r)) for o, r in ratios.items()},
        **{f"{o}_max": float(np.max(r)) for o, r in ratios.items()},
        "ours_optimal": float(np.mean(np.array(ratios["two_sided"]) == 1.0)),
    }


def planning_time(n: int, repeats: int) -> dict[str, float]:
    """(c): seconds of the first plan and of a later epoch's, per order."""
    pairs = wmt_like_lengths(n, seed=0)
    out = {}
    for order in ("max", "two_sided"):
        first, later = [], []
        for _ in range(repeats):
            planner = EpochPlanner(pairs, PlanConfig(16384, pair_order=order))
            t0 = time.perf_counter()
            planner.plan(0, world_size=8)
            t1 = time.perf_counter()
            planner.plan(1, world_size=8)
            first.append(t1 - t0)
            later.append(time.perf_counter() - t1)
        out[f"{order}_first"] = statistics.median(first)
        out[f"{order}_later"] = statistics.median(later)
    return out


def example_padding() -> dict[str, float]:
    """(d): the translation example's train split, its default settings, both orders."""
    from hydra import compose, initialize_config_dir

    from examples.translation.datamodule import build_datamodule
    from examples.translation.train import CONF_DIR

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config")
    with tempfile.TemporaryDirectory() as tmp:
        dm = build_datamodule(cfg, Path(tmp))[0]
    planner = dm.planner("train")
    sides = planner.prepared.sides
    assert sides is not None
    pairs = sides.T
    out = {}
    for order in ("max", "two_sided"):
        config = PlanConfig(**{**vars(planner.config), "pair_order": order})
        plan = EpochPlanner(pairs, config).plan(0, world_size=2)
        out[order] = 1 - padding(batches_of(plan), pairs)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="smoke test: small sizes")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "pair_plan")
    args = p.parse_args(argv)
    quick = args.quick
    package = MEASURED if quick else MEASURED + EXAMPLE
    run = Run(
        "pair_plan", settings=vars(args), package=package, bench=["benchmarks.planning.pair_plan"]
    )
    seeds = (0,) if quick else (0, 1, 2)
    budgets = (512, 4096) if quick else BUDGETS
    n = 2_000 if quick else 20_000
    runs = {s: by_budget(wmt_like_lengths(n, seed=s).astype(np.int64), budgets) for s in seeds}
    print(f"\n(a) padding of both tensors: {n:,} WMT-like pairs, 2 ranks, data seeds {seeds}")
    rows: list[list[str]] = []
    table: list[dict[str, Any]] = []
    out: dict[str, Any] = {"by_budget": runs, "table": table, "n": n, "seeds": list(seeds)}
    for i, budget in enumerate(budgets):
        per = [runs[s][i] for s in seeds]

        def med(key: str, per: list[dict[str, Any]] = per) -> float:
            return statistics.median(r[key] for r in per)

        wins = all(r["two_sided"] <= r["better_ref"] for r in per)
        table.append(
            {
                "budget": budget,
                **{k: med(k) for k in ("max", "two_sided", "better_ref")},
                **{f"b{w}": med(f"b{w}") for w in WIDTHS},
                "ratio": med("two_sided") / med("better_ref"),
                "wins_every_seed": wins,
                "mbs": {k: med(f"{k}_mbs") for k in ("two_sided", "max", "b0.05")},
            }
        )
        rows.append(
            [
                f"{budget:,}",
                f"{med('max'):.4f}",
                *(f"{med(f'b{w}'):.4f}" for w in WIDTHS),
                f"{med('two_sided'):.4f}",
                f"{med('two_sided') / med('better_ref'):.2f}",
                "yes" if wins else "NO",
                f"{med('two_sided_mbs'):.0f} / {med('max_mbs'):.0f} / {med('b0.05_mbs'):.0f}",
            ]
        )
    print_table(
        [
            "budget",
            "max order",
            *(f"buckets {w:.0%}" for w in WIDTHS),
            "ours",
            "ours / better",
            "<= every seed",
            "micro-batches ours/max/5%",
        ],
        rows,
    )
    trials = 5 if quick else 60
    bands: dict[str, tuple[int, int] | None] = {"random": None, "lengths 20-22": (20, 22)}
    opt = {name: to_optimum(trials, 8 if quick else 10, band) for name, band in bands.items()}
    out["optimum"] = opt
    print(f"\n(b) padded slots / the exact optimum, {trials} inputs of {8 if quick else 10} pairs")
    print_table(
        ["inputs", "ours mean", "ours max", "max order mean", "max order max", "ours optimal"],
        [
            [
                name,
                f"{o['two_sided_mean']:.3f}",
                f"{o['two_sided_max']:.3f}",
                f"{o['max_mean']:.3f}",
                f"{o['max_max']:.3f}",
                f"{o['ours_optimal']:.0%}",
            ]
            for name, o in opt.items()
        ],
    )
    size = 200_000 if quick else 4_500_000
    timing = planning_time(size, 1 if quick else 3)
    out["planning_s"] = timing
    print(f"\n(c) planning {size:,} WMT-like pairs, 8 ranks, max_tokens 16384 (s, median)")
    print_table(
        ["order", "first plan", "later epoch"],
        [
            [o, f"{timing[f'{o}_first']:.3f}", f"{timing[f'{o}_later']:.3f}"]
            for o in ("max", "two_sided")
        ],
    )
    if not quick:
        eff = example_padding()
        out["example_padding_efficiency"] = eff
        print(
            "\n(d) the translation example (default settings, 2 ranks): padding efficiency of "
            f"both tensors {eff['max']:.3f} (max order) -> {eff['two_sided']:.3f} (two-sided)"
        )
    out["wins"] = sum(r["wins_every_seed"] for r in table)
    out["budgets"] = len(table)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=float))
    run.write(json.loads(json.dumps(out, default=float)), result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
