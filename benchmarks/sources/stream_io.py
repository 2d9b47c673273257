"""Parts (b)-(d) of the streaming benchmark: memory by dataset size, sequential reads, resume.

See :mod:`benchmarks.sources.streaming` for the definitions. The memory children run as
``python -m benchmarks.sources.streaming --child MODE FOLDER``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterable
from typing import Any

import numpy as np

from benchmarks.harness import (
    child_command,
    child_env,
    fmt,
    print_table,
    proc_kib,
    run_child,
    run_children,
)
from benchmarks.sources.hf_common import paired
from benchmarks.sources.stream_plans import WORLD

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


def write_token_shards(folder: str, n: int, shard_rows: int) -> None:
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
    rows: list[list[str]] = []
    out: dict[str, Any] = {}
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
    out["k"], out["batches"] = k, len(full)
    out["x_faster"] = paired(
        [r["replay_s"] / r["resume_s"] for key, r in out.items() if key.startswith("round")]
    )
    out["exact"] = all(r["exact"] for key, r in out.items() if key.startswith("round"))
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
