"""Every peer at its best: the knobs each peer's own documentation offers, swept (issue 39).

A *configuration* is a row of :mod:`benchmarks.peers.model` with knob values, written
``row:knob=value,...`` (``lhotse:buckets=30``); a bare row is that row at its defaults.
:data:`GROUPS` lists, per peer, its configurations (the first is the peer's default, as its
users get it without touching the knob) and :func:`deal_config` deals one. The knobs:

* **lhotse** ``DynamicBucketingSampler(num_buckets=...)``: 10 (lhotse's default), 30, 50, 100.
  Two-sided (2D) bucketing is not in lhotse 1.33 (:func:`lhotse_two_sided`).
* **fairseq** (its own package): ``batch_by_size(required_batch_size_multiple=...)`` 8 (the
  translation task's default) and 1, and ``EpochBatchIterator(grouped_shuffling=...)`` off
  (default) and on (batches shuffled in groups of ``num_shards``, so that one step's ranks get
  neighbouring, similar batches).
* **SpeechBrain** ``DynamicBatchSampler``: ``num_buckets`` 20, 60, 200 (200: its LibriSpeech
  recipes; it has no default) with its own boundaries (log-normal warping up to
  ``max_batch_length``), or ``bucket_boundaries`` given: the 20 or 60 equal-count quantiles of
  the lengths, or one bucket per length.
* **Hugging Face** ``Trainer(train_sampling_strategy=...)``: ``group_by_length`` (default) and
  ``batch_rebalance`` with ``gradient_accumulation_steps`` 1 and 4 (the sampler balances over
  ``world x accumulation`` groups; every micro-batch is one step here).
* **DeepSpeed** ``batch_by_seqlens(sequence_picking_order=...)``: ``dataloader`` (default),
  ``seqlen``, ``random``. DeepSpeed's own function scans every candidate end for every
  micro-batch (~n^3; hours at 20,000 pairs), so :func:`batch_by_seqlens` computes its result in
  O(n log n); :func:`check_deepspeed` compares the two on 400 pairs, every order, every run.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

Batches = list[list[int]]

GROUPS: dict[str, tuple[str, ...]] = {
    "ours": ("ours",),
    "lhotse": ("lhotse:buckets=10", "lhotse:buckets=30", "lhotse:buckets=50", "lhotse:buckets=100"),
    "fairseq": (
        "fairseq_pkg:multiple=8,grouped=0",
        "fairseq_pkg:multiple=1,grouped=0",
        "fairseq_pkg:multiple=8,grouped=1",
        "fairseq_pkg:multiple=1,grouped=1",
    ),
    "speechbrain": (
        "speechbrain:buckets=200",
        "speechbrain:buckets=20",
        "speechbrain:buckets=60",
        "speechbrain:bounds=q20",
        "speechbrain:bounds=q60",
        "speechbrain:bounds=every",
    ),
    "hf": ("hf_group", "hf_rebalance:accum=1", "hf_rebalance:accum=4"),
    "deepspeed": (
        "deepspeed:order=dataloader",
        "deepspeed:order=seqlen",
        "deepspeed:order=random",
    ),
}
"""Per peer, its configurations; the first is its default."""
QUICK = {"lhotse": 2, "fairseq": 4, "speechbrain": 2, "hf": 2, "deepspeed": 2}
"""How many of each peer's configurations ``--quick`` sweeps."""
NAMES = {"ours": "ours", "lhotse": "lhotse", "fairseq": "fairseq pkg", "speechbrain": "SpeechBrain",
         "hf": "HF Trainer", "deepspeed": "DeepSpeed"}  # fmt: skip


def split(config: str) -> tuple[str, dict[str, str]]:
    """``("lhotse", {"buckets": "30"})`` from ``lhotse:buckets=30``."""
    row, _, knobs = config.partition(":")
    return row, dict(kv.split("=", 1) for kv in knobs.split(",") if kv)


def group_of(config: str) -> str:
    row = split(config)[0]
    return next((g for g, cs in GROUPS.items() if any(split(c)[0] == row for c in cs)), row)


def is_default(config: str) -> bool:
    return GROUPS.get(group_of(config), (config,))[0] == config


def knob_text(config: str) -> str:
    row, knobs = split(config)
    text = ", ".join(f"{k}={v}" for k, v in knobs.items())
    name = {"hf_group": "group_by_length", "hf_rebalance": "batch_rebalance"}.get(row)
    return ", ".join(x for x in (name, text) if x)


# -- dealing a configuration ---------------------------------------------------------------------


def _lhotse(key: np.ndarray, m: int, rank: int, world: int, seed: int, kn: dict) -> Batches:
    from benchmarks.planning.baselines_libs import lhotse_items, lhotse_rank

    _, out = lhotse_rank(lhotse_items(key), m, world, rank, seed, 0, int(kn.get("buckets", 10)))
    return [b.tolist() for b in out]


def lhotse_two_sided() -> str | None:
    """``None`` if the installed lhotse buckets pairs in two dimensions, else why not."""
    import importlib.metadata
    import inspect

    from lhotse.dataset.sampling.dynamic_bucketing import DynamicBucketingSampler

    doc = inspect.getsource(DynamicBucketingSampler.__init__)
    if "Tuple[" in doc and "duration_bins" in doc and "2D" in doc:
        return None
    return f"lhotse {importlib.metadata.version('lhotse')} has no 2D bucketing"


def _fairseq(tl: np.ndarray, m: int, rank: int, world: int, seed: int, kn: dict) -> Batches:
    """fairseq's translation task (:func:`benchmarks.peers.model._fairseq_pkg`) with its knobs:
    ``required_batch_size_multiple`` and ``grouped_shuffling``."""
    from benchmarks.planning.baselines_libs import fairseq_batches, fairseq_shard

    batches = fairseq_batches(tl, m, seed, int(kn.get("multiple", 1)))
    grouped = kn.get("grouped", "0") == "1"
    mine = fairseq_shard(batches, len(tl), world, rank, seed, 0, grouped)
    return [list(map(int, b)) for b in mine]


def _speechbrain(key: np.ndarray, m: int, rank: int, world: int, seed: int, kn: dict) -> Batches:
    from benchmarks.peers.batches import speechbrain_sampler_module

    sb, _ = speechbrain_sampler_module()
    extra: dict[str, Any] = {}
    if "bounds" in kn:
        q = kn["bounds"]
        if q == "every":
            extra["bucket_boundaries"] = sorted(set(key.tolist()))
        else:
            cuts = np.quantile(key, np.arange(1, int(q[1:]) + 1) / int(q[1:]))
            extra["bucket_boundaries"] = sorted({int(np.ceil(c)) for c in cuts})
    else:
        extra["num_buckets"] = int(kn.get("buckets", 200))
    inner = sb.DynamicBatchSampler(
        list(range(key.size)), max_batch_length=m, lengths_list=key.tolist(), shuffle=True,
        batch_ordering="random", seed=seed, **extra,
    )  # fmt: skip
    outer = sb.DistributedSamplerWrapper(inner, num_replicas=world, rank=rank, shuffle=True)
    outer.set_epoch(0)
    return [list(map(int, x)) for x in outer]


def batch_by_seqlens(
    seqlens: Sequence[int], max_tokens: int, order: str, effective_batch_size: int, seed: int
) -> tuple[list[tuple[int, list[int]]], list[int]]:
    """DeepSpeed's ``batch_by_seqlens`` (defaults otherwise: ``min_batch_size=1``, no
    ``max_batch_size``, ``required_microbatches_of_same_size=False``), in O(n log n): its
    ``(microbatch_ids, batch_max_seqlens)``. Its quirks kept: a micro-batch never ends at the
    last example (which is dropped), and the micro-batches that do not fill a round of
    ``effective_batch_size`` are dropped."""
    metrics = list(zip(seqlens, range(len(seqlens)), strict=True))
    if order == "random":
        random.Random(seed).shuffle(metrics)
    if order == "seqlen":
        metrics = sorted(metrics)
    metrics = [x for x in metrics if x[0] <= max_tokens]
    prefix = np.concatenate([[0], np.cumsum([x[0] for x in metrics])])
    mbs, i, n = [], 0, len(metrics)
    while i < n:
        j = min(int(np.searchsorted(prefix, prefix[i] + max_tokens, side="right")) - 1, n - 1)
        if j <= i:
            break
        mbs.append(metrics[i:j])
        i = j
    mbs = mbs[: len(mbs) - len(mbs) % effective_batch_size]
    ids, maxes = [], []
    for r in range(0, len(mbs), effective_batch_size):
        group = mbs[r : r + effective_batch_size]
        maxes.append(max(x[0] for mb in group for x in mb))
        ids += [(r // effective_batch_size, [x[1] for x in mb]) for mb in group]
    return ids, maxes


def check_deepspeed(n: int = 400, m: int = 512) -> None:
    """Raise if :func:`batch_by_seqlens` differs from DeepSpeed's own on ``n`` pairs."""
    from deepspeed.runtime.data_pipeline.data_sampling import variable_batch_size_and_lr as v

    from lightning_varbatch.planner import wmt_like_lengths

    key = (wmt_like_lengths(n, seed=99) + np.array([0, 1])).max(axis=1).tolist()  # with [BOS]
    for order in ("dataloader", "seqlen", "random"):
        theirs = v.batch_by_seqlens(key, m, effective_batch_size=2, sequence_picking_order=order,
                                    seed=3)  # fmt: skip
        mine = batch_by_seqlens(key, m, order, 2, 3)
        if [(b, list(x)) for b, x in theirs[0]] != mine[0] or list(theirs[2]) != mine[1]:
            raise RuntimeError(f"batch_by_seqlens differs from DeepSpeed's ({order})")


def _deepspeed(key: np.ndarray, m: int, rank: int, world: int, seed: int, kn: dict) -> Batches:
    from deepspeed.runtime.data_pipeline.data_sampling import variable_batch_size_and_lr as v

    ids, maxes = _ds_cached(tuple(key.tolist()), m, kn.get("order", "dataloader"), world, seed)
    loader, _ = v.dataloader_for_variable_batch_size(
        list(range(key.size)), ids, maxes, dataloader_rank=rank, dataloader_num_replicas=world,
        dataloader_num_workers=0,
    )  # fmt: skip
    return [list(map(int, x)) for x in loader]


_DS: dict[tuple, Any] = {}


def _ds_cached(key: tuple[int, ...], m: int, order: str, world: int, seed: int) -> Any:
    k = (hash(key), m, order, world, seed)
    if k not in _DS:
        _DS.clear()
        _DS[k] = batch_by_seqlens(list(key), m, order, world, seed)
    return _DS[k]


def _hf_rebalance(key: np.ndarray, b: int, rank: int, world: int, seed: int, kn: dict) -> Batches:
    from torch.utils.data import DataLoader
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    from benchmarks.peers.batches import prepared_loader

    accum = int(kn.get("accum", 1))
    sampler = BatchRebalanceSampler(
        lengths=key.tolist(), effective_batch_size=b * world * accum, dp_size=world,
        grad_accum=accum, rank=rank, drop_last=False,
    )  # fmt: skip
    loader = prepared_loader(
        DataLoader(list(range(key.size)), batch_sampler=sampler, collate_fn=list), rank, world
    )
    shard = getattr(loader, "batch_sampler", None)  # Trainer._get_dataloader's passthrough
    if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
        shard.num_processes, shard.process_index = 1, 0
    return [list(map(int, x)) for x in loader]


DEALERS: dict[str, Callable[..., Batches]] = {
    "lhotse": _lhotse, "speechbrain": _speechbrain, "deepspeed": _deepspeed,
    "hf_rebalance": _hf_rebalance,
}  # fmt: skip


def deal_config(config: str, tl: np.ndarray, setting: int, rank: int, world: int, seed: int) -> Any:
    """One rank's batches of a configuration with knobs (``row:knob=value,...``)."""
    row, knobs = split(config)
    if row == "fairseq_pkg":
        return _fairseq(tl, setting, rank, world, seed, knobs)
    key = tl.max(axis=1).astype(np.int64)
    return DEALERS[row](key, int(setting), rank, world, seed, knobs)


# -- the best configuration ----------------------------------------------------------------------


def pick_best(scores: dict[str, list[float]], over: dict[str, int]) -> str:
    """The configuration with the highest median score; one whose micro-batches never exceed the
    budget wins over any that does (``over``: the most over-budget micro-batches on a seed)."""
    fair = [c for c in scores if over.get(c, 0) == 0] or list(scores)
    return max(fair, key=lambda c: (statistics.median(scores[c]), -fair.index(c)))
