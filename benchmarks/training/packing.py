"""Padding-free packing (issue 16): FLOP balance across ranks, and training tokens/s on CPU.

Run from the repository root (venv active)::

    python -m benchmarks.training.packing            # ~5 min on 2 idle CPU cores
    python -m benchmarks.training.packing --quick    # smoke test, about 25 s

A full run writes ``benchmarks/results/packing.json`` (``benchmarks.training.tables`` renders it).
**Part 1**, per-step FLOP imbalance across 8 ranks (pure planning), is
:mod:`benchmarks.training.packing_flops` (its docstring defines documents, schedules, columns).

**Part 2: training tokens/s on CPU.** ``examples.lm.model.CausalLM`` (``d_model=64``, 4 heads,
2 layers, FFN 256, vocabulary 512; AdamW lr 1e-3, no dropout), one torch thread, fp32, trained
once over the same documents (random token ids) in every configuration: the Part 1 lengths / 8
(``--length-div``; median 48, longest 1024), the first ones that sum to ``--target-tokens``
(default 100,000), a budget of 2,048 tokens.

* **(i) packed**: ``layout="packed"`` plan, ``PackingCollate`` rows,
  :func:`~lightning_varbatch.attention.document_attention` (its ``"sdpa"`` backend on CPU).
* **(ii) padded**: ``layout="padded"`` plan, ``PaddingCollate(loss_offset=1)``, causal SDPA.
* **(iii) random fixed B**: a random permutation cut into batches of ``B = round(budget / mean
  length)`` documents, padded to each batch's longest (a plain ``DataLoader``).

Each run is a fresh process (``--quick``: in this process), interleaved ``i ii iii``, ``iii ii
i`` over ``--rounds`` rounds; batches are built before timing; a step is forward + loss +
backward + optimizer step, the first ``warmup`` untimed. **real tok/s** = real document tokens
of the timed steps / their summed step time; ratios are paired (against (iii) or (ii) of the same
round). :mod:`benchmarks.gpu.packing` runs Part 2 on one CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from benchmarks.harness import (
    TrainingSettings,
    add_child_options,
    command_line,
    emit_result,
    fmt,
    print_table,
    run_training_child,
    torch_machine_line,
    write_json,
)
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.training.packing_flops import (
    LONGEST,
    MEDIAN,
    describe_lengths,
    part_one,
    sft_lengths,
)

TRAIN_CONFIGS = ("packed", "padded", "random")
TRAIN_NAMES = {
    "packed": "(i) ours: packed rows",
    "padded": "(ii) ours: padded layout",
    "random": "(iii) random fixed B",
}
FIRST_TOKEN = 3
MODULE = "benchmarks.training.packing"
MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.diagnostics",
    "lightning_varbatch.planner.flops",
    "lightning_varbatch.data.packed_collate",
    "lightning_varbatch.data.collate",
    "lightning_varbatch.attention.choice",
    "examples.lm.model",
]
"""The package modules the benchmark measures (their import closure is fingerprinted)."""
BENCH = [MODULE, "benchmarks.training.packing_flops"]


# -- Part 2: training tokens/s -------------------------------------------------------------------


@dataclass(kw_only=True)
class LMSettings(TrainingSettings):
    """Everything a training run depends on (passed to child processes as JSON)."""

    target_tokens: int = 100_000
    """Real tokens of the documents (the first ones that reach them)."""
    length_div: int = 8
    """Divisor of the Part 1 lengths."""
    backend: str = "auto"
    """``document_attention`` backend of the packed rows."""


DEFAULTS = LMSettings(max_tokens=2048, vocab=512, d_model=64, nhead=4, layers=2, ffn=256, lr=1e-3)
"""The CPU sizes of Part 2 (:mod:`benchmarks.gpu.packing` replaces them)."""


@dataclass
class TrainResult:
    kind: str
    steps: int
    timed_steps: int
    timed_s: float
    timed_real: int
    real: int
    slots: int
    docs_mean: float
    slots_max: int
    fixed_batch: int
    backend: str
    peak_mb: float | None
    step_s: list[float] = field(default_factory=list)


def train_lengths(s: LMSettings) -> np.ndarray:
    """The first documents of the Part 1 distribution (/ ``length_div``) with enough tokens."""
    n = max(16, 2 * s.target_tokens // max(1, MEDIAN // s.length_div))
    while True:
        lengths = sft_lengths(n, s.seed, s.length_div)
        lengths = np.minimum(lengths, s.max_tokens)
        total = np.cumsum(lengths)
        if total[-1] >= s.target_tokens:
            return lengths[: int(np.searchsorted(total, s.target_tokens)) + 1]
        n *= 2


def train_batches(kind: str, lengths: np.ndarray, s: LMSettings) -> tuple[list[np.ndarray], int]:
    """(micro-batches of document ids, the fixed batch size B of (iii)) for ``kind``."""
    from lightning_varbatch import EpochPlanner, PlanConfig, transformer_flops

    fixed = max(1, round(s.max_tokens / float(lengths.mean())))
    if kind == "random":
        order = np.random.default_rng([s.seed, 18]).permutation(lengths.size)
        return [order[i : i + fixed] for i in range(0, lengths.size, fixed)], fixed
    if kind == "packed":
        fa = transformer_flops(s.d_model).flop_attention
        config = PlanConfig(
            max_tokens=s.max_tokens, layout="packed", flop_attention=fa, seed=s.seed
        )
    elif kind == "padded":
        config = PlanConfig(max_tokens=s.max_tokens, seed=s.seed)
    else:
        raise ValueError(f"unknown configuration {kind!r}; expected one of {TRAIN_CONFIGS}")
    plan = EpochPlanner(lengths, config).plan(0, 1, 1)
    return [plan.micro_batch(step, 0) for step in range(plan.num_steps)], fixed


def collate(kind: str, ids: np.ndarray, tokens: list[Any]) -> dict[str, Any]:
    """The model's batch: a packed row for (i), a right-padded batch for (ii) and (iii)."""
    from lightning_varbatch import PackingCollate, PaddingCollate

    items = [{"tokens": tokens[i]} for i in ids.tolist()]
    keep: tuple[str, ...]
    if kind == "packed":
        batch = PackingCollate()(items)
        keep = ("input_ids", "position_ids", "cu_seqlens", "max_seqlen", "labels")
    else:
        batch = PaddingCollate(loss_offset=1)(items)
        keep = ("tokens", "tokens_mask")
    return {k: batch[k] for k in keep}


def run_train(kind: str, s: LMSettings) -> TrainResult:
    """Train one configuration once over the documents; time every step."""
    import torch

    from examples.lm.model import CausalLM
    from lightning_varbatch.attention import select_backend

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    lengths = train_lengths(s)
    batches, fixed = train_batches(kind, lengths, s)
    if s.max_steps is not None:
        batches = batches[: s.max_steps]
    g = torch.Generator().manual_seed(s.seed)
    tokens = [torch.randint(FIRST_TOKEN, s.vocab, (int(n),), generator=g) for n in lengths]
    data = [collate(kind, ids, tokens) for ids in batches]
    moved = [
        {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in data
    ]
    del data
    model = CausalLM(
        vocab_size=s.vocab,
        d_model=s.d_model,
        nhead=s.nhead,
        num_layers=s.layers,
        dim_feedforward=s.ffn,
        dropout=0.0,
        attention_backend=s.backend,
    ).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if s.bf16 else torch.float32
    backend = "sdpa (padded)"
    if kind == "packed":
        probe = torch.zeros(1, 1, 8, device=device, dtype=dtype)
        backend = select_backend(probe, backend=s.backend)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times: list[float] = []
    reals: list[int] = []
    for ids, batch in zip(batches, moved, strict=True):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            loss_sum, ntokens = model.loss_sum(batch)
        (loss_sum / ntokens.clamp(min=1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        reals.append(int(lengths[ids].sum()))
    peak_mb = None
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    w = min(s.warmup, max(0, len(times) - 1))
    slots = [
        int(lengths[ids].sum()) if kind == "packed" else len(ids) * int(lengths[ids].max())
        for ids in batches
    ]
    return TrainResult(
        kind=kind,
        steps=len(times),
        timed_steps=len(times) - w,
        timed_s=sum(times[w:]),
        timed_real=sum(reals[w:]),
        real=sum(reals),
        slots=sum(slots),
        docs_mean=float(np.mean([len(b) for b in batches])),
        slots_max=max(slots),
        fixed_batch=fixed,
        backend=backend,
        peak_mb=peak_mb,
        step_s=times,
    )


def spawn(module: str, kind: str, s: LMSettings) -> TrainResult:
    """Configuration ``kind`` in a fresh ``python -m <module> --child <kind>`` process."""
    return TrainResult(**run_training_child(module, kind, s))


def child_main(kind: str, settings: str) -> int:
    """A child's work (``--child KIND --settings JSON``): one run, reported as a result line."""
    emit_result(asdict(run_train(kind, LMSettings.from_json(settings))))
    return 0


def run_training(
    module: str, s: LMSettings, rounds: int, in_process: bool
) -> dict[str, list[TrainResult]]:
    """Every configuration ``rounds`` times, interleaved, each in a fresh process by default."""
    out: dict[str, list[TrainResult]] = {k: [] for k in TRAIN_CONFIGS}
    for r in range(rounds):
        order = TRAIN_CONFIGS if r % 2 == 0 else tuple(reversed(TRAIN_CONFIGS))
        for kind in order:
            res = run_train(kind, s) if in_process else spawn(module, kind, s)
            out[kind].append(res)
            print(
                f"  round {r} {TRAIN_NAMES[kind]:<26} {res.steps:4d} steps, "
                f"{res.timed_s:7.2f} s timed, {res.timed_real / res.timed_s:9,.0f} real tok/s",
                flush=True,
            )
    return out


def report_training(results: dict[str, list[TrainResult]], peak: bool) -> dict[str, Any]:
    """Print the training table; return its numbers."""
    tps = {k: [r.timed_real / r.timed_s for r in runs] for k, runs in results.items()}
    base = statistics.median(tps["random"])
    headers = ["configuration", "steps", "docs/batch", "max slots", "slots/real"]
    headers += ["real tok/s", "min..max", "x (iii)", "attention"]
    if peak:
        headers.append("peak MB")
    rows = []
    out: dict[str, Any] = {"configs": {}}
    for kind in TRAIN_CONFIGS:
        r0 = results[kind][0]
        med = statistics.median(tps[kind])
        row = [
            TRAIN_NAMES[kind],
            str(r0.steps),
            f"{r0.docs_mean:.1f}",
            f"{r0.slots_max:,}",
            f"{r0.slots / r0.real:.3f}",
            f"{med:,.0f}",
            f"{min(tps[kind]):,.0f}..{max(tps[kind]):,.0f}",
            f"{med / base:.2f}",
            r0.backend,
        ]
        peaks = [r.peak_mb for r in results[kind] if r.peak_mb is not None]
        if peak:
            row.append(fmt(max(peaks) if peaks else None, ".0f"))
        rows.append(row)
        out["configs"][kind] = {
            "tps_median": med,
            "tps": tps[kind],
            "speedup_vs_random": med / base,
            # paired: this configuration over (iii), (ii), of the same round
            "vs_random_rounds": [a / b for a, b in zip(tps[kind], tps["random"], strict=True)],
            "vs_padded_rounds": [a / b for a, b in zip(tps[kind], tps["padded"], strict=True)],
            "steps": r0.steps,
            "slots_per_real": r0.slots / r0.real,
            "docs_mean": r0.docs_mean,
            "fixed_batch": r0.fixed_batch,
            "backend": r0.backend,
            "peak_mb": max(peaks) if peaks else None,
        }
    print_table(headers, rows)
    return out


def describe_training(s: LMSettings) -> None:
    lengths = train_lengths(s)
    describe_lengths(f"training documents (Part 1 lengths / {s.length_div})", lengths)
    print(
        f"model: CausalLM d_model={s.d_model}, {s.layers} layers, {s.nhead} heads, FFN "
        f"{s.ffn}, vocab {s.vocab}; budget {s.max_tokens} tokens; (iii) B = "
        f"{max(1, round(s.max_tokens / float(lengths.mean())))}; device {s.device}, "
        + ("bf16 autocast" if s.bf16 else "fp32")
        + f"; torch.set_num_threads({s.threads})"
    )


# -- the script ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = DEFAULTS
    p = argparse.ArgumentParser(description="Packing benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test (< 45 s), all in-process")
    p.add_argument("--docs", type=int, default=200_000, help="documents of Part 1")
    p.add_argument("--rounds", type=int, default=2, help="interleaved training rounds")
    p.add_argument("--target-tokens", type=int, default=d.target_tokens)
    p.add_argument("--length-div", type=int, default=d.length_div)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "packing")
    add_child_options(p, TRAIN_CONFIGS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.settings)
    s = replace(
        DEFAULTS, target_tokens=args.target_tokens, length_div=args.length_div, seed=args.seed
    )
    if args.quick:
        args.docs, args.rounds = 4_000, 1
        s.target_tokens, s.max_steps = 6000, 4
    settings = {"docs": args.docs, "rounds": args.rounds, "quick": args.quick, **asdict(s)}
    run = Run("packing", settings=settings, package=MEASURED, bench=BENCH)
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    lengths = sft_lengths(args.docs, args.seed)
    stats = describe_lengths("Part 1 documents (lognormal, median 384, sigma 1.0)", lengths)
    print(
        f"  p99 / median = {stats['p99_over_median']:.1f} (>= 8 required), max "
        f"{stats['max']} (<= {LONGEST})"
    )
    flops = part_one(lengths, args.seed, smoke=args.quick)
    print(
        f"\nPart 2: training tokens/s ({'in-process, 1 round, ' if args.quick else ''}median of "
        f"{args.rounds} interleaved round(s); real tok/s = non-padding document tokens per "
        "second of step time; slots/real = token slots computed per real token)"
    )
    describe_training(s)
    results = run_training(MODULE, s, args.rounds, in_process=args.quick)
    training = report_training(results, peak=False)
    print("machine after:", torch_machine_line())
    numbers = {
        "lengths": stats,
        "flops": flops,
        "training": training,
        "settings": asdict(s),
        "passed": flops["passed"],
    }
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
