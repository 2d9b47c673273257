"""Packing on one CUDA GPU: training tokens/s of packed rows, padded batches, random batches.

Part 2 of :mod:`benchmarks.training.packing` (read its docstring) at GPU sizes; Part 1 there (the
per-step FLOP imbalance across ranks) is pure planning and needs no GPU. The same documents are
trained once with (i) our packed rows (``layout="packed"`` plan, ``PackingCollate``,
:func:`~lightning_varbatch.attention.document_attention` with ``backend="auto"``:
FlashAttention's ``flash_attn_varlen_func`` when the ``flash-attn`` package is installed,
else FlexAttention with a document block mask, compiled), (ii) our padded layout
(``PaddingCollate``, causal SDPA) and (iii) random fixed-size batches of ``B = round(budget /
mean length)`` documents padded to each batch's longest; real (non-padding) tokens/s and the
ratio to (iii), peak memory (``torch.cuda.max_memory_allocated`` over the loop, above the model
and the pre-built batches). Each configuration runs in a fresh process, interleaved over
``--rounds`` rounds; the first ``--warmup`` steps of each run (compilation) are untimed.

Run from the repository root on a machine with one CUDA GPU (venv active, a CUDA build of
torch; ``pip install flash-attn`` for the FlashAttention path)::

    python -m benchmarks.gpu.packing                 # not yet timed on a GPU (no GPU so far)
    python -m benchmarks.gpu.packing --rounds 3 --json gpu_packing.json
    python -m benchmarks.gpu.packing --device cpu --tiny   # smoke test of the code path

Defaults: ``examples.lm.model.CausalLM`` with ``d_model=768``, 12 heads, 6 layers, FFN 3072,
vocabulary 16000, bf16 autocast (loss in fp32), AdamW; the Part 1 lengths unscaled (lognormal,
median 384, p99 about 10x the median, longest 8192), budget 16,384 tokens per micro-batch, 2M
real tokens per configuration. (iii)'s batches of about 26 documents pad to up to
26 x 8192 = 213k slots (its logits alone are about 7 GB in bf16): lower ``--budget`` or
``--vocab`` on a GPU with less than ~80 GB.

Without CUDA it refuses (exit code 2, one line on stderr) unless ``--device cpu --tiny``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, replace

from benchmarks.harness import (
    add_child_options,
    command_line,
    gpu_line,
    refuse_device,
    torch_machine_line,
    write_json,
)
from benchmarks.training.packing import (
    DEFAULTS,
    TRAIN_CONFIGS,
    LMSettings,
    child_main,
    describe_training,
    report_training,
    run_training,
)

MODULE = "benchmarks.gpu.packing"


def settings(args: argparse.Namespace) -> LMSettings:
    s = replace(
        DEFAULTS,
        target_tokens=args.target_tokens,
        length_div=1,
        max_tokens=args.budget,
        vocab=args.vocab,
        d_model=args.d_model,
        nhead=args.nhead,
        layers=args.layers,
        ffn=4 * args.d_model,
        lr=3e-4,
        warmup=args.warmup,
        threads=args.threads,
        seed=args.seed,
        device=args.device,
        bf16=not args.fp32 and args.device.startswith("cuda"),
        backend=args.backend,
    )
    if args.tiny:  # every code path in seconds, on any device
        s.target_tokens, s.length_div, s.max_tokens, s.vocab = 3000, 8, 2048, 512
        s.d_model, s.nhead, s.layers, s.ffn, s.warmup, s.max_steps = 32, 2, 1, 64, 1, 6
        s.threads = 1
    return s


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GPU packing throughput (see the module docstring).")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny model and data: smoke test")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-tokens", type=int, default=2_000_000)
    p.add_argument("--budget", type=int, default=16384, help="tokens per micro-batch")
    p.add_argument("--vocab", type=int, default=16000)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--nhead", type=int, default=12)
    p.add_argument("--layers", type=int, default=6)
    p.add_argument("--warmup", type=int, default=5, help="untimed steps per run (compilation)")
    p.add_argument(
        "--backend", default="auto", help="document_attention backend of (i): auto, flash, flex"
    )
    p.add_argument("--threads", type=int, default=4, help="torch CPU threads per run")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--fp32", action="store_true", help="no bf16 autocast")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_child_options(p, TRAIN_CONFIGS)
    return p.parse_args(argv)


def flash_status() -> str:
    """Whether flash-attn is importable (its version), in words."""
    try:
        import flash_attn  # type: ignore[import-not-found]
    except Exception as err:  # ImportError, or a broken CUDA build
        return f"flash-attn not usable ({type(err).__name__}); packed rows use FlexAttention"
    return f"flash-attn {getattr(flash_attn, '__version__', '?')}"


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.settings)
    if refuse_device(MODULE, args.device, args.tiny, "GPU sizes", "benchmarks.training.packing"):
        return 2
    s = settings(args)
    if args.tiny:
        args.rounds = 1
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    cuda = s.device.startswith("cuda")
    if cuda:
        print("gpu:", gpu_line())
        print("attention:", flash_status())
    describe_training(s)
    results = run_training(MODULE, s, args.rounds, in_process=args.tiny)
    print(
        f"\ntraining throughput (median of {args.rounds} interleaved round(s); real tok/s = "
        "non-padding document tokens per second of step time; slots/real = token slots "
        "computed per real token"
        + ("; peak = max_memory_allocated rise over the loop, max over rounds)" if cuda else ")")
    )
    numbers = report_training(results, peak=cuda)
    numbers["settings"] = asdict(s)
    write_json(args.json, numbers)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
