"""Training with every peer's batching, same loop: the figure users compare (issue 25).

Run from the repository root, after ``pip install -e ".[bench]"`` plus SpeechBrain (see
benchmarks/RESULTS.md, "Training with every peer's batches", for the exact install)::

    python -m benchmarks.peers.training                  # about 8-10 min on 2 busy CPU cores
    python -m benchmarks.peers.training --quick          # smoke test, < 30 s, 1 round

**Workload**: the model and data of :mod:`benchmarks.training.throughput`
(``TranslationModel``, d_model 128, 2 + 2 layers, FFN 512, vocabulary 8000, Adam lr 1e-4;
random tokens with WMT-like lengths x 0.5), the first examples with ``--target-tokens``
(default 16k) real target tokens, on **2 real ranks** (one process per rank, gloo, 1 thread
each). Every configuration trains the same examples, from the same initial weights, with the
exact token-mean loss, for one epoch (:mod:`benchmarks.peers.rank`).

**Rows**: every peer's batching through its own package (:mod:`benchmarks.peers.batches` says
exactly how each is driven), each with one setting: a token budget (``max_tokens``: ours,
lhotse, SpeechBrain's ``max_batch_length``, DeepSpeed's ``max_tokens``, the fairseq algorithm)
or a batch size ``B`` per rank (Hugging Face group_by_length and batch_rebalance, fixed random,
fixed sorted). A peer whose packages are missing is reported as ``not installed``.

**Two comparisons**, ``M`` = ``--max-tokens`` (default 512) and the padded cost of a
micro-batch = examples x longest key (key = ``max(source, [BOS] + target)``):

* **same token budget**: budgets get ``max_tokens = M``; batch sizes get ``B`` = our mean
  examples per micro-batch (n / our micro-batch count, rounded: as many steps as ours);
* **same memory limit**: each configuration gets the largest setting whose worst micro-batch
  (over both ranks, in the trained epoch) has a padded cost <= ``M``: ``B = M // longest key``
  for the fixed-size rows (their longest batch can hold the longest example), a bisection of the
  setting for the others (:func:`memory_setting`). A configuration whose setting is the same in
  both comparisons is run once and shown in both.

**Measured**, each configuration in a fresh pair of processes, interleaved (the order reversed
every other round) over ``--rounds`` (default 2), after one discarded warm-up run: real target
tokens/s (both ranks' weighted real target tokens of the timed steps / the wall time of those
steps: the headline), tokens per CPU-second (the same tokens / the ranks' mean process CPU time
over those steps: what other jobs on shared cores do not change), each
rank's wait at the gradient all-reduce (its time in ``all_reduce`` minus the step's smaller one,
summed), step time p50/p90 (per step the slower rank), peak memory (the RSS high-water rise over
the loop, the larger rank), examples trained / dropped / repeated and micro-batches over ``M``
(counted from the ids each rank trained), padded fraction, planning time (the slower rank).
Before training the ranks exchange their batch counts: unequal counts (which would hang the
epoch's last all-reduce) are recorded, then the peer's named workaround is applied.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from benchmarks.harness import (
    ChildFailed,
    child_command,
    child_env,
    command_line,
    emit_result,
    run_children,
    torch_machine_line,
    uptime,
    write_json,
)
from benchmarks.peers.batches import BY_NAME, PEERS, deal_all, unavailable, versions
from benchmarks.peers.rank import RankRun, RunSpec, as_dict, run_rank
from benchmarks.peers.report import draw, print_report, summarize
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.workload import (
    DEFAULTS,
    TranslationSettings,
    plan_lengths,
    workload_lengths,
)

WORLD = 2
MODULE = "benchmarks.peers.training"
MEASURED = ["lightning_varbatch.data.sampler", "lightning_varbatch.planner.synthetic"]
"""Our side of the figures (the sampler and what it imports; :mod:`benchmarks.results`)."""
BENCH_MODULES = [
    MODULE,
    "benchmarks.peers.batches",
    "benchmarks.peers.rank",
    "benchmarks.peers.report",
    "benchmarks.workload",
]


# -- settings: the same budget, the same memory limit ---------------------------------------------


def worst_cost(batches: list[list[list[int]]], key: np.ndarray) -> int:
    """The largest padded cost (examples x longest key) over every rank's micro-batches."""
    return max((len(b) * int(key[b].max()) for rank in batches for b in rank if b), default=0)


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest ``s`` in ``[lo, hi]`` with ``fits(s)``: ``hi`` itself if it fits, else a
    bisection (``fits(lo)`` must hold). A peer's worst micro-batch need not grow monotonically
    with its setting (lhotse's at 412 tokens overshoots 512 where its 512 does not): the result
    always fits, but between ``lo`` and ``hi`` a larger setting may fit too."""
    if fits(hi):
        return hi
    if not fits(lo):
        raise RuntimeError(f"even the smallest setting {lo} does not fit")
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def budget_setting(name: str, m: int, b_mean: int) -> int:
    """The peer's setting at the same token budget (``M``, or our mean batch size)."""
    return m if BY_NAME[name].setting == "max_tokens" else b_mean


def memory_setting(name: str, tl: np.ndarray, m: int, b_mean: int, seed: int) -> int:
    """The peer's largest setting whose worst micro-batch fits the padded-cost limit ``m``."""
    key = tl.max(axis=1)
    peer = BY_NAME[name]
    if peer.fixed_size:
        return max(1, m // int(key.max()))

    def fits(s: int) -> bool:
        return worst_cost(deal_all(name, tl, s, WORLD, seed), key) <= m

    if peer.setting == "max_tokens":
        return largest_fitting(fits, int(key.max()), m)
    return largest_fitting(fits, 1, 4 * b_mean)


def plan_specs(
    tl: np.ndarray, m: int, seed: int, names: Sequence[str]
) -> tuple[list[RunSpec], dict[str, dict[str, str]], int, dict[str, float]]:
    """The runs to make (deduplicated), each comparison's run per peer, ``B``, search seconds."""
    ours = deal_all("ours", tl, m, WORLD, seed)
    b_mean = max(1, round(tl.shape[0] / sum(len(r) for r in ours)))
    specs: dict[str, RunSpec] = {}
    table: dict[str, dict[str, str]] = {"budget": {}, "memory": {}}
    search_s: dict[str, float] = {}
    for name in names:
        t0 = time.perf_counter()
        settings = {
            "budget": budget_setting(name, m, b_mean),
            "memory": memory_setting(name, tl, m, b_mean, seed),
        }
        search_s[name] = time.perf_counter() - t0
        for comparison, setting in settings.items():
            spec = specs.setdefault(f"{name}@{setting}", RunSpec(name, setting, comparison))
            if spec.tag != comparison:
                spec.tag = "both"
            table[comparison][name] = spec.key
    return list(specs.values()), table, b_mean, search_s


# -- running ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(specs: list[RunSpec], s: TranslationSettings, timeout: float) -> list[list[RankRun]]:
    """Both ranks as fresh processes running ``specs`` in order; per spec, every rank's run.

    Raises:
        ChildFailed: a rank exited non-zero, printed no result or ran past ``timeout``.
    """
    import json

    port, payload = str(free_port()), json.dumps([asdict(x) for x in specs])
    commands = [
        child_command(MODULE, "--rank-child", payload, str(r), port, "--settings", s.to_json())
        for r in range(WORLD)
    ]
    found = run_children(commands, env=child_env(OMP_NUM_THREADS=str(s.threads)), timeout=timeout)
    per_rank = [[RankRun(**x) for x in f] for f in found]
    if any(len(x) != len(specs) for x in per_rank):
        raise RuntimeError(f"a rank reported {[len(x) for x in per_rank]} of {len(specs)} runs")
    return [[per_rank[r][i] for r in range(WORLD)] for i in range(len(specs))]


def run_rounds(
    specs: list[RunSpec], s: TranslationSettings, rounds: int, together: bool, timeout: float
) -> dict[str, list[list[RankRun]]]:
    """Every spec ``rounds`` times, interleaved; a fresh process pair per spec (or per round if
    ``together``, the smoke test). Returns per spec key its rounds' per-rank runs."""
    out: dict[str, list[list[RankRun]]] = {x.key: [] for x in specs}
    if not together:
        # the first process pair of a benchmark runs slower (seen 1.5-2x on this machine, for
        # whichever configuration comes first): one discarded run of the first configuration
        launch(specs[:1], s, timeout)
        print(f"  warm-up run of {specs[0].key} (discarded)", flush=True)
    for r in range(rounds):
        order = specs if r % 2 == 0 else specs[::-1]
        groups = [order] if together else [[x] for x in order]
        for group in groups:
            for spec, ranks in zip(group, launch(group, s, timeout), strict=True):
                out[spec.key].append(ranks)
                tps = sum(sum(x.tokens) for x in ranks) / max(1e-9, max(x.wall_s for x in ranks))
                state = "trained" if ranks[0].trained else "NOT trained (unequal counts)"
                print(
                    f"  round {r} {spec.key:<22} {state}, counts {ranks[0].counts}, "
                    f"{tps:8.0f} real tgt tok/s, both ranks reported",
                    flush=True,
                )
    return out


# -- entry point -----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Training with every peer's batches (docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny, 1 round, one pair")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--target-tokens", type=int, default=None, help="default 16k (cuda: 400k)")
    p.add_argument("--max-tokens", type=int, default=None, help="M; default 512 (cuda: 8192)")
    p.add_argument(
        "--device",
        default="cpu",
        help="cpu, or cuda: Transformer-base sizes, bf16, unscaled lengths; both ranks share it",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--peers", default=",".join(p.name for p in PEERS), help="comma-separated")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per process pair")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "training_peers")
    p.add_argument("--png", default=None, help="also draw the figure to this PNG file")
    p.add_argument("--rank-child", nargs=3, default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> TranslationSettings:
    gpu = args.device.startswith("cuda")
    s = replace(
        DEFAULTS,
        target_tokens=args.target_tokens or (400_000 if gpu else 16_000),
        max_tokens=args.max_tokens or (8192 if gpu else 512),
        seed=args.seed,
    )
    if gpu:  # the sizes of benchmarks.gpu.throughput
        s = replace(s, device=args.device, bf16=True, d_model=512, nhead=8, layers=6, ffn=2048)
        s.vocab, s.length_scale, s.lr, s.warmup = 32_000, 1.0, 1e-4, 3
    if args.quick:
        s.target_tokens, s.d_model, s.ffn, s.vocab, s.layers, s.nhead = 2500, 32, 64, 500, 1, 2
        s.max_tokens, args.rounds = 256, 1
    return s


def child_main(args: argparse.Namespace) -> int:
    import json

    specs = [RunSpec(**x) for x in json.loads(args.rank_child[0])]
    rank, port = int(args.rank_child[1]), int(args.rank_child[2])
    s = TranslationSettings.from_json(args.settings)
    for run in run_rank(specs, rank, WORLD, port, s):
        emit_result(as_dict(run))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_child is not None:
        return child_main(args)
    s = settings_from_args(args)
    run = Run("training_peers", settings=asdict(s), package=MEASURED, bench=BENCH_MODULES)
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    print("uptime before:", uptime())
    lengths = workload_lengths(s)
    tl = plan_lengths(lengths)
    key = tl.max(axis=1)
    names = [n for n in args.peers.split(",") if n]
    status = {n: unavailable(BY_NAME[n]) for n in names}
    runnable = [n for n in names if status[n] is None]
    peer_versions = {n: versions(BY_NAME[n]) for n in runnable}
    print(
        f"workload: {len(key):,} examples, {int(lengths[:, 1].sum()):,} real target tokens, "
        f"key median {np.median(key):.0f}, longest {key.max()}; M = {s.max_tokens}; "
        f"{WORLD} ranks (gloo), {s.threads} thread each; model d_model={s.d_model}, "
        f"{s.layers}+{s.layers} layers, FFN {s.ffn}, vocab {s.vocab}; {s.warmup} untimed steps; "
        f"device {s.device}{', bf16 autocast' if s.bf16 else ', fp32'}"
    )
    for n in names:
        state = status[n] or ", ".join(f"{k} {v}" for k, v in peer_versions[n].items()) or "-"
        print(f"  {BY_NAME[n].label:<32} {state}")
    specs, table, b_mean, search_s = plan_specs(tl, s.max_tokens, s.seed, runnable)
    print(f"B (our mean examples per micro-batch) = {b_mean}; runs per round: {len(specs)}")
    try:
        runs = run_rounds(specs, s, args.rounds, args.quick, args.timeout)
    except ChildFailed as e:
        print(f"a run failed:\n{e}")
        raise
    summary = summarize(specs, runs, key, lengths, s.max_tokens)
    numbers: dict[str, Any] = {
        "command": command_line(MODULE, argv),
        "machine": torch_machine_line(),
        "settings": asdict(s),
        "world": WORLD,
        "rounds": args.rounds,
        "n": len(key),
        "real_target_tokens": int(lengths[:, 1].sum()),
        "b_mean": b_mean,
        "limit": s.max_tokens,
        "status": {n: status[n] or "ok" for n in names},
        "versions": peer_versions,
        "torch": importlib.metadata.version("torch"),
        "device": s.device,
        "search_s": search_s,
        "comparisons": table,
        "runs": summary,
    }
    numbers["margins"] = print_report(numbers)
    print("uptime after:", uptime())
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    if args.png:
        print(f"figure: {draw(numbers, args.png)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
