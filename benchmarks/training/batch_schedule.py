"""Training at equal tokens with and without a batch-size schedule: the LM example on CPU.

Run from the repository root (issue 32)::

    python -m benchmarks.training.batch_schedule          # 12 runs, ~5 min idle (~10 busy)
    python -m benchmarks.training.batch_schedule --quick  # smoke test, seconds

A full run writes ``benchmarks/results/batch_schedule_training.json`` (``--quick`` only with
``--result PATH``); ``benchmarks.training.tables`` renders its table.

Every run trains the LM example's model (:class:`examples.lm.model.CausalLM`, 2 layers, 128
wide) on its embedded documents (19,500 training, 500 held out, cut to 128 tokens) in packed
rows of ``max_tokens=1024`` (one rank: the full step is 1,024 tokens), and stops at the first
step that reaches ``--tokens`` planning tokens, not at a step count. The arms: **schedule**
``none`` or ``ramp`` (``batch_schedule="ramp:0.25:T"``, ``T`` = 30 % of the run's tokens: a
quarter of the full step growing to it at ``T``); **peak learning rate** the example's ``3e-3``
and 3× it; **seed** 0, 1, 2 (shuffle and initial weights; one held-out split for all runs).

The learning rate follows **tokens**, the same in both arms: a linear warm-up over the first
10 % of the tokens, then a cosine decay to 10 % of the peak at ``--tokens``, read at the
midpoint of each step's tokens (a step-based schedule would hand the ramp arm's extra steps a
longer warm-up in tokens). ``BatchSizeLRScaler(rule="sqrt")`` scales every step's rate in both
arms by ``sqrt(step tokens / 1024)`` (the rule for Adam-type optimizers, and that of
``conf/callbacks/default.yaml``).

Reported per arm (median and range over the seeds): steps, the ramp's fill (real tokens over
``keys.STEP_BUDGET`` of the steps under the full step), tokens, the token-weighted training
loss over the last 10 % and the 5 % before the ramp ends, the held-out loss, the ``fit`` time;
and the ramp arm against ``none`` of the same peak rate and seed (differences, ratios).
"""

from __future__ import annotations

import argparse
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Trainer, seed_everything
from omegaconf import OmegaConf

from benchmarks.harness import command_line, fmt, print_table, torch_machine_line, write_json
from benchmarks.results import Run, add_result_option, result_path
from examples.lm.data import build_documents, encode_documents, length_stats, split_documents
from examples.lm.datamodule import flop_model
from examples.lm.model import CausalLM
from examples.translation import tokenizer as tok
from lightning_varbatch import BatchSizeLRScaler, PackingCollate, TokenBudgetDataModule, keys

MODULE = "benchmarks.training.batch_schedule"
RESULT = "batch_schedule_training"
MEASURED = [
    "examples.lm.model",
    "examples.lm.data",
    "examples.lm.datamodule",
    "examples.translation.tokenizer",
    "lightning_varbatch.callbacks.lr_scaling",
    "lightning_varbatch.callbacks.trainer_adapters",
    "lightning_varbatch.data.packed_collate",
    "lightning_varbatch.data.datamodule",
]
"""The package modules the runs train with (their import closure is fingerprinted)."""
SCHEDULES = ("none", "ramp")
SUMMED = ("steps", "tokens", "train_loss", "train_loss_ramp_end", "val_loss", "seconds")


@dataclass(frozen=True)
class Scale:
    """The sizes of one grid of runs (data, model, tokens, learning rates, seeds, device)."""

    num_docs: int = 20_000
    valid: int = 500
    max_length: int = 128
    vocab_size: int = 1000
    max_tokens: int = 1024
    d_model: int = 128
    nhead: int = 4
    num_layers: int = 2
    dim_feedforward: int = 512
    attention: str = "auto"
    tokens: int = 300_000
    ramp_start: float = 0.25
    ramp_share: float = 0.3
    warmup_share: float = 0.1
    lrs: tuple[float, ...] = (3e-3, 9e-3)
    seeds: tuple[int, ...] = (0, 1, 2)
    device: str = "cpu"
    threads: int = 1

    def schedule(self, name: str) -> str | None:
        """The ``batch_schedule`` setting of arm ``name``."""
        ramp = round(self.ramp_share * self.tokens)
        return None if name == "none" else f"ramp:{self.ramp_start:g}:{ramp}"


FULL = Scale()
QUICK = replace(FULL, num_docs=1200, valid=100, max_length=64, max_tokens=256, tokens=2500)
QUICK = replace(QUICK, d_model=32, nhead=2, num_layers=1, dim_feedforward=64, seeds=(0,))


def lr_factor(tokens: float, total: int, warmup: int) -> float:
    """The learning rate over the peak once ``tokens`` were trained: warm-up, then cosine.

    Example:
        >>> lr_factor(50, 1000, 100), lr_factor(1000, 1000, 100)
        (0.5, 0.1)
    """
    if tokens < warmup:
        return tokens / warmup
    done = min(1.0, (tokens - warmup) / max(1, total - warmup))
    return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * done))


class TokenClockLM(CausalLM):
    """The example's model with its learning rate set by tokens trained, stopping at a total.

    Args:
        total_tokens: stop at the first step that reaches this many planning tokens.
        warmup_tokens: the linear warm-up, in tokens.
        **kwargs: :class:`~examples.lm.model.CausalLM`'s arguments.
    """

    def __init__(self, total_tokens: int, warmup_tokens: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.total_tokens, self.warmup_tokens = total_tokens, warmup_tokens
        self.tokens_trained = 0
        # (tokens after the step, its tokens, its loss, its budget under the schedule)
        self.curve: list[tuple[int, int, float, int]] = []
        self._loss = math.nan

    def configure_optimizers(self) -> Any:
        return super().configure_optimizers()["optimizer"]  # the rate is set per step below

    def on_train_batch_start(self, batch: dict[str, Any], batch_idx: int) -> None:
        mid = self.tokens_trained + int(batch[keys.INPUT_TOKENS]) / 2
        rate = self.hparams["lr"] * lr_factor(mid, self.total_tokens, self.warmup_tokens)
        for optimizer in self.trainer.optimizers:
            for group in optimizer.param_groups:
                group["lr"] = rate  # BatchSizeLRScaler multiplies it for the update alone

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self._loss = float(loss.detach())
        return loss

    def on_train_batch_end(self, outputs: Any, batch: dict[str, Any], batch_idx: int) -> None:
        step = int(batch[keys.INPUT_TOKENS])
        budget = int(batch.get(keys.STEP_BUDGET, 0))
        self.tokens_trained += step
        self.curve.append((self.tokens_trained, step, self._loss, budget))
        if self.tokens_trained >= self.total_tokens:
            self.trainer.should_stop = True


def build_corpus(scale: Scale) -> dict[str, Any]:
    """The example's documents (split with seed 0), a BPE on the training ones, encoded."""
    docs = split_documents(build_documents(scale.num_docs, 0), scale.valid, 0)
    tokenizer = tok.train_or_load_tokenizer(docs["train"], vocab_size=scale.vocab_size)
    corpus = {
        split: encode_documents(tokenizer, docs[split], scale.max_length)
        for split in ("train", "valid")
    }
    return {**corpus, "vocab": tokenizer.get_vocab_size()}


def window_loss(curve: np.ndarray, lo: float, hi: float) -> float:
    """Token-weighted mean training loss of the steps ending in ``(lo, hi]`` tokens."""
    inside = (curve[:, 0] > lo) & (curve[:, 0] <= hi)
    if not inside.any():
        return math.nan
    return float(np.average(curve[inside, 2], weights=curve[inside, 1]))


def train_one(scale: Scale, corpus: dict[str, Any], schedule: str, lr: float, seed: int) -> dict:
    """One run: fit to ``scale.tokens`` tokens, then the held-out loss."""
    (train_items, train_lengths), (val_items, val_lengths) = corpus["train"], corpus["valid"]
    model_args = {
        "d_model": scale.d_model,
        "nhead": scale.nhead,
        "num_layers": scale.num_layers,
        "dim_feedforward": scale.dim_feedforward,
    }
    flops = flop_model(OmegaConf.create(model_args), corpus["vocab"])
    dm = TokenBudgetDataModule(
        train_items,
        train_lengths,
        scale.max_tokens,
        val_dataset=val_items,
        val_lengths=val_lengths,
        loss_offset=1,
        collate=PackingCollate(pad_id=tok.PAD_ID),
        layout="packed",
        flop_attention=float(flops.flop_attention),
        batch_schedule=scale.schedule(schedule),
        seed=seed,
    )
    seed_everything(seed, verbose=False)
    model = TokenClockLM(
        scale.tokens,
        round(scale.warmup_share * scale.tokens),
        vocab_size=corpus["vocab"],
        lr=lr,
        seed=seed,
        attention_backend=scale.attention,
        **model_args,
    )
    cuda = scale.device.startswith("cuda")
    common: dict[str, Any] = {
        "accelerator": "gpu" if cuda else "cpu",
        "devices": 1,
        "precision": "bf16-mixed" if cuda else "32-true",
        "logger": False,
        "enable_checkpointing": False,
        "enable_progress_bar": False,
        "enable_model_summary": False,
    }
    trainer = Trainer(
        max_epochs=1000,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        callbacks=[BatchSizeLRScaler(rule="sqrt")],
        **common,
    )
    start = time.perf_counter()
    trainer.fit(model, datamodule=dm)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    held_out = Trainer(**common).validate(model, datamodule=dm, verbose=False)[0]["val/loss"]
    curve = np.array(model.curve, dtype=np.float64)
    total, ramp_end = scale.tokens, scale.ramp_share * scale.tokens
    small = (curve[:, 3] > 0) & (curve[:, 3] < scale.max_tokens)  # steps under a full budget
    return {
        "schedule": schedule,
        "lr": lr,
        "seed": seed,
        "steps": int(trainer.global_step),
        "tokens": int(model.tokens_trained),
        "smallest_step": int(curve[:, 1].min()),
        "ramp_fill": float(curve[small, 1].sum() / max(1.0, curve[small, 3].sum())),
        "train_loss": window_loss(curve, 0.9 * total, math.inf),
        "train_loss_ramp_end": window_loss(curve, ramp_end - 0.05 * total, ramp_end),
        "val_loss": float(held_out),
        "seconds": seconds,
    }


def run_grid(scale: Scale, json_path: str | None = None, deadline: float = math.inf) -> list[dict]:
    """Every (seed, peak rate, schedule) run; ``json_path`` rewritten after each; no run starts
    after ``deadline`` (``time.perf_counter()``)."""
    torch.set_num_threads(scale.threads)
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)  # no per-Trainer banner
    corpus = build_corpus(scale)
    print(f"training documents: {length_stats(corpus['train'][1])}", flush=True)
    runs: list[dict] = []
    for seed in scale.seeds:
        for lr in scale.lrs:
            for schedule in SCHEDULES:
                if time.perf_counter() > deadline:
                    print("time budget spent: no further runs", flush=True)
                    return runs
                run = train_one(scale, corpus, schedule, lr, seed)
                runs.append(run)
                print(
                    f"lr {lr:g} {schedule:>4} seed {seed}: {run['steps']} steps, "
                    f"{run['tokens']} tokens, train {run['train_loss']:.4f}, held-out "
                    f"{run['val_loss']:.4f}, {run['seconds']:.1f} s",
                    flush=True,
                )
                write_json(json_path, {"scale": asdict(scale), "runs": runs})
    return runs


def _median_range(values: Sequence[float], spec: str = ".3f") -> str:
    if not values:
        return "-"
    if len(values) == 1:
        return fmt(float(values[0]), spec)
    mid = fmt(float(np.median(values)), spec)
    return f"{mid} [{fmt(float(min(values)), spec)}, {fmt(float(max(values)), spec)}]"


def summarise(runs: Sequence[dict]) -> list[dict]:
    """Per (peak rate, schedule): the seeds' values, and the ramp against ``none`` per seed."""
    rows = []
    by_key = {(r["lr"], r["schedule"], r["seed"]): r for r in runs}
    for lr in dict.fromkeys(r["lr"] for r in runs):
        for schedule in SCHEDULES:
            mine = [r for r in runs if r["lr"] == lr and r["schedule"] == schedule]
            if not mine:
                continue
            base = {key[2]: r for key, r in by_key.items() if key[:2] == (lr, "none")}
            pairs = [(r, base[r["seed"]]) for r in mine if r["seed"] in base]
            row: dict[str, Any] = {"lr": lr, "schedule": schedule, "seeds": len(mine)}
            for key in SUMMED:
                row[key] = [r[key] for r in mine]
            row["ramp_fill"] = [r["ramp_fill"] for r in mine if schedule != "none"]
            row["d_val"] = [r["val_loss"] - b["val_loss"] for r, b in pairs]
            row["d_train"] = [r["train_loss"] - b["train_loss"] for r, b in pairs]
            row["steps_ratio"] = [r["steps"] / b["steps"] for r, b in pairs]
            row["time_ratio"] = [r["seconds"] / b["seconds"] for r, b in pairs]
            rows.append(row)
    return rows


def table(rows: Sequence[dict]) -> None:
    """Print the table: medians and [min, max] over the seeds."""
    headers = ["peak lr", "schedule", "seeds", "steps", "ramp fill", "tokens"]
    headers += ["train loss (last 10%)", "train loss (ramp end)", "held-out loss"]
    headers += ["Δ held-out vs none", "Δ train vs none", "steps x", "fit s", "time x"]
    print_table(
        headers,
        [
            [
                f"{row['lr']:g}",
                row["schedule"],
                str(row["seeds"]),
                _median_range(row["steps"], ".0f"),
                _median_range(row["ramp_fill"], ".2f"),
                _median_range(row["tokens"], ".0f"),
                _median_range(row["train_loss"]),
                _median_range(row["train_loss_ramp_end"]),
                _median_range(row["val_loss"]),
                _median_range(row["d_val"], "+.3f"),
                _median_range(row["d_train"], "+.3f"),
                _median_range(row["steps_ratio"], ".2f"),
                _median_range(row["seconds"], ".1f"),
                _median_range(row["time_ratio"], ".2f"),
            ]
            for row in rows
        ],
    )


def describe(scale: Scale) -> None:
    """The settings every run shares."""
    print(
        f"LM: d_model {scale.d_model}, {scale.num_layers} layers, {scale.num_docs - scale.valid}"
        f" training documents cut to {scale.max_length} tokens, packed rows of "
        f"{scale.max_tokens} tokens; {scale.tokens} tokens per run; ramp arm "
        f"batch_schedule={scale.schedule('ramp')!r}; LR by tokens (warm-up "
        f"{scale.warmup_share:.0%}, cosine to 10 %), BatchSizeLRScaler(rule='sqrt'); peak "
        f"rates {', '.join(f'{lr:g}' for lr in scale.lrs)}; seeds {list(scale.seeds)}; "
        f"device {scale.device}, {scale.threads} torch thread(s)",
        flush=True,
    )


def report(
    scale: Scale, runs: Sequence[dict], json_path: str | None, started: float
) -> dict[str, Any]:
    """The table and the JSON of a finished grid; returns the numbers (empty: no run)."""
    rows = summarise(runs)
    if not rows:
        print("no run finished")
        return {}
    print(
        "\nper (peak lr, schedule): median [min, max] over seeds; Δ and x are the ramp arm "
        "minus / over the none arm of the same seed and peak lr, measured in this run\n"
    )
    table(rows)
    print(f"\n{len(runs)} runs in {time.perf_counter() - started:.0f} s")
    numbers = {"scale": asdict(scale), "runs": list(runs), "table": rows}
    write_json(json_path, numbers)
    return numbers


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny model, 1 seed: smoke test")
    parser.add_argument("--tokens", type=int, default=None, help="planning tokens per run")
    parser.add_argument("--seeds", type=int, nargs="+", default=None)
    parser.add_argument("--json", default=None, help="write the runs and the table here")
    add_result_option(parser, RESULT)
    args = parser.parse_args(argv)
    scale = QUICK if args.quick else FULL
    if args.tokens is not None:
        scale = replace(scale, tokens=args.tokens)
    if args.seeds is not None:
        scale = replace(scale, seeds=tuple(args.seeds))
    started = time.perf_counter()
    run = Run(RESULT, settings=asdict(scale), package=MEASURED, bench=[MODULE])
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    describe(scale)
    runs = run_grid(scale, args.json)
    numbers = report(scale, runs, args.json, started)
    if numbers:
        run.write(numbers, result_path(args))
    print("machine after:", torch_machine_line())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
