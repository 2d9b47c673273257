"""The shape budget (issue 17): padding cost of K static shapes, and torch.compile on CPU.

Run from the repository root (venv active)::

    python -m benchmarks.training.compile_shapes            # ~5-6 min on 2 idle CPU cores
    python -m benchmarks.training.compile_shapes --quick    # smoke test, under a minute

A full run writes ``benchmarks/results/compile_shapes.json`` (:class:`benchmarks.results.Run`;
``--result PATH`` elsewhere, ``--no-result`` none); ``--quick`` writes none unless given
``--result``. Compiling the K-shape arm's 8 shapes takes about 3 of the minutes.

``--quick`` plans 100,000 pairs and trains a one-layer ``d_model=32`` model on 400 documents
(budget 1,024, K = 2) in this process, compiling with the ``aot_eager`` backend (dynamo's
graphs, guards and counters without inductor's code generation, which alone takes 10-70 s per
shape on these cores); its numbers only show that every path runs.

**Part 1: the padding of K shapes** (pure planning, no model runs). 1,000,000 (source,
target) pairs of :func:`~lightning_varbatch.planner.synthetic.wmt_like_lengths` (planning
length ``max(source, target)``, 1 to 256), ``max_tokens=16384``, 8 ranks, accumulation 1.
The unrestricted plan (``PlanConfig(max_tokens=16384)``, free shapes) against
``PlanConfig(max_tokens=16384, max_shapes=K)`` for K in 4, 8, 16, 32, 48, 64. Columns:
**real share**: ``diagnose(planner, plan).padding_efficiency`` (real tokens / padded token
slots run, masked rows included); **gap**: ``1 - share / unrestricted share``; **bound**:
the best share *any* K padded lengths can reach on these lengths, real tokens / Σ over
examples of the shortest chosen length that holds it, from the optimal lengths the planner
chose (:func:`~lightning_varbatch.planner.shapes.choose_shape_lengths`, exact dynamic
programming): a plan's share cannot exceed it (the masked rows of each shape's last
micro-batches only lower it); **shapes**: ``diagnose(...).num_shapes``; **steps**: optimizer
steps; **plan s**: ``EpochPlanner(...)`` plus ``plan(0, 8, 1)`` (the shape lengths are
chosen on the first plan). Target of the issue: K = 8 within 2 % of the unrestricted share;
the benchmark prints which K meet it.

**Part 2: torch.compile (inductor) on CPU.** A causal Transformer LM written here (``TinyLM``,
:mod:`~benchmarks.training.compile_shapes_workload`: pre-norm blocks,
``F.scaled_dot_product_attention`` with a boolean mask ``causal & key mask``, GELU FFN, tied
embeddings; ``d_model=128``, 4 heads, 2 layers, FFN 512, vocabulary 1,000; AdamW lr 1e-3; fp32;
``torch.set_num_threads(1)``), trained once over the same ``--docs`` documents (4,000 in a CPU
run, :data:`CPU_RUN`; random token ids; lengths: the target side of ``wmt_like_lengths(docs,
seed=1)``, at least 2) with ``TokenBudgetBatchSampler(lengths, 4096, world_size=1, shuffle=True,
loss_lengths=lengths - 1)`` and ``PaddingCollate(loss_offset=1)`` (loss = summed cross-entropy /
the batch's ``ntokens``). Arms:

* **eager, free shapes** (the baseline): the model as it is; every micro-batch padded to its
  own longest.
* **eager, K shapes**: the same model on the ``max_shapes=K`` plan (K = 8): what the padding
  costs without compiling.
* **compiled, K shapes**: ``torch.compile(model, dynamic=False)`` on the ``max_shapes=K``
  plan, ``torch._dynamo.config.recompile_limit = K`` and ``fail_on_recompile_limit_hit =
  True`` (so that a fallback to eager would fail instead of passing silently).
* **compiled dynamic, free shapes**: ``torch.compile(model, dynamic=True)``, free shapes.
* **compiled static, free shapes**: ``torch.compile(model, dynamic=False)``, free shapes:
  the recompile storm, capped at ``--storm-steps`` steps (2).

Each arm runs in a fresh process (``--quick``: all in this process) with a fresh, empty
inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new temporary folder) and
``torch._inductor.config.compile_threads = 1``; the batches are collated before timing; a step
is forward + loss + backward + AdamW step + ``zero_grad``, timed with ``time.perf_counter``.
**graphs**: ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (graphs dynamo
captured and compiled, forward with its backward; ``frames ok`` counts compiled frames and
agrees with it when nothing breaks the graph; graph breaks are counted and must be 0);
**compile steps**: the steps during which ``graphs`` rose; **compile s**: their summed step
times (compilation plus one step); **steady real tok/s**: real (non-padding) document tokens
of the other steps after the first ``warmup`` (3) steps / their summed step time; **x eager**:
against the eager free-shape arm, run minutes apart in another process (the machine's load
moves it); **all steps s**: every step, compilation included.

**Paired ratios.** After training (nothing left to compile), the processes of ``eager_k``,
``compiled_k`` and ``dynamic_free`` run the arm and its references
(:data:`~benchmarks.training.compile_shapes_arms.PAIRED`: eager on free shapes, eager on K
shapes, the compiled model) one step each per round, in turn (a b c, then c b a), for
``--paired-steps`` rounds (24), on micro-batches spread over the epoch: a change of the
machine's load hits them alike. **x eager free, paired**: the arm's real tokens/s over eager
free shapes; **compiled / eager, same batches**: a compiled model's over the same model run
eagerly on the same micro-batches; each with a 90 % bootstrap interval over the rounds
(:func:`~benchmarks.training.compile_shapes_report.paired_ratio`). For the K-shape arm the
benchmark asserts ``graphs == distinct shapes``.

Before the arms, the benchmark checks the masked rows on the eager model: for a K-shape
micro-batch with fully masked rows, the attention output of those rows (every query sees no
key) must be exactly 0 (torch's SDPA returns zeros there, no NaN), and the loss and every
gradient finite; every arm checks its losses and final weights are finite.

**The code.** This module is the command (its options, the run, the result file); Part 1 is
:mod:`benchmarks.training.compile_shapes_padding`; Part 2's workload (settings, micro-batches,
model, masked-rows check) is :mod:`benchmarks.training.compile_shapes_workload`, its arms
(training and timing one arm, in this or a fresh process)
:mod:`benchmarks.training.compile_shapes_arms`, its table
:mod:`benchmarks.training.compile_shapes_report`.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import asdict, replace

from benchmarks.harness import (
    add_child_options,
    command_line,
    emit_result,
    torch_machine_line,
    write_json,
)
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.training.compile_shapes_arms import (
    ARM_NAMES,
    ARMS,
    MODULE,
    ArmResult,
    run_arm,
    run_in_process,
    spawn,
)
from benchmarks.training.compile_shapes_padding import (
    KS,
    PAIRS,
    PLAN_BUDGET,
    WORLD,
    report_padding,
    run_padding,
)
from benchmarks.training.compile_shapes_report import check_k_arm, report_training
from benchmarks.training.compile_shapes_workload import (
    DEFAULTS,
    CompileSettings,
    check_masked_rows,
    describe_training,
)

CPU_RUN = replace(DEFAULTS, docs=4_000, storm_steps=2, paired_steps=24)
"""What a full CPU run trains (the command's defaults): 4,000 of the workload's documents, 2
steps of the recompile storm and 24 paired rounds, so that a run takes about 5 minutes on 2
idle cores (compiling the 8 shapes alone takes about 3)."""

MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.diagnostics",
    "lightning_varbatch.planner.shapes",
    "lightning_varbatch.planner.synthetic",
    "lightning_varbatch.data.sampler",
    "lightning_varbatch.data.collate",
]
"""The package modules the result measured (their import closure is fingerprinted)."""

BENCH = [
    MODULE,
    "benchmarks.training.compile_shapes_padding",
    "benchmarks.training.compile_shapes_workload",
    "benchmarks.training.compile_shapes_arms",
    "benchmarks.training.compile_shapes_report",
]
"""The benchmark's own modules (fingerprinted as they are)."""


# -- the script ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = CPU_RUN
    p = argparse.ArgumentParser(description="Shape-budget benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test (< 1 min), all in-process")
    p.add_argument("--pairs", type=int, default=PAIRS, help="pairs of Part 1")
    p.add_argument("--docs", type=int, default=d.docs, help="documents of Part 2")
    p.add_argument("--max-shapes", type=int, default=d.max_shapes, help="K of Part 2")
    p.add_argument("--storm-steps", type=int, default=d.storm_steps)
    p.add_argument("--paired-steps", type=int, default=d.paired_steps, help="paired rounds")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=None, help="Part 2 arms to run")
    p.add_argument(
        "--backend",
        default=None,
        help="torch.compile backend (default inductor; --quick: aot_eager, no code generation)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "compile_shapes")
    add_child_options(p, ARMS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        emit_result(asdict(run_arm(args.child, CompileSettings.from_json(args.settings))))
        return 0
    s = replace(
        CPU_RUN,
        docs=args.docs,
        max_shapes=args.max_shapes,
        storm_steps=args.storm_steps,
        paired_steps=args.paired_steps,
        seed=args.seed,
    )
    arms = tuple(args.arms or ARMS)
    if "eager_free" not in arms:
        arms = ("eager_free", *arms)
    if args.quick:
        args.pairs = 100_000
        s.docs, s.max_tokens, s.max_shapes, s.warmup, s.paired_steps = 400, 1024, 2, 1, 6
        s.vocab, s.d_model, s.nhead, s.layers, s.ffn = 128, 32, 2, 1, 64
        s.backend = "aot_eager"
    if args.backend is not None:
        s.backend = args.backend
    settings = {**asdict(s), "pairs": args.pairs, "plan_budget": PLAN_BUDGET, "world": WORLD}
    run = Run("compile_shapes", settings=settings, package=MEASURED, bench=BENCH)
    t_start = time.perf_counter()
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    print(
        f"\nPart 1: padding of K static shapes, wmt_like_lengths({args.pairs:,}) pairs "
        f"(planning length max(source, target)), max_tokens={PLAN_BUDGET}, {WORLD} ranks"
    )
    padding = report_padding(run_padding(args.pairs, args.seed, KS), smoke=args.quick)
    print(
        "  real share = diagnose().padding_efficiency (real tokens / padded slots, masked rows "
        "included); gap = 1 - share / unrestricted share; bound = the best share of any K "
        "padded lengths (optimal lengths, no masked rows)"
    )
    where = "in-process" if args.quick else "one process per arm"
    print(f"\nPart 2: torch.compile (backend {s.backend!r}) on CPU, {where}")
    describe_training(s)
    masked = check_masked_rows(s)
    print(
        f"  [{'PASS' if masked['ok'] else 'FAIL'}] masked rows (eager, a {masked['shape'][0]} x "
        f"{masked['shape'][1]} micro-batch with {masked['masked_rows']} masked rows): attention "
        f"max |out| on them {masked['attention_max_abs_on_masked_rows']}, NaN "
        f"{masked['attention_nan']}, loss finite {masked['loss_finite']}, grads finite "
        f"{masked['grads_finite']}"
    )
    assert masked["ok"], masked
    results: dict[str, ArmResult] = {}
    for arm in arms:
        r = run_in_process(arm, s) if args.quick else spawn(arm, s)
        results[arm] = r
        print(
            f"  {ARM_NAMES[arm]:<30} {r.steps:4d} steps, {r.shapes:3d} shapes, {r.graphs:3d} "
            f"graphs, {r.total_s:7.1f} s, finite {r.finite}",
            flush=True,
        )
        assert r.finite, f"{arm}: a loss or a weight is not finite"
    print(
        "\ngraphs = dynamo counters['stats']['unique_graphs']; compile steps = steps in which "
        "it rose (their time: compile s); steady real tok/s = real tokens / time of the other "
        f"steps after the first {s.warmup}; x eager = against eager, free shapes; x eager "
        f"free paired = the arm's real tok/s over eager free shapes, and compiled / eager = over "
        f"its own model run eagerly on the same micro-batches, both in the arm's process after "
        f"training, one step each per round in turn, {s.paired_steps} rounds (90 % bootstrap "
        "interval over the rounds)"
    )
    training = report_training(results)
    check_k_arm(results)
    print("machine after:", torch_machine_line())
    wall = time.perf_counter() - t_start
    print(f"wall time: {wall:.0f} s")
    numbers = {
        "padding": padding,
        "masked_rows": masked,
        "training": training,
        "settings": asdict(s),
        "wall_s": wall,
    }
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
