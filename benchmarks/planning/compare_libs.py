"""The libraries' rows beyond lhotse and Hugging Face's length grouping: fairseq's own package,
SpeechBrain's ``DynamicBatchSampler`` and Hugging Face's ``batch_rebalance``.

Each library's rank-0 epoch is timed in turn with our planner's on the same examples
(``--repeats`` pairs, interleaved), so every ``x ours`` is a ratio of two runs seconds apart;
the note gives its range over the pairs. fairseq (vectorised) runs at the main size;
SpeechBrain and ``batch_rebalance`` walk every example in Python, so they run on the first
``--lhotse-size`` examples, as lhotse does. The quality figures are every rank's batches through
:func:`benchmarks.planning.metrics.quality`, as for every other row. How each library is driven:
:mod:`benchmarks.planning.baselines_libs`.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from benchmarks.harness import timed
from benchmarks.peers.batches import (
    BY_NAME,
    DEALERS,
    speechbrain_sampler,
    speechbrain_sampler_module,
    unavailable,
)
from benchmarks.planning.baselines_libs import fairseq_batches, fairseq_shard, fairseq_status
from benchmarks.planning.measure import ours_rank
from benchmarks.planning.metrics import batches_from_ranks, quality
from benchmarks.planning.report import Perf, qual_row
from lightning_varbatch import PlanConfig


def speechbrain_ranks(
    key: np.ndarray, max_tokens: int, world: int, ranks: Sequence[int], seed: int, epoch: int
) -> list[list[np.ndarray]]:
    """The given ranks' batches from SpeechBrain's ``DynamicBatchSampler`` (its LibriSpeech
    recipes' 200 buckets, ``shuffle=True``, ``batch_ordering="random"``) wrapped, as its
    ``Brain`` does under DDP, in ``DistributedSamplerWrapper(shuffle=True)``; the inner sampler
    is built once (every rank builds the same one).
    See :func:`benchmarks.peers.batches.speechbrain_sampler_module` for its torchaudio."""
    sb, _ = speechbrain_sampler_module()
    inner = speechbrain_sampler(key, max_tokens, seed)
    inner.set_epoch(epoch)
    out = []
    for rank in ranks:
        outer = sb.DistributedSamplerWrapper(inner, num_replicas=world, rank=rank, shuffle=True)
        outer.set_epoch(epoch)
        out.append([np.asarray(b, dtype=np.int64) for b in outer])
    return out


def hf_rebalance_rank(key: np.ndarray, batch: int, world: int, rank: int, seed: int) -> list[Any]:
    """One rank's batches from ``transformers``' ``BatchRebalanceSampler`` as its ``Trainer``
    builds it for ``train_sampling_strategy="batch_rebalance"`` (with accelerate's passthrough;
    :func:`benchmarks.peers.batches.deal`)."""
    return DEALERS["hf_rebalance"](key, key[:, None], batch, rank, world, seed)


def hf_rebalance_status() -> str | None:
    """``None`` when this ``transformers`` has ``batch_rebalance``, else why not."""
    return unavailable(BY_NAME["hf_rebalance"])


def _paired(
    name: str, n: int, theirs: Callable[[], Any], ours: Callable[[], float], reps: int, note: str
) -> Perf:
    """``reps`` pairs (ours, then theirs) of one rank's epoch: medians and the ratio's range."""
    mine, other = [], []
    for _ in range(reps):
        mine.append(ours())
        other.append(timed(theirs)[0])
    ratios = [t / o for t, o in zip(other, mine, strict=True)]
    span = f"x ours {min(ratios):.2f}-{max(ratios):.2f} over {reps} pairs"
    return Perf(
        method=name,
        n=n,
        plan_s=None,
        rank_s=statistics.median(other),
        rank_best_s=min(other),
        floor_s=None,
        ours_s=statistics.median(mine),
        note=f"{note}; {span}" if note else span,
        x_ours_min=min(ratios),
        x_ours_max=max(ratios),
    )


def run_fairseq(lengths: np.ndarray, key: np.ndarray, args: Any, results: Any) -> None:
    """fairseq's ``batch_by_size`` + ``EpochBatchIterator`` at the main size."""
    why = fairseq_status()
    if why is not None:
        results.lines.append(f"fairseq batch_by_size: not run ({why})")
        return
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    n = key.shape[0]
    config = PlanConfig(max_tokens=budget)

    def rank0() -> Any:
        return fairseq_shard(fairseq_batches(lengths, budget, seed), n, world, 0, seed, 0)

    name = "fairseq batch_by_size+EpochBatchIterator"
    perf = _paired(
        name,
        n,
        rank0,
        lambda: ours_rank(lengths, config, world, 0)[1],
        args.repeats,
        "ranks' counts differ: fairseq trains dummy batches",
    )
    results.perfs.append(perf)
    batches = fairseq_batches(lengths, budget, seed)
    epochs = [
        batches_from_ranks([fairseq_shard(batches, n, world, r, seed, e) for r in range(world)])
        for e in (0, 1)
    ]
    q = quality(epochs[0], key, budget, world, other_epoch=epochs[1], pairs=lengths)
    results.qualities["fairseq"] = q
    results.quals.append(qual_row(name, n, q))
    print(f"  fairseq batch_by_size: rank-0 epoch {perf.rank_s:.2f} s", flush=True)


def run_speechbrain(lengths: np.ndarray, args: Any, results: Any) -> None:
    """SpeechBrain's ``DynamicBatchSampler`` under ``DistributedSamplerWrapper``, on the first
    ``--lhotse-size`` examples."""
    why = unavailable(BY_NAME["speechbrain"])
    if why is not None:
        results.lines.append(f"SpeechBrain DynamicBatchSampler: not run ({why})")
        return
    m = min(args.lhotse_size, lengths.shape[0])
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    sub = lengths[:m]  # iid lengths: a prefix is a random subsample
    key = np.maximum(sub[:, 0], sub[:, 1]).astype(np.int64)
    config = PlanConfig(max_tokens=budget)
    name = f"SpeechBrain DynamicBatch, 200 buckets (n={m:,})"
    perf = _paired(
        name,
        m,
        lambda: speechbrain_ranks(key, budget, world, [0], seed, 0),
        lambda: ours_rank(sub, config, world, 0)[1],
        args.repeats,
        "",
    )
    results.perfs.append(perf)
    epochs = [
        batches_from_ranks(speechbrain_ranks(key, budget, world, range(world), seed, e))
        for e in (0, 1)
    ]
    q = quality(epochs[0], key, budget, world, other_epoch=epochs[1], pairs=sub)
    results.qualities["speechbrain"] = q
    results.quals.append(qual_row(name, m, q))
    print(
        f"  SpeechBrain DynamicBatchSampler n={m:,}: rank-0 epoch {perf.rank_s:.2f} s", flush=True
    )


def run_hf_rebalance(lengths: np.ndarray, args: Any, batch: int, results: Any) -> None:
    """Hugging Face's ``batch_rebalance`` at batch size ``batch`` on the first
    ``--lhotse-size`` examples."""
    why = hf_rebalance_status()
    if why is not None:
        results.lines.append(f"HF batch_rebalance: not run ({why})")
        return
    m = min(args.lhotse_size, lengths.shape[0])
    world, budget, seed = args.world_size, args.max_tokens, args.seed
    sub = lengths[:m]
    key = np.maximum(sub[:, 0], sub[:, 1]).astype(np.int64)
    config = PlanConfig(max_tokens=budget)
    name = f"HF batch_rebalance, B={batch} (n={m:,})"
    perf = _paired(
        name,
        m,
        lambda: hf_rebalance_rank(key, batch, world, 0, seed),
        lambda: ours_rank(sub, config, world, 0)[1],
        args.repeats,
        "",
    )
    results.perfs.append(perf)
    per_rank = [
        [np.asarray(b, dtype=np.int64) for b in hf_rebalance_rank(key, batch, world, r, seed)]
        for r in range(world)
    ]
    q = quality(batches_from_ranks(per_rank), key, budget, world, pairs=sub)
    results.qualities["hf_rebalance"] = q
    results.quals.append(qual_row(name, m, q))
    print(f"  HF batch_rebalance B={batch}, n={m:,}: rank-0 epoch {perf.rank_s:.2f} s", flush=True)
