"""Part 1 of the Hugging Face benchmark: lengths of many rows (``column_lengths``).

See :mod:`benchmarks.sources.hf_datasets` for the definitions. Each round runs, per case, one
fresh process for ours and one for the baselines (their order rotated by round); a baseline's
``x ours`` is its time per row over ours in the same round.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.harness import rss_peak, timed
from benchmarks.sources.hf_common import Spec, child_main, measure, paired

MODULE = "benchmarks.sources.hf_lengths"
CASES = ("a", "b", "c")
CASE_NAMES = {"a": "(a) int32 column", "b": "(b) list<int16> ids", "c": "(c) ids, shuffled"}
METHODS = ("ours", "loop", "map")
METHOD_NAMES = {
    "ours": "ours: column_lengths",
    "loop": "per-row Python loop",
    "map": "ds.map(batched=True)",
    "numpy": "ds.with_format('numpy')['n'][:]",
}
BATCH_ROWS = 1000  # datasets' ArrowWriter default writer_batch_size


def config_names() -> list[str]:
    """The ``configs`` keys of this part."""
    return [f"lengths/{c}/{m}" for c in CASES for m in METHODS] + ["lengths/a/numpy"]


def write_lengths_file(path: str, rows: int, seed: int = 0) -> tuple[int, int]:
    """Write ``rows`` rows (``n`` int32, ``ids`` list<int16>) as an Arrow IPC stream file.

    Returns (total tokens, file bytes).
    """
    import pyarrow as pa

    rng = np.random.default_rng(seed)
    chunk = 1_000_000
    # the ids are reused from a pool: only their lengths matter here
    pool = rng.integers(0, 32_000, size=12 * chunk, dtype=np.int16)
    schema = pa.schema([("n", pa.int32()), ("ids", pa.list_(pa.int16()))])
    total = 0
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        for start in range(0, rows, chunk):
            m = min(chunk, rows - start)
            n = (1 + rng.poisson(5.0, m)).astype(np.int32)
            offsets = np.zeros(m + 1, dtype=np.int32)
            np.cumsum(n, out=offsets[1:])
            size = int(offsets[-1])
            first = int(rng.integers(0, pool.size - size))
            ids = pa.ListArray.from_arrays(pa.array(offsets), pa.array(pool[first : first + size]))
            table = pa.Table.from_arrays([pa.array(n), ids], schema=schema)
            writer.write_table(table, max_chunksize=BATCH_ROWS)
            total += size
    return total, os.path.getsize(path)


def _open(path: str, case: str) -> Any:
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_file(path)
    return ds.shuffle(seed=0) if case == "c" else ds


def _method(ds: Any, case: str, method: str) -> Callable[[], np.ndarray]:
    from lightning_varbatch import column_lengths

    column = "n" if case == "a" else "ids"
    if method == "ours":
        return lambda: column_lengths(ds, column)
    if method == "loop" and case == "a":
        return lambda: np.asarray([x for x in ds["n"]], dtype=np.int64)
    if method == "loop":
        return lambda: np.asarray([len(x) for x in ds["ids"]], dtype=np.int64)
    if method == "numpy":
        return lambda: np.asarray(ds.with_format("numpy")["n"][:], dtype=np.int64)
    if method != "map":
        raise ValueError(f"unknown method {method!r}")

    def lengths(batch: dict[str, list[Any]]) -> dict[str, list[int]]:
        if case == "a":
            return {"length": list(batch["n"])}
        return {"length": [len(x) for x in batch["ids"]]}

    def mapped() -> np.ndarray:
        out = ds.map(
            lengths, batched=True, remove_columns=ds.column_names, load_from_cache_file=False
        )
        return np.asarray(out.with_format("numpy")["length"], dtype=np.int64)

    return mapped


def child_run(spec: Spec) -> Spec:
    """Time ``spec["methods"]`` in order on case ``spec["case"]`` (each on its rows)."""
    from lightning_varbatch import column_lengths

    full = _open(spec["path"], spec["case"])
    out, got = {}, {}
    for method, rows in zip(spec["methods"], spec["rows"], strict=True):
        ds = full if rows is None or rows >= len(full) else full.select(range(rows))
        fn = _method(ds, spec["case"], method)
        t0 = time.perf_counter()
        rss, got[method] = rss_peak(fn)
        seconds = time.perf_counter() - t0
        out[method] = {"rows": len(ds), "seconds": seconds, "rss_bytes": rss or 0}
    # checks, after the timings: the n column (through the shuffle's indices for (c))
    truth = column_lengths(full, "n")
    for method, result in got.items():
        out[method]["agrees"] = bool(np.array_equal(result, truth[: result.size]))
    return out


def measure_lengths(args: argparse.Namespace, tmp: str) -> dict[str, dict[str, Any]]:
    """Every configuration of part 1, ``--rounds`` interleaved rounds."""
    path = os.path.join(tmp, "lengths.arrow")
    need = args.rows * 30  # ~22 B/row for the file, the shuffle's indices (8 B/row)
    free = shutil.disk_usage(tmp).free
    if free < 2 * need:
        raise SystemExit(f"{tmp}: {free / 2**30:.1f} GiB free, need about {need / 2**30:.1f} GiB")
    seconds, (total, size) = timed(lambda: write_lengths_file(path, args.rows))
    print(
        f"  wrote {args.rows:,} rows ({total:,} token ids, {size / 2**30:.2f} GiB, record "
        f"batches of {BATCH_ROWS}) in {seconds:.1f} s (not timed below)",
        flush=True,
    )
    base, mapped = min(args.baseline_rows, args.rows), min(args.map_rows, args.rows)
    runs: dict[str, list[Spec]] = {}
    for rnd in range(args.rounds):
        for case in CASES if rnd % 2 == 0 else CASES[::-1]:
            slow = ["loop", "map", *(["numpy"] if case == "a" else [])]
            slow = slow[rnd % len(slow) :] + slow[: rnd % len(slow)]
            rows = {"loop": base, "map": mapped, "numpy": None}
            groups = [(["ours"], [None]), (slow, [rows[m] for m in slow])]
            for methods, counts in groups if rnd % 2 == 0 else groups[::-1]:
                spec = {"path": path, "case": case, "methods": methods, "rows": counts}
                for method, out in measure(MODULE, child_run, spec, args.quick).items():
                    runs.setdefault(f"lengths/{case}/{method}", []).append(out)
                    print(
                        f"  round {rnd}: lengths/{case}/{method:<6} rows {out['rows']:>11,}  "
                        f"{out['seconds']:8.3f} s  peak RSS +{out['rss_bytes'] / 2**20:7.1f} MiB"
                        f"  agrees {out['agrees']}",
                        flush=True,
                    )
    os.remove(path)
    return summarise(runs, args.rows)


def summarise(runs: dict[str, list[Spec]], rows: int) -> dict[str, dict[str, Any]]:
    """Medians, per-row figures and the paired ``x ours`` of every configuration."""
    results: dict[str, dict[str, Any]] = {}
    for name, outs in runs.items():
        n = outs[0]["rows"]
        seconds = [o["seconds"] for o in outs]
        results[name] = {
            "rows": n,
            "all_seconds": seconds,
            "seconds": statistics.median(seconds),
            "ns_per_row": 1e9 * statistics.median(seconds) / n,
            "seconds_at_rows": statistics.median(seconds) * rows / n,
            "extrapolated": n < rows,
            "rss_bytes": max(o["rss_bytes"] for o in outs),
            "bytes_per_row": max(o["rss_bytes"] for o in outs) / n,
            "agrees": all(o["agrees"] for o in outs),
        }
    for name, entry in results.items():
        ours = runs[name.rsplit("/", 1)[0] + "/ours"]
        per_round = [
            (o["seconds"] / o["rows"]) / (b["seconds"] / b["rows"])
            for o, b in zip(runs[name], ours, strict=True)
        ]
        entry["x_ours"] = paired(per_round)
        entry["at_100m_s"] = entry["ns_per_row"] * 0.1  # 1e8 rows x ns -> s
    return results


def report_lengths(results: dict[str, dict[str, Any]], rows: int) -> list[str]:
    """The part's one-line findings."""
    lines = []
    for case in CASES:
        ours = results[f"lengths/{case}/ours"]
        loop, mapped = results[f"lengths/{case}/loop"], results[f"lengths/{case}/map"]
        lines.append(
            f"{CASE_NAMES[case]}: ours {ours['seconds']:.3f} s for {rows:,} rows "
            f"({ours['ns_per_row']:.1f} ns/row, {ours['bytes_per_row']:.1f} B/row peak); "
            f"per-row loop {loop['x_ours']['median']:,.0f}x ({loop['x_ours']['min']:,.0f}-"
            f"{loop['x_ours']['max']:,.0f}), ds.map {mapped['x_ours']['median']:,.0f}x "
            f"({mapped['x_ours']['min']:,.0f}-{mapped['x_ours']['max']:,.0f}) the time per row"
        )
    agree = all(r["agrees"] for r in results.values())
    lines.append(f"[{'PASS' if agree else 'FAIL'}] every result equals the n column")
    for line in lines:
        print("  " + line)
    return lines


if __name__ == "__main__":
    raise SystemExit(child_main(child_run))
