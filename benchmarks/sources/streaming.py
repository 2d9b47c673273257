"""Streaming from shards (issue 15): windowed plans, memory, sequential reads, resume.

Run from the repository root (venv active; no network needed)::

    python -m benchmarks.sources.streaming              # full run: ~6.5 min on 2 cores at load 8-9
    python -m benchmarks.sources.streaming --quick      # smoke test: ~50 s there
    python -m benchmarks.sources.streaming --only plans memory --json out.json

Every figure is shown next to a baseline measured in the same run. Temporary shards go to a
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
batch ``k``. The resumed batches must equal the uninterrupted run's batches ``k..`` exactly.
Items are collated to their ids in (c) and (d), so the figures are reading and planning, not
tensor building.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import (
    child_command,
    child_env,
    emit_result,
    fmt,
    machine_line,
    print_table,
    proc_kib,
    run_child,
    run_children,
    uptime,
    write_json,
)

WORLD = 8


def _lhotse_version() -> str | None:
    """lhotse's version, or ``None`` when the baseline is not installed (the bench extra)."""
    try:
        import lhotse
    except ImportError:
        return None
    return str(lhotse.__version__)


def _versions() -> str:
    import pyarrow
    import torch

    lhotse = _lhotse_version()
    return f"numpy {np.__version__}, torch {torch.__version__}, pyarrow {pyarrow.__version__}, " + (
        f"lhotse {lhotse}" if lhotse else "lhotse not installed (pip install -e '.[bench]')"
    )


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


def _windowed(lengths: np.ndarray, max_tokens: int, shard_rows: int, window: int) -> dict:
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
        "name": f"windowed: window {window:,} ({wp.num_windows} windows)",
        "window": window,
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
    if not args.no_lhotse and _lhotse_version() is None:
        print("(a) lhotse: not run (not installed: pip install -e '.[bench]')")
    elif not args.no_lhotse:
        rows.append(_lhotse(lengths[: args.lhotse_pairs], args.max_tokens, 10_000))
        if args.lhotse_pairs != args.pairs:
            rows[-1]["name"] += f", first {args.lhotse_pairs:,}"
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
            for r in rows
        ],
    )
    print(
        "(rank tokens: real tokens of each rank over the epoch, the most over the fewest; "
        "lhotse: plan s is per rank, every rank walks the whole epoch)"
    )
    return {"rows": rows, "pairs": args.pairs}


# -- (b) memory ------------------------------------------------------------------------------


def _write_lengths_shards(folder: str, n: int, shard_rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lightning_varbatch.planner import wmt_like_lengths

    os.makedirs(folder)
    for i, start in enumerate(range(0, n, shard_rows)):
        part = wmt_like_lengths(min(shard_rows, n - start), seed=i).max(axis=1).astype(np.int32)
        pq.write_table(
            pa.table({"num_tokens": part}), os.path.join(folder, f"part-{i:05d}.parquet")
        )


def child_memory(mode: str, folder: str, max_tokens: int, window: int) -> dict[str, Any]:
    """One measurement in this (fresh) process; the parent reads its result line."""
    import pyarrow.parquet as pq

    from lightning_varbatch import EpochPlanner, PlanConfig, WindowedPlanner

    if mode == "stream":  # torch only where it is used
        from lightning_varbatch import StreamingBatches, shards_from_files

    paths = sorted(os.path.join(folder, p) for p in os.listdir(folder))
    base = proc_kib("VmRSS") or 0  # after the imports
    t0 = time.perf_counter()
    config = PlanConfig(max_tokens=max_tokens, seed=0)
    examples = 0
    if mode == "planner":
        rows = [pq.ParquetFile(p).metadata.num_rows for p in paths]

        def shard_lengths(s: int) -> np.ndarray:
            return pq.read_table(paths[s], columns=["num_tokens"]).column(0).to_numpy()

        wp = WindowedPlanner(rows, shard_lengths, config, window=window)
        for w in range(wp.num_windows):
            examples += wp.window_plan(0, w, WORLD).example_ids(0).size
    elif mode == "stream":
        # The default path: each shard's lengths cached on disk once (here in a folder of its
        # own, written by this first open), re-read per window, never all held at once.
        source = shards_from_files(paths, "num_tokens", cache_dir=folder.rstrip("/") + "-cache")
        batches = StreamingBatches(
            source,
            max_tokens,
            window=window,
            rank=0,
            world_size=WORLD,
            seed=0,
            collate=lambda items: len(items.ids),
        )
        counts: Iterable[int] = batches  # type: ignore[assignment]  # the collate returns counts
        examples = sum(counts)
    elif mode == "offline":
        lengths = np.concatenate(
            [pq.read_table(p, columns=["num_tokens"]).column(0).to_numpy() for p in paths]
        )
        plan = EpochPlanner(lengths, config).plan(0, WORLD)
        examples = plan.example_ids(0).size
    else:
        raise ValueError(f"unknown mode {mode!r}")
    seconds = time.perf_counter() - t0
    peak = proc_kib("VmHWM") or 0
    return {
        "mode": mode,
        "base_kib": base,
        "peak_kib": peak,
        "rise_kib": peak - base,
        "rank0_examples": examples,
        "seconds": seconds,
    }


def run_memory(args: argparse.Namespace, tmp: str) -> dict[str, Any]:
    results: dict[str, dict[str, Any]] = {}
    for n in args.sizes:
        folder = os.path.join(tmp, f"lengths-{n}")
        t0 = time.perf_counter()
        _write_lengths_shards(folder, n, args.shard_rows)
        print(
            f"(b) wrote {n:,} rows in {n // args.shard_rows:,} shards: "
            f"{time.perf_counter() - t0:.1f} s",
            flush=True,
        )
        cmds = [
            child_command(
                "benchmarks.sources.streaming",
                "--child",
                mode,
                folder,
                "--max-tokens",
                str(args.max_tokens),
            )
            for mode in args.memory_modes
        ]
        env = child_env(OMP_NUM_THREADS="1")
        if args.quick:  # the children at once: each peak is its own, only the seconds suffer
            found = [out[-1] for out in run_children(cmds, env=env)]
        else:
            found = [run_child(cmd, env=env)[-1] for cmd in cmds]
        results.update({f"{m}/{n}": r for m, r in zip(args.memory_modes, found, strict=True)})
        shutil.rmtree(folder)
    small, large = min(args.sizes), max(args.sizes)
    print(
        f"\n(b) peak RSS rise over the imports (MiB), {small:,} vs {large:,} examples, "
        f"window 10,000, rank 0 of {WORLD}"
    )
    rows = []
    for mode in args.memory_modes:
        a, b = results[f"{mode}/{small}"], results[f"{mode}/{large}"]
        diff = (b["rise_kib"] - a["rise_kib"]) / 1024
        rows.append(
            [
                {
                    "planner": "ours: WindowedPlanner, every window",
                    "stream": "ours: shards_from_files + StreamingBatches",
                    "offline": "baseline: all lengths + EpochPlanner",
                }[mode],
                fmt(a["rise_kib"] / 1024, ".1f"),
                fmt(b["rise_kib"] / 1024, ".1f"),
                fmt(diff, ".1f"),
                fmt(diff * 2**20 / (large - small), ".2f"),
                fmt(a["seconds"], ".1f"),
                fmt(b["seconds"], ".1f"),
            ]
        )
    print_table(
        [
            "configuration",
            f"{small:,}",
            f"{large:,}",
            "difference",
            "B/extra example",
            f"s {small:,}",
            f"s {large:,}",
        ],
        rows,
    )
    return {"sizes": args.sizes, "configs": results}


# -- (c) reads and (d) resume ----------------------------------------------------------------


def _write_token_shards(folder: str, n: int, shard_rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from lightning_varbatch.planner import wmt_like_lengths

    os.makedirs(folder)
    lengths = wmt_like_lengths(n, seed=0)
    rng = np.random.default_rng(0)
    for i, start in enumerate(range(0, n, shard_rows)):
        part = lengths[start : start + shard_rows].astype(np.int64)
        cols = {}
        for c, name in enumerate(("source", "target")):
            offsets = np.concatenate([[0], np.cumsum(part[:, c])]).astype(np.int32)
            values = pa.array(rng.integers(4, 32000, int(offsets[-1]), dtype=np.int32))
            cols[name] = pa.ListArray.from_arrays(pa.array(offsets), values)
        cols["idx"] = pa.array(np.arange(start, start + len(part), dtype=np.int64))
        pq.write_table(
            pa.table(cols), os.path.join(folder, f"part-{i:05d}.parquet"), row_group_size=1000
        )


def _stats_dir() -> str | None:
    return os.environ.get("STREAMING_BENCH_STATS")


def _make_batches(folder: str, rank: int, world: int, max_tokens: int, window: int) -> Any:
    from lightning_varbatch import StreamingBatches, shards_from_files

    class Recorded(StreamingBatches):
        """Writes this worker's read counts when its iteration ends (they live in the worker)."""

        def __iter__(self):  # type: ignore[no-untyped-def]
            from torch.utils.data import get_worker_info

            before = self.source.stats
            yield from super().__iter__()
            after = self.source.stats
            info = get_worker_info()
            out = _stats_dir()
            if out:
                worker = 0 if info is None else info.id
                with open(os.path.join(out, f"r{self.rank}-w{worker}.json"), "w") as f:
                    json.dump(
                        {
                            k: getattr(after, k) - getattr(before, k)
                            for k in ("opens", "rows_read", "rows_decoded", "backward_seeks")
                        },
                        f,
                    )

    source = shards_from_files(folder, ("source", "target"), cache_dir=None)
    return Recorded(
        source,
        max_tokens,
        window=window,
        rank=rank,
        world_size=world,
        seed=0,
        collate=lambda items: [int(i) for i in items.ids],
    )


def run_reads(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    from torch.utils.data import DataLoader

    world = 2
    shards = len(os.listdir(folder))
    rows = []
    out: dict[str, Any] = {}
    for workers in (0, 2):
        stats_dir = tempfile.mkdtemp(dir=os.path.dirname(folder))
        os.environ["STREAMING_BENCH_STATS"] = stats_dir
        ids: list[int] = []
        counts: list[int] = []
        t0 = time.perf_counter()
        for rank in range(world):
            batches = _make_batches(folder, rank, world, args.max_tokens, args.read_window)
            got = list(DataLoader(batches, batch_size=None, num_workers=workers))
            counts.append(len(got))
            ids.extend(i for b in got for i in b)
        seconds = time.perf_counter() - t0
        stats = [json.load(open(os.path.join(stats_dir, p))) for p in sorted(os.listdir(stats_dir))]
        total = {k: sum(s[k] for s in stats) for k in stats[0]}
        exact = len(ids) == args.read_pairs and len(set(ids)) == args.read_pairs
        key = f"w{workers}"
        out[key] = {
            "stats": total,
            "per_worker": stats,
            "counts": counts,
            "exact": exact,
            "seconds": seconds,
        }
        rows.append(
            [
                f"num_workers={workers}",
                str(len(stats)),
                str(total["backward_seeks"]),
                fmt(total["opens"] / (shards * len(stats)), ".2f"),
                f"{total['rows_read']:,}",
                f"{total['rows_decoded']:,}",
                fmt(total["rows_decoded"] / total["rows_read"], ".2f"),
                "/".join(map(str, counts)),
                "yes" if exact else "NO",
                fmt(seconds, ".1f"),
            ]
        )
    print(
        f"\n(c) reads: {args.read_pairs:,} pairs in {shards} parquet shards (row groups of "
        f"1,000), world size {world}, window {args.read_window:,}; counts of all ranks and "
        "workers (index building at open is not counted: it is once per shard, no cache)"
    )
    print_table(
        [
            "loader",
            "readers",
            "backward seeks",
            "opens/shard/reader",
            "rows read",
            "rows decoded",
            "decoded/read",
            "batches per rank",
            "each example once",
            "s",
        ],
        rows,
    )
    return out


def run_resume(args: argparse.Namespace, folder: str) -> dict[str, Any]:
    os.environ.pop("STREAMING_BENCH_STATS", None)
    world = 2
    full = list(_make_batches(folder, 0, world, args.max_tokens, args.read_window))
    k = len(full) // 2
    rows, out = [], {}
    for rnd in range(args.rounds):
        batches = _make_batches(folder, 0, world, args.max_tokens, args.read_window)
        t0 = time.perf_counter()
        it = iter(batches)
        for _ in range(k + 1):
            first_replay = next(it)
        replay = time.perf_counter() - t0
        state = batches.state_dict(k)
        state = json.loads(json.dumps(state))  # what a checkpoint round trip keeps
        fresh = _make_batches(folder, 0, world, args.max_tokens, args.read_window)
        t0 = time.perf_counter()
        fresh.load_state_dict(state)
        it2 = iter(fresh)
        first = next(it2)
        resume = time.perf_counter() - t0
        rest = [first, *it2]
        exact = rest == full[k:] and first == first_replay
        out[f"round{rnd}"] = {"replay_s": replay, "resume_s": resume, "exact": exact}
        rows.append(
            [
                f"round {rnd}",
                f"{k:,} of {len(full):,}",
                fmt(replay, ".3f"),
                fmt(resume, ".3f"),
                fmt(replay / resume, ".1f"),
                "yes" if exact else "NO",
            ]
        )
    print(
        f"\n(d) resume at micro-batch k (rank 0 of {world}, num_workers=0, window "
        f"{args.read_window:,}; opening the shards is outside both timings)"
    )
    print_table(
        [
            "round",
            "k",
            "replay to k s",
            "load_state_dict + 1st batch s",
            "x faster",
            "rest identical",
        ],
        rows,
    )
    return out


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
    p.add_argument("--json", default=None)
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
    args.rounds = args.rounds or (1 if q else 3)
    parts = args.only or ["plans", "memory", "reads", "resume"]
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
            _write_token_shards(folder, args.read_pairs, args.shard_rows)
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
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
