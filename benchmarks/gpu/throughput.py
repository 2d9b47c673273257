"""Training throughput on one CUDA GPU: Transformer-base, bf16 autocast. Not part of CI.

The measurements of :mod:`benchmarks.training.throughput` (read its docstring): the same
examples trained once with (a) our token-budget batches, (b) random fixed-size batches of the
same mean size, (c) length-sorted fixed-size batches; real target tokens/sec, padded fraction,
peak memory (``torch.cuda.max_memory_allocated`` over the loop, above what the model and the
pre-built batches hold), the speed-up of (a) over (b) against the one the padding predicts.
Each configuration runs in a fresh process (``--tiny``: all in this process, one round),
interleaved over ``--rounds`` rounds.

Run from the repository root on a machine with one CUDA GPU (venv active, a CUDA build of
torch)::

    python -m benchmarks.gpu.throughput                 # about 3-5 min on one H100-class GPU
    python -m benchmarks.gpu.throughput --rounds 3 --target-tokens 4000000 --json gpu.json
    python -m benchmarks.gpu.throughput --device cpu --tiny   # smoke test of the code path

Defaults: Transformer-base (Vaswani et al. 2017): ``d_model=512``, 8 heads, 6 + 6 layers,
FFN 2048, dropout 0.1, shared vocabulary 32000, tied embeddings; WMT14 en-de-like lengths
unscaled (median 24, p99 110, longest 256); ``max_tokens=16384`` per batch (padded
``n * max(src, tgt)``); 2M real target tokens per configuration; bf16 autocast, loss in fp32;
Adam; 5 warm-up steps untimed. (b) uses fixed batches of the mean size of (a) (about 470
examples): its longest batches are ~470 x 256 tokens, ~8 GB of bf16 logits with vocabulary
32000; lower ``--max-tokens`` on a GPU with less than ~40 GB.

Without CUDA it refuses (exit code 2) unless ``--device cpu`` is given.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace

from benchmarks.harness import (
    add_child_options,
    command_line,
    gpu_line,
    refuse_device,
    torch_machine_line,
    write_json,
)
from benchmarks.training.throughput import (
    child_main,
    describe,
    report,
    run_all_configs,
)
from benchmarks.workload import CONFIGS, DEFAULTS, TranslationSettings

MODULE = "benchmarks.gpu.throughput"


def base_settings(args: argparse.Namespace) -> TranslationSettings:
    s = replace(
        DEFAULTS,
        target_tokens=args.target_tokens,
        length_scale=1.0,
        max_tokens=args.max_tokens,
        vocab=32000,
        d_model=512,
        nhead=8,
        layers=6,
        ffn=2048,
        warmup=5,
        threads=args.threads,
        seed=args.seed,
        device=args.device,
        bf16=not args.fp32,
    )
    if args.tiny:  # exercises every code path in seconds, on any device
        s.target_tokens, s.d_model, s.nhead, s.layers, s.ffn, s.vocab = 3000, 32, 2, 1, 64, 500
        s.max_tokens, s.length_scale, s.warmup = 1024, 0.5, 2
    return s


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GPU training throughput (see the module docstring).")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny model and data: smoke test")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-tokens", type=int, default=2_000_000)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_child_options(p, CONFIGS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.settings)
    if refuse_device(
        MODULE, args.device, args.tiny, "Transformer-base", "benchmarks.training.throughput"
    ):
        return 2
    s = base_settings(args)
    if args.tiny:
        args.rounds = 1
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    if s.device.startswith("cuda"):
        print("gpu:", gpu_line())
    describe(s)
    results = run_all_configs(MODULE, s, args.rounds, in_process=args.tiny)
    print(
        f"\ntraining throughput (median of {args.rounds} interleaved rounds; tok/s = real target "
        "tokens per second of step time; pad frac = 1 - real / padded source+target slots; "
        "peak = "
        + ("max_memory_allocated" if s.device.startswith("cuda") else "RSS high-water")
        + " rise over the loop, max over rounds)"
    )
    numbers = report(results, s, "peak MB", smoke=args.tiny)
    write_json(args.json, numbers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
