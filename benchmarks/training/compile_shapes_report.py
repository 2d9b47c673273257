"""Shape-budget benchmark, Part 2's report: paired ratios, the training table, the K check.

How :mod:`benchmarks.training.compile_shapes` turns its arms' :class:`ArmResult` into the
printed table and the result file's ``training`` figures (its docstring describes the columns).
"""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import Any

import numpy as np

from benchmarks.harness import print_table
from benchmarks.training.compile_shapes_arms import ARM_NAMES, ArmResult

SAME_BATCHES = {"compiled_k": "eager_k", "dynamic_free": "eager_free"}
"""A compiled arm's eager counterpart on the same micro-batches."""


def paired_ratio(
    r: ArmResult, num: str, den: str, resamples: int = 2000, seed: int = 0
) -> list[float]:
    """``[ratio, low, high]``: real tokens/s of variant ``num`` over ``den`` in ``r``'s paired
    pass, with a 90 % bootstrap interval over its rounds (each round resampled as a whole)."""
    ns, nr = np.asarray(r.paired_s[num]), np.asarray(r.paired_real[num], dtype=np.float64)
    ds, dr = np.asarray(r.paired_s[den]), np.asarray(r.paired_real[den], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, ns.size, (resamples, ns.size))
    boot = (nr[idx].sum(1) / ns[idx].sum(1)) / (dr[idx].sum(1) / ds[idx].sum(1))
    point = (nr.sum() / ns.sum()) / (dr.sum() / ds.sum())
    return [float(point), float(np.quantile(boot, 0.05)), float(np.quantile(boot, 0.95))]


def interval(x: list[float] | None) -> str:
    """``1.05 [1.02, 1.08]``, or ``-``."""
    return "-" if x is None else f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]"


def report_training(results: dict[str, ArmResult]) -> dict[str, Any]:
    base = results["eager_free"].tps
    headers = [
        "arm",
        "steps",
        "shapes",
        "graphs",
        "compile steps",
        "compile s",
        "s/compile",
        "slots/real",
        "steady real tok/s",
        "x eager",
        "x eager free, paired [90 %]",
        "compiled / eager, same batches [90 %]",
        "all steps s",
    ]
    rows = []
    out: dict[str, Any] = {}
    for arm, r in results.items():
        steady = r.timed_steps > 0
        vs_free = paired_ratio(r, arm, "eager_free") if r.paired_steps else None
        same = SAME_BATCHES.get(arm)
        vs_same = paired_ratio(r, arm, same) if r.paired_steps and same else None
        rows.append(
            [
                ARM_NAMES[arm],
                str(r.steps),
                str(r.shapes),
                str(r.graphs),
                str(r.compile_steps),
                f"{r.compile_s:.1f}" if r.compile_steps else "-",
                f"{r.compile_s / r.compile_steps:.1f}" if r.compile_steps else "-",
                f"{r.slots / r.real:.3f}",
                f"{r.tps:,.0f}" if steady else "- (all compile)",
                f"{r.tps / base:.2f}" if steady else "-",
                interval(vs_free),
                interval(vs_same),
                f"{r.total_s:.1f}",
            ]
        )
        d = asdict(r)
        d["tps"] = r.tps if steady else None
        d["speedup_vs_eager"] = r.tps / base if steady else None
        d["paired_vs_eager_free"] = vs_free
        d["paired_vs_same_batches"] = vs_same
        d["step_median_s"] = statistics.median(r.step_s)
        d["compile_per_shape_s"] = r.compile_s / r.compile_steps if r.compile_steps else None
        out[arm] = d
    print_table(headers, rows)
    return out


def check_k_arm(results: dict[str, ArmResult]) -> bool:
    """The issue's count: compilations of the K-shape arm == its distinct shapes (asserted)."""
    r = results.get("compiled_k")
    if r is None:
        return True
    ok = r.graphs == r.shapes and r.graph_breaks == 0 and r.compile_steps == r.shapes
    print(
        f"  [{'PASS' if ok else 'FAIL'}] compiled, K shapes: {r.graphs} graphs compiled "
        f"(unique_graphs; frames ok {r.frames_ok}, graph breaks {r.graph_breaks}) for "
        f"{r.shapes} distinct shapes in {r.steps} steps, recompile_limit={r.recompile_limit}"
    )
    assert ok, f"compiled K-shape arm: {r.graphs} graphs for {r.shapes} shapes"
    return ok
