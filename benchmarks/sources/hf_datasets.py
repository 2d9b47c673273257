"""Hugging Face ``datasets`` as a source (issue 14): lengths, token counts, collated batches.

Run from the repository root (venv active; no network needed)::

    python -m benchmarks.sources.hf_datasets            # full run: ~15 min on 2 busy shared cores
    python -m benchmarks.sources.hf_datasets --quick    # smoke test, ~10 s there
    python -m benchmarks.sources.hf_datasets --only lengths --json out.json

Every measurement runs in a **fresh subprocess**
(``python -m benchmarks.sources.hf_datasets --child``; ``--quick``: all in this process, a
smoke test of the code paths) and every figure is shown next to a baseline measured in
the same run. Temporary data go to a fresh folder under ``--tmp`` (default: the system's
temp dir), deleted at the end.

**1. Lengths** (:func:`lightning_varbatch.sources.column_lengths`) of ``--rows`` rows (default
100M; ``--quick`` 200k). The data are written with pyarrow as an Arrow IPC *stream* file in
record batches of 1,000 rows (what ``datasets`` writes: ``ArrowWriter``'s default
``writer_batch_size``) and opened with ``datasets.Dataset.from_file`` (memory-mapped; the file
was just written, so the page cache is warm). Columns: ``n`` (int32 lengths, 1 + Poisson(5),
mean 6) and ``ids`` (``list<int16>`` token ids with those lengths). Cases: **(a)** the int32
column ``n``; **(b)** the token-id column ``ids`` (list lengths from the Arrow offsets);
**(c)** ``ids`` after ``ds.shuffle(seed=0)`` (an indices mapping; the shuffle itself is not
timed). Baselines on the first rows (for (c) ``ds.shuffle(seed=0).select(range(k))``), their
time **extrapolated linearly** to ``--rows`` (marked ``extrap.``): a **per-row Python loop**
(``[len(x) for x in ds["ids"]]``, for (a) ``[x for x in ds["n"]]``) on ``--baseline-rows``
rows (default 1M; ``--quick`` 5k) and **``ds.map(batched=True)``** computing the lengths
(``load_from_cache_file=False``, the default on-disk cache file) on ``--map-rows`` rows
(default 100k, ``--quick`` 2k: at 50-200 us/row it would take minutes on 1M). For (a) also
``ds.with_format("numpy")["n"][:]`` on all rows (the vectorised way to read an int column).
**Peak memory**: the rise of the process's resident-set high-water mark (``VmHWM`` of
``/proc/self/status``, reset through ``/proc/self/clear_refs`` just before the call, minus
``VmRSS`` then; :func:`benchmarks.harness.rss_peak`). It includes the file-backed pages of the
memory-mapped file that the call touches (the offsets of ``ids``, the ``n`` column) and the
returned ``int64`` array (8 B/row). Every result is checked: (b) equals the ``n`` column, (c)
equals it gathered through the shuffle's indices, each baseline equals ours on its rows.
Target (issue 14): 100M rows in under 10 s on this machine.

**2. Token counts** (:func:`lightning_varbatch.sources.tokenized_lengths`) of ``--texts``
generated sentences (default 200k; ``--quick`` 2k; Zipf-distributed pseudo-words, lognormal
sentence lengths, median 20 words) in a ``datasets.Dataset`` saved to disk and reloaded, with a
byte-level BPE ``tokenizers.Tokenizer`` (vocabulary 8000) trained on the fly on 20k of them
(no download): ``num_proc=None`` and ``num_proc=2`` (no cache), and with the cache on, the
first call (counts and writes the ``.npy``) and the second (reads it). Baseline: the per-row
loop ``[len(tok.encode(t).ids) for t in texts]`` (the texts already a Python list, untimed).
Reference: one ``tok.encode_batch(texts)`` call over all texts (the tokenizer's own floor,
without ``Dataset.map``). Medians over ``--rounds`` interleaved rounds (each with a cold
cache). The counts of every configuration and round must agree.

**3. Collated examples/s** through :func:`lightning_varbatch.token_budget_dataloader` with
the default :class:`~lightning_varbatch.PaddingCollate`, one epoch of
``TokenBudgetBatchSampler(lengths, max_tokens=--max-tokens (4096), world_size=1, seed=0)``,
on ``--pairs`` (default 200k; ``--quick`` 2k) (source, target) pairs with WMT-like lengths
(:func:`~lightning_varbatch.planner.synthetic.wmt_like_lengths`, median 24) and random ids:
**list**: a list of dicts of int64 tensors (the item path); **hf**: the same ids in a
``datasets.Dataset.from_dict`` of Arrow ``list<int32>`` columns (in memory; one batched Arrow
read per micro-batch); **disk**: that dataset ``save_to_disk`` + ``load_from_disk``
(memory-mapped). Each with ``num_workers`` 0 and 2. Timed: from ``iter(loader)`` to the end of
the epoch (worker start-up included), examples/s = pairs / seconds; medians over ``--rounds``
rounds (default 2), configurations interleaved. The ratio HF/list must be >= 1 (issue 14:
the HF path is not slower). Once, all batches of an epoch of all three are compared tensor by
tensor (``--verify-pairs``, default 20k). ``--profile`` adds a cProfile of list vs hf
(``num_workers=0``).

Every loader process runs torch with 1 thread (``torch.set_num_threads(1)``, what DataLoader
workers do themselves): the collate's small tensor ops (``repeat_interleave``, indexing) cost
milliseconds each when 2 OpenMP threads fight the other jobs on 2 busy cores (measured: 1.8 ms
vs 0.01 ms per ``repeat_interleave`` of 120 rows), which would swamp both paths alike.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import (
    child_command,
    child_env,
    emit_result,
    fmt,
    machine_line,
    print_table,
    rss_peak,
    run_child,
    timed,
    uptime,
    write_json,
)

LENGTH_CASES = ("a", "b", "c")
CASE_NAMES = {
    "a": "(a) int32 column",
    "b": "(b) list<int16> ids",
    "c": "(c) ids, shuffled",
}
LENGTH_METHODS = ("ours", "loop", "map")
TOKEN_METHODS = ("loop", "encode_batch", "ours", "ours_np2", "ours_first", "ours_cached")
TOKEN_NAMES = {
    "loop": "baseline: [len(tok.encode(t).ids) for t in texts]",
    "encode_batch": "reference: tok.encode_batch(all texts)",
    "ours": "ours: tokenized_lengths, num_proc=None",
    "ours_np2": "ours: tokenized_lengths, num_proc=2",
    "ours_first": "ours: cache on, first call (writes it)",
    "ours_cached": "ours: cache on, second call (reads it)",
}
LOADER_KINDS = ("list", "hf", "disk")
LOADER_NAMES = {
    "list": "list of dicts (item path)",
    "hf": "datasets.Dataset.from_dict",
    "disk": "save_to_disk + load_from_disk",
}
WORKERS = (0, 2)
BATCH_ROWS = 1000  # datasets' ArrowWriter default writer_batch_size


def config_names() -> list[str]:
    """Every configuration the full and quick runs report (the JSON's ``configs`` keys)."""
    names = [f"lengths/{c}/{m}" for c in LENGTH_CASES for m in LENGTH_METHODS]
    names.append("lengths/a/numpy")
    names += [f"tokens/{m}" for m in TOKEN_METHODS]
    names += [f"loader/{k}/w{w}" for k in LOADER_KINDS for w in WORKERS]
    return names


def versions() -> str:
    import datasets
    import pyarrow
    import tokenizers
    import torch

    return (
        f"numpy {np.__version__}, torch {torch.__version__}, datasets {datasets.__version__}, "
        f"pyarrow {pyarrow.__version__}, tokenizers {tokenizers.__version__}"
    )


# -- subprocesses ---------------------------------------------------------------------------------


def measure(spec: dict[str, Any], in_process: bool = False, timeout: float = 600) -> dict[str, Any]:
    """Run one measurement in a fresh ``python -m benchmarks.sources.hf_datasets --child`` process.

    ``in_process`` (``--quick``): in this process instead, the result passed through JSON as
    a child's would be (no start-up and imports per measurement; the figures then less clean).
    """
    if in_process:
        result: dict[str, Any] = json.loads(json.dumps(child_run(spec)))
        return result
    cmd = child_command("benchmarks.sources.hf_datasets", "--child", json.dumps(spec))
    found: dict[str, Any] = run_child(
        cmd, env=child_env(TOKENIZERS_PARALLELISM="true"), timeout=timeout
    )[-1]
    return found


def child_main(spec: dict[str, Any]) -> None:
    emit_result(child_run(spec))


def child_run(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement, what its child reports."""
    part = spec["part"]
    if part in ("loader", "verify", "profile"):
        import torch

        torch.set_num_threads(1)  # as DataLoader workers do; see the module docstring
    if part == "lengths":
        out = child_lengths(spec)
    elif part == "tokens":
        out = child_tokens(spec)
    elif part == "loader":
        out = child_loader(spec)
    elif part == "verify":
        out = child_verify(spec)
    elif part == "profile":
        out = child_profile(spec)
    else:
        raise ValueError(f"unknown part {part!r}")
    return out


# -- 1. lengths -----------------------------------------------------------------------------------


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


def open_case(path: str, case: str, rows: int | None) -> Any:
    import datasets

    datasets.disable_progress_bars()
    ds = datasets.Dataset.from_file(path)
    if case == "c":
        ds = ds.shuffle(seed=0)
    if rows is not None and rows < len(ds):
        ds = ds.select(range(rows))
    return ds


def child_lengths(spec: dict[str, Any]) -> dict[str, Any]:
    from lightning_varbatch import column_lengths

    case, method = spec["case"], spec["method"]
    ds = open_case(spec["path"], case, spec.get("rows"))
    column = "n" if case == "a" else "ids"
    fn: Callable[[], np.ndarray]
    if method == "ours":

        def fn() -> np.ndarray:
            return column_lengths(ds, column)

    elif method == "loop":
        if case == "a":

            def fn() -> np.ndarray:
                return np.asarray([x for x in ds["n"]], dtype=np.int64)

        else:

            def fn() -> np.ndarray:
                return np.asarray([len(x) for x in ds["ids"]], dtype=np.int64)

    elif method == "map":

        def lengths(batch: dict[str, list[Any]]) -> dict[str, list[int]]:
            if case == "a":
                return {"length": list(batch["n"])}
            return {"length": [len(x) for x in batch["ids"]]}

        def fn() -> np.ndarray:
            out = ds.map(
                lengths, batched=True, remove_columns=ds.column_names, load_from_cache_file=False
            )
            return np.asarray(out.with_format("numpy")["length"], dtype=np.int64)

    elif method == "numpy":

        def fn() -> np.ndarray:
            return np.asarray(ds.with_format("numpy")["n"][:], dtype=np.int64)

    else:
        raise ValueError(method)
    t0 = time.perf_counter()
    rss, result = rss_peak(fn)
    seconds = time.perf_counter() - t0
    # checks, not timed: the n column (through the shuffle's indices for (c)) is the truth
    truth = column_lengths(ds, "n") if method != "ours" or case != "a" else result
    return {
        "rows": len(ds),
        "seconds": seconds,
        "rss_bytes": rss,
        "result_bytes": int(result.nbytes),
        "agrees": bool(np.array_equal(result, truth)),
        "total": int(result.sum()),
    }


def measure_lengths(args: argparse.Namespace, tmp: str) -> dict[str, dict[str, Any]]:
    path = os.path.join(tmp, "lengths.arrow")
    need = args.rows * 30  # ~22 B/row for the file, the shuffle's indices (8 B/row), map caches
    free = shutil.disk_usage(tmp).free
    if free < 2 * need:
        raise SystemExit(f"{tmp}: {free / 2**30:.1f} GiB free, need about {need / 2**30:.1f} GiB")
    seconds, (total, size) = timed(lambda: write_lengths_file(path, args.rows))
    print(
        f"  wrote {args.rows:,} rows ({total:,} token ids, {size / 2**30:.2f} GiB, record "
        f"batches of {BATCH_ROWS}) in {seconds:.1f} s (not timed below)",
        flush=True,
    )
    base = min(args.baseline_rows, args.rows)
    results: dict[str, dict[str, Any]] = {}
    plan: list[tuple[str, str, int | None]] = []
    mapped = min(args.map_rows, args.rows)
    for case in LENGTH_CASES:
        plan += [(case, "ours", None), (case, "loop", base), (case, "map", mapped)]
    plan.append(("a", "numpy", None))
    for rnd in range(args.rounds):
        for case, method, rows in plan if rnd % 2 == 0 else plan[::-1]:
            if method != "ours" and rnd > 0:
                continue  # the slow baselines once
            out = measure(
                {"part": "lengths", "path": path, "case": case, "method": method, "rows": rows},
                args.quick,
            )
            name = f"lengths/{case}/{method}"
            entry = results.setdefault(name, {**out, "all_seconds": [], "all_rss": []})
            entry["all_seconds"].append(out["seconds"])
            entry["all_rss"].append(out["rss_bytes"])
            entry["agrees"] = entry["agrees"] and out["agrees"]
            print(
                f"  {name:<20} rows {out['rows']:>11,}  {out['seconds']:8.3f} s  "
                f"peak RSS +{(out['rss_bytes'] or 0) / 2**20:8.1f} MiB  agrees {out['agrees']}",
                flush=True,
            )
    for entry in results.values():
        entry["seconds"] = statistics.median(entry["all_seconds"])
        entry["rss_bytes"] = max(r or 0 for r in entry["all_rss"])
        entry["extrapolated"] = entry["rows"] < args.rows
        entry["seconds_at_rows"] = entry["seconds"] * args.rows / entry["rows"]
    os.remove(path)
    return results


def report_lengths(results: dict[str, dict[str, Any]], rows: int) -> list[str]:
    headers = [
        "case / method",
        "rows run",
        "time [s]",
        "ns/row",
        f"s at {rows:,}",
        "x ours",
        "peak RSS MiB",
        "B/row",
        "agrees",
    ]
    table = []
    for case in LENGTH_CASES:
        ours = results[f"lengths/{case}/ours"]["seconds_at_rows"]
        methods = [*LENGTH_METHODS, "numpy"] if case == "a" else list(LENGTH_METHODS)
        for method in methods:
            r = results[f"lengths/{case}/{method}"]
            label = {
                "ours": "ours: column_lengths",
                "loop": "per-row Python loop",
                "map": "ds.map(batched=True)",
                "numpy": "ds.with_format('numpy')['n'][:]",
            }[method]
            at_rows = fmt(r["seconds_at_rows"], ".2f") + (" extrap." if r["extrapolated"] else "")
            table.append(
                [
                    f"{CASE_NAMES[case]}: {label}",
                    f"{r['rows']:,}",
                    fmt(r["seconds"]),
                    fmt(1e9 * r["seconds"] / r["rows"], ".1f"),
                    at_rows,
                    fmt(r["seconds_at_rows"] / ours, ".1f"),
                    fmt(r["rss_bytes"] / 2**20, ".0f"),
                    fmt(r["rss_bytes"] / r["rows"], ".1f"),
                    "yes" if r["agrees"] else "NO",
                ]
            )
    print_table(headers, table)
    lines = []
    worst = max(results[f"lengths/{c}/ours"]["seconds_at_rows"] for c in LENGTH_CASES)
    measured = all(not results[f"lengths/{c}/ours"]["extrapolated"] for c in LENGTH_CASES)
    if rows >= 100_000_000 and measured:
        ok = worst < 10.0
        lines.append(
            f"[{'PASS' if ok else 'FAIL'}] lengths of {rows:,} rows in < 10 s, every case: "
            f"slowest {worst:.2f} s"
        )
    for case in LENGTH_CASES:
        ours = results[f"lengths/{case}/ours"]["seconds_at_rows"]
        loop = results[f"lengths/{case}/loop"]["seconds_at_rows"]
        mapped = results[f"lengths/{case}/map"]["seconds_at_rows"]
        lines.append(
            f"{CASE_NAMES[case]}: ours {ours:.2f} s; per-row loop {loop / ours:,.0f}x slower, "
            f"ds.map {mapped / ours:,.0f}x slower (extrapolated from "
            f"{results[f'lengths/{case}/loop']['rows']:,} and "
            f"{results[f'lengths/{case}/map']['rows']:,} rows)"
        )
    agree = all(r["agrees"] for r in results.values())
    lines.append(f"[{'PASS' if agree else 'FAIL'}] every result equals the n column")
    for line in lines:
        print("  " + line)
    return lines


# -- 2. token counts ------------------------------------------------------------------------------


def make_sentences(count: int, seed: int = 0) -> list[str]:
    """``count`` sentences of Zipf-distributed pseudo-words (lognormal length, median 20)."""
    rng = np.random.default_rng(seed)
    letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
    vocab = np.array(
        ["".join(rng.choice(letters, size=int(k))) for k in rng.integers(2, 11, size=5000)]
    )
    weights = 1.0 / np.arange(1, vocab.size + 1)
    words_per = np.clip(np.rint(rng.lognormal(np.log(20), 0.5, size=count)), 1, 200).astype(int)
    picks = vocab[rng.choice(vocab.size, size=int(words_per.sum()), p=weights / weights.sum())]
    ends = np.cumsum(words_per)
    return [" ".join(picks[e - k : e]) + "." for e, k in zip(ends, words_per, strict=True)]


def train_tokenizer(texts: Sequence[str]) -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=8000,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def child_tokens(spec: dict[str, Any]) -> dict[str, Any]:
    import datasets
    from tokenizers import Tokenizer

    from lightning_varbatch import tokenized_lengths

    datasets.disable_progress_bars()
    ds = datasets.load_from_disk(spec["data"])
    tok = Tokenizer.from_file(spec["tokenizer"])
    method = spec["method"]
    out: dict[str, Any] = {"rows": len(ds)}
    if method in ("loop", "encode_batch"):
        texts = list(ds["text"])
        if method == "loop":
            seconds, counts = timed(lambda: [len(tok.encode(t).ids) for t in texts])
        else:
            seconds, counts = timed(lambda: [len(e.ids) for e in tok.encode_batch(texts)])
        result = np.asarray(counts, dtype=np.int64)
    elif method in ("ours", "ours_np2"):
        num_proc = 2 if method == "ours_np2" else None
        seconds, result = timed(
            lambda: tokenized_lengths(
                ds, tok, "text", num_proc=num_proc, cache_dir=None, progress=False
            )
        )
    elif method == "ours_cache":
        cache = spec["cache"]
        seconds, result = timed(
            lambda: tokenized_lengths(ds, tok, "text", cache_dir=cache, progress=False)
        )
        out["seconds_cached"], again = timed(
            lambda: tokenized_lengths(ds, tok, "text", cache_dir=cache, progress=False)
        )
        out["cached_agrees"] = bool(np.array_equal(again, result))
    else:
        raise ValueError(method)
    np.save(spec["out"], result)
    out["seconds"] = seconds
    out["tokens"] = int(result.sum())
    return out


def measure_tokens(args: argparse.Namespace, tmp: str) -> dict[str, dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    texts = make_sentences(args.texts)
    tok = train_tokenizer(texts[:20_000])
    tok_path = os.path.join(tmp, "tokenizer.json")
    tok.save(tok_path)
    data = os.path.join(tmp, "texts")
    datasets.Dataset.from_dict({"text": texts}).save_to_disk(data)
    words = sum(t.count(" ") + 1 for t in texts)
    print(
        f"  {len(texts):,} sentences ({words / len(texts):.1f} words, "
        f"{sum(map(len, texts)) / len(texts):.0f} characters on average), byte-level BPE "
        f"vocabulary {tok.get_vocab_size()} trained on {min(len(texts), 20_000):,} of them",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    counts: dict[str, list[np.ndarray]] = {}
    plan = ["loop", "encode_batch", "ours", "ours_np2", "ours_cache"]
    for rnd in range(args.rounds):
        for method in plan if rnd % 2 == 0 else plan[::-1]:
            out_npy = os.path.join(tmp, f"counts_{method}_{rnd}.npy")
            spec = {
                "part": "tokens",
                "method": method,
                "data": data,
                "tokenizer": tok_path,
                "cache": os.path.join(tmp, f"cache_{rnd}"),  # a cold cache every round
                "out": out_npy,
            }
            out = measure(spec, args.quick)
            counts.setdefault(method, []).append(np.load(out_npy))
            found = {f"tokens/{method}": out}
            if method == "ours_cache":
                found = {
                    "tokens/ours_first": out,
                    "tokens/ours_cached": {**out, "seconds": out["seconds_cached"]},
                }
            for name, entry in found.items():
                kept = results.setdefault(name, {**entry, "all_seconds": []})
                kept["all_seconds"].append(entry["seconds"])
                kept["cached_agrees"] = kept.get("cached_agrees", True) and entry.get(
                    "cached_agrees", True
                )
                print(
                    f"  round {rnd}: {name:<20} {entry['seconds']:8.3f} s  "
                    f"{entry['tokens']:,} tokens",
                    flush=True,
                )
    for entry in results.values():
        entry["seconds"] = statistics.median(entry["all_seconds"])
    truth = counts["loop"][0]
    for name, entry in results.items():
        method = name.split("/")[1]
        key = "ours_cache" if method in ("ours_first", "ours_cached") else method
        same = all(np.array_equal(got, truth) for got in counts[key])
        entry["agrees"] = same and entry["cached_agrees"]
    return results


def report_tokens(results: dict[str, dict[str, Any]]) -> list[str]:
    loop = results["tokens/loop"]["seconds"]
    rows = results["tokens/loop"]["rows"]
    table = []
    for method in TOKEN_METHODS:
        r = results[f"tokens/{method}"]
        table.append(
            [
                TOKEN_NAMES[method],
                fmt(r["seconds"]),
                fmt(rows / r["seconds"], ",.0f"),
                fmt(loop / r["seconds"], ".2f"),
                "yes" if r["agrees"] else "NO",
            ]
        )
    print_table(["method", "time [s]", "texts/s", "x loop", "counts agree"], table)
    ours = results["tokens/ours"]["seconds"]
    cached = results["tokens/ours_cached"]["seconds"]
    agree = all(r["agrees"] for r in results.values())
    lines = [
        f"tokenized_lengths (num_proc=None) {loop / ours:.2f}x the per-row loop; num_proc=2 "
        f"{loop / results['tokens/ours_np2']['seconds']:.2f}x; cached second call "
        f"{cached * 1e3:.1f} ms ({ours / cached:,.0f}x faster than counting)",
        f"[{'PASS' if agree else 'FAIL'}] the counts of every configuration agree "
        f"({results['tokens/loop']['tokens']:,} tokens in {rows:,} texts)",
    ]
    for line in lines:
        print("  " + line)
    return lines


# -- 3. collated examples/s -----------------------------------------------------------------------


def make_pairs(count: int, seed: int = 0) -> tuple[np.ndarray, list[np.ndarray], list[np.ndarray]]:
    """WMT-like (source, target) lengths, and per field its Arrow offsets and int32 ids."""
    from lightning_varbatch.planner import wmt_like_lengths

    lengths = wmt_like_lengths(count, seed=seed).astype(np.int64)
    rng = np.random.default_rng(seed + 1)
    offsets, values = [], []
    for j in range(2):
        off = np.zeros(count + 1, dtype=np.int32)
        np.cumsum(lengths[:, j], out=off[1:])
        offsets.append(off)
        values.append(rng.integers(4, 32_000, size=int(off[-1]), dtype=np.int32))
    return lengths, offsets, values


def build_dataset(kind: str, pairs: int, tmp: str) -> tuple[Any, np.ndarray]:
    """The dataset of configuration ``kind`` and its (n, 2) lengths (not timed)."""
    import datasets
    import pyarrow as pa
    import torch

    from lightning_varbatch import column_lengths

    datasets.disable_progress_bars()
    lengths, offsets, values = make_pairs(pairs)
    if kind == "list":
        fields = [
            torch.from_numpy(v.astype(np.int64)).split(lengths[:, j].tolist())
            for j, v in enumerate(values)
        ]
        data = [{"source": s, "target": t} for s, t in zip(*fields, strict=True)]
        return data, lengths
    if kind == "disk":
        path = os.path.join(tmp, f"pairs_{pairs}")
        ds = datasets.load_from_disk(path)
    else:
        columns = {
            name: pa.ListArray.from_arrays(pa.array(o), pa.array(v))
            for name, o, v in zip(("source", "target"), offsets, values, strict=True)
        }
        ds = datasets.Dataset.from_dict(columns)
    planned = column_lengths(ds, ("source", "target"))
    assert np.array_equal(planned, lengths)
    return ds, planned


def make_loader(data: Any, lengths: np.ndarray, max_tokens: int, workers: int) -> Any:
    from lightning_varbatch import PaddingCollate, TokenBudgetBatchSampler, token_budget_dataloader

    sampler = TokenBudgetBatchSampler(lengths, max_tokens, rank=0, world_size=1, seed=0)
    return token_budget_dataloader(data, sampler, collate_fn=PaddingCollate(), num_workers=workers)


def child_loader(spec: dict[str, Any]) -> dict[str, Any]:
    data, lengths = build_dataset(spec["kind"], spec["pairs"], spec["tmp"])
    loader = make_loader(data, lengths, spec["max_tokens"], spec["workers"])

    def epoch() -> tuple[int, int, int]:
        examples = batches = tokens = 0
        for batch in loader:
            examples += int(batch["nexamples"])
            tokens += int(batch["input_tokens"])
            batches += 1
        return examples, batches, tokens

    seconds, (examples, batches, tokens) = timed(epoch)
    return {"seconds": seconds, "examples": examples, "batches": batches, "tokens": tokens}


def child_verify(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    loaders = []
    for kind in LOADER_KINDS:
        data, lengths = build_dataset(kind, spec["pairs"], spec["tmp"])
        loaders.append(make_loader(data, lengths, spec["max_tokens"], 0))
    compared = 0
    identical = True
    for batches in zip(*loaders, strict=True):
        first = batches[0]
        for other in batches[1:]:
            if set(other) != set(first):
                identical = False
            for key, value in first.items():
                got = other.get(key)
                if isinstance(value, torch.Tensor):
                    same = (
                        isinstance(got, torch.Tensor)
                        and got.dtype == value.dtype
                        and torch.equal(got, value)
                    )
                else:
                    same = got == value
                identical = identical and bool(same)
        compared += 1
    return {"batches": compared, "identical": identical}


def child_profile(spec: dict[str, Any]) -> dict[str, Any]:
    texts = {}
    for kind in ("list", "hf"):
        data, lengths = build_dataset(kind, spec["pairs"], spec["tmp"])
        loader = make_loader(data, lengths, spec["max_tokens"], 0)
        prof = cProfile.Profile()
        prof.enable()
        for _ in loader:
            pass
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        texts[kind] = buf.getvalue()
    return texts


def measure_loader(args: argparse.Namespace, tmp: str) -> dict[str, dict[str, Any]]:
    import datasets

    datasets.disable_progress_bars()
    for pairs in sorted({args.pairs, args.verify_pairs}):
        ds, _ = build_dataset("hf", pairs, tmp)
        ds.save_to_disk(os.path.join(tmp, f"pairs_{pairs}"))
    lengths, _, _ = make_pairs(args.pairs)
    print(
        f"  {args.pairs:,} pairs, {int(lengths.sum()):,} tokens (source median "
        f"{np.median(lengths[:, 0]):.0f}, longest {lengths.max()}), max_tokens {args.max_tokens}",
        flush=True,
    )
    verify = measure(
        {"part": "verify", "pairs": args.verify_pairs, "tmp": tmp, "max_tokens": args.max_tokens},
        args.quick,
    )
    print(
        f"  identical batches (list / hf / disk, {args.verify_pairs:,} pairs, "
        f"{verify['batches']} batches): {verify['identical']}",
        flush=True,
    )
    results: dict[str, dict[str, Any]] = {}
    plan = [(k, w) for w in WORKERS for k in LOADER_KINDS]
    for rnd in range(args.rounds):
        for kind, workers in plan if rnd % 2 == 0 else plan[::-1]:
            spec = {
                "part": "loader",
                "kind": kind,
                "workers": workers,
                "pairs": args.pairs,
                "tmp": tmp,
                "max_tokens": args.max_tokens,
            }
            out = measure(spec, args.quick)
            name = f"loader/{kind}/w{workers}"
            entry = results.setdefault(name, {**out, "all_seconds": []})
            entry["all_seconds"].append(out["seconds"])
            print(
                f"  round {rnd}: {name:<16} {out['seconds']:7.2f} s  "
                f"{out['examples'] / out['seconds']:>9,.0f} examples/s  {out['batches']} batches",
                flush=True,
            )
    for entry in results.values():
        entry["seconds"] = statistics.median(entry["all_seconds"])
        entry["examples_per_s"] = entry["examples"] / entry["seconds"]
        entry["identical_batches"] = verify["identical"]
    if args.profile:
        prof = measure(
            {"part": "profile", "pairs": args.pairs, "tmp": tmp, "max_tokens": args.max_tokens},
            args.quick,
        )
        for kind, text in prof.items():
            print(f"\n  cProfile, {kind}, num_workers=0 (by cumulative time):\n{text}")
    return results


def report_loader(results: dict[str, dict[str, Any]]) -> list[str]:
    table = []
    for workers in WORKERS:
        base = results[f"loader/list/w{workers}"]["examples_per_s"]
        for kind in LOADER_KINDS:
            r = results[f"loader/{kind}/w{workers}"]
            table.append(
                [
                    f"{LOADER_NAMES[kind]}, num_workers={workers}",
                    str(r["batches"]),
                    fmt(r["seconds"], ".2f"),
                    fmt(min(r["all_seconds"]), ".2f"),
                    fmt(r["examples_per_s"], ",.0f"),
                    fmt(r["tokens"] / r["seconds"], ",.0f"),
                    fmt(r["examples_per_s"] / base, ".2f"),
                ]
            )
    print_table(
        ["dataset", "batches", "epoch [s]", "best [s]", "examples/s", "tokens/s", "x list"],
        table,
    )
    lines = []
    for workers in WORKERS:
        base = results[f"loader/list/w{workers}"]["examples_per_s"]
        for kind in ("hf", "disk"):
            ratio = results[f"loader/{kind}/w{workers}"]["examples_per_s"] / base
            lines.append(
                f"[{'PASS' if ratio >= 1.0 else 'FAIL'}] {LOADER_NAMES[kind]} not slower than "
                f"the list, num_workers={workers}: {ratio:.2f}x"
            )
    identical = all(r["identical_batches"] for r in results.values())
    lines.append(f"[{'PASS' if identical else 'FAIL'}] list, hf and disk give identical batches")
    for line in lines:
        print("  " + line)
    return lines


# -- main -----------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Hugging Face datasets benchmark (see the docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test sizes (< 60 s)")
    p.add_argument("--only", nargs="+", choices=("lengths", "tokens", "loader"), default=None)
    p.add_argument("--rows", type=int, default=None, help="rows for the lengths (100M)")
    p.add_argument("--baseline-rows", type=int, default=None, help="per-row loop's rows (1M)")
    p.add_argument("--map-rows", type=int, default=None, help="ds.map baseline's rows (100k)")
    p.add_argument("--texts", type=int, default=None, help="sentences to count (200k)")
    p.add_argument("--pairs", type=int, default=None, help="pairs for the loader (200k)")
    p.add_argument("--verify-pairs", type=int, default=None, help="pairs compared (20k)")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--profile", action="store_true", help="cProfile list vs hf loaders")
    p.add_argument("--tmp", default=None, help="where the temporary data go")
    p.add_argument("--json", default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    defaults = {
        "rows": (200_000, 100_000_000),
        "baseline_rows": (5_000, 1_000_000),
        "map_rows": (2_000, 100_000),
        "texts": (2_000, 200_000),
        "pairs": (2_000, 200_000),
        "verify_pairs": (2_000, 20_000),
    }
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.quick:
        args.rounds = min(args.rounds, 1)
    if args.tmp is not None:  # the children run from the repository root
        args.tmp = os.path.abspath(args.tmp)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        child_main(json.loads(args.child))
        return 0
    parts = args.only or ["lengths", "tokens", "loader"]
    command = (
        "python -m benchmarks.sources.hf_datasets" + (" " + " ".join(argv or sys.argv[1:])).rstrip()
    )
    print("command:", command)
    print("machine:", machine_line(versions(), with_load=True))
    print("uptime:", uptime())
    configs: dict[str, dict[str, Any]] = {}
    summary: dict[str, list[str]] = {}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lvb_hf_bench_", dir=args.tmp) as tmp:
        if "lengths" in parts:
            print(f"\n== 1. lengths of {args.rows:,} rows (column_lengths)", flush=True)
            found = measure_lengths(args, tmp)
            configs.update(found)
            print()
            summary["lengths"] = report_lengths(found, args.rows)
        if "tokens" in parts:
            print(f"\n== 2. token counts of {args.texts:,} texts (tokenized_lengths)", flush=True)
            found = measure_tokens(args, tmp)
            configs.update(found)
            print()
            summary["tokens"] = report_tokens(found)
        if "loader" in parts:
            print(f"\n== 3. collated examples/s, {args.pairs:,} pairs", flush=True)
            found = measure_loader(args, tmp)
            configs.update(found)
            print()
            summary["loader"] = report_loader(found)
    print(f"\nwall time {time.perf_counter() - t_start:.0f} s; uptime after: {uptime()}")
    write_json(
        args.json,
        {
            "command": command,
            "machine": machine_line(versions()),
            "settings": {k: v for k, v in vars(args).items() if k not in ("child", "json")},
            "configs": configs,
            "summary": summary,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
