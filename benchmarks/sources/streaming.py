"""Streaming from shards (issue 15): windowed plans, memory, sequential reads, resume.

Run from the repository root (venv active; no network needed)::

    python -m benchmarks.sources.streaming              # full run: ~2-3 min on 2 idle cores
                                                        # writes benchmarks/results/streaming.json
    python -m benchmarks.sources.streaming --quick      # smoke test, ~40 s; writes nothing
    python -m benchmarks.sources.streaming --only plans memory --json out.json

Modules: (a) in :mod:`.stream_plans`, (b)-(d) in :mod:`.stream_io`. Every figure is shown
next to a baseline measured in the same run. Temporary shards go to a
fresh folder under ``--tmp`` (default: the system's temp dir), deleted at the end.

**(a) Planning quality** on ``--pairs`` (default 1M; ``--quick`` 50k) WMT-like (source,
target) lengths (:func:`~lightning_varbatch.planner.synthetic.wmt_like_lengths`, seed 0),
``--max-tokens`` 16384, world size 8, accumulation 1, seed 0, epoch 0, as ``--shard-rows``
(10k) shards. Rows: the **offline** whole-epoch plan (``EpochPlanner`` + ``diagnose``);
**windowed** plans (``WindowedPlanner``, windows ``--windows``, default 1k/10k/100k), every
window planned and diagnosed (``diagnose(wp.planner, wp.plan)``), padding efficiency = Σ real /
Σ padded tokens over all windows, imbalance (per step: busiest rank's n·L over the mean) the
step-weighted mean over windows and the worst step, micro-batches over budget counted from the
plans' tile costs, coverage = distinct examples / examples; and **lhotse**
``DynamicBucketingSampler`` on the same keys ``max(src, tgt)`` with
``TokenConstraint(max_tokens=16384)`` (lhotse's own padded budget, ``n × longest``: the
``max_duration`` equivalent that counts padding; no quadratic term), ``buffer_size=10_000``,
default ``num_buckets`` (10), ``shuffle=True``, ``seed=0``, run once per rank with
``world_size=8, rank=r`` on the first ``--lhotse-pairs`` (default all; ``--quick`` 10k);
its figures come from :func:`benchmarks.planning.metrics.quality` (the
library's ``diagnose`` over the batches; imbalance over the steps where every rank has a
batch). Over budget: padded cost ``n × longest > max_tokens``. Ratio column: padding
efficiency / the offline plan's. Target (issue 15): window 10k within 2 % of offline, zero
over budget, imbalance like offline.

**(b) Memory flat in dataset size**: lengths-only parquet shards (one int32 column
``num_tokens`` = ``max(src, tgt)``, ``--shard-rows`` rows per file) of ``--sizes`` examples
(default 1M and 10M; ``--quick`` 50k and 200k), each measured in a **fresh subprocess**
(``--quick``: the three of a size at once, so their seconds are not clean):
``planner``: ``WindowedPlanner`` (window 10k, world size 8) planning every window of the epoch,
its shard lengths read from the parquet column on demand; ``stream``: ``shards_from_files`` +
``StreamingBatches`` (rank 0 of 8) iterating the epoch, reading its rows (a collate that
returns the ids only, so no tensors); baseline ``offline``: all lengths read into memory and
planned by ``EpochPlanner``. Peak = the process's resident-set high-water mark (``VmHWM``) minus
its RSS after the imports. Reported: the peak at each size and the difference, next to the
window (10k examples).

**(c) Sequential reads**: ``StreamingBatches`` over parquet shards with token columns
``source``/``target`` (``list<int32>``, the lengths of (a)'s first ``--read-pairs``, default
200k; ``--quick`` 20k) and a global ``idx`` column, row groups of 1,000, world size 2, through
a ``DataLoader`` with ``num_workers`` 0 and 2; each worker writes its shards' ``ReadStats``
when its iteration ends. Reported per configuration: backward seeks (must be 0), data opens
per shard and worker, rows decoded / rows read, and whether the ranks' batches hold every
example exactly once.

**(d) Resume** on the same shards (rank 0 of 2, ``num_workers=0``): at micro-batch ``k`` =
half the epoch, ``state_dict(k)`` then a new ``StreamingBatches`` + ``load_state_dict`` +
the first batch, timed, vs the replay baseline: iterating from the start up to and including
batch ``k``, in each of ``--rounds`` (default 5) rounds; ``x faster``: replay over resume in
the same round, median and range over the rounds. The resumed batches must equal the
uninterrupted run's batches ``k..`` exactly.
Items are collated to their ids in (c) and (d), so the figures are reading and planning, not
tensor building.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness import emit_result, machine_line, uptime, write_json
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.sources.stream_io import (
    child_memory,
    run_memory,
    run_reads,
    run_resume,
    write_token_shards,
)
from benchmarks.sources.stream_plans import lhotse_version, run_plans

PACKAGE = [
    "lightning_varbatch.data.streaming",
    "lightning_varbatch.sources.shards",
    "lightning_varbatch.planner.windows",
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.diagnostics",
    "lightning_varbatch.planner.synthetic",
]
"""The package modules the benchmark measures (their import closure is fingerprinted)."""
BENCH = [
    "benchmarks.sources.streaming",
    "benchmarks.sources.stream_plans",
    "benchmarks.sources.stream_io",
    "benchmarks.sources.hf_common",
    "benchmarks.planning.metrics",
    "benchmarks.planning.baselines_libs",
]


def _versions() -> str:
    import pyarrow
    import torch

    lhotse = lhotse_version()
    return f"numpy {np.__version__}, torch {torch.__version__}, pyarrow {pyarrow.__version__}, " + (
        f"lhotse {lhotse}" if lhotse else "lhotse not installed (pip install -e '.[bench]')"
    )


# -- main ------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Streaming benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--only", nargs="+", choices=("plans", "memory", "reads", "resume"))
    p.add_argument("--pairs", type=int, default=None)
    p.add_argument("--lhotse-pairs", type=int, default=None)
    p.add_argument("--no-lhotse", action="store_true")
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--shard-rows", type=int, default=10_000)
    p.add_argument("--windows", type=int, nargs="+", default=None)
    p.add_argument("--sizes", type=int, nargs=2, default=None)
    p.add_argument("--memory-modes", nargs="+", default=["planner", "stream", "offline"])
    p.add_argument("--read-pairs", type=int, default=None)
    p.add_argument("--read-window", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=None)
    p.add_argument("--tmp", default=None)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "streaming")
    p.add_argument("--child", nargs=2, metavar=("MODE", "FOLDER"), default=None)
    args = p.parse_args(argv)
    if args.child:
        emit_result(child_memory(args.child[0], args.child[1], args.max_tokens, 10_000))
        return 0
    q = args.quick
    args.pairs = args.pairs or (50_000 if q else 1_000_000)
    args.lhotse_pairs = min(args.lhotse_pairs or (10_000 if q else args.pairs), args.pairs)
    args.windows = args.windows or [1_000, 10_000, 100_000]
    args.sizes = args.sizes or ([50_000, 200_000] if q else [1_000_000, 10_000_000])
    args.read_pairs = args.read_pairs or (20_000 if q else 200_000)
    args.rounds = args.rounds or (1 if q else 5)
    parts = args.only or ["plans", "memory", "reads", "resume"]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "result", "tmp", "child")}
    run = Run("streaming", settings=settings, package=PACKAGE, bench=BENCH)
    print(machine_line(_versions(), with_load=True))
    print(f"uptime: {uptime()}")
    t_start = time.perf_counter()
    data: dict[str, Any] = {"machine": machine_line(_versions()), "quick": q}
    # absolute: the children run from the repository root
    tmp = os.path.abspath(tempfile.mkdtemp(prefix="lv-streaming-", dir=args.tmp))
    try:
        if "plans" in parts:
            data["plans"] = run_plans(args)
        if "memory" in parts:
            data["memory"] = run_memory(args, tmp)
        if "reads" in parts or "resume" in parts:
            folder = os.path.join(tmp, "tokens")
            t0 = time.perf_counter()
            write_token_shards(folder, args.read_pairs, args.shard_rows)
            print(f"\nwrote {args.read_pairs:,} token pairs: {time.perf_counter() - t0:.1f} s")
            if "reads" in parts:
                data["reads"] = run_reads(args, folder)
            if "resume" in parts:
                data["resume"] = run_resume(args, folder)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    data["seconds"] = time.perf_counter() - t_start
    print(f"\ntotal {data['seconds']:.0f} s; uptime: {uptime()}")
    write_json(args.json, data)
    if args.only and args.result is None:
        print("(--only: a partial run writes no result file unless given --result PATH)")
        return 0
    run.write(data, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
