"""Shape-budget benchmark, Part 1: the padding cost of K static shapes (planning only).

The settings, the plans and the table of Part 1 of :mod:`benchmarks.training.compile_shapes`
(which runs it and writes the result file; its docstring describes the columns); no model runs
here.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from benchmarks.harness import print_table

# -- Part 1 settings
PAIRS = 1_000_000
PLAN_BUDGET = 16384
WORLD = 8
KS = (4, 8, 16, 32, 48, 64)
TARGET_GAP = 0.02
TARGET_K = 8


@dataclass
class PadRow:
    k: int | None  # None: free shapes
    share: float
    gap: float
    bound: float
    shapes: int
    steps: int
    plan_s: float
    lengths: list[int] = field(default_factory=list)


def run_padding(num_pairs: int, seed: int, ks: Sequence[int]) -> list[PadRow]:
    """The unrestricted plan, then one plan per K; every figure of the table."""
    from lightning_varbatch import EpochPlanner, PlanConfig
    from lightning_varbatch.planner import diagnose, wmt_like_lengths

    pairs = wmt_like_lengths(num_pairs, seed=seed)
    key = pairs.max(axis=1).astype(np.int64)
    rows: list[PadRow] = []
    for k in (None, *ks):
        t0 = time.perf_counter()
        planner = EpochPlanner(pairs, PlanConfig(max_tokens=PLAN_BUDGET, max_shapes=k, seed=seed))
        plan = planner.plan(0, WORLD, 1)
        plan_s = time.perf_counter() - t0
        diag = diagnose(planner, plan)
        chosen = planner.shape_lengths
        if chosen is None:
            bound = 1.0
        else:
            padded = chosen[np.searchsorted(chosen, key)]
            bound = float(key.sum() / padded.sum())
        share = diag.padding_efficiency
        base = rows[0].share if rows else share
        rows.append(
            PadRow(
                k=k,
                share=share,
                gap=1 - share / base,
                bound=bound,
                shapes=diag.num_shapes,
                steps=diag.num_steps,
                plan_s=plan_s,
                lengths=[] if chosen is None else chosen.tolist(),
            )
        )
    return rows


def report_padding(rows: Sequence[PadRow], smoke: bool) -> dict[str, Any]:
    headers = ["shapes allowed", "real share", "gap", "bound", "shapes", "steps", "plan s"]
    table = [
        [
            "unrestricted" if r.k is None else f"max_shapes={r.k}",
            f"{r.share:.4f}",
            f"{100 * r.gap:.2f} %",
            "-" if r.k is None else f"{r.bound:.4f}",
            str(r.shapes),
            f"{r.steps:,}",
            f"{r.plan_s:.2f}",
        ]
        for r in rows
    ]
    print_table(headers, table)
    for r in rows:
        if r.k is not None and r.k <= 16:
            print(f"  K={r.k} lengths: {r.lengths}")
    meet = [r.k for r in rows if r.k is not None and r.gap <= TARGET_GAP]
    at_target = next((r for r in rows if r.k == TARGET_K), None)
    verdict = "smoke test, not judged" if smoke else ""
    if at_target is not None:
        ok = at_target.gap <= TARGET_GAP
        print(
            f"  [{verdict or ('PASS' if ok else 'FAIL')}] K={TARGET_K} within "
            f"{100 * TARGET_GAP:.0f} % of the unrestricted share: gap "
            f"{100 * at_target.gap:.2f} % (share {at_target.share:.4f}; no {TARGET_K} padded "
            f"lengths do better than {at_target.bound:.4f})"
        )
    print(
        f"  smallest K within {100 * TARGET_GAP:.0f} %: "
        + (str(min(meet)) if meet else f"none of {[r.k for r in rows if r.k is not None]}")
    )
    return {"rows": [asdict(r) for r in rows], "smallest_k_within_target": min(meet, default=None)}
