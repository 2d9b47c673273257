"""Planning benchmark: the epoch planner against the floor and three baselines.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.planning                 # full run: 4.5M and 100M examples
    python -m benchmarks.planning --quick         # smoke test: 200k examples, no 100M row,
                                                  # no RSS child, small lhotse/DeepSpeed runs
    python -m benchmarks.planning --sizes 4500000 20000000 --ds-sizes 5000 10000

Workload: WMT14 en-de-like (source, target) lengths from
:func:`lightning_varbatch.synthetic.wmt_like_lengths`, ``max_tokens=16384``, ``world_size=8``,
``accumulate_grad_batches=1``, default :class:`PlanConfig` (cost ``"padded"``, tail
``"spread"``). The key of a pair is ``max(src, tgt)``. The first of ``--sizes`` is the main
size: baselines run there and the targets are checked there; the largest size is the
linearity check (planner, floor and sampler only).

Definitions:

* **floor**: ``rng.permutation(n)`` plus ``np.argsort(key.astype(np.int16), kind="stable")``
  (one random permutation and one stable radix sort), ``key`` computed beforehand.
* **rank 0 planned + iterated** (the planner's time): ``EpochPlanner(lengths, config)`` +
  ``plan(0, world_size)`` + for each tile of rank 0 ``plan.tile_ids(t).tolist()`` (each list
  discarded at once) + ``plan.step_tokens``. **plan all ranks**: construction + ``plan()``.
* Timings: floor, planner and sampler are interleaved, ``--repeats`` times (default 3); the
  tables show the **median** (the best is printed alongside). Baselines: median as well.
* **peak extra memory**: ``tracemalloc`` peak (numpy reports its array buffers to it) during
  the rank-0 plan + iteration, the input lengths allocated before tracing; in bytes per
  example. ``held``: what is still traced at the end with planner and plan alive. **RSS
  peak**: the rise of the process high-water mark (``/proc/self/clear_refs`` reset, Linux
  only) over the same work, measured in a child process run with a fixed glibc mmap threshold
  (``MALLOC_MMAP_THRESHOLD_``) so that freed buffers leave the resident set; it also sees
  buffers numpy allocates with plain ``malloc`` and does not report to tracemalloc (e.g. the
  8 B/example scratch of its radix argsort), and torch tensors.
* **padding efficiency**: sum over micro-batches of real key tokens (sum of ``max(src, tgt)``
  of the members) / sum of ``n_examples * longest key``.
* **budget fill**: mean micro-batch cost / ``max_tokens``; **max cost**: largest cost /
  ``max_tokens``; **over**: fraction of micro-batches above the budget. Costs use the padded
  model ``n * L`` (``L``: longest key), except the ``cost=quadratic`` row (quadratic model).
* **imbalance**: per optimizer step, each rank's cost is the sum of its micro-batch costs in
  the step; imbalance is max / mean over ranks; the tables show the mean over the steps in
  which every rank has a micro-batch. Linear cost ``n * L``; quadratic ``n*L + n*L**2/64``.
* **batches/rank**: min and max number of micro-batches over ranks (equal counts: min = max).
* **coverage**: distinct examples in the epoch / n; **dup**: examples yielded more than once.
* **d-order**: fraction of steps whose rank-0 first micro-batch differs between epoch 0 and 1
  (tile id for layouts fixed across epochs, else the example set). **d-comp**: fraction of
  epoch-1 micro-batches whose example set equals no epoch-0 micro-batch (order-independent
  64-bit hash of the sorted ids).

Targets (checked at the main size, printed as PASS/FAIL): rank 0 planned + iterated <= 2x
the floor; peak extra memory <= 16 B/example (tracemalloc, and RSS shown as well); at the
largest size, <= 2x the floor and ns/example growth <= 1.25x the floor's own growth (the
machine's memory system makes even the floor super-linear), and <= 16 B/example; padding
efficiency >= 0.99 with d-order and d-comp > 0.5; max cost <= max_tokens; mean imbalance
<= 1.01 (linear) and <= 1.02 (quadratic); coverage 100 % with no duplicate and equal counts.

Baselines:

* **DistributedSampler**: ``torch.utils.data.DistributedSampler(shuffle=True)`` (random
  permutation, ``perm[rank::world]``) + ``BatchSampler`` of a fixed size ``B``, the largest ``B``
  whose median (p50) random batch fits the budget; fixed sizes cannot respect a token budget,
  so the over-budget fraction is reported.
* **greedy sorted** (fairseq-like): stable sort by key (ascending), cut greedily into the
  largest batches under the budget, batch order shuffled each epoch, sharded
  ``batches[rank::world]``, no tail handling.
* **DeepSpeed** ``batch_by_seqlens`` (``sequence_picking_order="seqlen"``,
  ``effective_batch_size=world_size``), micro-batches dealt as DeepSpeed's dataloader does
  (``DistributedSampler(shuffle=False)``: micro-batch ``i`` to rank ``i % world``). It packs by
  *unpadded* tokens and is super-linear, so it runs on subsamples (``--ds-sizes``); its time is
  extrapolated to the main size with the exponent fitted on the two largest subsamples.
* **lhotse** ``DynamicBucketingSampler`` (``TokenConstraint``), **Hugging Face**
  ``LengthGroupedSampler`` (+ accelerate's ``BatchSamplerShard``) and **fairseq**
  ``batch_by_size`` (not installable on Python 3.11): see :mod:`benchmarks.planning_others`.
  lhotse runs on ``--lhotse-size`` examples (default 500k) next to our planner timed on the
  same examples.

The performance table's **x ours** column is the row's time over our planner's time at the
same size, measured in the same run.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from functools import partial
from typing import Any, TypeVar, cast

import numpy as np

from lightning_varbatch.planning import EpochPlan, EpochPlanner, PlanConfig
from lightning_varbatch.synthetic import wmt_like_lengths

T = TypeVar("T")

QUAD_COEF = 1 / 64
MAIN_DEFAULT = 4_500_000
BIG_DEFAULT = 100_000_000


# -- measuring ---------------------------------------------------------------------------------


def _timed(fn: Callable[[], T]) -> tuple[float, T]:
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def _traced(fn: Callable[[], T]) -> tuple[int, int, T]:
    """Run ``fn`` under tracemalloc: (peak bytes, bytes still held with the result alive)."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    out = fn()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, current, out


def _proc_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _rss_peak(fn: Callable[[], T]) -> tuple[int | None, T]:
    """Rise of the resident-set high-water mark over ``fn`` (bytes), ``None`` if unsupported."""
    gc.collect()
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset VmHWM to the current RSS
    except OSError:
        return None, fn()
    before = _proc_kib("VmRSS")
    out = fn()
    after = _proc_kib("VmHWM")
    if before is None or after is None:
        return None, out
    return (after - before) * 1024, out


# -- one epoch of micro-batches, whatever made it ------------------------------------------------


@dataclass
class Batches:
    """Every rank's micro-batches of one epoch: batch ``b`` is ``pool[start[b]:start[b]+size[b]]``.

    ``slot`` names the batch in a layout that is fixed across epochs (``None`` when there is
    none); it is what the batch-order comparison compares.
    """

    pool: np.ndarray
    start: np.ndarray
    size: np.ndarray
    rank: np.ndarray
    step: np.ndarray
    slot: np.ndarray | None = None


@dataclass
class Quality:
    """Plan-quality numbers of one epoch (see the module docstring)."""

    pad_eff: float
    fill: float
    max_cost: float
    over: float
    imb_lin: float
    imb_quad: float
    full_steps: int
    steps: int
    count_min: int
    count_max: int
    coverage: float
    dup: int
    d_order: float | None = None
    d_comp: float | None = None


def _members(b: Batches) -> tuple[np.ndarray, np.ndarray]:
    """Example ids of all batches, batch after batch, and each batch's offset in them."""
    size = b.size.astype(np.int64)
    offs = np.cumsum(size) - size
    pos = np.repeat(b.start.astype(np.int64) - offs, size)
    pos += np.arange(pos.size, dtype=np.int64)
    return b.pool[pos], offs


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser, vectorised (wrapping uint64 arithmetic)."""
    z = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _set_hashes(b: Batches) -> np.ndarray:
    """Order-independent hash of each batch's example set."""
    ids, offs = _members(b)
    h = np.add.reduceat(_mix(ids), offs)
    return h ^ _mix(b.size)


def _first_rank0(b: Batches) -> np.ndarray:
    """Index of rank 0's first micro-batch of every step, in step order."""
    idx = np.flatnonzero(b.rank == 0)
    _, first = np.unique(b.step[idx], return_index=True)
    return idx[first]


def epoch_change(b0: Batches, b1: Batches) -> tuple[float, float]:
    """(d-order, d-comp) between two epochs."""
    h0, h1 = _set_hashes(b0), _set_hashes(b1)
    f0, f1 = _first_rank0(b0), _first_rank0(b1)
    m = min(f0.size, f1.size)
    if b0.slot is not None and b1.slot is not None:
        id0, id1 = b0.slot[f0[:m]], b1.slot[f1[:m]]
    else:
        id0, id1 = h0[f0[:m]], h1[f1[:m]]
    d_order = float(np.mean(id0 != id1)) if m else 0.0
    d_comp = float(np.mean(np.isin(h1, h0, invert=True)))
    return d_order, d_comp


def quality(
    b: Batches,
    key: np.ndarray,
    max_tokens: int,
    world: int,
    *,
    budget_cost: str = "linear",
    other_epoch: Batches | None = None,
) -> Quality:
    """Padding, budget, balance, counts and coverage of one epoch of batches."""
    n = key.shape[0]
    ids, offs = _members(b)
    kv = key[ids]
    longest = np.maximum.reduceat(kv, offs).astype(np.float64)
    real = np.add.reduceat(kv, offs, dtype=np.int64)
    size = b.size.astype(np.float64)
    lin = size * longest
    quad = lin + size * longest * longest * QUAD_COEF
    cost = lin if budget_cost == "linear" else quad
    steps = int(b.step.max()) + 1
    cell = b.step.astype(np.int64) * world + b.rank
    counts = np.bincount(cell, minlength=steps * world).reshape(steps, world)
    full = (counts > 0).all(axis=1)
    imb = []
    for c in (lin, quad):
        per = np.bincount(cell, weights=c, minlength=steps * world).reshape(steps, world)
        per = per[full]
        imb.append(float(np.mean(per.max(axis=1) / per.mean(axis=1))) if per.size else math.nan)
    per_rank = np.bincount(b.rank, minlength=world)
    seen = np.zeros(n, dtype=bool)
    seen[ids] = True
    distinct = int(np.count_nonzero(seen))
    del seen
    q = Quality(
        pad_eff=float(real.sum() / lin.sum()),
        fill=float(cost.mean() / max_tokens),
        max_cost=float(cost.max() / max_tokens),
        over=float(np.mean(cost > max_tokens)),
        imb_lin=imb[0],
        imb_quad=imb[1],
        full_steps=int(full.sum()),
        steps=steps,
        count_min=int(per_rank.min()),
        count_max=int(per_rank.max()),
        coverage=distinct / n,
        dup=int(ids.size - distinct),
    )
    if other_epoch is not None:
        q.d_order, q.d_comp = epoch_change(b, other_epoch)
    return q


# -- the planner ---------------------------------------------------------------------------------


def _iterate_plan(plan: EpochPlan, rank: int) -> None:
    for tile in plan.rank_tiles(rank).tolist():
        ids = plan.tile_ids(tile).tolist()
        del ids  # consumed batch by batch, never kept
    _ = plan.step_tokens


def ours_rank(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int
) -> tuple[float, float]:
    """(plan all ranks, rank planned + iterated) seconds of one run of the planner."""
    gc.collect()
    t0 = time.perf_counter()
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world)
    t1 = time.perf_counter()
    _iterate_plan(plan, rank)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t0


def ours_memory(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int
) -> tuple[EpochPlanner, EpochPlan]:
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world)
    _iterate_plan(plan, rank)
    return planner, plan


def plan_batches(plan: EpochPlan) -> Batches:
    s, w, a = plan.assign.shape
    tiles = plan.assign.reshape(-1)
    return Batches(
        pool=plan.order,
        start=plan.tile_start[tiles],
        size=plan.tile_size[tiles],
        rank=np.tile(np.repeat(np.arange(w), a), s),
        step=np.repeat(np.arange(s), w * a),
        slot=tiles,
    )


def floor_once(key: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    perm = rng.permutation(key.shape[0])
    order = np.argsort(key.astype(np.int16), kind="stable")
    return perm, order


def _sampler_cls() -> Any:
    try:
        from lightning_varbatch.sampler import TokenBudgetBatchSampler
    except ImportError:
        return None
    return TokenBudgetBatchSampler


# -- baselines -----------------------------------------------------------------------------------


def fixed_batch_size(key: np.ndarray, max_tokens: int, seed: int) -> int:
    """Largest fixed batch size whose median random batch fits the budget (padded cost)."""
    rng = np.random.default_rng([seed, 99])
    sample = rng.permutation(key)[: 1 << 21].astype(np.int64)
    lo, hi = 1, max(1, max_tokens // int(sample.min()))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        rows = sample.size // mid
        if rows == 0:
            hi = mid - 1
            continue
        longest = sample[: rows * mid].reshape(rows, mid).max(axis=1)
        if float(np.median(mid * longest)) <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return lo


def dist_sampler_rank(n: int, batch: int, world: int, rank: int, seed: int) -> float:
    from torch.utils.data import BatchSampler, DistributedSampler

    gc.collect()
    t0 = time.perf_counter()
    sampler: DistributedSampler[int] = DistributedSampler(
        cast(Any, range(n)), num_replicas=world, rank=rank, shuffle=True, seed=seed, drop_last=False
    )
    sampler.set_epoch(0)
    for ids in BatchSampler(sampler, batch, drop_last=False):
        del ids
    return time.perf_counter() - t0


def dist_sampler_all(n: int, batch: int, world: int, seed: int) -> list[list[list[int]]]:
    """Every rank's batches, computed the way DistributedSampler + BatchSampler do."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    idx: list[int] = torch.randperm(n, generator=g).tolist()
    total = -(-n // world) * world
    idx += idx[: total - n]
    shards = [idx[r:total:world] for r in range(world)]
    return [[s[i : i + batch] for i in range(0, len(s), batch)] for s in shards]


def dist_sampler_batches(n: int, batch: int, world: int, seed: int, epoch: int) -> Batches:
    import torch

    g = torch.Generator()
    g.manual_seed(seed + epoch)  # DistributedSampler seeds with seed + epoch
    perm = torch.randperm(n, generator=g).numpy()
    total = -(-n // world) * world
    perm = np.concatenate([perm, perm[: total - n]])
    per = total // world
    pool = perm.reshape(per, world).T.reshape(-1)  # rank-major: rank r's indices perm[r::world]
    nb = -(-per // batch)
    j = np.arange(nb)
    start = (np.arange(world)[:, None] * per + j[None, :] * batch).reshape(-1)
    size = np.minimum(batch, per - j * batch)
    return Batches(
        pool=pool,
        start=start,
        size=np.tile(size, world),
        rank=np.repeat(np.arange(world), nb),
        step=np.tile(j, world),
    )


def greedy_cut(sorted_key: np.ndarray, max_tokens: int) -> np.ndarray:
    """Starts of the greedy cut of ascending keys: each batch as large as the budget allows."""
    k = memoryview(cast(Any, np.ascontiguousarray(sorted_key, dtype=np.int32)))
    n = len(k)
    starts: list[int] = []
    pos = 0
    while pos < n:
        lo = pos + 1
        hi = min(n, pos + max(1, max_tokens // k[pos]))
        while lo < hi:  # (size) * (last, the longest) <= budget is monotone in the end
            mid = (lo + hi + 1) // 2
            if (mid - pos) * k[mid - 1] <= max_tokens:
                lo = mid
            else:
                hi = mid - 1
        starts.append(pos)
        pos = lo
    return np.asarray(starts, dtype=np.int64)


def greedy_plan(
    key: np.ndarray, max_tokens: int, seed: int, epoch: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(sorted ids, batch starts, batch sizes, shuffled batch order) of the greedy baseline."""
    ids = np.argsort(key, kind="stable")
    starts = greedy_cut(key[ids], max_tokens)
    sizes = np.diff(np.append(starts, key.shape[0]))
    perm = np.random.default_rng([seed, epoch]).permutation(starts.size)
    return ids, starts, sizes, perm


def greedy_rank(key: np.ndarray, max_tokens: int, world: int, rank: int, seed: int) -> float:
    gc.collect()
    t0 = time.perf_counter()
    ids, starts, sizes, perm = greedy_plan(key, max_tokens, seed, 0)
    for slot in perm[rank::world].tolist():
        s = int(starts[slot])
        batch = ids[s : s + int(sizes[slot])].tolist()
        del batch
    return time.perf_counter() - t0


def greedy_batches(key: np.ndarray, max_tokens: int, world: int, seed: int, epoch: int) -> Batches:
    ids, starts, sizes, perm = greedy_plan(key, max_tokens, seed, epoch)
    k = np.arange(perm.size)
    return Batches(
        pool=ids, start=starts[perm], size=sizes[perm], rank=k % world, step=k // world, slot=perm
    )


def deepspeed_fn() -> Callable[..., Any] | None:
    try:
        from deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr import (
            batch_by_seqlens,
        )
    except Exception:  # ImportError, or deepspeed failing to initialise
        return None
    return batch_by_seqlens


def deepspeed_batches(
    fn: Callable[..., Any], key: np.ndarray, max_tokens: int, world: int, seed: int
) -> Batches:
    microbatches, _, _ = fn(
        key.astype(np.int64).tolist(),
        max_tokens,
        effective_batch_size=world,
        sequence_picking_order="seqlen",
        seed=seed,
    )
    lists = [ids for _, ids in microbatches]
    size = np.array([len(x) for x in lists], dtype=np.int64)
    i = np.arange(size.size)
    return Batches(
        pool=np.concatenate([np.asarray(x, dtype=np.int64) for x in lists]),
        start=np.cumsum(size) - size,
        size=size,
        rank=i % world,
        step=i // world,
        slot=i,
    )


# -- profile of the planner ----------------------------------------------------------------------


def profile_pieces(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int, calls: int
) -> list[tuple[str, Callable[[], object]]]:
    """The planner's pieces, each a callable that can be called ``calls`` times."""
    from lightning_varbatch.layout import Layout, SortedGroups
    from lightning_varbatch.lengths import prepare_lengths

    prep = prepare_lengths(lengths, config)
    groups = SortedGroups.build(prep.key, prep.kept, config.bucket_width)
    planner = EpochPlanner(lengths, config)
    plan = planner.plan(0, world)
    fresh = [planner.plan(0, world) for _ in range(calls)]  # tile_tokens is cached per plan
    warm = [planner.plan(0, world) for _ in range(calls)]
    for p in warm:
        _ = p.tile_tokens

    def shuffle() -> np.ndarray:
        rng = np.random.default_rng(0)
        order = groups.ids.copy()
        starts = groups.starts
        for g in np.flatnonzero(np.diff(starts) > 1):
            rng.shuffle(order[starts[g] : starts[g + 1]])
        return order

    return [
        (
            "prepare_lengths (validate, key = max(src, tgt))",
            lambda: prepare_lengths(lengths, config),
        ),
        (
            "SortedGroups.build (radix argsort of the key)",
            lambda: SortedGroups.build(prep.key, prep.kept, config.bucket_width),
        ),
        ("Layout.build (greedy cut of the groups)", lambda: Layout.build(groups, config)),
        ("plan(epoch), sort + layout cached (per-epoch work)", lambda: planner.plan(1, world)),
        ("  of which: ids.copy + shuffle within groups", shuffle),
        ("iterate rank 0: tile_ids(t).tolist()", lambda: _iterate_rank_only(plan, rank)),
        ("tile_tokens (loss[order] gather + reduceat)", lambda: fresh.pop().tile_tokens),
        ("step_tokens, tile_tokens known", lambda: warm.pop().step_tokens),
    ]


def profile(
    lengths: np.ndarray, config: PlanConfig, world: int, rank: int
) -> list[tuple[str, float, float]]:
    """(piece, seconds, tracemalloc peak B/example) of the planner's pieces."""
    n = lengths.shape[0]
    rows = []
    for name, fn in profile_pieces(lengths, config, world, rank, calls=2):
        dt, out = _timed(fn)
        del out
        peak, _, out = _traced(fn)
        del out
        rows.append((name, dt, peak / n))
    return rows


def _iterate_rank_only(plan: EpochPlan, rank: int) -> None:
    for tile in plan.rank_tiles(rank).tolist():
        ids = plan.tile_ids(tile).tolist()
        del ids


# -- resident-set peaks, measured in a child process ---------------------------------------------


def rss_child(n: int, args: argparse.Namespace) -> dict[str, float]:
    """RSS high-water rises (B/example); run with a fixed, small glibc mmap threshold."""
    config = PlanConfig(max_tokens=args.max_tokens)
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    lengths = wmt_like_lengths(n, seed=seed)
    key = np.maximum(lengths[:, 0], lengths[:, 1])
    out: dict[str, float] = {}

    def put(name: str, fn: Callable[[], object]) -> None:
        rss, res = _rss_peak(fn)
        del res
        if rss is not None:
            out[name] = rss / n

    put("ours", lambda: ours_memory(lengths, config, world, 0))
    put("floor", lambda: floor_once(key, seed))
    if args.rss_baselines:
        bsz = fixed_batch_size(key, budget, seed)
        put("dist", lambda: dist_sampler_rank(n, bsz, world, 0, seed))
        put("greedy", lambda: greedy_rank(key, budget, world, 0, seed))
    for name, fn in profile_pieces(lengths, config, world, 0, calls=1):
        put("piece:" + name, fn)
    return out


def measure_rss(n: int, args: argparse.Namespace, baselines: bool) -> dict[str, float]:
    """Run :func:`rss_child` in a fresh process; ``{}`` when that is not possible."""
    if not os.path.exists("/proc/self/clear_refs"):
        return {}
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    # a fixed threshold: every large buffer is its own mapping, returned to the OS when freed,
    # so the resident set before a measurement holds only live data
    env["MALLOC_MMAP_THRESHOLD_"] = "131072"
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--rss-child",
        str(n),
        "--max-tokens",
        str(args.max_tokens),
        "--world-size",
        str(args.world_size),
        "--seed",
        str(args.seed),
    ] + (["--rss-baselines"] if baselines else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RSS "):
            return {k: float(v) for k, v in json.loads(line[4:]).items()}
    print(f"  RSS measurement failed: {proc.stderr.strip()[-300:]}", flush=True)
    return {}


# -- printing ------------------------------------------------------------------------------------


def _fmt(x: object, spec: str = ".3f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, str):
        return x
    if spec == ".3f" and isinstance(x, float) and abs(x) >= 1e4:
        return format(x, ".3g")
    return format(x, spec)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


@dataclass
class Perf:
    method: str
    n: int
    plan_s: float | None
    rank_s: float | None
    rank_best_s: float | None
    floor_s: float | None
    peak_bpe: float | None = None
    held_bpe: float | None = None
    rss_bpe: float | None = None
    note: str = ""
    ours_s: float | None = None


def perf_rows(perfs: Sequence[Perf]) -> list[list[str]]:
    out = []
    for p in perfs:
        ratio = p.rank_s / p.floor_s if p.rank_s is not None and p.floor_s else None
        vs_ours = p.rank_s / p.ours_s if p.rank_s is not None and p.ours_s else None
        nspe = None if p.rank_s is None else p.rank_s / p.n * 1e9
        out.append(
            [
                p.method,
                f"{p.n:,}",
                _fmt(p.plan_s),
                _fmt(p.rank_s),
                _fmt(p.rank_best_s),
                _fmt(ratio, ".2f"),
                _fmt(vs_ours, ".2f"),
                _fmt(nspe, ".1f"),
                _fmt(p.peak_bpe, ".1f"),
                _fmt(p.held_bpe, ".1f"),
                _fmt(p.rss_bpe, ".1f"),
                p.note,
            ]
        )
    return out


PERF_HEADERS = [
    "method",
    "n",
    "plan all [s]",
    "rank0 [s]",
    "best [s]",
    "x floor",
    "x ours",
    "ns/ex",
    "peak B/ex",
    "held B/ex",
    "RSS B/ex",
    "note",
]
QUAL_HEADERS = [
    "method",
    "n",
    "pad eff",
    "fill",
    "max cost",
    "over %",
    "imb lin",
    "imb quad",
    "steps (full)",
    "batches/rank",
    "coverage %",
    "dup",
    "d-order",
    "d-comp",
]


def qual_row(method: str, n: int, q: Quality) -> list[str]:
    counts = f"{q.count_min}" if q.count_min == q.count_max else f"{q.count_min}-{q.count_max}"
    return [
        method,
        f"{n:,}",
        _fmt(q.pad_eff, ".4f"),
        _fmt(q.fill, ".4f"),
        _fmt(q.max_cost, ".4f"),
        _fmt(100 * q.over, ".2f"),
        _fmt(q.imb_lin, ".4f"),
        _fmt(q.imb_quad, ".4f"),
        f"{q.steps} ({q.full_steps})",
        counts,
        _fmt(100 * q.coverage, ".3f"),
        str(q.dup),
        _fmt(q.d_order, ".3f"),
        _fmt(q.d_comp, ".3f"),
    ]


# -- the run -------------------------------------------------------------------------------------


@dataclass
class SizeResult:
    n: int
    floor_s: float
    floor_best_s: float
    ours_plan_s: float
    ours_s: float
    ours_best_s: float
    peak_bpe: float
    held_bpe: float
    floor_peak_bpe: float
    sampler_s: float | None
    sampler_note: str
    quality: Quality
    dropped: int
    rss: dict[str, float]


def run_size(
    n: int, args: argparse.Namespace, config: PlanConfig, baselines: bool
) -> tuple[SizeResult, np.ndarray, np.ndarray]:
    world, rank, reps = args.world_size, 0, args.repeats
    t_gen, lengths = _timed(lambda: wmt_like_lengths(n, seed=args.seed))
    key = np.maximum(lengths[:, 0], lengths[:, 1])
    print(f"\n== n = {n:,}  (lengths generated in {t_gen:.1f} s, not timed)", flush=True)
    sampler_cls = _sampler_cls()
    floors: list[float] = []
    ours_plan: list[float] = []
    ours: list[float] = []
    samp: list[float] = []
    sampler_note = "not importable" if sampler_cls is None else ""
    for r in range(reps):
        dt, fl = _timed(partial(floor_once, key, args.seed + r))
        del fl
        floors.append(dt)
        p, t = ours_rank(lengths, config, world, rank)
        ours_plan.append(p)
        ours.append(t)
        if sampler_cls is not None and not sampler_note:
            try:
                dt, batches = _timed(
                    lambda: list(sampler_cls(lengths, args.max_tokens, rank=rank, world_size=world))
                )
                del batches
                samp.append(dt)
            except Exception as e:  # the sampler is being written concurrently
                sampler_note = f"error: {type(e).__name__}: {e}"[:80]
        print(
            f"  repeat {r}: floor {floors[-1]:.3f} s, planner {ours[-1]:.3f} s"
            + (f", sampler {samp[-1]:.3f} s" if len(samp) == r + 1 else ""),
            flush=True,
        )
    peak, held, kept = _traced(lambda: ours_memory(lengths, config, world, rank))
    del kept
    fpeak, _, fout = _traced(lambda: floor_once(key, args.seed))
    del fout
    planner = EpochPlanner(lengths, config)
    plan0 = planner.plan(0, world)
    b1 = plan_batches(planner.plan(1, world))
    q = quality(plan_batches(plan0), key, args.max_tokens, world, other_epoch=b1)
    dropped = plan0.num_dropped
    del b1, plan0, planner
    gc.collect()
    rss = {} if args.quick else measure_rss(n, args, baselines)  # a child process: slow
    res = SizeResult(
        n=n,
        floor_s=statistics.median(floors),
        floor_best_s=min(floors),
        ours_plan_s=statistics.median(ours_plan),
        ours_s=statistics.median(ours),
        ours_best_s=min(ours),
        peak_bpe=peak / n,
        held_bpe=held / n,
        floor_peak_bpe=fpeak / n,
        sampler_s=statistics.median(samp) if samp else None,
        sampler_note=sampler_note,
        quality=q,
        dropped=dropped,
        rss=rss,
    )
    return res, lengths, key


def size_perfs(res: SizeResult) -> list[Perf]:
    rows = [
        Perf(
            method="floor (perm + radix argsort)",
            n=res.n,
            plan_s=None,
            rank_s=res.floor_s,
            rank_best_s=res.floor_best_s,
            floor_s=res.floor_s,
            ours_s=res.ours_s,
            peak_bpe=res.floor_peak_bpe,
            rss_bpe=res.rss.get("floor"),
        ),
        Perf(
            method="ours: EpochPlanner",
            n=res.n,
            plan_s=res.ours_plan_s,
            rank_s=res.ours_s,
            rank_best_s=res.ours_best_s,
            floor_s=res.floor_s,
            ours_s=res.ours_s,
            peak_bpe=res.peak_bpe,
            held_bpe=res.held_bpe,
            rss_bpe=res.rss.get("ours"),
        ),
    ]
    if res.sampler_s is not None or res.sampler_note:
        rows.append(
            Perf(
                method="ours: list(TokenBudgetBatchSampler)",
                n=res.n,
                plan_s=None,
                rank_s=res.sampler_s,
                rank_best_s=None,
                floor_s=res.floor_s,
                ours_s=res.ours_s,
                note=res.sampler_note or "list() keeps all batches",
            )
        )
    return rows


def run_baselines(
    n: int, lengths: np.ndarray, key: np.ndarray, res: SizeResult, args: argparse.Namespace
) -> tuple[list[Perf], list[list[str]], dict[str, Any]]:
    world, budget, seed, reps = args.world_size, args.max_tokens, args.seed, args.repeats
    perfs: list[Perf] = []
    quals: list[list[str]] = []
    info: dict[str, Any] = {}

    # ours with the quadratic cost model (informational: budget in quadratic units)
    qcfg = PlanConfig(max_tokens=budget, cost="quadratic", quadratic_coef=QUAD_COEF)
    qplanner = EpochPlanner(lengths, qcfg)
    qb0 = plan_batches(qplanner.plan(0, world))
    qb1 = plan_batches(qplanner.plan(1, world))
    qq = quality(qb0, key, budget, world, budget_cost="quadratic", other_epoch=qb1)
    quals.append(qual_row("ours, cost=quadratic (quad budget)", n, qq))
    del qplanner, qb0, qb1

    # (a) DistributedSampler + fixed batch size
    bsz = fixed_batch_size(key, budget, seed)
    info["fixed_batch"] = bsz
    print(f"  DistributedSampler baseline: fixed batch size B = {bsz}", flush=True)
    times = [dist_sampler_rank(n, bsz, world, 0, seed) for _ in range(reps)]
    plan_t = [_timed(lambda: dist_sampler_all(n, bsz, world, seed))[0] for _ in range(reps)]
    peak, _, out = _traced(lambda: dist_sampler_rank(n, bsz, world, 0, seed))
    del out
    name = f"DistributedSampler, B={bsz}"
    perfs.append(
        Perf(
            method=name,
            n=n,
            plan_s=statistics.median(plan_t),
            rank_s=statistics.median(times),
            rank_best_s=min(times),
            floor_s=res.floor_s,
            peak_bpe=peak / n,
            rss_bpe=res.rss.get("dist"),
            ours_s=res.ours_s,
            note="randperm tensor untraced",
        )
    )
    b0 = dist_sampler_batches(n, bsz, world, seed, 0)
    b1 = dist_sampler_batches(n, bsz, world, seed, 1)
    quals.append(qual_row(name, n, quality(b0, key, budget, world, other_epoch=b1)))
    del b0, b1

    # (b) greedy sorted, round-robin
    times = [greedy_rank(key, budget, world, 0, seed) for _ in range(reps)]
    plan_t = [_timed(lambda: greedy_batches(key, budget, world, seed, 0))[0] for _ in range(reps)]
    peak, _, out = _traced(lambda: greedy_rank(key, budget, world, 0, seed))
    del out
    name = "greedy sorted, batches[rank::world]"
    perfs.append(
        Perf(
            method=name,
            n=n,
            plan_s=statistics.median(plan_t),
            rank_s=statistics.median(times),
            rank_best_s=min(times),
            floor_s=res.floor_s,
            peak_bpe=peak / n,
            rss_bpe=res.rss.get("greedy"),
            ours_s=res.ours_s,
        )
    )
    b0 = greedy_batches(key, budget, world, seed, 0)
    b1 = greedy_batches(key, budget, world, seed, 1)
    gq = quality(b0, key, budget, world, other_epoch=b1)
    info["greedy"] = gq
    quals.append(qual_row(name, n, gq))
    del b0, b1

    # (c) lhotse, Hugging Face, fairseq (benchmarks/planning_others.py)
    from benchmarks.planning_others import run_others

    config = PlanConfig(max_tokens=budget)  # as in main()
    others = run_others(lengths, key, args, config, bsz, res.ours_s, res.floor_s)
    perfs += others.perfs
    quals += others.quals
    info["others"] = others

    # (d) DeepSpeed batch_by_seqlens on subsamples
    fn = deepspeed_fn() if args.ds_sizes else None
    if fn is None:
        perfs.append(Perf("DeepSpeed batch_by_seqlens", n, None, None, None, None, note="n/a"))
        return perfs, quals, info
    ds_times: list[tuple[int, float]] = []
    last: Batches | None = None
    for m in args.ds_sizes:
        sub = key[:m]  # iid lengths: a prefix is a random subsample
        try:
            dt, last = _timed(partial(deepspeed_batches, fn, sub, budget, world, seed))
        except AssertionError as e:  # too few examples for one micro-batch per rank
            print(f"  DeepSpeed n={m}: failed ({e})", flush=True)
            continue
        ds_times.append((m, dt))
        print(f"  DeepSpeed batch_by_seqlens n={m:,}: {dt:.2f} s", flush=True)
    if last is None:
        perfs.append(Perf("DeepSpeed batch_by_seqlens", n, None, None, None, None, note="failed"))
        return perfs, quals, info
    m0, m_last, t_last = ds_times[0][0], ds_times[-1][0], ds_times[-1][1]
    dpeak, _, dsb = _traced(lambda: deepspeed_batches(fn, key[:m0], budget, world, seed))
    del dsb
    if len(ds_times) >= 2:
        (ma, ta), (mb, tb) = ds_times[-2], ds_times[-1]
        expo = math.log(tb / ta) / math.log(mb / ma)
    else:
        expo = 1.0  # one subsample: linear extrapolation, a lower bound
    extrap = t_last * (n / m_last) ** expo
    info["ds_exponent"], info["ds_extrapolated_s"] = expo, extrap
    for m, dt in ds_times:
        perfs.append(
            Perf(
                method=f"DeepSpeed batch_by_seqlens (n={m:,})",
                n=m,
                plan_s=dt,
                rank_s=None,
                rank_best_s=None,
                floor_s=None,
                peak_bpe=dpeak / m0 if m == m0 else None,
                note=f"{dt / m * 1e6:.0f} us/ex",
            )
        )
    perfs.append(
        Perf(
            method=f"DeepSpeed extrapolated (t ~ n^{expo:.2f})",
            n=n,
            plan_s=extrap,
            rank_s=None,
            rank_best_s=None,
            floor_s=None,
            note=f"{extrap / 86400:.3g} days = {extrap / res.floor_s:.3g}x floor",
        )
    )
    qd = quality(last, key[:m_last], budget, world)
    e0 = deepspeed_batches(fn, key[:m0], budget, world, seed)
    e1 = deepspeed_batches(fn, key[:m0], budget, world, seed + 1)
    qd.d_order, qd.d_comp = epoch_change(e0, e1)  # on the smallest subsample
    quals.append(qual_row(f"DeepSpeed batch_by_seqlens (n={m_last:,})", m_last, qd))
    return perfs, quals, info


def _mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_targets(
    main: SizeResult, big: SizeResult | None, args: argparse.Namespace, info: dict[str, Any]
) -> None:
    q = main.quality
    ratio = main.ours_s / main.floor_s
    print(f"\ntargets (n={main.n:,}; timings are medians of {args.repeats} interleaved repeats)")
    if args.quick:
        print(
            "  (--quick: a smoke test; the targets are set for 4.5M examples, and at this size "
            "fixed costs dominate the time and bytes-per-example ratios)"
        )
    lines: list[tuple[bool, str]] = [
        (
            ratio <= 2.0,
            f"rank-0 epoch planned+iterated <= 2x floor: {main.ours_s:.3f} s vs floor "
            f"{main.floor_s:.3f} s = {ratio:.2f}x "
            f"(best of {args.repeats}: {main.ours_best_s / main.floor_best_s:.2f}x)",
        ),
        (
            main.peak_bpe <= 16.0,
            f"peak extra memory <= 16 B/example (tracemalloc): {main.peak_bpe:.1f} B/ex "
            f"(held after: {main.held_bpe:.1f})",
        ),
    ]
    if "ours" in main.rss:
        lines.append(
            (
                main.rss["ours"] <= 16.0,
                "peak extra memory <= 16 B/example (RSS high-water, sees untraced malloc): "
                f"{main.rss['ours']:.1f} B/ex",
            )
        )
    if big is not None:
        g_ours = (big.ours_s / big.n) / (main.ours_s / main.n)
        g_floor = (big.floor_s / big.n) / (main.floor_s / main.n)
        big_ratio = big.ours_s / big.floor_s
        ok = big_ratio <= 2.0 and g_ours <= 1.25 * max(1.0, g_floor)
        lines.append(
            (
                ok,
                f"time scales linearly to {big.n:,}: {big.ours_s:.2f} s = "
                f"{big.ours_s / big.n * 1e9:.1f} ns/ex vs {main.ours_s / main.n * 1e9:.1f} at "
                f"{main.n:,} (x{g_ours:.2f}; floor x{g_floor:.2f}), {big_ratio:.2f}x floor  "
                "[criterion: <= 2x floor and ns/ex growth <= 1.25x the floor's]",
            )
        )
        lines.append(
            (
                big.peak_bpe <= 16.0,
                f"peak extra memory <= 16 B/example at {big.n:,} (tracemalloc): "
                f"{big.peak_bpe:.1f} B/ex",
            )
        )
        if "ours" in big.rss:
            lines.append(
                (
                    big.rss["ours"] <= 16.0,
                    f"peak extra memory <= 16 B/example at {big.n:,} (RSS high-water): "
                    f"{big.rss['ours']:.1f} B/ex",
                )
            )
    lines += [
        (q.pad_eff >= 0.99, f"padding efficiency >= 0.99: {q.pad_eff:.4f}"),
        (
            (q.d_order or 0) > 0.5 and (q.d_comp or 0) > 0.5,
            "batch order and composition change between epochs 0 and 1 (> half): order "
            f"{100 * (q.d_order or 0):.1f} % of steps, composition "
            f"{100 * (q.d_comp or 0):.1f} % of micro-batches",
        ),
        (
            q.max_cost <= 1.0 and q.over == 0.0,
            f"budget never exceeded: max cost {q.max_cost:.4f} x max_tokens, "
            f"{100 * q.over:.2f} % over",
        ),
        (q.imb_lin <= 1.01, f"mean per-step imbalance <= 1.01 (linear n*L): {q.imb_lin:.4f}"),
        (
            q.imb_quad <= 1.02,
            f"mean per-step imbalance <= 1.02 (quadratic n*L + n*L^2/64): {q.imb_quad:.4f}",
        ),
        (
            q.coverage == 1.0 and q.dup == 0 and q.count_min == q.count_max,
            f"coverage 100 % with the default tail ({PlanConfig(1).tail!r}): "
            f"{100 * q.coverage:.3f} %, {q.dup} duplicated, {main.dropped} dropped; "
            f"equal counts: {q.count_min}..{q.count_max} micro-batches per rank",
        ),
    ]
    for ok, text in lines:
        print(f"  [{_mark(ok)}] {text}")
    if "greedy" in info:
        g = info["greedy"]
        print(
            f"  (greedy sorted, for contrast: {g.count_min}..{g.count_max} batches per rank, "
            f"imbalance lin {g.imb_lin:.3f} / quad {g.imb_quad:.3f}, d-comp {g.d_comp:.3f})"
        )


def machine() -> str:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "lightning_varbatch"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        rev, dirty = "?", ""
    return (
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}; "
        f"{platform.machine()}, {os.cpu_count()} CPUs; Python {platform.python_version()}, "
        f"numpy {np.__version__}; git {rev}"
        + (" + uncommitted changes in lightning_varbatch/" if dirty else "")
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Planning benchmark (see the module docstring).")
    p.add_argument(
        "--sizes",
        type=int,
        nargs="+",
        default=None,
        help=f"dataset sizes; the first is the main size (default {MAIN_DEFAULT} {BIG_DEFAULT})",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test: 200k examples, no 100M row, no RSS child, small lhotse + DeepSpeed runs",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-tokens", type=int, default=16384)
    p.add_argument("--world-size", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--ds-sizes",
        type=int,
        nargs="*",
        default=None,
        help="DeepSpeed subsample sizes (default 5000 10000 20000; give none to skip)",
    )
    p.add_argument(
        "--baseline-max",
        type=int,
        default=20_000_000,
        help="run the baselines at the main size only if it is at most this",
    )
    p.add_argument("--no-profile", action="store_true", help="skip the planner profile")
    p.add_argument("--json", default=None, help="also write the tables to this JSON file")
    p.add_argument(
        "--lhotse-size",
        type=int,
        default=None,
        help="examples for lhotse's DynamicBucketingSampler (default 500000; --quick 20000; "
        "0 skips it)",
    )
    p.add_argument(
        "--lhotse-buckets",
        type=int,
        nargs="+",
        default=[10, 30],
        help="num_buckets values for lhotse (default: 10, its default, and 30)",
    )
    p.add_argument(
        "--no-hf", action="store_true", help="skip Hugging Face's length-grouped sampler"
    )
    p.add_argument("--rss-child", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--rss-baselines", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.sizes is None:
        args.sizes = [200_000] if args.quick else [MAIN_DEFAULT, BIG_DEFAULT]
    if args.lhotse_size is None:
        args.lhotse_size = 20_000 if args.quick else 500_000
    if args.quick:
        args.lhotse_buckets = args.lhotse_buckets[:1]
    if args.ds_sizes is None:
        args.ds_sizes = [5000] if args.quick else [5000, 10000, 20000]
    return args


def _import_and_freeze(args: argparse.Namespace) -> None:
    """Import the baselines' libraries now and move every object so far out of the collector.

    The measurements call ``gc.collect()`` before each run (untimed); with deepspeed,
    transformers and lhotse loaded a full collection takes ~0.2 s on this machine, which made
    the smoke test slow. Frozen objects are never collected, so the calls stay cheap.
    """
    import importlib

    names = ["torch"]
    if args.ds_sizes:
        names.append("deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr")
    if args.lhotse_size:
        names.append("lhotse.dataset.sampling.dynamic_bucketing")
    if not args.no_hf:
        names += ["transformers.trainer_pt_utils", "accelerate.data_loader"]
    for name in names:
        try:
            importlib.import_module(name)
        except Exception:  # reported where the baseline runs
            pass
    gc.collect()
    gc.freeze()


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.rss_child is not None:
        print("RSS " + json.dumps(rss_child(args.rss_child, args)))
        return 0
    _import_and_freeze(args)
    config = PlanConfig(max_tokens=args.max_tokens)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: python -m benchmarks.planning {shown}".rstrip())
    print("machine:", machine())
    print(
        f"workload: wmt_like_lengths(n, seed={args.seed}), max_tokens={args.max_tokens}, "
        f"world_size={args.world_size}, accumulate_grad_batches=1, {config}"
    )
    results: list[SizeResult] = []
    perfs: list[Perf] = []
    quals: list[list[str]] = []
    profiles: list[tuple[int, list[tuple[str, float, float]], dict[str, float]]] = []
    info: dict[str, Any] = {}
    for i, n in enumerate(args.sizes):
        baselines = i == 0 and n <= args.baseline_max
        res, lengths, key = run_size(n, args, config, baselines)
        results.append(res)
        perfs += size_perfs(res)
        quals.append(qual_row("ours: EpochPlanner", n, res.quality))
        if baselines:
            bp, bq, info = run_baselines(n, lengths, key, res, args)
            perfs += bp
            quals += bq
        if not args.no_profile and (i == 0 or n == max(args.sizes)):
            try:
                profiles.append((n, profile(lengths, config, args.world_size, 0), res.rss))
            except Exception as e:  # internals may change under the benchmark
                print(f"  profile unavailable: {type(e).__name__}: {e}")
        del lengths, key
        gc.collect()

    print(
        "\nperformance (rank0 = one rank's epoch planned + iterated, median; B/ex = bytes per "
        "example: peak = tracemalloc peak, held = still traced after, RSS = high-water rise)"
    )
    print_table(PERF_HEADERS, perf_rows(perfs))
    print("\nplan quality (epoch 0; d-order, d-comp compare epoch 0 with epoch 1)")
    print_table(QUAL_HEADERS, quals)
    if "others" in info and info["others"].lines:
        print("\nother libraries")
        for line in info["others"].lines:
            print("  " + line)
    for n, rows, rss in profiles:
        print(f"\nprofile of the planner at n={n:,} (one run per piece)")
        print_table(
            ["piece", "seconds", "traced peak B/ex", "RSS peak B/ex"],
            [
                [name, _fmt(sec), _fmt(b, ".1f"), _fmt(rss.get("piece:" + name), ".1f")]
                for name, sec, b in rows
            ],
        )
    main_res = results[0]
    big = results[-1] if len(results) > 1 and results[-1].n > main_res.n else None
    print_targets(main_res, big, args, info)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                {
                    "performance": [asdict(p) for p in perfs],
                    "quality": [dict(zip(QUAL_HEADERS, row, strict=True)) for row in quals],
                },
                f,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
