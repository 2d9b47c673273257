"""Training throughput: token-budget batches against fixed-size batches, same data, same steps.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.training.throughput            # default: about 3 min on 2 CPU cores
    python -m benchmarks.training.throughput --quick    # smoke test, < 20 s

Workload: the translation model of ``examples/translation/model.py`` (``TranslationModel``:
pre-norm encoder-decoder, tied embeddings), by default ``d_model=128``, 4 heads, 2 + 2 layers,
FFN 512, vocabulary 8000, dropout 0.1, trained with Adam (lr 1e-4) on the summed cross
entropy over real target tokens divided by their count. Data: random token ids with WMT14
en-de-like (source, target) lengths (:func:`lightning_varbatch.planner.synthetic.wmt_like_lengths`)
multiplied by ``--length-scale`` (default 0.5: median 12, p99 55, longest 128; the shape of the
long tail, p99 / median = 4.6, is kept) and rounded, at least 1; the target tensor is
``[BOS] + target`` (the model reads ``target[:, :-1]`` and predicts ``target[:, 1:]``). The
examples are the first ``n`` of that generator where ``n`` is the smallest count with at least
``--target-tokens`` (default 40k) real target tokens: **every configuration trains on exactly
the same examples, once**, so on the same number of real tokens.

Configurations (batches built before timing; padding to the longest member of each batch):

* **(a) ours**: :class:`lightning_varbatch.TokenBudgetBatchSampler` (``max_tokens`` =
  ``--max-tokens``, padded cost ``n * max(src, tgt)``, ``world_size=1``, one epoch).
* **(a') ours, max order**: (a) with ``pair_order="max"``: pairs ordered by ``max(src,
  tgt)`` only, the planner before issue 33 (the same cut: as many micro-batches as (a)).
* **(b) random fixed**: a random permutation cut into batches of ``B`` examples, ``B`` = the
  mean number of examples per batch of (a) rounded (so (b) has as many optimizer steps as (a),
  give or take one).
* **(c) sorted fixed**: examples sorted by ``max(src, tgt)``, cut into batches of ``B``, batch
  order shuffled (the best case of length grouping with a fixed batch size: a global sort,
  tighter than Hugging Face's mega-batches of 50).

Measurements, each configuration in a **fresh subprocess** (``torch.set_num_threads(--threads)``,
default 1; default allocator settings), configurations interleaved ``a a' b c``, ``c b a' a``,
... for ``--rounds`` rounds (default 2):

* **step time**: ``perf_counter`` around forward + loss + backward + optimizer step + zero_grad
  (``torch.cuda.synchronize`` around it on a GPU); the first ``--warmup`` steps of each run are
  left out of the timing and of the token counts.
* **real tokens/sec**: real target tokens (the loss tokens) of the timed steps / their summed
  step time; the table shows the median over rounds, and the **speed-up** of (a) over (b) and
  over (c) (ratio of medians).
* **padded fraction**: 1 - real / allocated slots, over the whole epoch, where slots are the
  padded source and target tensors (``B * S + B * T``) and real their non-pad tokens.
* **padding-predicted speed-up** of (a) over (b): (b)'s slots per real token / (a)'s (the same
  examples, so the ratio of total slots). **realised fraction** = measured speed-up /
  predicted speed-up.
* **peak memory**: on CPU, the rise of the process resident-set high-water mark (VmHWM,
  reset through ``/proc/self/clear_refs``) over the training loop, above the resident set just
  before the first step (the model and the pre-built batches are already resident; Adam's state,
  created at the first step, is included, the same in every configuration). ``tracemalloc``
  does not see torch's CPU tensors, hence RSS. It is the process's footprint with the default
  glibc allocator, which keeps some freed memory for reuse, so it is an upper bound of the live
  tensors. On CUDA, ``torch.cuda.max_memory_allocated`` over the loop. The table shows the
  largest over rounds.

Target (issue 6): (a) at least 2.5x the real tokens/sec of (b).

:mod:`benchmarks.gpu.throughput` runs the same measurements with Transformer-base sizes in
bf16 on one CUDA GPU.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from benchmarks.harness import (
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
from benchmarks.workload import (
    CONFIGS,
    DEFAULTS,
    NAMES,
    RunResult,
    TranslationSettings,
    run_config,
    workload_lengths,
)

TARGET_SPEEDUP = 2.5
MEASURED = [
    "lightning_varbatch.data.sampler",
    "lightning_varbatch.planner.synthetic",
    "examples.translation.model",
]
"""The package code the figures measure (with its imports; :mod:`benchmarks.results`)."""
BENCH_MODULES = ["benchmarks.training.throughput", "benchmarks.workload"]


# -- the parent: interleaved runs in fresh processes ---------------------------------------------


def spawn(module: str, kind: str, s: TranslationSettings) -> RunResult:
    """Configuration ``kind`` in a fresh ``python -m <module> --child <kind>`` process."""
    return RunResult(**run_training_child(module, kind, s))


def child_main(kind: str, settings: str) -> int:
    """A child's work (``--child KIND --settings JSON``): one run, reported as a result line."""
    emit_result(asdict(run_config(kind, TranslationSettings.from_json(settings))))
    return 0


@dataclass
class Summary:
    kind: str
    tps: list[float]
    runs: list[RunResult]

    @property
    def tps_median(self) -> float:
        return statistics.median(self.tps)


def run_all_configs(
    module: str, s: TranslationSettings, rounds: int, in_process: bool = False
) -> dict[str, Summary]:
    """Run every configuration ``rounds`` times, interleaved; each in a fresh process unless
    ``in_process`` (the smoke test: no imports per run, memory figures then less clean)."""
    out = {k: Summary(k, [], []) for k in CONFIGS}
    for r in range(rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for kind in order:
            res = run_config(kind, s) if in_process else spawn(module, kind, s)
            tps = res.timed_real_tgt / res.timed_s
            out[kind].tps.append(tps)
            out[kind].runs.append(res)
            print(
                f"  round {r} {NAMES[kind]:<24} {res.steps:4d} steps, "
                f"{res.timed_s:7.2f} s timed, {tps:8.0f} real tgt tok/s, "
                f"peak {_fmt(res.peak_mb, '.0f')} MB",
                flush=True,
            )
    return out


def _fmt(x: object, spec: str = ".2f") -> str:
    return fmt(x, spec)


def report(
    results: dict[str, Summary], s: TranslationSettings, peak_label: str, smoke: bool = False
) -> dict[str, Any]:
    """Print the table and the target; return the numbers (for RESULTS.md and plots)."""
    a = results["a"]
    headers = [
        "configuration",
        "steps",
        "B mean",
        "B max",
        "max slots",
        "tgt tok/s",
        "min..max",
        "x (b)",
        "pad frac",
        "slots/real",
        peak_label,
        "epoch s",
    ]
    rows = []
    out: dict[str, Any] = {"configs": {}}
    for kind in CONFIGS:
        summ = results[kind]
        r0 = summ.runs[0]
        ratio = summ.tps_median / results["b"].tps_median
        peaks = [r.peak_mb for r in summ.runs if r.peak_mb is not None]
        pad = 1 - r0.real / r0.slots
        rows.append(
            [
                NAMES[kind],
                str(r0.steps),
                f"{r0.mean_examples:.1f}",
                str(r0.max_examples),
                f"{r0.max_slots:,}",
                f"{summ.tps_median:,.0f}",
                f"{min(summ.tps):,.0f}..{max(summ.tps):,.0f}",
                f"{ratio:.2f}",
                f"{pad:.3f}",
                f"{r0.slots / r0.real:.3f}",
                _fmt(max(peaks) if peaks else None, ".0f"),
                f"{statistics.median(r.total_s for r in summ.runs):.1f}",
            ]
        )
        out["configs"][kind] = {
            "tps_median": summ.tps_median,
            "tps": summ.tps,
            "speedup_vs_b": ratio,
            "pad_fraction": pad,
            "slots_per_real": r0.slots / r0.real,
            "peak_mb": max(peaks) if peaks else None,
            "steps": r0.steps,
            "mean_examples": r0.mean_examples,
            "epoch_s": [r.total_s for r in summ.runs],
        }
    print_table(headers, rows)
    b, c = results["b"], results["c"]
    measured = a.tps_median / b.tps_median
    predicted = (b.runs[0].slots / b.runs[0].real) / (a.runs[0].slots / a.runs[0].real)
    vs_c = a.tps_median / c.tps_median
    pred_c = (c.runs[0].slots / c.runs[0].real) / (a.runs[0].slots / a.runs[0].real)
    per_round = [ta / tb for ta, tb in zip(a.tps, b.tps, strict=True)]
    print(
        f"\nspeed-up of (a) over (b): {measured:.2f}x (per round: "
        + ", ".join(f"{x:.2f}" for x in per_round)
        + f"); padding predicts {predicted:.2f}x; realised fraction {measured / predicted:.2f}"
    )
    print(
        f"speed-up of (a) over (c): {vs_c:.2f}x; padding predicts {pred_c:.2f}x; "
        f"realised fraction {vs_c / pred_c:.2f}"
    )
    m = results["m"]
    vs_m = a.tps_median / m.tps_median
    pred_m = (m.runs[0].slots / m.runs[0].real) / (a.runs[0].slots / a.runs[0].real)
    print(
        f"speed-up of (a) over (a', pairs by max(source, target): the order before issue 33): "
        f"{vs_m:.2f}x; padding predicts {pred_m:.2f}x"
    )
    ok = measured >= TARGET_SPEEDUP
    verdict = "smoke test, not judged" if smoke else ("PASS" if ok else "FAIL")
    print(f"  [{verdict}] (a) >= {TARGET_SPEEDUP}x the real tokens/sec of (b): {measured:.2f}x")
    peak = {k: out["configs"][k]["peak_mb"] for k in ("a", "b", "c")}
    out.update(
        peak_vs_b=peak["a"] / peak["b"] if peak["a"] and peak["b"] else None,
        peak_vs_c=peak["a"] / peak["c"] if peak["a"] and peak["c"] else None,
        speedup_vs_m=vs_m,
        speedup_per_round=per_round,
        speedup=measured,
        predicted=predicted,
        realised_fraction=measured / predicted,
        speedup_vs_c=vs_c,
        predicted_vs_c=pred_c,
        passed=ok,
        settings=asdict(s),
    )
    return out


def describe(s: TranslationSettings) -> None:
    lengths = workload_lengths(s)
    print(
        f"workload: {lengths.shape[0]:,} examples, {int(lengths[:, 1].sum()):,} real target tokens "
        f"(wmt_like_lengths x {s.length_scale}; source median {np.median(lengths[:, 0]):.0f}, "
        f"p99 {np.percentile(lengths[:, 0], 99):.0f}, max {lengths.max()}); "
        f"max_tokens={s.max_tokens}; model d_model={s.d_model}, {s.layers}+{s.layers} layers, "
        f"{s.nhead} heads, FFN {s.ffn}, vocab {s.vocab}; device {s.device}"
        + (", bf16 autocast" if s.bf16 else ", fp32")
        + f"; {s.threads} thread(s) per run"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = DEFAULTS
    p = argparse.ArgumentParser(description="Training throughput benchmark (module docstring).")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test (< 20 s): tiny model, 1 round, all runs in this process",
    )
    p.add_argument(
        "--rounds", type=int, default=2, help="interleaved rounds (a a' b c, c b a' a, ...)"
    )
    p.add_argument("--target-tokens", type=int, default=d.target_tokens)
    p.add_argument("--length-scale", type=float, default=d.length_scale)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--ffn", type=int, default=d.ffn)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "training_throughput")
    add_child_options(p, CONFIGS)
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> TranslationSettings:
    s = replace(
        DEFAULTS,
        target_tokens=args.target_tokens,
        length_scale=args.length_scale,
        max_tokens=args.max_tokens,
        vocab=args.vocab,
        d_model=args.d_model,
        layers=args.layers,
        ffn=args.ffn,
        threads=args.threads,
        seed=args.seed,
    )
    if args.quick:
        s.target_tokens, s.d_model, s.ffn, s.vocab, s.layers, s.nhead = 3000, 32, 64, 500, 1, 2
        s.max_tokens = 512
        args.rounds = 1
    return s


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.settings)
    s = settings_from_args(args)
    run = Run("training_throughput", settings=asdict(s), package=MEASURED, bench=BENCH_MODULES)
    print("command:", command_line("benchmarks.training.throughput", argv))
    print("machine:", torch_machine_line())
    describe(s)
    results = run_all_configs("benchmarks.training.throughput", s, args.rounds, args.quick)
    print(
        f"\ntraining throughput (median of {args.rounds} interleaved rounds; tok/s = real "
        "target tokens per second of step time; pad frac = 1 - real / padded source+target "
        "slots; peak = RSS high-water rise over the loop, max over rounds)"
    )
    numbers = report(results, s, "peak MB", smoke=args.quick)
    print("machine after:", torch_machine_line())
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
