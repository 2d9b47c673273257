"""PNG plots from the benchmarks' JSON output (small files: 100 dpi, few points).

Usage (after ``python -m benchmarks``, which calls it)::

    python -m benchmarks.plots --results benchmarks/runs --out benchmarks

Draws, for each JSON file present: ``planning/baselines.png`` (time per rank-epoch relative to
ours, padding efficiency and per-step imbalance of every method), ``training/throughput.png``
(and ``gpu/throughput.png`` if that JSON exists: real target tokens/sec and padded fraction of
(a), (b), (c)), ``training/straggler.png`` (all-reduce wait and compute gap per dealing).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections.abc import Sequence
from typing import Any

COLORS = {"a": "#1f77b4", "b": "#d62728", "c": "#ff7f0e"}
LABELS = {"a": "(a) ours", "b": "(b) random B", "c": "(c) sorted B"}


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_throughput(data: dict[str, Any], path: str, title: str) -> str:
    plt = _plt()
    cfg = data["configs"]
    kinds = [k for k in ("a", "b", "c") if k in cfg]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
    x = range(len(kinds))
    ax1.bar(x, [cfg[k]["tps_median"] for k in kinds], color=[COLORS[k] for k in kinds])
    for i, k in enumerate(kinds):
        ax1.plot([i] * len(cfg[k]["tps"]), cfg[k]["tps"], "k.", ms=4)
        ax1.text(
            i, cfg[k]["tps_median"], f"{cfg[k]['speedup_vs_b']:.2f}x", ha="center", va="bottom"
        )
    ax1.set_xticks(list(x), [LABELS[k] for k in kinds])
    ax1.set_ylabel("real target tokens / s")
    ax1.set_title(
        f"(a)/(b) {data['speedup']:.2f}x; padding predicts {data['predicted']:.2f}x", fontsize=9
    )
    ax2.bar(x, [cfg[k]["pad_fraction"] for k in kinds], color=[COLORS[k] for k in kinds])
    ax2.set_xticks(list(x), [LABELS[k] for k in kinds])
    ax2.set_ylabel("padded fraction of slots")
    ax2.set_ylim(0, 1)
    peaks = [cfg[k].get("peak_mb") for k in kinds]
    if all(p is not None for p in peaks):
        for i, p in enumerate(peaks):
            ax2.text(i, cfg[kinds[i]]["pad_fraction"], f"peak {p:.0f} MB", ha="center", va="bottom")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_straggler(data: dict[str, Any], path: str) -> str:
    plt = _plt()
    cfg = data["configs"]
    kinds = list(cfg)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(8, 3.2))
    for ax, key, label in (
        (ax1, "wait_s", "wait at all-reduce [s], both ranks"),
        (ax2, "compute_gap_s", "per-step compute gap [s], summed"),
    ):
        meds = [statistics.median(cfg[k][key]) for k in kinds]
        ax.bar(range(len(kinds)), meds, color=["#1f77b4", "#d62728", "#ff7f0e"][: len(kinds)])
        for i, k in enumerate(kinds):
            ax.plot([i] * len(cfg[k][key]), cfg[k][key], "k.", ms=4)
        ax.set_xticks(range(len(kinds)), kinds)
        ax.set_ylabel(label)
    fig.suptitle("Straggler cost, 2 CPU processes (gloo); dots: rounds", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _label(method: str, n: int) -> str:
    if "n=" in method:
        return method
    size = f"{n / 1e6:g}M" if n >= 1_000_000 else f"{n // 1000}k"
    return f"{method} (n={size})"


def plot_planning(data: dict[str, Any], path: str) -> str:
    plt = _plt()
    perf = [
        p
        for p in data["performance"]
        if p.get("rank_s") is not None and p.get("ours_s") and not p["method"].startswith("floor")
    ]
    qual = [q for q in data["quality"] if q.get("pad eff") not in (None, "-")]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
    ratios = [p["rank_s"] / p["ours_s"] for p in perf]
    ax1.barh(range(len(perf)), ratios, color="#1f77b4")
    ax1.set_xscale("log")
    ax1.axvline(1.0, color="k", lw=0.8)
    ax1.set_yticks(range(len(perf)), [_label(p["method"], p["n"]) for p in perf], fontsize=7)
    ax1.invert_yaxis()
    ax1.set_xlabel("one rank's epoch: time / ours (same n, same run)", fontsize=8)
    y = range(len(qual))
    ax2.barh([i - 0.2 for i in y], [float(q["pad eff"]) for q in qual], 0.4, label="pad eff")
    imb = [float(q["imb quad"]) if q["imb quad"] != "-" else 0.0 for q in qual]
    ax2.barh(
        [i + 0.2 for i in y], [v - 1.0 for v in imb], 0.4, label="per-step imbalance (quad) - 1"
    )
    labels = [_label(q["method"], int(str(q["n"]).replace(",", ""))) for q in qual]
    ax2.set_yticks(list(y), labels, fontsize=7)
    ax2.invert_yaxis()
    ax2.legend(fontsize=7, loc="lower center", bbox_to_anchor=(0.5, 1.0), ncol=2, frameon=False)
    ax2.set_xlabel("padding efficiency; excess imbalance", fontsize=8)
    fig.suptitle("Planning an epoch: WMT-like lengths, 8 ranks, 16384 tokens", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _load(path: str) -> dict[str, Any] | None:
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data: dict[str, Any] = json.load(f)
    return data


def _out(out_dir: str, folder: str, name: str) -> str:
    os.makedirs(os.path.join(out_dir, folder), exist_ok=True)
    return os.path.join(out_dir, folder, name)


def draw_all(results_dir: str, out_dir: str) -> list[str]:
    """Every plot whose JSON is in ``results_dir``; returns the written paths."""
    os.makedirs(out_dir, exist_ok=True)
    written = []
    if (d := _load(os.path.join(results_dir, "planning_epoch.json"))) is not None:
        written.append(plot_planning(d, _out(out_dir, "planning", "baselines.png")))
    for name, title in (
        ("training_throughput", "CPU training throughput, same examples, same steps"),
        ("gpu_throughput", "GPU training throughput (Transformer-base, bf16)"),
    ):
        if (d := _load(os.path.join(results_dir, f"{name}.json"))) is not None:
            where, _, file = name.partition("_")
            path = _out(out_dir, "training" if where == "training" else "gpu", f"{file}.png")
            written.append(plot_throughput(d, path, title))
    if (d := _load(os.path.join(results_dir, "training_straggler.json"))) is not None:
        written.append(plot_straggler(d, _out(out_dir, "training", "straggler.png")))
    return written


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Draw the benchmark plots from their JSON output.")
    p.add_argument("--results", default=os.path.join("benchmarks", "runs"))
    p.add_argument("--out", default="benchmarks")
    args = p.parse_args(argv)
    for path in draw_all(args.results, args.out):
        print(f"{path} ({os.path.getsize(path) // 1024} KB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
