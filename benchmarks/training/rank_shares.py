"""Ranks of different speed (issue 26): equal shares, the right fixed shares, and balancing.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.training.rank_shares            # about 1.5-2 min on 2 CPU cores
    python -m benchmarks.training.rank_shares --quick    # smoke test, < 15 s

A full run writes ``benchmarks/results/rank_shares.json`` (:class:`benchmarks.results.Run`;
``--result PATH`` elsewhere, ``--no-result`` none); ``--quick`` writes none unless given
``--result``. Besides each arm's figures by factor (``configs``), the file repeats the
headline per factor in the order of the settings' factors (``per_factor``) for the documents.

Two real processes (``torch.distributed``, gloo, 1 thread each) train a small token model
(embedding 256 x 16 -> linear 16 x 256, a token-mean cross-entropy) on WMT-like target lengths
(:func:`lightning_varbatch.planner.wmt_like_lengths`, column 1) through
:class:`lightning_varbatch.TokenBudgetBatchSampler`. The model's own compute is tiny; the user
model then sleeps ``--delay-us`` per padded token of its micro-batch (rows x longest, the
planner's ``"padded"`` cost) on rank 0, and ``factor`` times that on rank 1: rank 1 is a
``factor``-times slower device, and the sleep dominates each step, so the timing holds on a
busy machine. After backward, each rank concatenates its gradients and calls ``dist.all_reduce``
(sum; each rank's loss is its tokens' summed loss over the step's global token count,
``MicroBatch.step_ntokens``). For each factor (1.5 and 2) three arms run, each with a fresh
model and sampler, for ``--epochs`` epochs:

* **a: equal shares** (the sampler's default);
* **b: the right fixed shares**, ``rank_shares=[1, 1/factor]``;
* **c: balancing**: starts from equal shares; after each epoch every rank all-gathers every
  rank's compute seconds (forward + backward + the sleep, not the all-reduce) and planned work
  (the plan's cost of its micro-batches), calls
  :func:`lightning_varbatch.planner.balanced_shares` on them (with the speeds smoothed over
  the epochs, as ``RankShareBalancer`` keeps them) and ``sampler.set_rank_shares(...)`` with
  the result (in force from the next epoch).

Per arm: the wall time of each epoch on rank 0 (between barriers), its first epoch and the
median and worst of the later ones ("from the second epoch"), real tokens/s, and ratios to equal
shares measured in the same run. The three arms of a factor take turns epoch by epoch
(``a b c``, then ``c b a``, ...), so that the machine's load changes fall on all of them.
Checked, not assumed, in every epoch of every arm: every
example was trained exactly once on the union of the ranks; and on ``--check-steps`` steps per
epoch (untimed), the all-reduced gradient equals a float64 single-process gradient of the token
mean over that step's examples (gathered from both ranks), and ``step_ntokens`` equals the
step's real token count. Then :mod:`benchmarks.training.rank_shares_model` models 4 ranks (2 fast,
2 slow) from the plan alone. The exit code is 1 when a check fails (coverage, equal counts,
gradient), 0 otherwise: the timing targets are reported, not enforced.

**The code.** This module is the parent (the command, the two rank processes it starts, the
table, the targets and the result file); what each rank process runs (the workload, the arms'
epochs, the gradient checks) is :mod:`benchmarks.training.rank_shares_rank`.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from importlib import metadata
from typing import Any

from benchmarks.harness import (
    child_command,
    child_env,
    command_line,
    emit_result,
    fmt,
    machine_line,
    print_table,
    run_children,
    write_json,
)
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.training.rank_shares_model import model_section
from benchmarks.training.rank_shares_rank import ARMS, WORLD, Data, ShareSettings, run_rank

MODULE = "benchmarks.training.rank_shares"
MEASURED = [
    "lightning_varbatch.data.sampler",
    "lightning_varbatch.planner.rank_shares",
    "lightning_varbatch.planner.share_balance",
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.synthetic",
]
"""The package modules the result measured (their import closure is fingerprinted)."""
BENCH = [MODULE, "benchmarks.training.rank_shares_rank", "benchmarks.training.rank_shares_model"]
"""The benchmark's own modules (fingerprinted as they are)."""
GRAD_RTOL = 1e-5
"""Largest |all-reduced - float64 reference| / max |reference| a checked step may show."""
HEADLINE = ("x_equal", "x_equal_epochs", "vs_fixed", "worst_vs_fixed", "later_s", "tokens_per_s")
"""The figures of each arm that ``per_factor`` repeats for the documents."""


# -- the parent ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def summarise(r0: dict[str, Any], r1: dict[str, Any]) -> dict[str, Any]:
    """One arm's figures from both ranks' records (times from rank 0)."""
    walls = [e["wall_s"] for e in r0["epochs"]]
    later = walls[1:] if len(walls) > 1 else walls
    last = r0["epochs"][-1]
    checks = [c for e in r0["epochs"] for c in e["checks"]]
    tokens = r0["epochs"][0]["tokens"]
    return {
        "epoch_s": walls,
        "first_s": walls[0],
        "later_s": statistics.median(later),
        "later_max_s": max(later),
        "tokens_per_s": tokens / statistics.median(later),
        "shares": [e["shares"] for e in r0["epochs"]],
        "budgets": [e["budgets"] for e in r0["epochs"]],
        "work_share_r1": [e["work"][1] / sum(e["work"]) for e in r0["epochs"]],
        "micro_batches_per_rank": last["micro_batches_per_rank"],
        "steps": [e["steps"] for e in r0["epochs"]],
        "compute_s": [statistics.median(e["compute_s"][r] for e in r0["epochs"]) for r in (0, 1)],
        "wait_s": [statistics.median(e["wait_s"] for e in r["epochs"]) for r in (r0, r1)],
        "once": all(e["once"] for e in r0["epochs"]),
        "counts_equal": all(
            e["ran_micro_batches"] == [e["micro_batches_per_rank"]] * WORLD for e in r0["epochs"]
        ),
        "grad_checks": len(checks),
        "grad_max_rel_err": max((c["rel_err"] for c in checks), default=float("nan")),
        "step_tokens_ok": all(c["tokens_ok"] for c in checks),
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Rank shares benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test (< 15 s): tiny, factor 2")
    p.add_argument("--examples", type=int, default=ShareSettings.examples)
    p.add_argument("--epochs", type=int, default=ShareSettings.epochs)
    p.add_argument("--delay-us", type=float, default=ShareSettings.delay_us)
    p.add_argument("--max-tokens", type=int, default=ShareSettings.max_tokens)
    p.add_argument("--accumulate", type=int, default=ShareSettings.accumulate)
    p.add_argument(
        "--smoothing", type=float, default=None, help="arm c's smoothing (default: the library's)"
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds for the 2 processes")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "rank_shares")
    p.add_argument("--rank-child", nargs=2, default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_child is not None:
        rank, port = int(args.rank_child[0]), int(args.rank_child[1])
        for x in run_rank(rank, port, ShareSettings.from_json(args.settings)):
            emit_result(x)
        return 0
    s = ShareSettings(
        examples=args.examples,
        epochs=args.epochs,
        delay_us=args.delay_us,
        max_tokens=args.max_tokens,
        accumulate=args.accumulate,
        smoothing=args.smoothing,
        seed=args.seed,
    )
    model_examples = 200_000
    if args.quick:
        s = replace(s, examples=200, max_tokens=512, delay_us=10.0, epochs=3, factors=[2.0])
        model_examples = 10_000
    run = Run("rank_shares", settings=asdict(s), package=MEASURED, bench=BENCH)
    print("command:", command_line(MODULE, argv))
    # the version without importing torch here (2 s the children need more)
    print("machine:", machine_line(f"torch {metadata.version('torch')}", with_load=True))
    data = Data(s)
    print(
        f"workload: {s.examples:,} examples, {int(data.lengths.sum()):,} real tokens "
        f"(wmt_like_lengths target column), max_tokens={s.max_tokens}, accumulate="
        f"{s.accumulate}, world_size={WORLD} (gloo, 1 thread per rank); sleep {s.delay_us:g} "
        f"us per padded token on rank 0, x factor on rank 1; {s.epochs} epochs per arm; balancing "
        f"smoothing {'library default' if s.smoothing is None else s.smoothing}"
    )
    free = str(_free_port())
    commands = [
        child_command(
            MODULE,
            "--rank-child",
            str(r),
            free,
            "--settings",
            s.to_json(),
        )
        for r in range(WORLD)
    ]
    t0 = time.perf_counter()
    ranks = run_children(commands, env=child_env(OMP_NUM_THREADS="1"), timeout=args.timeout)
    print(f"both ranks reported every arm ({time.perf_counter() - t0:.1f} s)")
    found = {(x["factor"], x["arm"]): [x] for x in ranks[0]}
    for x in ranks[1]:
        found[(x["factor"], x["arm"])].append(x)
    results: dict[str, dict[str, Any]] = {arm: {} for arm in ARMS}
    for (factor, arm), (r0, r1) in found.items():
        results[arm][str(factor)] = summarise(r0, r1)
    rows = []
    for factor in s.factors:
        base = results["a"][str(factor)]["later_s"]
        fixed = results["b"][str(factor)]["later_s"]
        for arm, name in ARMS.items():
            x = results[arm][str(factor)]
            x["x_equal"] = base / x["later_s"]
            x["vs_fixed"] = x["later_s"] / fixed
            x["worst_vs_fixed"] = x["later_max_s"] / fixed
            # per epoch from the second: the arms of an epoch ran one after the other
            a_e, b_e = results["a"][str(factor)]["epoch_s"], results["b"][str(factor)]["epoch_s"]
            x["x_equal_epochs"] = [u / v for u, v in zip(a_e[1:], x["epoch_s"][1:], strict=True)]
            x["vs_fixed_epochs"] = [u / v for u, v in zip(x["epoch_s"][1:], b_e[1:], strict=True)]
            rows.append(
                [
                    f"{factor:g}x  {arm}: {name}",
                    "/".join(f"{v:.3f}" for v in (x["shares"][-1] or [1.0, 1.0])),
                    "/".join(str(b) for b in x["budgets"][-1]),
                    str(x["micro_batches_per_rank"]),
                    f"{100 * x['work_share_r1'][-1]:.1f}",
                    fmt(x["first_s"]),
                    fmt(x["later_s"]),
                    fmt(x["later_max_s"]),
                    fmt(x["x_equal"]),
                    f"{min(x['x_equal_epochs']):.3f}..{max(x['x_equal_epochs']):.3f}",
                    fmt(x["vs_fixed"]),
                    f"{x['tokens_per_s']:,.0f}",
                    "/".join(f"{c:.2f}" for c in x["compute_s"]),
                    "/".join(f"{w:.2f}" for w in x["wait_s"]),
                    ("yes" if x["once"] else "NO") + ("" if x["counts_equal"] else " (counts!)"),
                    f"{x['grad_checks']}: {x['grad_max_rel_err']:.1e}"
                    + ("" if x["step_tokens_ok"] else " (tokens!)"),
                ]
            )
    print(
        "\n2 gloo ranks, rank 1 slowed by the factor; epoch times on rank 0 (untimed checks "
        "left out); 'epoch 2+' = median of the epochs after the first; ratios to equal shares "
        "and to the fixed right shares of the same run"
    )
    print_table(
        [
            "factor, arm",
            "shares (last)",
            "budgets",
            "mb/rank",
            "r1 work %",
            "epoch 1 s",
            "epoch 2+ s",
            "worst 2+ s",
            "x equal",
            "per epoch",
            "/ fixed",
            "tok/s",
            "compute s r0/r1",
            "all-reduce s r0/r1",
            "once",
            "grad checks: max rel err",
        ],
        rows,
    )
    c = {f: results["c"][str(f)] for f in s.factors}
    for f in s.factors:
        print(
            f"balancing at {f:g}x, per epoch: "
            + "; ".join(
                f"{sh if sh is None else '/'.join(f'{v:.3f}' for v in sh)} -> {t:.2f} s"
                for sh, t in zip(c[f]["shares"], c[f]["epoch_s"], strict=True)
            )
        )
    top = max(s.factors)
    speedup = results["b"][str(top)]["x_equal"]
    every = [results[a][str(f)] for a in ARMS for f in s.factors]
    targets = {
        f"fixed >= 1.35x equal at {top:g}x": speedup >= 1.35,
        "balancing within 10% of fixed from its 2nd epoch (every such epoch)": all(
            c[f]["worst_vs_fixed"] <= 1.10 for f in s.factors
        ),
        "every example once per epoch, equal micro-batch counts (all arms, all epochs)": all(
            x["once"] and x["counts_equal"] for x in every
        ),
        f"gradient = float64 token mean (rel err <= {GRAD_RTOL:g}), step tokens exact": all(
            x["grad_max_rel_err"] <= GRAD_RTOL and x["step_tokens_ok"] for x in every
        ),
    }
    for name, ok in targets.items():
        print(f"target: {name}: {'met' if ok else 'NOT met'}")
    if args.quick:
        print("(--quick: epochs of ~0.1 s; the timing targets mean nothing here, the checks do)")
    model = model_section(model_examples, 4096, s.seed)
    out = {
        "settings": asdict(s),
        "configs": results,
        "predicted": (top + 1) / 2,  # the ideal equal / fixed epoch-time ratio at the top factor
        "targets": targets,
        "model": model,
        # the headline per factor, in the order of ``settings.factors`` (markers cannot name
        # a key with a dot, such as "1.5")
        "per_factor": [
            {
                "factor": f,
                **{
                    arm: {k: results[arm][str(f)][k] for k in HEADLINE}
                    | {"last_share_r1": (results[arm][str(f)]["shares"][-1] or [1.0, 1.0])[1]}
                    for arm in ARMS
                },
            }
            for f in s.factors
        ],
    }
    write_json(args.json, out)
    run.write(out, result_path(args))
    correct = [k for k in targets if k.startswith(("every example", "gradient"))]
    return 0 if all(targets[k] for k in correct) else 1  # a wrong result fails, a slow one not


if __name__ == "__main__":
    raise SystemExit(main())
