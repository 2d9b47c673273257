"""Part (a) of the streaming benchmark: planning quality of windowed plans, offline, lhotse.

See :mod:`benchmarks.sources.streaming` for the definitions.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import numpy as np

from benchmarks.harness import fmt, print_table

WORLD = 8


def lhotse_version() -> str | None:
    """lhotse's version, or ``None`` when the baseline is not installed (the bench extra)."""
    try:
        import lhotse
    except ImportError:
        return None
    return str(lhotse.__version__)


# -- (a) planning quality --------------------------------------------------------------------


def _offline(lengths: np.ndarray, max_tokens: int) -> dict[str, Any]:
    from lightning_varbatch import EpochPlanner, PlanConfig
    from lightning_varbatch.planner import diagnose

    t0 = time.perf_counter()
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, seed=0))
    plan = planner.plan(0, WORLD)
    seconds = time.perf_counter() - t0
    d = diagnose(planner, plan)
    run = plan.assign.reshape(-1)
    key = lengths.max(axis=1).astype(np.int64)
    tokens = [int(key[plan.example_ids(r)].sum()) for r in range(WORLD)]
    return {
        "rank_tokens": tokens,
        "name": "offline: EpochPlanner (whole epoch)",
        "pad_eff": d.padding_efficiency,
        "imb_mean": d.imbalance_linear_mean,
        "imb_max": d.imbalance_linear_max,
        "over": int((plan.micro_batch_cost[run] > max_tokens).sum()),
        "steps": d.num_steps,
        "counts": f"{d.micro_batches_per_rank}",
        "coverage": d.coverage,
        "seconds": seconds,
    }


def _windowed(lengths: np.ndarray, max_tokens: int, shard_rows: int, window: int | None) -> dict:
    """A windowed plan's figures (``window=None``: the default window, ``auto_window``)."""
    from lightning_varbatch import PlanConfig, WindowedPlanner
    from lightning_varbatch.planner import diagnose

    n = lengths.shape[0]
    rows = [min(shard_rows, n - s) for s in range(0, n, shard_rows)]
    wp = WindowedPlanner(
        rows,
        lambda s: lengths[s * shard_rows : s * shard_rows + rows[s]],
        PlanConfig(max_tokens=max_tokens, seed=0),
        window=window,
    )
    t0 = time.perf_counter()
    plans = [wp.window_plan(0, w, WORLD) for w in range(wp.num_windows)]
    seconds = time.perf_counter() - t0
    real = padded = over = steps = 0
    imb_sum, imb_max, counts, seen = 0.0, 0.0, set(), []
    key = lengths.max(axis=1).astype(np.int64)
    tokens = np.zeros(WORLD, dtype=np.int64)
    for p in plans:
        for r in range(WORLD):
            tokens[r] += key[p.example_ids(r)].sum()
        d = diagnose(p.planner, p.plan)
        real += d.real_tokens
        padded += d.padded_tokens
        imb_sum += d.imbalance_linear_mean * d.num_steps
        imb_max = max(imb_max, d.imbalance_linear_max)
        steps += d.num_steps
        run = p.plan.assign.reshape(-1)
        over += int((p.plan.micro_batch_cost[run] > max_tokens).sum())
        counts.add(p.plan.num_micro_batches_per_rank)
        seen.append(p.example_ids())
    assert len(counts) >= 1
    ids = np.concatenate(seen)
    return {
        "rank_tokens": tokens.tolist(),
        "name": f"windowed: {'default ' if window is None else ''}window {wp.window:,} "
        f"({wp.num_windows} windows)",
        "window": wp.window,
        "pad_eff": real / padded,
        "imb_mean": imb_sum / steps,
        "imb_max": imb_max,
        "over": over,
        "steps": steps,
        "counts": f"{steps} (equal)",
        "coverage": np.unique(ids).size / n,
        "seconds": seconds,
    }


def _lhotse(lengths: np.ndarray, max_tokens: int, buffer_size: int) -> dict[str, Any]:
    from lhotse.dataset.sampling.base import TokenConstraint
    from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler

    from benchmarks.planning.baselines_libs import lhotse_items
    from benchmarks.planning.metrics import batches_from_ranks, quality

    key = lengths.max(axis=1).astype(np.int64)
    items = lhotse_items(key)
    per_rank, seconds = [], 0.0
    for rank in range(WORLD):
        t0 = time.perf_counter()
        sampler = DynamicBucketingSampler(
            items,
            constraint=TokenConstraint(max_tokens=max_tokens),
            buffer_size=buffer_size,
            shuffle=True,
            seed=0,
            world_size=WORLD,
            rank=rank,
        )
        sampler.set_epoch(0)
        per_rank.append([np.fromiter((c.id for c in b), dtype=np.int64) for b in sampler])
        seconds += time.perf_counter() - t0
    q = quality(batches_from_ranks(per_rank), key, max_tokens, WORLD)
    batches = sum(len(r) for r in per_rank)
    return {
        "rank_tokens": [int(sum(key[b].sum() for b in r)) for r in per_rank],
        "name": f"lhotse DynamicBucketingSampler (buffer {buffer_size:,})",
        "pad_eff": q.pad_eff,
        "imb_mean": q.imb_lin,
        "imb_max": None,
        "over": round(q.over * batches),
        "over_max_cost": q.max_cost,
        "steps": q.full_steps,
        "counts": f"{q.count_min}..{q.count_max}",
        "coverage": q.coverage,
        "duplicates": q.dup,
        "seconds": seconds / WORLD,
    }


def run_plans(args: argparse.Namespace) -> dict[str, Any]:
    from lightning_varbatch.planner import wmt_like_lengths

    lengths = wmt_like_lengths(args.pairs, seed=0)
    rows = [_offline(lengths, args.max_tokens)]
    rows += [_windowed(lengths, args.max_tokens, args.shard_rows, w) for w in args.windows]
    if not args.no_lhotse and lhotse_version() is None:
        print("(a) lhotse: not run (not installed: pip install -e '.[bench]')")
    elif not args.no_lhotse:
        rows.append(_lhotse(lengths[: args.lhotse_pairs], args.max_tokens, 10_000))
        if args.lhotse_pairs != args.pairs:
            rows[-1]["name"] += f", first {args.lhotse_pairs:,}"
    default = _windowed(lengths, args.max_tokens, args.shard_rows, None)
    base = rows[0]["pad_eff"]
    print(
        f"\n(a) planning quality: {args.pairs:,} WMT-like pairs, max_tokens {args.max_tokens}, "
        f"world size {WORLD}, shards of {args.shard_rows:,}"
    )
    print_table(
        [
            "plan",
            "pad eff",
            "x offline",
            "imb mean",
            "imb max",
            "over budget",
            "steps",
            "per rank",
            "coverage",
            "rank tokens max/min",
            "plan s",
        ],
        [
            [
                r["name"],
                fmt(r["pad_eff"], ".4f"),
                fmt(r["pad_eff"] / base, ".4f"),
                fmt(r["imb_mean"], ".4f"),
                fmt(r["imb_max"], ".4f"),
                str(r["over"])
                + (f" (max {r['over_max_cost']:.3f}x)" if r.get("over_max_cost", 0) > 1 else ""),
                str(r["steps"]),
                r["counts"],
                fmt(r["coverage"], ".4f"),
                fmt(max(r["rank_tokens"]) / min(r["rank_tokens"]), ".3f"),
                fmt(r["seconds"], ".2f"),
            ]
            for r in [*rows, default]
        ],
    )
    print(
        "(rank tokens: real tokens of each rank over the epoch, the most over the fewest; "
        "lhotse: plan s is per rank, every rank walks the whole epoch)"
    )
    return {"rows": rows, "pairs": args.pairs, "default": default}
