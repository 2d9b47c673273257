"""Planning benchmark: the epoch planner against the floor and every installed baseline.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.planning.epoch                 # full run: 4.5M and 100M examples
    python -m benchmarks.planning.epoch --quick         # smoke test: 200k examples, no 100M row,
                                                  # no RSS child, small lhotse/DeepSpeed runs
    python -m benchmarks.planning.epoch --sizes 4500000 20000000 --ds-sizes 5000 10000

Workload: WMT14 en-de-like (source, target) lengths from
:func:`lightning_varbatch.planner.synthetic.wmt_like_lengths`, ``max_tokens=16384``,
``world_size=8``,
``accumulate_grad_batches=1``, default :class:`PlanConfig` (cost ``"padded"``, tail
``"spread"``). The key of a pair is ``max(src, tgt)``. The first of ``--sizes`` is the main
size: baselines run there and the targets are checked there; the largest size is the
linearity check (planner, floor and sampler only).

Definitions:

* **argsort**: a plain ``np.argsort(key)`` of the planning key (int64, numpy's default
  introsort), the floor a reader would write first; reported beside the floor below.
* **floor**: ``rng.permutation(n)`` plus ``np.argsort(key.astype(np.int16), kind="stable")``
  (one random permutation and one stable radix sort), ``key`` computed beforehand.
* **rank 0 planned + iterated** (the planner's time): ``EpochPlanner(lengths, config)`` +
  ``plan(0, world_size)`` + for each tile of rank 0 ``plan.micro_batch_ids(t).tolist()`` (each list
  discarded at once) + ``plan.step_tokens``. **plan all ranks**: construction + ``plan()``.
* Timings: floor, planner and sampler are interleaved, ``--repeats`` times (default 3); the
  tables show the **median** (the best is printed alongside). Baselines: median as well.
* **peak extra memory**: ``tracemalloc`` peak (numpy reports its array buffers to it) during
  the rank-0 plan + iteration, the input lengths allocated before tracing; in bytes per
  example. ``held``: what is still traced at the end with planner and plan alive. **RSS
  peak**: the rise of the process high-water mark (``/proc/self/clear_refs`` reset, Linux
  only) over the same work, measured in a child process run with a fixed glibc mmap threshold
  (``MALLOC_MMAP_THRESHOLD_``) so that freed buffers leave the resident set; it also sees
  buffers numpy allocates with plain ``malloc`` and does not report to tracemalloc (e.g. the
  8 B/example scratch of its radix argsort), and torch tensors.
* The quality figures are :func:`lightning_varbatch.planner.diagnostics.diagnose`'s (padding
  efficiency, fill, imbalance, coverage), for ours and for every baseline's batches alike
  (:mod:`benchmarks.planning.metrics`); in words:
* **pad both**: both padded tensors' efficiency, real source + target tokens over
  ``Σ n * (longest source + longest target)`` (what the padding collate allocates;
  :func:`benchmarks.planning.metrics.pair_padding_efficiency`).
* **padding efficiency**: sum over micro-batches of real key tokens (sum of ``max(src, tgt)``
  of the members) / sum of ``n_examples * longest key``.
* **budget fill**: mean micro-batch cost / ``max_tokens``; **max cost**: largest cost /
  ``max_tokens``; **over**: fraction of micro-batches above the budget. Costs use the padded
  model ``n * L`` (``L``: longest key), except the ``cost=quadratic`` row (quadratic model).
* **imbalance**: per optimizer step, each rank's cost is the sum of its micro-batch costs in
  the step; imbalance is max / mean over ranks; the tables show the mean over the steps in
  which every rank has a micro-batch. Linear cost ``n * L``; quadratic ``n*L + n*L**2/64``.
* **batches/rank**: min and max number of micro-batches over ranks (equal counts: min = max).
* **coverage**: distinct examples in the epoch / n; **dup**: examples yielded more than once.
* **d-order**: fraction of steps whose rank-0 first micro-batch differs between epoch 0 and 1
  (tile id for layouts fixed across epochs, else the example set). **d-comp**: fraction of
  epoch-1 micro-batches whose example set equals no epoch-0 micro-batch (order-independent
  64-bit hash of the sorted ids).

Targets (checked at the main size, printed as PASS/FAIL): rank 0 planned + iterated <= 2x
the floor; peak extra memory <= 16 B/example (tracemalloc, and RSS shown as well); at the
largest size, <= 2x the floor and ns/example growth <= 1.25x the floor's own growth (the
machine's memory system makes even the floor super-linear), and <= 16 B/example; padding
efficiency >= 0.99 with d-order and d-comp > 0.5; max cost <= max_tokens; mean imbalance
<= 1.01 (linear) and <= 1.02 (quadratic); coverage 100 % with no duplicate and equal counts.

Baselines (how each is driven: :mod:`benchmarks.planning.baselines` for the fixed-size
``DistributedSampler``, greedy sorted and DeepSpeed ``batch_by_seqlens``;
:mod:`benchmarks.planning.baselines_libs` for lhotse ``DynamicBucketingSampler``, Hugging Face
``LengthGroupedSampler`` + accelerate's ``BatchSamplerShard`` and ``batch_rebalance``, fairseq's
``batch_by_size`` + ``EpochBatchIterator`` and SpeechBrain's ``DynamicBatchSampler``; each runs
only where its package imports, and the run says why not otherwise). DeepSpeed is super-linear,
so it runs on subsamples (``--ds-sizes``) and its time is extrapolated to the main size with the
exponent fitted on the two largest; lhotse, SpeechBrain and ``batch_rebalance`` run on
``--lhotse-size`` examples (default 500k) next to our planner timed on the same examples.

The performance table's **x ours** column is the row's time over our planner's time at the
same size, measured in the same run.

Layout: this module holds the run and the command line; :mod:`benchmarks.planning.measure` the
measurement of our planner and the floor, :mod:`benchmarks.planning.compare` the baselines'
rows, :mod:`benchmarks.planning.report` the tables and targets, :mod:`benchmarks.planning.metrics`
the quality figures (from :func:`lightning_varbatch.planner.diagnostics.diagnose`) and
:mod:`benchmarks.harness` the timing, memory and table plumbing every script shares.
"""

from __future__ import annotations

import argparse
import gc
import logging
import statistics
from collections.abc import Sequence
from dataclasses import asdict
from functools import partial
from typing import Any

import numpy as np

from benchmarks.harness import (
    command_line,
    emit_result,
    fmt,
    git_dirty,
    machine_line,
    print_table,
    timed,
    traced,
    write_json,
)
from benchmarks.peers.batches import speechbrain_sampler_module
from benchmarks.planning.baselines_libs import library_versions
from benchmarks.planning.compare import run_baselines
from benchmarks.planning.measure import (
    BENCH_MODULES,
    MEASURED,
    argsort_once,
    floor_once,
    load_sampler_cls,
    measure_rss,
    ours_memory,
    ours_rank,
    profile,
    rss_child,
)
from benchmarks.planning.metrics import plan_batches, plan_quality
from benchmarks.planning.report import (
    PERF_HEADERS,
    QUAL_HEADERS,
    Perf,
    SizeResult,
    perf_rows,
    print_targets,
    qual_row,
    result_record,
    size_perfs,
)
from benchmarks.results import Run, add_result_option, result_path
from lightning_varbatch import EpochPlanner, PlanConfig
from lightning_varbatch.planner import wmt_like_lengths

MAIN_DEFAULT = 4_500_000
BIG_DEFAULT = 100_000_000


def run_size(
    n: int, args: argparse.Namespace, config: PlanConfig, baselines: bool
) -> tuple[SizeResult, np.ndarray, np.ndarray]:
    world, rank, reps = args.world_size, 0, args.repeats
    t_gen, lengths = timed(lambda: wmt_like_lengths(n, seed=args.seed))
    key = np.maximum(lengths[:, 0], lengths[:, 1])
    print(f"\n== n = {n:,}  (lengths generated in {t_gen:.1f} s, not timed)", flush=True)
    sampler_cls = load_sampler_cls()
    floors: list[float] = []
    argsorts: list[float] = []
    ours_plan: list[float] = []
    ours: list[float] = []
    samp: list[float] = []
    sampler_note = "not importable" if sampler_cls is None else ""
    for r in range(reps):
        dt, fl = timed(partial(floor_once, key, args.seed + r))
        del fl
        floors.append(dt)
        argsorts.append(timed(partial(argsort_once, key))[0])
        p, t = ours_rank(lengths, config, world, rank)
        ours_plan.append(p)
        ours.append(t)
        if sampler_cls is not None and not sampler_note:
            try:
                dt, batches = timed(
                    lambda: list(sampler_cls(lengths, args.max_tokens, rank=rank, world_size=world))
                )
                del batches
                samp.append(dt)
            except Exception as e:  # the sampler is being written concurrently
                sampler_note = f"error: {type(e).__name__}: {e}"[:80]
        print(
            f"  repeat {r}: floor {floors[-1]:.3f} s, planner {ours[-1]:.3f} s"
            + (f", sampler {samp[-1]:.3f} s" if len(samp) == r + 1 else ""),
            flush=True,
        )
    peak, held, kept = traced(lambda: ours_memory(lengths, config, world, rank))
    del kept
    fpeak, _, fout = traced(lambda: floor_once(key, args.seed))
    del fout
    planner = EpochPlanner(lengths, config)
    plan0 = planner.plan(0, world)
    b1 = plan_batches(planner.plan(1, world))
    q = plan_quality(planner, plan0, other_epoch=b1, pairs=lengths)
    dropped = plan0.num_dropped
    del b1, plan0, planner
    gc.collect()
    rss = {} if args.quick else measure_rss(n, args, baselines)  # a child process: slow
    res = SizeResult(
        n=n,
        floor_s=statistics.median(floors),
        floor_best_s=min(floors),
        ours_plan_s=statistics.median(ours_plan),
        ours_s=statistics.median(ours),
        ours_best_s=min(ours),
        peak_bpe=peak / n,
        held_bpe=held / n,
        floor_peak_bpe=fpeak / n,
        sampler_s=statistics.median(samp) if samp else None,
        sampler_note=sampler_note,
        quality=q,
        dropped=dropped,
        rss=rss,
        floor_all=floors,
        ours_all=ours,
        argsort_s=statistics.median(argsorts),
    )
    return res, lengths, key


def machine() -> str:
    dirty = git_dirty("lightning_varbatch")
    return machine_line(f"numpy {np.__version__}") + (
        " + uncommitted changes in lightning_varbatch/" if dirty else ""
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Planning benchmark (see the module docstring).")
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help=f"dataset sizes; the first is the main size (default {MAIN_DEFAULT} {BIG_DEFAULT})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 200k examples, no 100M row, no RSS child, small lhotse + DeepSpeed runs",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ds-sizes",
        type=int,
        nargs="*",
        default=None,
        help="DeepSpeed subsample sizes (default 5000 10000 20000; give none to skip)",
    )
    p.add_argument(
        "--baseline-max",
        type=int,
        default=20_000_000,
        help="run the baselines at the main size only if it is at most this",
    )
    p.add_argument("--no-profile", action="store_true", help="skip the planner profile")
    p.add_argument("--json", default=None, help="also write the tables to this JSON file")
    add_result_option(p, "planning")
    p.add_argument(
        "--lhotse-size",
        type=int,
        default=None,
        help="examples for lhotse's DynamicBucketingSampler (default 500000; --quick 10000; "
        "0 skips it)",
    )
    p.add_argument(
        "--lhotse-buckets",
        type=int,
        nargs="+",
        default=[10, 30],
        help="num_buckets values for lhotse (default: 10, its default, and 30)",
    )
    p.add_argument(
        "--no-hf", action="store_true", help="skip Hugging Face's length-grouped sampler"
    )
    p.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rss-baselines", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = [200_000] if args.quick else [MAIN_DEFAULT, BIG_DEFAULT]
    if args.lhotse_size is None:
        args.lhotse_size = 10_000 if args.quick else 500_000
    if args.quick:
        args.lhotse_buckets = args.lhotse_buckets[:1]
    if args.ds_sizes is None:
        args.ds_sizes = [2000] if args.quick else [5000, 10000, 20000]
    return args


def _import_and_freeze(args: argparse.Namespace) -> None:
    """Import the baselines' libraries now and move every object so far out of the collector.

    The measurements call ``gc.collect()`` before each run (untimed); with deepspeed,
    transformers and lhotse loaded a full collection takes ~0.2 s on this machine, which made
    the smoke test slow. Frozen objects are never collected, so the calls stay cheap.
    """
    import importlib

    names = ["torch"]
    if args.ds_sizes:
        names.append("deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr")
    if args.lhotse_size:
        names.append("lhotse.dataset.sampling.dynamic_bucketing")
    if not args.no_hf:
        names += ["transformers.trainer_pt_utils", "accelerate.data_loader"]
    names.append("fairseq.data.iterators")
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # reported where the baseline runs
            pass
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets the root to DEBUG
    if args.lhotse_size:
        try:
            speechbrain_sampler_module()
        except Exception:  # reported where the baseline runs
            pass
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_child is not None:
        emit_result(rss_child(args.rss_child, args))
        return 0
    _import_and_freeze(args)
    run = Run("planning", settings=vars(args), package=MEASURED, bench=BENCH_MODULES)
    config = PlanConfig(max_tokens=args.max_tokens)
    print("command:", command_line("benchmarks.planning.epoch", argv))
    print("machine:", machine())
    print(
        f"workload: wmt_like_lengths(n, seed={args.seed}), max_tokens={args.max_tokens}, "
        f"world_size={args.world_size}, accumulate_grad_batches=1, {config}"
    )
    results: list[SizeResult] = []
    perfs: list[Perf] = []
    quals: list[list[str]] = []
    profiles: list[tuple[int, list[tuple[str, float, float]], dict[str, float]]] = []
    info: dict[str, Any] = {}
    for i, n in enumerate(args.sizes):
        baselines = i == 0 and n <= args.baseline_max
        res, lengths, key = run_size(n, args, config, baselines)
        results.append(res)
        perfs += size_perfs(res)
        quals.append(qual_row("ours: EpochPlanner", n, res.quality))
        if baselines:
            bp, bq, info = run_baselines(n, lengths, key, res, args)
            perfs += bp
            quals += bq
        if not args.no_profile and (i == 0 or n == max(args.sizes)):
            try:
                profiles.append((n, profile(lengths, config, args.world_size, 0), res.rss))
            except Exception as e:  # internals may change under the benchmark
                print(f"  profile unavailable: {type(e).__name__}: {e}")
        del lengths, key
        gc.collect()

    print(
        "\nperformance (rank0 = one rank's epoch planned + iterated, median; B/ex = bytes per "
        "example: peak = tracemalloc peak, held = still traced after, RSS = high-water rise)"
    )
    print_table(PERF_HEADERS, perf_rows(perfs))
    print("\nplan quality (epoch 0; d-order, d-comp compare epoch 0 with epoch 1)")
    print_table(QUAL_HEADERS, quals)
    if "others" in info and info["others"].lines:
        print("\nother libraries")
        for line in info["others"].lines:
            print("  " + line)
    for n, rows, rss in profiles:
        print(f"\nprofile of the planner at n={n:,} (one run per piece)")
        print_table(
            ["piece", "seconds", "traced peak B/ex", "RSS peak B/ex"],
            [
                [name, fmt(sec), fmt(b, ".1f"), fmt(rss.get("piece:" + name), ".1f")]
                for name, sec, b in rows
            ],
        )
    main_res = results[0]
    big = results[-1] if len(results) > 1 and results[-1].n > main_res.n else None
    print_targets(main_res, big, args, info)
    info["versions"] = library_versions()
    run.write(result_record(results, perfs, quals, info), result_path(args))
    write_json(
        args.json,
        {
            "performance": [asdict(p) for p in perfs],
            "quality": [dict(zip(QUAL_HEADERS, row, strict=True)) for row in quals],
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
