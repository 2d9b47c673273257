"""Hugging Face ``datasets`` as a source (issue 14): lengths, token counts, collated batches.

Run from the repository root (venv active; no network needed)::

    python -m benchmarks.sources.hf_datasets            # full run (~4 min on 2 idle cores):
                                                        # writes benchmarks/results/hf_datasets.json
    python -m benchmarks.sources.hf_datasets --quick    # smoke test, ~10 s; writes nothing
    python -m benchmarks.sources.hf_datasets --only lengths --rows 100000000 --no-result

Every measurement runs in a **fresh subprocess** (``python -m benchmarks.sources.hf_<part>
--child``; ``--quick``: all in this process, a smoke test of the code paths). Every figure
is shown next to a baseline measured in the same run: each of ``--rounds`` (default 3)
rounds measures ours and the baselines, in an order rotated by round, and a ratio is taken
within a round; the tables give its median and its range over the rounds. Temporary data go
to a fresh folder under ``--tmp`` (default: the system's temp dir), deleted at the end.

**1. Lengths** (:func:`lightning_varbatch.sources.column_lengths`, :mod:`.hf_lengths`) of
``--rows`` rows (default 10M; ``--quick`` 200k; issue 14's target is stated at 100M: pass
``--rows 100000000``, about 2 GiB of disk and 7 GB of memory for the shuffle). The data are
written with pyarrow as an Arrow IPC *stream* file in record batches of 1,000 rows (what
``datasets`` writes) and opened with ``datasets.Dataset.from_file`` (memory-mapped; page
cache warm). Columns: ``n`` (int32 lengths, 1 + Poisson(5), mean 6) and ``ids``
(``list<int16>`` token ids with those lengths). Cases: **(a)** the int32 column ``n``;
**(b)** the token-id column ``ids`` (list lengths from the Arrow offsets); **(c)** ``ids``
after ``ds.shuffle(seed=0)`` (an indices mapping; the shuffle itself is not timed). Ours runs
on every row in a process of its own. Baselines, in one other process per case and round, on
the first rows (for (c) of the shuffled dataset): a **per-row Python loop**
(``[len(x) for x in ds["ids"]]``, for (a) ``[x for x in ds["n"]]``) on ``--baseline-rows``
rows (default 100k; ``--quick`` 5k), **``ds.map(batched=True)``** computing the lengths
(``load_from_cache_file=False``) on ``--map-rows`` rows (default 10k; ``--quick`` 2k), and for
(a) ``ds.with_format("numpy")["n"][:]`` on every row. ``x ours``: a baseline's time per row
over ours, in the same round. **Peak memory**: the rise of the process's resident-set
high-water mark over the call (``VmHWM``, reset through ``/proc/self/clear_refs``;
:func:`benchmarks.harness.rss_peak`), per row; it includes the mapped file pages the call
touches and the returned ``int64`` array (8 B/row). Every result is checked against the ``n``
column (through the shuffle's indices for (c)).

**2. Token counts** (:func:`lightning_varbatch.sources.tokenized_lengths`, :mod:`.hf_tokens`)
of ``--texts`` generated sentences (default 20k; ``--quick`` 2k; Zipf-distributed
pseudo-words, lognormal sentence lengths, median 20 words) in a ``datasets.Dataset`` saved to
disk and reloaded, with a byte-level BPE ``tokenizers.Tokenizer`` (vocabulary 8000) trained
on the fly (no download): ``num_proc=None`` and ``num_proc=2`` (no cache), and with the cache
on, the first call (counts and writes the ``.npy``) and the second (reads it). Baseline: the
per-row loop ``[len(tok.encode(t).ids) for t in texts]`` (the texts already a Python list,
untimed). Reference: one ``tok.encode_batch(texts)`` call (the tokenizer's own floor, without
``Dataset.map``). ``x loop``: the loop's time over the configuration's, same round (each round
with a cold cache). The counts of every configuration and round must agree.

**3. Collated examples/s** (:mod:`.hf_loader`) through
:func:`lightning_varbatch.token_budget_dataloader` with the default
:class:`~lightning_varbatch.PaddingCollate`, one epoch of
``TokenBudgetBatchSampler(lengths, max_tokens=--max-tokens (4096), world_size=1, seed=0)``,
on ``--pairs`` (default 50k; ``--quick`` 2k) (source, target) pairs with WMT-like lengths
(:func:`~lightning_varbatch.planner.synthetic.wmt_like_lengths`) and random ids: **list**: a
list of dicts of int64 tensors (the item path); **hf**: the same ids in a
``datasets.Dataset.from_dict`` of Arrow ``list<int32>`` columns (in memory); **disk**: that
dataset ``save_to_disk`` + ``load_from_disk`` (memory-mapped). One process per kind and
round times an epoch with ``num_workers`` 0 and 2 (worker start-up included); examples/s =
pairs / seconds (median over rounds); ``x list``: the list's epoch time over the kind's, same
round and ``num_workers``. Once, every batch of an epoch of all three is compared tensor by
tensor (``--verify-pairs``, default 5k). ``--profile`` adds a cProfile of list vs hf.

Every loader process runs torch with 1 thread (``torch.set_num_threads(1)``, what DataLoader
workers do themselves): on busy shared cores the collate's small tensor ops cost
milliseconds each under 2 OpenMP threads, which would swamp both paths alike.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from benchmarks.harness import machine_line, uptime, write_json
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.sources import hf_loader, hf_tokens
from benchmarks.sources.hf_common import versions
from benchmarks.sources.hf_lengths import config_names as length_configs
from benchmarks.sources.hf_lengths import measure_lengths, report_lengths
from benchmarks.sources.tables import hf_lengths_table, hf_loader_table, hf_tokens_table

PACKAGE = [
    "lightning_varbatch.sources.arrow_lengths",
    "lightning_varbatch.sources.tokenized_lengths",
    "lightning_varbatch.data.loader",
    "lightning_varbatch.data.collate",
    "lightning_varbatch.data.sampler",
    "lightning_varbatch.planner.synthetic",
]
"""The package modules the benchmark measures (their import closure is fingerprinted)."""
BENCH = [
    "benchmarks.sources.hf_datasets",
    "benchmarks.sources.hf_common",
    "benchmarks.sources.hf_lengths",
    "benchmarks.sources.hf_tokens",
    "benchmarks.sources.hf_loader",
]


def config_names() -> list[str]:
    """Every configuration the full and quick runs report (the results' ``configs`` keys)."""
    return length_configs() + hf_tokens.config_names() + hf_loader.config_names()


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Hugging Face datasets benchmark (see the docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test sizes (~10 s)")
    p.add_argument("--only", nargs="+", choices=("lengths", "tokens", "loader"), default=None)
    p.add_argument("--rows", type=int, default=None, help="rows for the lengths (10M)")
    p.add_argument("--baseline-rows", type=int, default=None, help="per-row loop's rows (100k)")
    p.add_argument("--map-rows", type=int, default=None, help="ds.map baseline's rows (10k)")
    p.add_argument("--texts", type=int, default=None, help="sentences to count (20k)")
    p.add_argument("--pairs", type=int, default=None, help="pairs for the loader (50k)")
    p.add_argument("--verify-pairs", type=int, default=None, help="pairs compared (5k)")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--rounds", type=int, default=None, help="interleaved rounds (3)")
    p.add_argument("--profile", action="store_true", help="cProfile list vs hf loaders")
    p.add_argument("--tmp", default=None, help="where the temporary data go")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "hf_datasets")
    args = p.parse_args(argv)
    defaults = {
        "rows": (200_000, 10_000_000),
        "baseline_rows": (5_000, 100_000),
        "map_rows": (2_000, 10_000),
        "texts": (2_000, 20_000),
        "pairs": (2_000, 50_000),
        "verify_pairs": (2_000, 5_000),
        "rounds": (1, 3),
    }
    for name, (quick, full) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    if args.tmp is not None:  # the children run from the repository root
        args.tmp = os.path.abspath(args.tmp)
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    parts = args.only or ["lengths", "tokens", "loader"]
    settings = {k: v for k, v in vars(args).items() if k not in ("json", "result", "tmp")}
    run = Run("hf_datasets", settings=settings, package=PACKAGE, bench=BENCH)
    print("command:", "python -m benchmarks.sources.hf_datasets", *(argv or sys.argv[1:]))
    print("machine:", machine_line(versions(), with_load=True))
    results: dict[str, Any] = {"configs": {}, "summary": {}}
    configs, summary = results["configs"], results["summary"]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="lvb_hf_bench_", dir=args.tmp) as tmp:
        if "lengths" in parts:
            print(f"\n== 1. lengths of {args.rows:,} rows (column_lengths)", flush=True)
            configs.update(measure_lengths(args, tmp))
            summary["lengths"] = report_lengths(configs, args.rows)
        if "tokens" in parts:
            print(f"\n== 2. token counts of {args.texts:,} texts (tokenized_lengths)", flush=True)
            configs.update(hf_tokens.measure_tokens(args, tmp))
            summary["tokens"] = hf_tokens.report_tokens(configs)
        if "loader" in parts:
            print(f"\n== 3. collated examples/s, {args.pairs:,} pairs", flush=True)
            configs.update(hf_loader.measure_loader(args, tmp))
            summary["loader"] = hf_loader.report_loader(configs)
    results["rows"], results["wall_s"] = args.rows, time.perf_counter() - t_start
    record = run.record(results)
    for part, table in (
        ("lengths", hf_lengths_table),
        ("tokens", hf_tokens_table),
        ("loader", hf_loader_table),
    ):
        if part in parts:
            print(f"\n{table(record)}")
    print(f"wall time {results['wall_s']:.0f} s; uptime after: {uptime()}")
    write_json(args.json, results)
    if args.only and args.result is None:
        print("(--only: a partial run writes no result file unless given --result PATH)")
        return 0
    run.write(results, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
