"""Ranks of different speed, modelled (issue 26): the planner alone, no processes.

Run from the repository root (also a section of :mod:`benchmarks.training.rank_shares`)::

    python -m benchmarks.training.rank_shares_model            # about 1 s
    python -m benchmarks.training.rank_shares_model --quick

Four ranks with speeds ``1, 1, 0.5, 0.5`` (two fast, two slow) and WMT-like (source, target)
lengths (:func:`lightning_varbatch.planner.wmt_like_lengths`). One epoch is planned twice with
the library's :class:`~lightning_varbatch.planner.EpochPlanner`: with equal shares, and with
shares equal to the speeds (per-rank budgets from
:func:`lightning_varbatch.planner.rank_shares.rank_budgets`). A rank runs a step in (its
planned work in the step) / (its speed); the modelled step time is the maximum over the ranks,
the modelled epoch time the sum over steps.
Reported: the modelled epoch time and its ratio to equal shares (the ideal is
``sum(speeds) / (world * min(speeds))`` = 1.5 here), each rank's share of the epoch's work
against its target (``speed / sum(speeds)``), and the micro-batches per rank (equal on every
rank by construction; the count of empty ones is shown too).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness import command_line, fmt, machine_line, print_table, write_json
from lightning_varbatch import EpochPlanner, PlanConfig
from lightning_varbatch.planner import rank_budgets, wmt_like_lengths

SPEEDS = (1.0, 1.0, 0.5, 0.5)


def model_arm(
    planner: EpochPlanner, speeds: Sequence[float], shares: Sequence[float] | None
) -> dict[str, Any]:
    """One planned epoch under ``shares`` (``None``: equal), timed by the speed model."""
    world = len(speeds)
    # no floor needed: the smallest budget (max_tokens / 2) is far above one example's cost
    budgets = rank_budgets(planner.config.max_tokens, world, shares)
    plan = planner.plan(0, world, 1, rank_budgets=budgets)
    load = plan.micro_batch_load[plan.assign].sum(axis=2).astype(np.float64)  # (steps, world)
    step_time = (load / np.asarray(speeds)[None, :]).max(axis=1)
    work = load.sum(axis=0)
    share = work / work.sum()
    target = np.asarray(speeds if shares is not None else [1.0] * world, dtype=np.float64)
    target = target / target.sum()
    empty = (plan.micro_batch_size[plan.assign] == 0).sum(axis=(0, 2))
    over = plan.micro_batch_cost[plan.assign] > np.asarray(budgets)[None, :, None]
    return {
        "shares": None if shares is None else [float(x) for x in shares],
        "budgets": list(budgets),
        "steps": plan.num_steps,
        "micro_batches_per_rank": [plan.num_micro_batches_per_rank] * world,
        "empty_micro_batches": [int(x) for x in empty],
        "over_budget": int(over.sum()),
        "examples_once": bool(
            np.array_equal(np.sort(plan.example_ids()), np.arange(planner.num_examples))
        ),
        "epoch_time": float(step_time.sum()),
        "work_share": [float(x) for x in share],
        "target_share": [float(x) for x in target],
        "max_share_dev": float(np.abs(share - target).max()),
        "max_share_rel_dev": float((np.abs(share - target) / target).max()),
    }


def model_section(examples: int, max_tokens: int, seed: int = 0) -> dict[str, Any]:
    """Plan with equal shares and with shares = :data:`SPEEDS`; print the table; the figures."""
    lengths = wmt_like_lengths(examples, seed=seed)
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, seed=seed))
    arms = {"equal": model_arm(planner, SPEEDS, None), "speeds": model_arm(planner, SPEEDS, SPEEDS)}
    base = arms["equal"]["epoch_time"]
    ideal = sum(SPEEDS) / (len(SPEEDS) * min(SPEEDS))
    print(
        f"\n4-rank model (planner only): speeds {list(SPEEDS)}, {examples:,} WMT-like pairs, "
        f"max_tokens={max_tokens}; step time = max over ranks of planned work / speed; "
        f"ideal ratio {ideal:.2f}x"
    )
    rows = []
    for name, a in arms.items():
        rows.append(
            [
                "equal shares" if name == "equal" else "shares = speeds",
                "/".join(str(b) for b in a["budgets"]),
                str(a["steps"]),
                "/".join(str(c) for c in a["micro_batches_per_rank"]),
                str(sum(a["empty_micro_batches"])),
                fmt(a["epoch_time"] / 1e6, ".3f"),
                fmt(base / a["epoch_time"], ".3f"),
                "/".join(f"{x:.3f}" for x in a["work_share"]),
                "/".join(f"{x:.3f}" for x in a["target_share"]),
                fmt(a["max_share_dev"], ".4f"),
                fmt(100 * a["max_share_rel_dev"], ".2f"),
                "yes" if a["examples_once"] and a["over_budget"] == 0 else "NO",
            ]
        )
    print_table(
        [
            "plan",
            "budgets",
            "steps",
            "mb/rank",
            "empty mb",
            "epoch (M cost/speed)",
            "x equal",
            "work share r0/r1/r2/r3",
            "target",
            "max dev",
            "max rel dev %",
            "once, in budget",
        ],
        rows,
    )
    return {
        "speeds": list(SPEEDS),
        "examples": examples,
        "max_tokens": max_tokens,
        "ideal_ratio": ideal,
        "ratio": base / arms["speeds"]["epoch_time"],
        "arms": arms,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="4-rank share model (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="20,000 pairs instead of 200,000")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = p.parse_args(argv)
    print("command:", command_line("benchmarks.training.rank_shares_model", argv))
    print("machine:", machine_line(f"numpy {np.__version__}"))
    out = model_section(20_000 if args.quick else 200_000, args.max_tokens, args.seed)
    write_json(args.json, out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
