"""Part 2 of the Hugging Face benchmark: token counts (``tokenized_lengths``).

See :mod:`benchmarks.sources.hf_datasets` for the definitions. Each configuration runs in a
fresh process, in an order rotated by round; ``x loop`` is the per-row loop's time over the
configuration's in the same round.
"""

from __future__ import annotations

import argparse
import os
import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness import timed
from benchmarks.sources.hf_common import Spec, child_main, measure, paired

MODULE = "benchmarks.sources.hf_tokens"
METHODS = ("loop", "encode_batch", "ours", "ours_np2", "ours_first", "ours_cached")
NAMES = {
    "loop": "baseline: [len(tok.encode(t).ids) for t in texts]",
    "encode_batch": "reference: tok.encode_batch(all texts)",
    "ours": "ours: tokenized_lengths, num_proc=None",
    "ours_np2": "ours: tokenized_lengths, num_proc=2",
    "ours_first": "ours: cache on, first call (writes it)",
    "ours_cached": "ours: cache on, second call (reads it)",
}


def config_names() -> list[str]:
    """The ``configs`` keys of this part."""
    return [f"tokens/{m}" for m in METHODS]


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
    """A byte-level BPE tokenizer (vocabulary 8000) trained on ``texts`` (no download)."""
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


def child_run(spec: Spec) -> Spec:
    """Count the tokens one way; the counts go to ``spec["out"]`` (``.npy``)."""
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


def prepare(args: argparse.Namespace, tmp: str) -> tuple[str, str]:
    """The texts saved as a dataset and the trained tokenizer: their paths."""
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
    return data, tok_path


def measure_tokens(args: argparse.Namespace, tmp: str) -> dict[str, dict[str, Any]]:
    """Every configuration of part 2, ``--rounds`` interleaved rounds."""
    data, tok_path = prepare(args, tmp)
    runs: dict[str, list[Spec]] = {}
    counts: dict[str, list[np.ndarray]] = {}
    plan = ["loop", "encode_batch", "ours", "ours_np2", "ours_cache"]
    for rnd in range(args.rounds):
        shift = rnd % len(plan)
        for method in plan[shift:] + plan[:shift]:
            out_npy = os.path.join(tmp, f"counts_{method}_{rnd}.npy")
            spec = {
                "method": method,
                "data": data,
                "tokenizer": tok_path,
                "cache": os.path.join(tmp, f"cache_{rnd}"),  # a cold cache every round
                "out": out_npy,
            }
            out = measure(MODULE, child_run, spec, args.quick)
            counts.setdefault(method, []).append(np.load(out_npy))
            found = {f"tokens/{method}": out}
            if method == "ours_cache":
                found = {
                    "tokens/ours_first": out,
                    "tokens/ours_cached": {**out, "seconds": out["seconds_cached"]},
                }
            for name, entry in found.items():
                runs.setdefault(name, []).append(entry)
                print(
                    f"  round {rnd}: {name:<20} {entry['seconds']:8.3f} s  "
                    f"{entry['tokens']:,} tokens",
                    flush=True,
                )
    truth = counts["loop"][0]
    results: dict[str, dict[str, Any]] = {}
    for name, outs in runs.items():
        method = name.split("/")[1]
        key = "ours_cache" if method in ("ours_first", "ours_cached") else method
        seconds = [o["seconds"] for o in outs]
        loop = [o["seconds"] for o in runs["tokens/loop"]]
        results[name] = {
            "rows": outs[0]["rows"],
            "tokens": outs[0]["tokens"],
            "all_seconds": seconds,
            "seconds": statistics.median(seconds),
            "texts_per_s": outs[0]["rows"] / statistics.median(seconds),
            "x_loop": paired([b / s for b, s in zip(loop, seconds, strict=True)]),
            "agrees": all(np.array_equal(c, truth) for c in counts[key])
            and all(o.get("cached_agrees", True) for o in outs),
        }
    return results


def report_tokens(results: dict[str, dict[str, Any]]) -> list[str]:
    """The part's one-line findings."""
    x = {m: results[f"tokens/{m}"]["x_loop"] for m in METHODS}
    cached = results["tokens/ours_cached"]["seconds"]
    agree = all(r["agrees"] for r in results.values())
    lines = [
        f"tokenized_lengths (num_proc=None) {x['ours']['median']:.2f}x the per-row loop's speed "
        f"({x['ours']['min']:.2f}-{x['ours']['max']:.2f}); num_proc=2 "
        f"{x['ours_np2']['median']:.2f}x; encode_batch {x['encode_batch']['median']:.2f}x; "
        f"cached second call {cached * 1e3:.1f} ms",
        f"[{'PASS' if agree else 'FAIL'}] the counts of every configuration agree "
        f"({results['tokens/loop']['tokens']:,} tokens in {results['tokens/loop']['rows']:,} "
        "texts)",
    ]
    for line in lines:
        print("  " + line)
    return lines


if __name__ == "__main__":
    raise SystemExit(child_main(child_run))
