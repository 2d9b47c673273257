"""Measuring our planner and the floor: time, traced memory, RSS (in a child), the profile.

See :mod:`benchmarks.planning.epoch` for the definitions (floor, rank 0 planned + iterated, peak,
held and RSS bytes per example, the profile's pieces).
"""

from __future__ import annotations

import argparse
import gc
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import (
    ChildFailed,
    child_command,
    child_env,
    rss_peak,
    run_child,
    timed,
    traced,
)
from benchmarks.planning.baselines import dist_sampler_rank, fixed_batch_size, greedy_rank
from lightning_varbatch import EpochPlan, EpochPlanner, PlanConfig
from lightning_varbatch.planner import wmt_like_lengths

MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.diagnostics",
    "lightning_varbatch.planner.synthetic",
]
"""The package code the figures measure (with what it imports: :mod:`benchmarks.results`)."""
BENCH_MODULES = [
    "benchmarks.planning.epoch",
    "benchmarks.planning.measure",
    "benchmarks.planning.compare",
    "benchmarks.planning.compare_libs",
    "benchmarks.planning.report",
    "benchmarks.planning.metrics",
    "benchmarks.planning.baselines",
    "benchmarks.planning.baselines_libs",
    "benchmarks.peers.batches",
]


def _iterate_plan(plan: EpochPlan, rank: int) -> None:
    for tile in plan.rank_micro_batches(rank).tolist():
        ids = plan.micro_batch_ids(tile).tolist()
        del ids  # consumed batch by batch, never kept
    _ = plan.step_tokens


def ours_rank(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int
) -> tuple[float, float]:
    """(plan all ranks, rank planned + iterated) seconds of one run of the planner."""
    gc.collect()
    t0 = time.perf_counter()
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world)
    t1 = time.perf_counter()
    _iterate_plan(plan, rank)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def ours_memory(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int
) -> tuple[EpochPlanner, EpochPlan]:
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world)
    _iterate_plan(plan, rank)
    return planner, plan


def argsort_once(key: np.ndarray) -> np.ndarray:
    """The plain floor: ``np.argsort`` of the planning key as computed (int64, introsort)."""
    return np.argsort(key)


def floor_once(key: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The floor: a random permutation plus a stable radix argsort of the 16-bit key."""
    rng = np.random.default_rng(seed)
    perm = rng.permutation(key.shape[0])
    order = np.argsort(key.astype(np.int16), kind="stable")
    return perm, order


def load_sampler_cls() -> Any:
    try:
        from lightning_varbatch import TokenBudgetBatchSampler
    except ImportError:
        return None
    return TokenBudgetBatchSampler


def profile_pieces(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int, calls: int
) -> list[tuple[str, Callable[[], object]]]:
    """The planner's pieces, each a callable that can be called ``calls`` times."""
    from lightning_varbatch.planner.lengths import prepare_lengths
    from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups

    prep = prepare_lengths(lengths, config)
    groups = SortedGroups.build(prep.key, prep.kept, config.bucket_width)
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world)
    fresh = [planner.plan(0, world) for _ in range(calls)]  # micro_batch_tokens is cached per plan
    warm = [planner.plan(0, world) for _ in range(calls)]
    for p in warm:
        _ = p.micro_batch_tokens

    def shuffle() -> np.ndarray:
        rng = np.random.default_rng(0)
        order = groups.ids.copy()
        starts = groups.starts
        for g in np.flatnonzero(np.diff(starts) > 1):
            rng.shuffle(order[starts[g] : starts[g + 1]])
        return order

    return [
        (
            "prepare_lengths (validate, key = max(src, tgt))",
            lambda: prepare_lengths(lengths, config),
        ),
        (
            "SortedGroups.build (radix argsort of the key)",
            lambda: SortedGroups.build(prep.key, prep.kept, config.bucket_width),
        ),
        ("SortedCut.build (greedy cut of the groups)", lambda: SortedCut.build(groups, config)),
        ("plan(epoch), sort + layout cached (per-epoch work)", lambda: planner.plan(1, world)),
        ("  of which: ids.copy + shuffle within groups", shuffle),
        ("iterate rank 0: micro_batch_ids(t).tolist()", lambda: _iterate_rank_only(plan, rank)),
        (
            "micro_batch_tokens (loss[order] gather + reduceat)",
            lambda: fresh.pop().micro_batch_tokens,
        ),
        ("step_tokens, micro_batch_tokens known", lambda: warm.pop().step_tokens),
    ]


def profile(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int
) -> list[tuple[str, float, float]]:
    """(piece, seconds, tracemalloc peak B/example) of the planner's pieces."""
    n = lengths.shape[0]
    rows = []
    for name, fn in profile_pieces(lengths, config, world, rank, calls=2):
        dt, out = timed(fn)
        del out
        peak, _, out = traced(fn)
        del out
        rows.append((name, dt, peak / n))
    return rows


def _iterate_rank_only(plan: EpochPlan, rank: int) -> None:
    for tile in plan.rank_micro_batches(rank).tolist():
        ids = plan.micro_batch_ids(tile).tolist()
        del ids


# -- resident-set peaks, measured in a child process ---------------------------------------------


def rss_child(n: int, args: argparse.Namespace) -> dict[str, float]:
    """RSS high-water rises (B/example); run with a fixed, small glibc mmap threshold."""
    config = PlanConfig(max_tokens=args.max_tokens)
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    lengths = wmt_like_lengths(n, seed=seed)
    key = np.maximum(lengths[:, 0], lengths[:, 1])
    out: dict[str, float] = {}

    def put(name: str, fn: Callable[[], object]) -> None:
        rss, res = rss_peak(fn)
        del res
        if rss is not None:
            out[name] = rss / n

    put("ours", lambda: ours_memory(lengths, config, world, 0))
    put("floor", lambda: floor_once(key, seed))
    if args.rss_baselines:
        bsz = fixed_batch_size(key, budget, seed)
        put("dist", lambda: dist_sampler_rank(n, bsz, world, 0, seed))
        put("greedy", lambda: greedy_rank(key, budget, world, 0, seed))
    for name, fn in profile_pieces(lengths, config, world, 0, calls=1):
        put("piece:" + name, fn)
    return out


def measure_rss(n: int, args: argparse.Namespace, baselines: bool) -> dict[str, float]:
    """Run :func:`rss_child` in a fresh process; ``{}`` when that is not possible."""
    if not os.path.exists("/proc/self/clear_refs"):
        return {}
    # a fixed threshold: every large buffer is its own mapping, returned to the OS when freed,
    # so the resident set before a measurement holds only live data
    env = child_env(MALLOC_MMAP_THRESHOLD_="131072")
    cmd = child_command(
        "benchmarks.planning.epoch",
        "--rss-child",
        str(n),
        "--max-tokens",
        str(args.max_tokens),
        "--world-size",
        str(args.world_size),
        "--seed",
        str(args.seed),
        *(["--rss-baselines"] if baselines else []),
    )
    try:
        found = run_child(cmd, env=env)[-1]
    except ChildFailed as err:  # the table shows "-" for RSS
        print(f"  RSS measurement failed: {err.failures[0].stderr.strip()[-300:]}", flush=True)
        return {}
    return {k: float(v) for k, v in found.items()}
