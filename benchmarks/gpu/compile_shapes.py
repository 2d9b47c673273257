"""The shape budget on one CUDA GPU: K static shapes under CUDA graphs, compiled and eager.

The GPU counterpart of Part 2 of :mod:`benchmarks.training.compile_shapes` (read its docstring): its
causal Transformer LM (``compile_shapes_workload.make_model``: pre-norm blocks, SDPA with a boolean
``causal & key`` mask, tied embeddings, the summed next-token loss) is trained on the
micro-batches of a ``max_shapes=K`` plan (``compile_shapes_workload.train_batches``:
``TokenBudgetBatchSampler(..., max_shapes=K, loss_lengths=lengths - 1)`` and
``PaddingCollate(loss_offset=1)``), bf16 autocast, AdamW, three times in one process:

* **eager**: the model as it is;
* **reduce-overhead**: ``torch.compile(model, mode="reduce-overhead", dynamic=False)``
  (inductor with CUDA graphs, ``torch.compiler.cudagraph_mark_step_begin()`` before each step);
* **default**: ``torch.compile(model, dynamic=False)``.

Each compiled arm runs with ``torch._dynamo.config.recompile_limit = K`` and
``fail_on_recompile_limit_hit = True`` (a recompile beyond K would fail, not fall back to eager
silently) and asserts ``graphs == distinct shapes`` (dynamo's ``unique_graphs``). Per arm:
steps, distinct shapes, graphs, graph breaks, the steps that compiled and their summed time,
CUDA-graph tree nodes recorded and CUDA-graph skips (``counters["inductor"]["cudagraph_skips"]``),
steady real (non-padding) tokens/s over the steps after each shape's first ``--skip-first``
(2: compilation, then CUDA graphs' warm-up run and recording) occurrences, the ratio to eager,
and whether losses and weights stayed finite. Each step is forward + loss + backward + AdamW
step + ``zero_grad``, timed with ``torch.cuda.synchronize`` on both ends. The JSON file is
rewritten after every arm.

Run from the repository root on a machine with one CUDA GPU::

    python -m benchmarks.gpu.compile_shapes --json gpu_compile_shapes.json   # ~40 s on a GPU
    python -m benchmarks.gpu.compile_shapes --device cpu --tiny   # smoke test (aot_eager)

``--device cpu --tiny`` compiles with the ``aot_eager`` backend (no CUDA graphs, no inductor
code generation) on a one-layer model: it only shows that every path runs.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from benchmarks.harness import command_line, fmt, print_table, write_json
from benchmarks.training.compile_shapes_arms import graph_counts
from benchmarks.training.compile_shapes_workload import (
    DEFAULTS,
    CompileSettings,
    make_model,
    train_batches,
)

MODULE = "benchmarks.gpu.compile_shapes"
ARMS = ("eager", "reduce-overhead", "default")


def settings(args: argparse.Namespace) -> CompileSettings:
    s = replace(
        DEFAULTS,
        max_tokens=args.max_tokens,
        vocab=8000,
        d_model=512,
        nhead=8,
        layers=args.layers,
        ffn=2048,
        lr=3e-4,
        docs=args.docs,
        max_shapes=args.max_shapes,
        device=args.device,
        bf16=args.device.startswith("cuda"),
        threads=4,
        max_steps=args.max_steps,
    )
    if args.tiny:
        s = replace(
            s,
            max_tokens=1024,
            vocab=300,
            d_model=32,
            nhead=2,
            layers=1,
            ffn=64,
            docs=1500,
            max_steps=24,
            threads=1,
            backend="aot_eager",
        )
    return s


def cudagraph_nodes() -> int | None:
    """CUDA-graph tree nodes recorded on device 0 (``None`` when not readable)."""
    try:
        from torch._inductor import cudagraph_trees

        manager = cudagraph_trees.get_manager(0, create_if_none_exists=False)
        if manager is None:
            return 0
        stack = [n for nodes in manager.roots.values() for n in nodes]
        count = 0
        while stack:
            node = stack.pop()
            count += 1
            stack.extend(c for nodes in node.children.values() for c in nodes)
        return count
    except Exception:
        return None


def run_arm(
    arm: str, s: CompileSettings, batches: list[dict[str, Any]], skip_first: int
) -> dict[str, Any]:
    """Train a fresh model over ``batches`` once; time every step."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    cuda = s.device.startswith("cuda")
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(s.seed)
    model = make_model(s).to(s.device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    shapes = {tuple(b["tokens"].shape) for b in batches}
    dynamo = torch._dynamo.config
    saved = (dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit)
    fn: Any = model
    if arm != "eager":
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = len(shapes), True
        if not cuda:
            fn = torch.compile(model, dynamic=False, backend=s.backend)
        elif arm == "reduce-overhead":
            fn = torch.compile(model, dynamic=False, mode="reduce-overhead")
        else:
            fn = torch.compile(model, dynamic=False)

    def sync() -> float:
        if cuda:
            torch.cuda.synchronize()
        return time.perf_counter()

    times: list[float] = []
    compiled: list[bool] = []
    losses: list[float] = []
    error = None
    try:
        for batch in batches:
            before = graph_counts()[0]
            t0 = sync()
            if arm == "reduce-overhead" and cuda:
                torch.compiler.cudagraph_mark_step_begin()
            with torch.autocast(s.device.split(":")[0], torch.bfloat16, enabled=s.bf16):
                summed = fn(batch["tokens"], batch["tokens_mask"])
            loss = summed.float() / batch["ntokens"].clamp(min=1)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
            times.append(sync() - t0)
            compiled.append(graph_counts()[0] > before)
    except Exception as err:  # reported: the other arms still run
        error = f"{type(err).__name__}: {err}"[:3000]
    finally:
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = saved
    graphs, frames, breaks = graph_counts()
    seen: dict[tuple[int, ...], int] = {}
    steady: list[int] = []
    for i, b in enumerate(batches[: len(times)]):
        shape = tuple(b["tokens"].shape)
        seen[shape] = seen.get(shape, 0) + 1
        if seen[shape] > skip_first and not compiled[i]:
            steady.append(i)
    real = [int(b["tokens_mask"].sum()) for b in batches[: len(times)]]
    steady_s = sum(times[i] for i in steady)
    finite = bool(losses) and all(math.isfinite(x) for x in losses)
    finite = finite and all(bool(torch.isfinite(p).all()) for p in model.parameters())
    return {
        "arm": arm,
        "error": error,
        "steps": len(times),
        "shapes": len(shapes),
        "graphs": graphs,
        "frames_ok": frames,
        "graph_breaks": breaks,
        "graphs_equal_shapes": arm == "eager" or graphs == len(shapes),
        "recompile_limit": None if arm == "eager" else len(shapes),
        "compile_steps": sum(compiled),
        "compile_s": sum(t for t, c in zip(times, compiled, strict=False) if c),
        "cudagraph_nodes": cudagraph_nodes() if arm == "reduce-overhead" else None,
        "cudagraph_skips": int(counters["inductor"]["cudagraph_skips"]),
        "steady_steps": len(steady),
        "steady_s": steady_s,
        "steady_real_tokens_per_s": sum(real[i] for i in steady) / steady_s if steady_s else None,
        "total_s": sum(times),
        "final_loss": losses[-1] if losses else None,
        "finite": finite,
        "step_s": times,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="K shapes under CUDA graphs (module docstring).")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny model, aot_eager: smoke test")
    p.add_argument("--max-shapes", type=int, default=4, help="K of the plan")
    p.add_argument("--max-tokens", type=int, default=8192)
    p.add_argument("--docs", type=int, default=10_000)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--skip-first", type=int, default=2, help="untimed occurrences per shape")
    p.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_compile_shapes: no CUDA device; use --device cpu --tiny on CPU")
        return 2
    s = settings(args)
    torch.set_num_threads(s.threads)
    print("command:", command_line(MODULE, argv))
    print("settings:", s.to_json())
    batches = train_batches(s, shapes=True)
    if s.max_steps is not None:
        batches = batches[: s.max_steps]
    batches = [{k: v.to(s.device) for k, v in b.items()} for b in batches]
    shapes = sorted({tuple(b["tokens"].shape) for b in batches})
    print(f"{len(batches)} micro-batches, {len(shapes)} shapes: {shapes}")
    out: dict[str, Any] = {"settings": s.to_json(), "torch": torch.__version__, "arms": {}}
    out["shapes"] = [list(x) for x in shapes]
    if s.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
    for arm in args.arms:
        print(f"-- {arm}", flush=True)
        out["arms"][arm] = run_arm(arm, s, batches, args.skip_first)
        eager = out["arms"].get("eager", {}).get("steady_real_tokens_per_s")
        for r in out["arms"].values():
            tps = r["steady_real_tokens_per_s"]
            r["x_eager"] = tps / eager if tps and eager else None
        write_json(args.json, out)
        if out["arms"][arm]["error"]:
            print(f"{arm} error: {out['arms'][arm]['error']}")
    rows = [
        [
            r["arm"],
            str(r["steps"]),
            str(r["shapes"]),
            str(r["graphs"]),
            str(r["graph_breaks"]),
            str(r["cudagraph_nodes"] if r["cudagraph_nodes"] is not None else "-"),
            str(r["cudagraph_skips"]),
            fmt(r["compile_s"], ".1f"),
            str(r["steady_steps"]),
            fmt(r["steady_real_tokens_per_s"], ".0f"),
            fmt(r["x_eager"], ".2f"),
            str(r["finite"]),
        ]
        for r in out["arms"].values()
    ]
    print_table(
        [
            "arm",
            "steps",
            "shapes",
            "graphs",
            "breaks",
            "cg nodes",
            "cg skips",
            "compile s",
            "steady",
            "real tok/s",
            "x eager",
            "finite",
        ],
        rows,
    )
    bad = [r["arm"] for r in out["arms"].values() if not r["graphs_equal_shapes"] or r["error"]]
    if bad:
        print(f"FAILED: graphs != shapes or an error in {bad}")
        return 1
    print(f"ok: every compiled arm has graphs == shapes ({len(shapes)}), no recompile beyond K")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
