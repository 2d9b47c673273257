"""Straggler cost under 2 CPU processes (gloo): time ranks wait at the gradient all-reduce.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.training.straggler            # default: about 3-4 min on 2 CPU cores
    python -m benchmarks.training.straggler --quick    # smoke test, < 20 s

Workload: the model and data of :mod:`benchmarks.training.throughput` (``TranslationModel``
with ``d_model=128``, 2 + 2 layers, FFN 512, vocabulary 8000; random tokens with WMT-like
lengths x 0.5), ``--target-tokens`` real target tokens (default 60k), ``max_tokens=1024``.

The global set of micro-batches is fixed: the epoch plan of
:class:`lightning_varbatch.TokenBudgetBatchSampler` for ``world_size=2``. It is run three ways:

* **ours**: as the sampler deals it (the two micro-batches of a step are consecutive in the
  length-sorted layout, dealt largest-first to the least-loaded rank).
* **round-robin, shuffled**: the same micro-batches in a random order, micro-batch ``i`` to
  rank ``i % 2`` (what ``batches[rank::world]`` after a batch shuffle does, e.g. fairseq).
* **round-robin, sorted**: the same micro-batches sorted by their longest member, dealt
  ``i % 2``, steps then shuffled. With 2 ranks this pairs the same micro-batches as ours
  (the cost-model imbalance columns are equal), so its difference from ours measures the
  noise of the machine, not a difference of method.

Each round is a real 2-process run: one ``python`` subprocess per rank, ``torch.distributed``
with the gloo backend, 1 thread per rank, running the three configurations one after the other
(fresh model with the same initial weights for each). No DDP wrapper: after backward
each rank concatenates its gradients and calls ``dist.all_reduce`` once, so the time in that
call is the wait for the other rank plus the transfer. Per step and rank: **compute** =
forward + backward + concatenation, **all-reduce** = the time in ``dist.all_reduce``. Then:

* **wait**: all-reduce time minus the transfer floor; the floor of a step is the smaller of the
  two ranks' all-reduce times (the rank that arrived last waits for nobody). Summed over both
  ranks and the timed steps.
* **compute gap**: per step, max minus min compute time over the ranks (what the faster rank
  idles, if both start the step together); summed over steps.
* **epoch**: wall time of the timed steps on rank 0.

Every rank prints a completion record; a run counts only if both ranks reported. Runs are
interleaved (``ours, rr-shuffled, rr-sorted``, then reversed, ...) for ``--rounds`` rounds; the
table shows medians and ratios to ours measured in the same run. The other jobs that share the
CPU add waits of their own (a descheduled rank makes the other wait), so the rounds matter.
"""

from __future__ import annotations

import argparse
import socket
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from benchmarks.harness import (
    child_command,
    child_env,
    command_line,
    emit_result,
    print_table,
    run_children,
    torch_machine_line,
    write_json,
)
from benchmarks.planning.metrics import batches_from_steps, quality
from benchmarks.results import Run, add_result_option, result_path
from benchmarks.workload import (
    DEFAULTS,
    TranslationSettings,
    build_model,
    collate,
    plan_lengths,
    workload_lengths,
)

WORLD = 2
CONFIGS = ("ours", "rr-shuffled", "rr-sorted")
MEASURED = ["lightning_varbatch.data.sampler", "lightning_varbatch.planner.synthetic"]
MEASURED += ["lightning_varbatch.planner.diagnostics", "examples.translation.model"]
BENCH_MODULES = [
    "benchmarks.training.straggler",
    "benchmarks.workload",
    "benchmarks.planning.metrics",
]


def assignment(kind: str, lengths: np.ndarray, s: TranslationSettings) -> list[list[np.ndarray]]:
    """``steps[j][r]``: the micro-batch of rank ``r`` in step ``j``, for configuration ``kind``."""
    from lightning_varbatch import TokenBudgetBatchSampler

    tl = plan_lengths(lengths)
    ranks = [
        [
            np.asarray(b, dtype=np.int64)
            for b in TokenBudgetBatchSampler(
                tl, s.max_tokens, rank=r, world_size=WORLD, seed=s.seed
            )
        ]
        for r in range(WORLD)
    ]
    steps = [list(step) for step in zip(*ranks, strict=True)]
    if kind == "ours":
        return steps
    flat = [b for step in steps for b in step]
    rng = np.random.default_rng([s.seed, 11])
    if kind == "rr-shuffled":
        flat = [flat[i] for i in rng.permutation(len(flat))]
        return [flat[i : i + WORLD] for i in range(0, len(flat), WORLD)]
    if kind == "rr-sorted":
        key = tl.max(axis=1)
        flat.sort(key=lambda b: (-int(key[b].max()), -len(b)))
        dealt = [flat[i : i + WORLD] for i in range(0, len(flat), WORLD)]
        return [dealt[i] for i in rng.permutation(len(dealt))]
    raise ValueError(f"unknown configuration {kind!r}; expected one of {CONFIGS}")


def cost_imbalance(
    steps: list[list[np.ndarray]], lengths: np.ndarray, max_tokens: int
) -> tuple[float, float]:
    """Mean over steps of max/mean rank load, linear ``n*L`` and quadratic ``n*L + n*L^2/64``.

    The library's definition (:func:`lightning_varbatch.planner.diagnostics.diagnose`, through
    :func:`benchmarks.planning.metrics.quality`), over the planning key ``max(src, [BOS] + tgt)``.
    """
    key = plan_lengths(lengths).max(axis=1)
    q = quality(batches_from_steps(steps), key, max_tokens, WORLD)
    return q.imb_lin, q.imb_quad


# -- one rank ------------------------------------------------------------------------------------


@dataclass
class RankResult:
    kind: str
    rank: int
    steps: int
    compute_s: list[float] = field(default_factory=list)
    allreduce_s: list[float] = field(default_factory=list)
    wall_s: float = 0.0


def train_config(
    kind: str, steps: list[list[np.ndarray]], lengths: np.ndarray, rank: int, s: TranslationSettings
) -> RankResult:
    """One configuration on this rank (the process group is up)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    if s.max_steps is not None:
        steps = steps[: s.max_steps]
    mine = [
        collate(step[rank], lengths, s.vocab, s.seed + 7919 * j) for j, step in enumerate(steps)
    ]
    torch.manual_seed(s.seed)  # the same initial weights on both ranks
    model = build_model(s)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=s.lr)
    out = RankResult(kind=kind, rank=rank, steps=len(steps))
    dist.barrier()
    t_start = time.perf_counter()
    for j, batch in enumerate(mine):
        if j == s.warmup:
            dist.barrier()
            t_start = time.perf_counter()
        t0 = time.perf_counter()
        logits = model(batch)
        real = batch["target_mask"][:, 1:]
        labels = batch["target"][:, 1:]
        loss = F.cross_entropy(logits[real], labels[real], reduction="sum")
        (loss / max(1, int(real.sum()))).backward()
        flat = torch.cat(
            [(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
        )
        t1 = time.perf_counter()
        dist.all_reduce(flat)
        t2 = time.perf_counter()
        flat /= WORLD
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = flat[offset : offset + n].view_as(p).clone()
            offset += n
        opt.step()
        opt.zero_grad(set_to_none=True)
        if j >= s.warmup:
            out.compute_s.append(t1 - t0)
            out.allreduce_s.append(t2 - t1)
    out.wall_s = time.perf_counter() - t_start
    dist.barrier()
    return out


def run_rank(
    kinds: Sequence[str], rank: int, port: int, s: TranslationSettings
) -> list[RankResult]:
    """This rank's part of every configuration in ``kinds``, in that order, one process group."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(s.threads)
    # every rank's micro-batches, planned before the process group exists (the sampler checks
    # its rank against a live process group, and here each process plans for both ranks)
    lengths = workload_lengths(s)
    plans = {kind: assignment(kind, lengths, s) for kind in kinds}
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        # warm-up, discarded: the first configuration of a round would otherwise also pay for
        # the allocator's and the gloo connection's first use
        warm = replace(s, max_steps=s.warmup + 3)
        train_config(kinds[0], plans[kinds[0]], lengths, rank, warm)
        return [train_config(kind, plans[kind], lengths, rank, s) for kind in kinds]
    finally:
        dist.destroy_process_group()


# -- the parent ----------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def launch(
    kinds: Sequence[str], s: TranslationSettings, timeout: float
) -> dict[str, list[RankResult]]:
    """Both ranks as subprocesses running ``kinds`` in order; both must report every one, else
    :class:`benchmarks.harness.ChildFailed` with their stderr. Returns each configuration's
    per-rank results."""
    port, settings = str(_free_port()), s.to_json()
    commands = [
        child_command(
            "benchmarks.training.straggler",
            "--rank-child",
            ",".join(kinds),
            str(r),
            port,
            "--settings",
            settings,
        )
        for r in range(WORLD)
    ]
    done = [
        [RankResult(**x) for x in found]
        for found in run_children(
            commands, env=child_env(OMP_NUM_THREADS=str(s.threads)), timeout=timeout
        )
    ]
    if any(len(x) != len(kinds) for x in done):
        raise RuntimeError(f"{','.join(kinds)}: a rank reported {[len(x) for x in done]} runs")
    return {k: [done[r][i] for r in range(WORLD)] for i, k in enumerate(kinds)}


@dataclass
class RunStats:
    wait_s: float
    allreduce_s: float
    floor_s: float
    compute_gap_s: float
    compute_s: float
    epoch_s: float
    steps: int


def stats(ranks: list[RankResult]) -> RunStats:
    ar = np.array([r.allreduce_s for r in ranks])  # (world, steps)
    comp = np.array([r.compute_s for r in ranks])
    floor = ar.min(axis=0)
    return RunStats(
        wait_s=float((ar - floor[None, :]).sum()),
        allreduce_s=float(ar.sum()),
        floor_s=float(floor.sum() * len(ranks)),
        compute_gap_s=float((comp.max(axis=0) - comp.min(axis=0)).sum()),
        compute_s=float(comp.sum()),
        epoch_s=ranks[0].wall_s,
        steps=int(ar.shape[1]),
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Straggler benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test (< 20 s): tiny, 1 round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--target-tokens", type=int, default=60_000)
    p.add_argument("--max-tokens", type=int, default=1024)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds per 2-process run")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "straggler")
    p.add_argument("--rank-child", nargs=3, default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rank_child is not None:
        kinds = args.rank_child[0].split(",")
        rank, port = int(args.rank_child[1]), int(args.rank_child[2])
        for x in run_rank(kinds, rank, port, TranslationSettings.from_json(args.settings)):
            emit_result(asdict(x))
        return 0
    s = replace(
        DEFAULTS, target_tokens=args.target_tokens, max_tokens=args.max_tokens, seed=args.seed
    )
    if args.quick:
        s.target_tokens, s.d_model, s.ffn, s.vocab, s.layers, s.nhead = 3000, 32, 64, 500, 1, 2
        s.max_tokens, args.rounds = 512, 1
    run = Run("straggler", settings=asdict(s), package=MEASURED, bench=BENCH_MODULES)
    print("command:", command_line("benchmarks.training.straggler", argv))
    print("machine:", torch_machine_line())
    lengths = workload_lengths(s)
    print(
        f"workload: {lengths.shape[0]:,} examples, {int(lengths[:, 1].sum()):,} real target "
        f"tokens (wmt_like_lengths x {s.length_scale}), max_tokens={s.max_tokens}, "
        f"world_size={WORLD} (gloo, {s.threads} thread per rank); model d_model={s.d_model}, "
        f"{s.layers}+{s.layers} layers, FFN {s.ffn}, vocab {s.vocab}; first {s.warmup} steps "
        "untimed"
    )
    imb = {k: cost_imbalance(assignment(k, lengths, s), lengths, s.max_tokens) for k in CONFIGS}
    runs: dict[str, list[RunStats]] = {k: [] for k in CONFIGS}
    for r in range(args.rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        per_kind = launch(order, s, args.timeout)  # one pair of processes per round
        for kind in order:
            st = stats(per_kind[kind])
            runs[kind].append(st)
            print(
                f"  round {r} {kind:<12} {st.steps} steps: wait {st.wait_s:6.2f} s, "
                f"in all_reduce {st.allreduce_s:6.2f} s, compute gap {st.compute_gap_s:6.2f} s, "
                f"epoch {st.epoch_s:6.2f} s (both ranks reported)",
                flush=True,
            )

    def med(kind: str, name: str) -> float:
        return statistics.median(getattr(x, name) for x in runs[kind])

    print(
        f"\nstraggler cost (median of {args.rounds} interleaved rounds; sums over both ranks and "
        "the timed steps; imb = mean per-step max/mean rank cost under the cost model)"
    )
    headers = [
        "dealing",
        "imb lin",
        "imb quad",
        "wait s",
        "x ours",
        "wait/step ms",
        "wait % compute",
        "compute gap s",
        "x ours",
        "epoch s",
        "x ours",
    ]
    rows = []
    numbers: dict[str, Any] = {"configs": {}}
    for kind in CONFIGS:
        steps = runs[kind][0].steps
        wait, gap, epoch = med(kind, "wait_s"), med(kind, "compute_gap_s"), med(kind, "epoch_s")
        comp = med(kind, "compute_s")
        rows.append(
            [
                kind,
                f"{imb[kind][0]:.4f}",
                f"{imb[kind][1]:.4f}",
                f"{wait:.2f}",
                f"{wait / med('ours', 'wait_s'):.2f}",
                f"{1000 * wait / (WORLD * steps):.1f}",
                f"{100 * wait / comp:.1f}",
                f"{gap:.2f}",
                f"{gap / med('ours', 'compute_gap_s'):.2f}",
                f"{epoch:.2f}",
                f"{epoch / med('ours', 'epoch_s'):.3f}",
            ]
        )
        numbers["configs"][kind] = {
            "imb_lin": imb[kind][0],
            "imb_quad": imb[kind][1],
            "wait_s": [x.wait_s for x in runs[kind]],
            "compute_gap_s": [x.compute_gap_s for x in runs[kind]],
            "epoch_s": [x.epoch_s for x in runs[kind]],
            "compute_s": [x.compute_s for x in runs[kind]],
            "steps": steps,
            "wait_median_s": wait,
            "wait_vs_ours": wait / med("ours", "wait_s"),
            "gap_vs_ours": gap / med("ours", "compute_gap_s"),
            "epoch_vs_ours": epoch / med("ours", "epoch_s"),
            "wait_pct_compute": 100 * wait / comp,
        }
    print_table(headers, rows)
    print("machine after:", torch_machine_line())
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
