"""Baselines written here: the fixed-size ``DistributedSampler``, greedy sorted, DeepSpeed.

Each yields every rank's micro-batches of one epoch as :class:`~benchmarks.planning.metrics.Batches`
(for the quality table) and has a ``*_rank`` function that times one rank's epoch the way a
data loader would walk it. How each is driven:

* **DistributedSampler**: ``torch.utils.data.DistributedSampler(shuffle=True)`` (random
  permutation, ``perm[rank::world]``) + ``BatchSampler`` of a fixed size ``B``, the largest ``B``
  whose median (p50) random batch fits the budget (:func:`fixed_batch_size`); fixed sizes cannot
  respect a token budget, so the over-budget fraction is reported.
* **greedy sorted** (fairseq's ``batch_by_size`` algorithm): stable sort by key (ascending), cut
  greedily into the largest batches under the padded budget, batch order shuffled each epoch,
  sharded ``batches[rank::world]``, no tail handling.
* **DeepSpeed** ``batch_by_seqlens`` (``sequence_picking_order="seqlen"``,
  ``effective_batch_size=world_size``), micro-batches dealt as DeepSpeed's dataloader does
  (``DistributedSampler(shuffle=False)``: micro-batch ``i`` to rank ``i % world``). It packs by
  *unpadded* tokens and is super-linear.

The baselines of other libraries (lhotse, Hugging Face + accelerate, fairseq) are in
:mod:`benchmarks.planning.baselines_libs`.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any, cast

import numpy as np

from benchmarks.planning.metrics import Batches


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
