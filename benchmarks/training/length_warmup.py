"""Training with and without the planner's sequence-length warm-up: the LM example on CPU.

Run from the repository root::

    python -m benchmarks.training.length_warmup --runs-dir /tmp/lwt \\
        --png benchmarks/training/length_warmup.png
    python -m benchmarks.training.length_warmup --runs-dir /tmp/lwt --no-train  # plot only

Each run is ``examples/lm/train.py`` with its defaults (packed rows, ``data.max_tokens=2048``,
300 optimizer steps, about 1.2 epochs of 19,500 documents, AdamW with 30 warm-up steps and a
cosine decay) at the default peak learning rate (``model.lr=3e-3``) and at 4x it, without a
length warm-up and with ``data.length_warmup=100`` (a third of the run, 40 % of epoch 0) from
``length_warmup_min=8`` along the ``root`` (Li et al.) and ``linear`` schedules, for seeds 0, 1
and 2 (``seed`` also draws the split, the shuffle and the initial weights). Every step holds the
same token budget with or without the warm-up, so the runs train on the same number of tokens
(``train/total_tokens`` is printed to show it). Validation every 50 steps on the 500 held-out
documents. Two runs at a time, one torch thread each.

The figure: the validation loss against the step (mean over the seeds) per learning rate, the
training loss (mean over the seeds, every 5 steps), and the realised cap the
``TokenThroughputMonitor`` logged (``train/length_cap``) for seed 0.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.harness import run_program

LRS = {"default": 3.0e-3, "4x": 1.2e-2}
WARMUPS: dict[str, list[str]] = {
    "none": [],
    "root": ["data.length_warmup=100", "data.length_warmup_schedule=root"],
    "linear": ["data.length_warmup=100", "data.length_warmup_schedule=linear"],
}
SEEDS = (0, 1, 2)


def run_name(lr: str, warmup: str, seed: int) -> str:
    return f"lr{lr}-{warmup}-s{seed}"


def train(runs_dir: Path, lr: str, warmup: str, seed: int) -> None:
    """One run of the LM example into ``runs_dir/<name>`` (skipped when it finished before)."""
    out = runs_dir / run_name(lr, warmup, seed)
    if (out / "metrics.json").exists():
        return
    command = [
        sys.executable,
        "examples/lm/train.py",
        f"output_dir={out}",
        f"seed={seed}",
        f"model.lr={LRS[lr]}",
        *WARMUPS[warmup],
        "trainer.val_check_interval=50",
        "trainer.log_every_n_steps=5",
        "trainer.enable_progress_bar=false",
        "callbacks.checkpoint.enabled=false",
    ]
    out.mkdir(parents=True, exist_ok=True)
    run_program(command, out.with_suffix(".log"))


def read_run(out: Path) -> dict[str, Any]:
    """Train/val loss curves, the logged cap and the run's totals from one run's logs."""
    curves: dict[str, dict[int, float]] = {"train/loss": {}, "val/loss": {}, "train/length_cap": {}}
    with open(out / "logs" / "version_0" / "metrics.csv") as f:
        for row in csv.DictReader(f):
            for key, curve in curves.items():
                if row.get(key):
                    curve[int(row["step"]) + 1] = float(row[key])  # steps done
    final = json.loads((out / "metrics.json").read_text())
    return {
        "curves": {k: sorted(v.items()) for k, v in curves.items()},
        "val_loss": float(final["val/loss"]),
        "tokens": float(final["train/total_tokens"]),
        "examples": float(final["train/total_examples"]),
    }


def summarise(runs_dir: Path) -> dict[str, Any]:
    """Every finished run, and per (lr, warm-up) the seeds' final validation losses."""
    runs, table = {}, {}
    for lr in LRS:
        for warmup in WARMUPS:
            finals, tokens, at100 = [], [], []
            for seed in SEEDS:
                out = runs_dir / run_name(lr, warmup, seed)
                if not (out / "metrics.json").exists():
                    continue
                run = runs[out.name] = read_run(out)
                finals.append(run["val_loss"])
                tokens.append(run["tokens"])
                at100.append(dict(run["curves"]["val/loss"]).get(100, float("nan")))
            if finals:
                table[f"{lr}/{warmup}"] = {
                    "seeds": len(finals),
                    "val_loss": finals,
                    "val_loss_mean": float(np.mean(finals)),
                    "val_loss_at_100": at100,
                    "tokens": tokens,
                }
    return {"runs": runs, "table": table}


def print_table(table: dict[str, Any]) -> None:
    print("| lr | warm-up | seeds | val loss at step 100 (mean) | final val loss per seed | mean |")
    print("|---|---|---|---|---|---|")
    for key, row in table.items():
        lr, warmup = key.split("/")
        finals = " / ".join(f"{v:.3f}" for v in row["val_loss"])
        early = float(np.nanmean(row["val_loss_at_100"]))
        print(
            f"| {lr} ({LRS[lr]:g}) | {warmup} | {row['seeds']} | {early:.3f} | {finals} | "
            f"{row['val_loss_mean']:.4f} |"
        )
    tokens = {t for row in table.values() for t in row["tokens"]}
    print(f"\ntraining loss tokens per run: {sorted(tokens)}")


def plot(summary: dict[str, Any], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = summary["runs"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    colours = {"none": "black", "root": "tab:blue", "linear": "tab:orange"}
    styles = {"default": "-", "4x": "--"}

    def mean_curve(lr: str, warmup: str, key: str) -> tuple[np.ndarray, np.ndarray] | None:
        curves = [
            dict(runs[run_name(lr, warmup, s)]["curves"][key])
            for s in SEEDS
            if run_name(lr, warmup, s) in runs
        ]
        if not curves:
            return None
        steps = sorted(set.intersection(*(set(c) for c in curves)))
        return np.array(steps), np.array([np.mean([c[s] for c in curves]) for s in steps])

    for lr in LRS:
        for warmup in WARMUPS:
            label = f"lr {LRS[lr]:g}, warm-up {warmup}"
            style = {"color": colours[warmup], "linestyle": styles[lr]}
            val = mean_curve(lr, warmup, "val/loss")
            if val is not None:
                axes[0].plot(*val, marker="o", label=label, **style)
            tr = mean_curve(lr, warmup, "train/loss")
            if tr is not None:
                axes[1].plot(*tr, label=label, alpha=0.8, **style)
            name = run_name(lr, warmup, 0)
            if lr == "default" and warmup != "none" and name in runs:
                caps = runs[name]["curves"]["train/length_cap"]
                if caps:
                    axes[2].step(*zip(*caps, strict=True), where="post", label=warmup, **style)
    axes[0].set(title="validation loss (mean of seeds)", xlabel="optimizer step", ylabel="loss")
    axes[0].set_ylim(top=3.0)
    axes[1].set(title="training loss (mean of seeds)", xlabel="optimizer step", ylabel="loss")
    axes[1].set_ylim(1.5, 4.0)
    axes[2].set(
        title="train/length_cap (seed 0)", xlabel="optimizer step", ylabel="longest document"
    )
    axes[0].legend(fontsize=7)
    axes[2].legend(fontsize=8)
    fig.suptitle(
        "LM example (packed, 2,048 tokens/step, 300 steps): with and without a length warm-up"
        " of 100 steps, same tokens"
    )
    fig.tight_layout()
    fig.savefig(png, dpi=110)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs-dir", type=Path, required=True)
    parser.add_argument("--png", type=Path, default=Path("benchmarks/training/length_warmup.png"))
    parser.add_argument("--json", type=Path, default=None, help="write the summary here")
    parser.add_argument("--no-train", action="store_true", help="only read finished runs")
    parser.add_argument("--parallel", type=int, default=2)
    args = parser.parse_args(argv)
    if not args.no_train:
        jobs = [(lr, w, s) for s in SEEDS for lr in LRS for w in WARMUPS]
        with ThreadPoolExecutor(args.parallel) as pool:
            list(pool.map(lambda job: train(args.runs_dir, *job), jobs))
    summary = summarise(args.runs_dir)
    print_table(summary["table"])
    plot(summary, args.png)
    if args.json is not None:
        args.json.write_text(json.dumps(summary["table"], indent=1))


if __name__ == "__main__":
    main()
