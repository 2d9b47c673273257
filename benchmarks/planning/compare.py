"""Running the baselines next to our planner: their rows of the performance and quality tables.

:func:`run_baselines` runs, at the main size: our planner with the quadratic cost model, the
baselines of :mod:`benchmarks.planning.baselines` (DistributedSampler, greedy sorted, DeepSpeed on
subsamples) and those of :mod:`benchmarks.planning.baselines_libs` (lhotse on ``--lhotse-size``
examples next to our planner on the same examples, Hugging Face + accelerate) and of
:mod:`benchmarks.planning.compare_libs` (fairseq's package, SpeechBrain, Hugging Face's
``batch_rebalance``).
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import numpy as np

from benchmarks.harness import timed, traced
from benchmarks.planning.baselines import (
    deepspeed_batches,
    deepspeed_fn,
    dist_sampler_all,
    dist_sampler_batches,
    dist_sampler_rank,
    fixed_batch_size,
    greedy_batches,
    greedy_rank,
)
from benchmarks.planning.baselines_libs import (
    hf_all_ranks,
    hf_available,
    hf_rank,
    lhotse_items,
    lhotse_rank,
)
from benchmarks.planning.compare_libs import run_fairseq, run_hf_rebalance, run_speechbrain
from benchmarks.planning.measure import ours_rank
from benchmarks.planning.metrics import (
    QUAD_COEF,
    Batches,
    Quality,
    batches_from_ranks,
    epoch_change,
    plan_batches,
    plan_quality,
    quality,
)
from benchmarks.planning.report import Perf, SizeResult, qual_row
from lightning_varbatch import EpochPlanner, PlanConfig


@dataclass
class OtherResults:
    perfs: list[Perf] = field(default_factory=list)
    quals: list[list[str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    qualities: dict[str, Quality] = field(default_factory=dict)


def _measure(
    name: str,
    n: int,
    res: SizeResult,
    reps: int,
    *,
    rank: Callable[[], Any],
    whole: Callable[[], Any],
    rss_key: str,
    note: str = "",
) -> Perf:
    """Time one rank's epoch and the whole plan ``reps`` times, and trace one rank's peak."""
    times = [rank() for _ in range(reps)]
    plan_t = [timed(whole)[0] for _ in range(reps)]
    peak, _, out = traced(rank)
    del out
    return Perf(
        method=name,
        n=n,
        plan_s=statistics.median(plan_t),
        rank_s=statistics.median(times),
        rank_best_s=min(times),
        floor_s=res.floor_s,
        peak_bpe=peak / n,
        rss_bpe=res.rss.get(rss_key),
        ours_s=res.ours_s,
        note=note,
    )


def run_baselines(
    n: int, lengths: np.ndarray, key: np.ndarray, res: SizeResult, args: argparse.Namespace
) -> tuple[list[Perf], list[list[str]], dict[str, Any]]:
    world, budget, seed, reps = args.world_size, args.max_tokens, args.seed, args.repeats
    perfs: list[Perf] = []
    quals: list[list[str]] = []
    info: dict[str, Any] = {}

    # ours with the quadratic cost model (informational: budget in quadratic units)
    qcfg = PlanConfig(max_tokens=budget, cost="quadratic", quadratic_coef=QUAD_COEF)
    qplanner = EpochPlanner(lengths, qcfg)
    qb1 = plan_batches(qplanner.plan(1, world))
    qq = plan_quality(qplanner, qplanner.plan(0, world), other_epoch=qb1)
    quals.append(qual_row("ours, cost=quadratic (quad budget)", n, qq))
    del qplanner, qb1

    # (a) DistributedSampler + fixed batch size
    bsz = fixed_batch_size(key, budget, seed)
    info["fixed_batch"] = bsz
    print(f"  DistributedSampler baseline: fixed batch size B = {bsz}", flush=True)
    name = f"DistributedSampler, B={bsz}"
    perfs.append(
        _measure(
            name,
            n,
            res,
            reps,
            rank=lambda: dist_sampler_rank(n, bsz, world, 0, seed),
            whole=lambda: dist_sampler_all(n, bsz, world, seed),
            rss_key="dist",
            note="randperm tensor untraced",
        )
    )
    b0 = dist_sampler_batches(n, bsz, world, seed, 0)
    b1 = dist_sampler_batches(n, bsz, world, seed, 1)
    quals.append(qual_row(name, n, quality(b0, key, budget, world, other_epoch=b1, pairs=lengths)))
    del b0, b1

    # (b) greedy sorted, round-robin
    name = "greedy sorted, batches[rank::world]"
    perfs.append(
        _measure(
            name,
            n,
            res,
            reps,
            rank=lambda: greedy_rank(key, budget, world, 0, seed),
            whole=lambda: greedy_batches(key, budget, world, seed, 0),
            rss_key="greedy",
        )
    )
    b0 = greedy_batches(key, budget, world, seed, 0)
    b1 = greedy_batches(key, budget, world, seed, 1)
    gq = quality(b0, key, budget, world, other_epoch=b1, pairs=lengths)
    info["greedy"] = gq
    quals.append(qual_row(name, n, gq))
    del b0, b1

    # (c) lhotse, Hugging Face, fairseq (benchmarks/planning/baselines_libs.py)
    config = PlanConfig(max_tokens=budget)  # as in main()
    others = run_others(lengths, key, args, config, bsz, res.ours_all, res.floor_s)
    perfs += others.perfs
    quals += others.quals
    info["others"] = others

    # (d) DeepSpeed batch_by_seqlens on subsamples
    fn = deepspeed_fn() if args.ds_sizes else None
    if fn is None:
        perfs.append(Perf("DeepSpeed batch_by_seqlens", n, None, None, None, None, note="n/a"))
        return perfs, quals, info
    ds_times: list[tuple[int, float]] = []
    last: Batches | None = None
    for m in args.ds_sizes:
        sub = key[:m]  # iid lengths: a prefix is a random subsample
        try:
            dt, last = timed(partial(deepspeed_batches, fn, sub, budget, world, seed))
        except AssertionError as e:  # too few examples for one micro-batch per rank
            print(f"  DeepSpeed n={m}: failed ({e})", flush=True)
            continue
        ds_times.append((m, dt))
        print(f"  DeepSpeed batch_by_seqlens n={m:,}: {dt:.2f} s", flush=True)
    if last is None:
        perfs.append(Perf("DeepSpeed batch_by_seqlens", n, None, None, None, None, note="failed"))
        return perfs, quals, info
    m0, m_last, t_last = ds_times[0][0], ds_times[-1][0], ds_times[-1][1]
    dpeak, _, dsb = traced(lambda: deepspeed_batches(fn, key[:m0], budget, world, seed))
    del dsb
    if len(ds_times) >= 2:
        (ma, ta), (mb, tb) = ds_times[-2], ds_times[-1]
        expo = math.log(tb / ta) / math.log(mb / ma)
    else:
        expo = 1.0  # one subsample: linear extrapolation, a lower bound
    extrap = t_last * (n / m_last) ** expo
    info["ds_exponent"], info["ds_extrapolated_s"] = expo, extrap
    for m, dt in ds_times:
        perfs.append(
            Perf(
                method=f"DeepSpeed batch_by_seqlens (n={m:,})",
                n=m,
                plan_s=dt,
                rank_s=None,
                rank_best_s=None,
                floor_s=None,
                peak_bpe=dpeak / m0 if m == m0 else None,
                note=f"{dt / m * 1e6:.0f} us/ex",
            )
        )
    perfs.append(
        Perf(
            method=f"DeepSpeed extrapolated (t ~ n^{expo:.2f})",
            n=n,
            plan_s=extrap,
            rank_s=None,
            rank_best_s=None,
            floor_s=None,
            note=f"{extrap / 86400:.3g} days = {extrap / res.floor_s:.3g}x floor",
        )
    )
    qd = quality(last, key[:m_last], budget, world, pairs=lengths[:m_last])
    e0 = deepspeed_batches(fn, key[:m0], budget, world, seed)
    e1 = deepspeed_batches(fn, key[:m0], budget, world, seed + 1)
    qd.d_order, qd.d_comp = epoch_change(e0, e1)  # on the smallest subsample
    quals.append(qual_row(f"DeepSpeed batch_by_seqlens (n={m_last:,})", m_last, qd))
    return perfs, quals, info


def run_lhotse(lengths: np.ndarray, args: Any, config: PlanConfig, results: OtherResults) -> None:
    m = min(args.lhotse_size, lengths.shape[0])
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    sub = lengths[:m]  # iid lengths: a prefix is a random subsample
    key = np.maximum(sub[:, 0], sub[:, 1])
    items = lhotse_items(key)
    # ours on the same examples, interleaved with lhotse's ranks below
    ours_t: list[float] = []
    planner = EpochPlanner(sub, config)
    ours_q = plan_quality(
        planner,
        planner.plan(0, world),
        other_epoch=plan_batches(planner.plan(1, world)),
        pairs=sub,
    )
    del planner
    results.quals.append(qual_row(f"ours: EpochPlanner (n={m:,})", m, ours_q))
    results.qualities["ours_small"] = ours_q
    rows: list[tuple[int, list[float], Quality]] = []
    for nb in args.lhotse_buckets:
        times: list[float] = []
        per_rank: list[list[np.ndarray]] = []
        for r in range(world):  # every rank walks the whole epoch: each one is a timing sample
            dt, batches = lhotse_rank(items, budget, world, r, seed, 0, nb)
            times.append(dt)
            per_rank.append(batches)
            if r % 2 == 0:
                ours_t.append(ours_rank(sub, config, world, 0)[1])
        dt1, next_epoch = lhotse_rank(items, budget, world, 0, seed, 1, nb)
        times.append(dt1)
        b0 = batches_from_ranks(per_rank)
        q = quality(b0, key, budget, world, pairs=sub)
        q.d_order, q.d_comp = epoch_change(b0, batches_from_ranks([next_epoch]))
        rows.append((nb, times, q))
        results.qualities[f"lhotse{nb}"] = q
        print(
            f"  lhotse DynamicBucketingSampler num_buckets={nb}, n={m:,}: rank epochs "
            + ", ".join(f"{t:.2f}" for t in times)
            + " s",
            flush=True,
        )
    ours_med = statistics.median(ours_t)
    results.perfs.append(
        Perf(
            method=f"ours: EpochPlanner (n={m:,})",
            n=m,
            plan_s=None,
            rank_s=ours_med,
            rank_best_s=min(ours_t),
            floor_s=None,
            ours_s=ours_med,
            note=f"{len(ours_t)} runs interleaved with lhotse",
        )
    )
    for nb, times, q in rows:
        med = statistics.median(times)
        name = f"lhotse DynamicBucketing, {nb} buckets"
        extrap = med * args.main_n / m
        results.perfs.append(
            Perf(
                method=f"{name} (n={m:,})",
                n=m,
                plan_s=None,
                rank_s=med,
                rank_best_s=min(times),
                floor_s=None,
                ours_s=ours_med,
                note=f"linear to {args.main_n:,}: {extrap:.1f} s per rank",
                x_ours_min=min(times) / max(ours_t),  # every rank against every run of ours
                x_ours_max=max(times) / min(ours_t),
            )
        )
        results.quals.append(qual_row(f"{name} (n={m:,})", m, q))
    del items


def run_hf(
    key: np.ndarray,
    pairs: np.ndarray,
    args: Any,
    fixed_b: int,
    ours_all: list[float],
    results: OtherResults,
) -> None:
    """Hugging Face's length-grouped sampler at the main size; ``ours_all``: our planner's
    runs at that size (every HF run is compared with every one of them for the range)."""
    why = hf_available()
    if why is not None:
        results.lines.append(f"Hugging Face LengthGroupedSampler: not run ({why})")
        return
    world, budget, seed, reps = args.world_size, args.max_tokens, args.seed, args.repeats
    n = key.shape[0]
    lengths: list[int] = key.tolist()
    safe_b = max(1, budget // int(key.max()))
    for b, why_b in ((fixed_b, "median random batch fits"), (safe_b, "never over budget")):
        times = [hf_rank(lengths, b, world, 0, seed) for _ in range(reps)]
        name = f"HF LengthGrouped+accelerate, B={b}"
        med = statistics.median(times)
        results.perfs.append(
            Perf(
                method=name,
                n=n,
                plan_s=None,
                rank_s=med,
                rank_best_s=min(times),
                floor_s=args.floor_s,
                ours_s=statistics.median(ours_all),
                note=why_b,
                x_ours_min=min(times) / max(ours_all),
                x_ours_max=max(times) / min(ours_all),
            )
        )
        b0 = batches_from_ranks(hf_all_ranks(lengths, b, world, seed, 0))
        b1 = batches_from_ranks(hf_all_ranks(lengths, b, world, seed, 1))
        q = quality(b0, key, budget, world, other_epoch=b1, pairs=pairs)
        results.qualities[f"hf{b}"] = q
        results.quals.append(qual_row(name, n, q))
        print(f"  HF LengthGroupedSampler + BatchSamplerShard B={b}: rank-0 epoch {med:.2f} s")


def run_others(
    lengths: np.ndarray,
    key: np.ndarray,
    args: Any,
    config: PlanConfig,
    fixed_b: int,
    ours_all: list[float],
    floor_s: float,
) -> OtherResults:
    """The libraries' baselines (lhotse, Hugging Face, fairseq, SpeechBrain); skipped ones are
    explained in ``lines``. ``ours_all``: our planner's runs at the main size."""
    results = OtherResults()
    args.main_n = lengths.shape[0]
    args.floor_s = floor_s
    if args.lhotse_size > 0:
        try:
            import lhotse  # noqa: F401
        except Exception as e:
            results.lines.append(f"lhotse: not run ({type(e).__name__}: {e})"[:140])
        else:
            run_lhotse(lengths, args, config, results)
    if not args.no_hf:
        run_hf(key, lengths, args, fixed_b, ours_all, results)
        run_hf_rebalance(lengths, args, fixed_b, results)
    run_fairseq(lengths, key, args, results)
    if args.lhotse_size > 0:
        run_speechbrain(lengths, args, results)
    return results
