"""Part 3 of the Hugging Face benchmark: collated examples/s through the token-budget loader.

See :mod:`benchmarks.sources.hf_datasets` for the definitions. Each round runs one fresh
process per dataset kind (kinds in an order rotated by round), timing an epoch with
``num_workers`` 0 and 2 (their order alternating by round); ``x list`` is the list's epoch
time over the kind's in the same round, at the same ``num_workers``.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import io
import os
import pstats
import statistics
from typing import Any

import numpy as np

from benchmarks.harness import timed
from benchmarks.sources.hf_common import Spec, child_main, measure, paired

MODULE = "benchmarks.sources.hf_loader"
KINDS = ("list", "hf", "disk")
NAMES = {
    "list": "list of dicts (item path)",
    "hf": "datasets.Dataset.from_dict",
    "disk": "save_to_disk + load_from_disk",
}
WORKERS = (0, 2)


def config_names() -> list[str]:
    """The ``configs`` keys of this part."""
    return [f"loader/{k}/w{w}" for k in KINDS for w in WORKERS]


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
        ds = datasets.load_from_disk(os.path.join(tmp, f"pairs_{pairs}"))
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


def _epoch(loader: Any) -> tuple[int, int, int]:
    examples = batches = tokens = 0
    for batch in loader:
        examples += int(batch["nexamples"])
        tokens += int(batch["input_tokens"])
        batches += 1
    return examples, batches, tokens


def _identical(first: dict[str, Any], other: dict[str, Any]) -> bool:
    import torch

    if set(other) != set(first):
        return False
    for key, value in first.items():
        got = other[key]
        if isinstance(value, torch.Tensor):
            same = isinstance(got, torch.Tensor) and got.dtype == value.dtype
            if not (same and torch.equal(got, value)):
                return False
        elif got != value:
            return False
    return True


def child_run(spec: Spec) -> Spec:
    """``loader``: time the epochs of one kind; ``verify``: compare every kind's batches;
    ``profile``: cProfile list vs hf."""
    import torch

    torch.set_num_threads(1)  # as DataLoader workers do; see hf_datasets' docstring
    if spec["part"] == "loader":
        data, lengths = build_dataset(spec["kind"], spec["pairs"], spec["tmp"])
        out = {}
        for workers in spec["workers"]:
            loader = make_loader(data, lengths, spec["max_tokens"], workers)
            seconds, (examples, batches, tokens) = timed(functools.partial(_epoch, loader))
            out[f"w{workers}"] = {
                "seconds": seconds,
                "examples": examples,
                "batches": batches,
                "tokens": tokens,
            }
        return out
    if spec["part"] == "verify":
        loaders = []
        for kind in KINDS:
            data, lengths = build_dataset(kind, spec["pairs"], spec["tmp"])
            loaders.append(make_loader(data, lengths, spec["max_tokens"], 0))
        compared, identical = 0, True
        for group in zip(*loaders, strict=True):
            identical = identical and all(_identical(group[0], b) for b in group[1:])
            compared += 1
        return {"batches": compared, "identical": identical}
    texts = {}
    for kind in ("list", "hf"):
        data, lengths = build_dataset(kind, spec["pairs"], spec["tmp"])
        loader = make_loader(data, lengths, spec["max_tokens"], 0)
        prof = cProfile.Profile()
        prof.enable()
        _epoch(loader)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(25)
        texts[kind] = buf.getvalue()
    return texts


def measure_loader(args: argparse.Namespace, tmp: str) -> dict[str, dict[str, Any]]:
    """Every configuration of part 3, ``--rounds`` interleaved rounds."""
    for pairs in sorted({args.pairs, args.verify_pairs}):
        ds, _ = build_dataset("hf", pairs, tmp)
        ds.save_to_disk(os.path.join(tmp, f"pairs_{pairs}"))
    lengths, _, _ = make_pairs(args.pairs)
    print(
        f"  {args.pairs:,} pairs, {int(lengths.sum()):,} tokens (source median "
        f"{np.median(lengths[:, 0]):.0f}, longest {lengths.max()}), max_tokens {args.max_tokens}",
        flush=True,
    )
    common = {"tmp": tmp, "max_tokens": args.max_tokens}
    spec = {"part": "verify", "pairs": args.verify_pairs, **common}
    verify = measure(MODULE, child_run, spec, args.quick)
    print(
        f"  identical batches (list / hf / disk, {args.verify_pairs:,} pairs, "
        f"{verify['batches']} batches): {verify['identical']}",
        flush=True,
    )
    runs: dict[str, list[Spec]] = {}
    for rnd in range(args.rounds):
        shift = rnd % len(KINDS)
        workers = list(WORKERS if rnd % 2 == 0 else WORKERS[::-1])
        for kind in KINDS[shift:] + KINDS[:shift]:
            spec = {"part": "loader", "kind": kind, "workers": workers, "pairs": args.pairs}
            for key, out in measure(MODULE, child_run, {**spec, **common}, args.quick).items():
                runs.setdefault(f"loader/{kind}/{key}", []).append(out)
                print(
                    f"  round {rnd}: loader/{kind}/{key:<4} {out['seconds']:7.2f} s  "
                    f"{out['examples'] / out['seconds']:>9,.0f} examples/s  "
                    f"{out['batches']} batches",
                    flush=True,
                )
    results: dict[str, dict[str, Any]] = {}
    for name, outs in runs.items():
        seconds = [o["seconds"] for o in outs]
        base = [o["seconds"] for o in runs[f"loader/list/{name.rsplit('/', 1)[1]}"]]
        results[name] = {
            **{k: outs[0][k] for k in ("examples", "batches", "tokens")},
            "all_seconds": seconds,
            "seconds": statistics.median(seconds),
            "examples_per_s": outs[0]["examples"] / statistics.median(seconds),
            "x_list": paired([b / s for b, s in zip(base, seconds, strict=True)]),
            "identical_batches": verify["identical"],
        }
    if args.profile:
        prof = measure(MODULE, child_run, {"part": "profile", "pairs": args.pairs, **common})
        for kind, text in prof.items():
            print(f"\n  cProfile, {kind}, num_workers=0 (by cumulative time):\n{text}")
    return results


def report_loader(results: dict[str, dict[str, Any]]) -> list[str]:
    """The part's one-line findings."""
    lines = []
    for workers in WORKERS:
        for kind in ("hf", "disk"):
            x = results[f"loader/{kind}/w{workers}"]["x_list"]
            verdict = "not slower" if x["min"] >= 1.0 else "slower" if x["max"] < 1.0 else "mixed"
            lines.append(
                f"{NAMES[kind]} / list, num_workers={workers}: {x['median']:.2f}x "
                f"({x['min']:.2f}-{x['max']:.2f} over rounds): {verdict}"
            )
    identical = all(r["identical_batches"] for k, r in results.items() if k.startswith("loader/"))
    lines.append(f"[{'PASS' if identical else 'FAIL'}] list, hf and disk give identical batches")
    for line in lines:
        print("  " + line)
    return lines


if __name__ == "__main__":
    raise SystemExit(child_main(child_run))
