"""Planning baselines from other libraries, for :mod:`benchmarks.planning`.

Each baseline is driven through its public API with plain lengths (no audio, no text):

* **lhotse** ``DynamicBucketingSampler`` with a ``TokenConstraint(max_tokens=...)``. lhotse
  samples any iterable of objects that have an ``id``, the attribute the constraint measures
  (``num_tokens``) and a writable ``dataloading_info``; each example here is such an object whose
  ``num_tokens`` is the pair's ``max(src, tgt)`` (the same key our planner and fairseq use).
  ``TokenConstraint`` counts a batch as ``n_examples * longest``: our padded cost. Defaults
  otherwise (``buffer_size=20000``, ``sync_buckets=True``, ``drop_last=False``),
  ``shuffle=True``, ``seed``; ``num_buckets`` from ``--lhotse-buckets``. In DDP every rank draws
  ``world_size`` batches per step and keeps its own, so every rank walks the whole epoch in
  Python: it runs on ``--lhotse-size`` examples (default 500k) and the table compares it with
  our planner timed on the same examples in the same run. Building the example objects is not
  timed. The quality numbers come from running all ``world_size`` ranks.
* **Hugging Face** ``transformers.trainer_pt_utils.LengthGroupedSampler`` (random permutation,
  mega-batches of 50 batches each sorted by length, the longest example first) +
  ``torch.utils.data.BatchSampler`` of a fixed size ``B`` + accelerate's ``BatchSamplerShard``
  (batch ``i`` to rank ``i % world``, the last round completed from the start): the pipeline
  the ``Trainer`` builds for ``group_by_length`` under DDP. Lengths are passed as a Python list
  (converted beforehand, untimed). Rank 0 is timed (every rank walks all batches). For the
  quality table the sampler's order is drawn once per epoch and every rank's
  ``BatchSamplerShard`` runs over it. Two sizes: ``B`` of the DistributedSampler row (the
  largest fixed size whose median random batch fits the budget) and
  ``B = max_tokens // longest key`` (the largest size that never exceeds the budget).
* **fairseq** ``data_utils.batch_by_size``: only if ``fairseq`` imports. fairseq 0.12.2 (the
  latest release) does not install on Python 3.11: there is no wheel for it, the sdist fails to
  build (its ``setup.py`` lists ``fairseq/clib/libbase/balanced_assignment.cpp``, which the
  sdist does not contain), and the package does not import on 3.11 either (dataclass mutable
  defaults, facebookresearch/fairseq#5012). The ``greedy sorted`` row of the main benchmark is
  fairseq's algorithm (sort by length, cut greedily under the padded budget, shuffle batches,
  ``batches[rank::world]``).
"""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.planning import (
    Batches,
    Perf,
    Quality,
    epoch_change,
    ours_rank,
    plan_batches,
    qual_row,
    quality,
)
from lightning_varbatch.planning import EpochPlanner, PlanConfig


@dataclass
class OtherResults:
    perfs: list[Perf] = field(default_factory=list)
    quals: list[list[str]] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    qualities: dict[str, Quality] = field(default_factory=dict)


def _batches_from_ranks(per_rank: list[list[np.ndarray]]) -> Batches:
    """Rank ``r``'s ``j``-th batch runs in step ``j`` (what DDP does with equal counts)."""
    pool: list[np.ndarray] = []
    rank: list[int] = []
    step: list[int] = []
    for r, batches in enumerate(per_rank):
        for j, ids in enumerate(batches):
            pool.append(ids)
            rank.append(r)
            step.append(j)
    size = np.array([b.size for b in pool], dtype=np.int64)
    return Batches(
        pool=np.concatenate(pool) if pool else np.zeros(0, dtype=np.int64),
        start=np.cumsum(size) - size,
        size=size,
        rank=np.asarray(rank, dtype=np.int64),
        step=np.asarray(step, dtype=np.int64),
    )


# -- lhotse --------------------------------------------------------------------------------------


class _LengthItem:
    """The smallest object lhotse's samplers accept: an id, a size, and room for its info."""

    __slots__ = ("dataloading_info", "id", "num_tokens")

    def __init__(self, idx: int, num_tokens: int) -> None:
        self.id = idx
        self.num_tokens = num_tokens


def lhotse_items(key: np.ndarray) -> list[_LengthItem]:
    return [_LengthItem(i, k) for i, k in enumerate(key.tolist())]


def lhotse_rank(
    items: list[_LengthItem],
    max_tokens: int,
    world: int,
    rank: int,
    seed: int,
    epoch: int,
    num_buckets: int,
) -> tuple[float, list[np.ndarray]]:
    """(seconds, batches) of one rank's epoch with lhotse's DynamicBucketingSampler."""
    from lhotse.dataset.sampling.base import TokenConstraint
    from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler

    gc.collect()
    t0 = time.perf_counter()
    sampler = DynamicBucketingSampler(
        items,
        constraint=TokenConstraint(max_tokens=max_tokens),
        num_buckets=num_buckets,
        shuffle=True,
        seed=seed,
        world_size=world,
        rank=rank,
    )
    sampler.set_epoch(epoch)
    out = [np.fromiter((c.id for c in batch), dtype=np.int64) for batch in sampler]
    return time.perf_counter() - t0, out


def run_lhotse(lengths: np.ndarray, args: Any, config: PlanConfig, results: OtherResults) -> None:
    m = min(args.lhotse_size, lengths.shape[0])
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    sub = lengths[:m]  # iid lengths: a prefix is a random subsample
    key = np.maximum(sub[:, 0], sub[:, 1])
    items = lhotse_items(key)
    # ours on the same examples, interleaved with lhotse's ranks below
    ours_t: list[float] = []
    planner = EpochPlanner(sub, config)
    ours_b0 = plan_batches(planner.plan(0, world))
    ours_q = quality(ours_b0, key, budget, world, other_epoch=plan_batches(planner.plan(1, world)))
    del planner, ours_b0
    results.quals.append(qual_row(f"ours: EpochPlanner (n={m:,})", m, ours_q))
    results.qualities["ours_small"] = ours_q
    rows: list[tuple[int, list[float], Quality]] = []
    for nb in args.lhotse_buckets:
        times: list[float] = []
        per_rank: list[list[np.ndarray]] = []
        for r in range(world):  # every rank walks the whole epoch: each one is a timing sample
            dt, batches = lhotse_rank(items, budget, world, r, seed, 0, nb)
            times.append(dt)
            per_rank.append(batches)
            if r % 2 == 0:
                ours_t.append(ours_rank(sub, config, world, 0)[1])
        dt1, next_epoch = lhotse_rank(items, budget, world, 0, seed, 1, nb)
        times.append(dt1)
        b0 = _batches_from_ranks(per_rank)
        q = quality(b0, key, budget, world)
        q.d_order, q.d_comp = epoch_change(b0, _batches_from_ranks([next_epoch]))
        rows.append((nb, times, q))
        results.qualities[f"lhotse{nb}"] = q
        print(
            f"  lhotse DynamicBucketingSampler num_buckets={nb}, n={m:,}: rank epochs "
            + ", ".join(f"{t:.2f}" for t in times)
            + " s",
            flush=True,
        )
    ours_med = statistics.median(ours_t)
    results.perfs.append(
        Perf(
            method=f"ours: EpochPlanner (n={m:,})",
            n=m,
            plan_s=None,
            rank_s=ours_med,
            rank_best_s=min(ours_t),
            floor_s=None,
            ours_s=ours_med,
            note=f"{len(ours_t)} runs interleaved with lhotse",
        )
    )
    for nb, times, q in rows:
        med = statistics.median(times)
        name = f"lhotse DynamicBucketing, {nb} buckets"
        extrap = med * args.main_n / m
        results.perfs.append(
            Perf(
                method=f"{name} (n={m:,})",
                n=m,
                plan_s=None,
                rank_s=med,
                rank_best_s=min(times),
                floor_s=None,
                ours_s=ours_med,
                note=f"linear to {args.main_n:,}: {extrap:.1f} s per rank",
            )
        )
        results.quals.append(qual_row(f"{name} (n={m:,})", m, q))
    del items


# -- Hugging Face --------------------------------------------------------------------------------


def hf_available() -> str | None:
    """``None`` when transformers' sampler and accelerate's sharding import, else the reason."""
    try:
        from accelerate.data_loader import BatchSamplerShard  # noqa: F401
        from transformers.trainer_pt_utils import LengthGroupedSampler  # noqa: F401
    except Exception as e:  # ImportError, or a library failing to initialise
        return f"{type(e).__name__}: {e}"[:100]
    return None


def _hf_sampler(lengths: list[int], batch: int, seed: int, epoch: int) -> Any:
    import torch
    from transformers.trainer_pt_utils import LengthGroupedSampler

    g = torch.Generator()
    g.manual_seed(seed + epoch)  # the Trainer seeds the same global RNG on every rank
    return LengthGroupedSampler(batch, lengths=lengths, generator=g)


def _shard(indices: Any, batch: int, world: int, rank: int) -> Any:
    from accelerate.data_loader import BatchSamplerShard
    from torch.utils.data import BatchSampler

    return BatchSamplerShard(
        BatchSampler(indices, batch, drop_last=False), num_processes=world, process_index=rank
    )


def hf_rank(lengths: list[int], batch: int, world: int, rank: int, seed: int) -> float:
    """Seconds for one rank's epoch: LengthGroupedSampler -> BatchSampler -> BatchSamplerShard."""
    gc.collect()
    t0 = time.perf_counter()
    for ids in _shard(_hf_sampler(lengths, batch, seed, 0), batch, world, rank):
        del ids
    return time.perf_counter() - t0


def hf_all_ranks(
    lengths: list[int], batch: int, world: int, seed: int, epoch: int
) -> list[list[np.ndarray]]:
    """Every rank's batches: the sampler's order drawn once, then each rank's shard of it."""
    order = list(_hf_sampler(lengths, batch, seed, epoch))
    return [
        [np.asarray(b, dtype=np.int64) for b in _shard(order, batch, world, r)]
        for r in range(world)
    ]


def run_hf(key: np.ndarray, args: Any, fixed_b: int, ours_s: float, results: OtherResults) -> None:
    why = hf_available()
    if why is not None:
        results.lines.append(f"Hugging Face LengthGroupedSampler: not run ({why})")
        return
    world, budget, seed, reps = args.world_size, args.max_tokens, args.seed, args.repeats
    n = key.shape[0]
    lengths: list[int] = key.tolist()
    safe_b = max(1, budget // int(key.max()))
    for b, why_b in ((fixed_b, "median random batch fits"), (safe_b, "never over budget")):
        times = [hf_rank(lengths, b, world, 0, seed) for _ in range(reps)]
        name = f"HF LengthGrouped+accelerate, B={b}"
        med = statistics.median(times)
        results.perfs.append(
            Perf(
                method=name,
                n=n,
                plan_s=None,
                rank_s=med,
                rank_best_s=min(times),
                floor_s=args.floor_s,
                ours_s=ours_s,
                note=why_b,
            )
        )
        b0 = _batches_from_ranks(hf_all_ranks(lengths, b, world, seed, 0))
        b1 = _batches_from_ranks(hf_all_ranks(lengths, b, world, seed, 1))
        q = quality(b0, key, budget, world, other_epoch=b1)
        results.qualities[f"hf{b}"] = q
        results.quals.append(qual_row(name, n, q))
        print(f"  HF LengthGroupedSampler + BatchSamplerShard B={b}: rank-0 epoch {med:.2f} s")


# -- fairseq -------------------------------------------------------------------------------------


def fairseq_status() -> str:
    """Why fairseq's ``batch_by_size`` is not run here (it is never run; see the docstring)."""
    try:
        from fairseq.data.data_utils import batch_by_size  # noqa: F401
    except Exception as e:  # ImportError, or the Python 3.11 dataclass ValueError
        return f"not importable: {type(e).__name__}: {e}"[:140]
    return "importable, but no adapter is written (it could not be installed when this was made)"


def run_others(
    lengths: np.ndarray,
    key: np.ndarray,
    args: Any,
    config: PlanConfig,
    fixed_b: int,
    ours_s: float,
    floor_s: float,
) -> OtherResults:
    """All baselines of this module; skipped ones are explained in ``lines``."""
    results = OtherResults()
    args.main_n = lengths.shape[0]
    args.floor_s = floor_s
    if args.lhotse_size > 0:
        try:
            import lhotse  # noqa: F401
        except Exception as e:
            results.lines.append(f"lhotse: not run ({type(e).__name__}: {e})"[:140])
        else:
            run_lhotse(lengths, args, config, results)
    if not args.no_hf:
        run_hf(key, args, fixed_b, ours_s, results)
    results.lines.append(
        "fairseq batch_by_size: not run: " + fairseq_status() + ". fairseq 0.12.2 has no "
        "Python 3.11 wheel and its sdist fails to build (balanced_assignment.cpp missing); "
        "see the 'greedy sorted' row for its algorithm"
    )
    return results


def iter_lines(results: OtherResults) -> Iterable[str]:
    yield from results.lines
