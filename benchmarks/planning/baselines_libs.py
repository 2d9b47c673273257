"""Baselines from other libraries (lhotse, Hugging Face, fairseq, SpeechBrain), driven by API.

Each baseline is driven through its public API with plain lengths (no audio, no text):

* **lhotse** ``DynamicBucketingSampler`` with a ``TokenConstraint(max_tokens=...)``. lhotse
  samples any iterable of objects that have an ``id``, the attribute the constraint measures
  (``num_tokens``) and a writable ``dataloading_info``; each example here is such an object whose
  ``num_tokens`` is the pair's ``max(src, tgt)`` (the same key our planner and fairseq use).
  ``TokenConstraint`` counts a batch as ``n_examples * longest``: our padded cost. Defaults
  otherwise (``buffer_size=20000``, ``sync_buckets=True``, ``drop_last=False``),
  ``shuffle=True``, ``seed``; ``num_buckets`` from ``--lhotse-buckets``. In DDP every rank draws
  ``world_size`` batches per step and keeps its own, so every rank walks the whole epoch in
  Python: :mod:`benchmarks.planning.compare` runs it on ``--lhotse-size`` examples (default
  500k) and compares it with our planner timed on the same examples in the same run. Building
  the example objects is not timed. The quality numbers come from running all ``world_size``
  ranks.
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
* **fairseq** (the ``ve-fairseq`` wheel for CPython 3.11; fairseq 0.12.2 itself has no 3.11
  wheel and does not import there, facebookresearch/fairseq#5012): its translation task's
  batching, ``LanguagePairDataset.ordered_indices`` then ``data_utils.batch_by_size`` with the
  pairs' ``max(source, target)`` as ``num_tokens_vec``, dealt by ``EpochBatchIterator``
  (``ShardedIterator(fill_value=[])``: ranks may hold different counts, fairseq trains dummy
  batches for the missing ones). The ``greedy sorted`` row of the main benchmark is its
  algorithm re-implemented (:mod:`benchmarks.planning.baselines`).
* **SpeechBrain** and Hugging Face's ``batch_rebalance``: driven in
  :mod:`benchmarks.planning.compare_libs` through :mod:`benchmarks.peers.batches`.

Every function returns plain index arrays per rank;
:func:`benchmarks.planning.metrics.batches_from_ranks` turns them into what the metrics read.
"""

from __future__ import annotations

import gc
import logging
import time
from typing import Any

import numpy as np

DISTRIBUTIONS = ("lhotse", "transformers", "accelerate", "deepspeed", "ve-fairseq", "speechbrain")
"""The libraries' distributions whose versions a planning result records."""


def library_versions() -> dict[str, str]:
    """``{distribution: version}`` of the libraries of :data:`DISTRIBUTIONS` installed here."""
    from importlib import metadata

    out = {}
    for name in DISTRIBUTIONS:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


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


# -- fairseq -------------------------------------------------------------------------------------


def fairseq_status() -> str | None:
    """``None`` when fairseq's batching imports (the ``ve-fairseq`` wheel), else why not."""
    try:
        from fairseq.data.data_utils import batch_by_size  # noqa: F401
        from fairseq.data.iterators import EpochBatchIterator  # noqa: F401
    except Exception as e:  # ImportError, or the Python 3.11 dataclass ValueError
        return f"not importable: {type(e).__name__}: {e}"[:140]
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets the root to DEBUG
    return None


def fairseq_batches(
    lengths: np.ndarray, max_tokens: int, seed: int, multiple: int = 1
) -> list[np.ndarray]:
    """The batches fairseq's translation task cuts (the same on every rank).

    ``LanguagePairDataset.ordered_indices`` under ``numpy_seed(seed)`` (a permutation, then
    stable sorts by target and source size), then ``batch_by_size`` with ``num_tokens_vec``
    the pairs' ``max(source, target)`` and ``required_batch_size_multiple=multiple``.
    """
    from fairseq.data import data_utils

    src, tgt = lengths[:, 0].astype(np.int64), lengths[:, 1].astype(np.int64)
    with data_utils.numpy_seed(seed):
        indices = np.random.permutation(len(lengths)).astype(np.int64)  # noqa: NPY002 (fairseq's)
    indices = indices[np.argsort(tgt[indices], kind="mergesort")]
    indices = indices[np.argsort(src[indices], kind="mergesort")]
    key = np.maximum(src, tgt)
    return list(
        data_utils.batch_by_size(
            indices,
            lambda i: key[i],
            num_tokens_vec=key[indices],
            max_tokens=max_tokens,
            required_batch_size_multiple=multiple,
        )
    )


def fairseq_shard(
    batches: list[np.ndarray],
    n: int,
    world: int,
    rank: int,
    seed: int,
    epoch: int,
    grouped: bool = False,
) -> list[np.ndarray]:
    """Rank ``rank``'s batches of ``epoch`` (0-based): ``EpochBatchIterator`` shuffles them with
    ``seed + epoch`` (``grouped``: its ``grouped_shuffling``) and deals them with
    ``ShardedIterator(fill_value=[])``; the fill (an empty batch fairseq trains as a dummy) is
    left out, so ranks may hold different counts."""
    import torch
    from fairseq.data.iterators import EpochBatchIterator

    ids = torch.utils.data.TensorDataset(torch.arange(n))
    it = EpochBatchIterator(
        ids,
        list,
        batches,
        seed=seed,
        num_shards=world,
        shard_id=rank,
        epoch=epoch + 1,
        grouped_shuffling=grouped,
    )
    mine = it.ordered_batches(epoch + 1, False, True)
    return [np.asarray(b, dtype=np.int64) for b in mine if len(b)]
