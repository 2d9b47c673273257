"""Every peer's batches for one rank, made by the peer's own package as its users configure it.

:mod:`benchmarks.peers.training` trains on these. Each function below returns one rank's
micro-batches of one epoch (lists of example ids, in the order the rank's data loader yields
them), given the planning key of every example (``max(source, [BOS] + target)``, the padded
cost key that our planner, lhotse, fairseq, SpeechBrain and Hugging Face all receive), the
peer's one batch setting, the rank and the world size. Nothing is reimplemented except where
a row says so (fairseq, which does not install on Python 3.11; the two fixed-size rows are
plain torch, as Lightning builds them):

* ``ours``: :class:`lightning_varbatch.TokenBudgetBatchSampler` (``max_tokens``).
* ``lhotse``: ``DynamicBucketingSampler(constraint=TokenConstraint(max_tokens))``, lhotse's
  defaults otherwise (10 buckets, ``sync_buckets``), ``world_size``/``rank`` given
  (:func:`benchmarks.planning.baselines_libs.lhotse_rank`).
* ``hf_group``: what ``transformers.Trainer`` builds for ``train_sampling_strategy=
  "group_by_length"`` under DDP: ``set_seed(seed)``, ``LengthGroupedSampler(B, lengths)``, a
  ``DataLoader(batch_size=B)``, then ``accelerate.data_loader.prepare_data_loader`` (a
  ``BatchSamplerShard`` with ``even_batches=True``: the last round completed from the start).
* ``hf_rebalance``: ``train_sampling_strategy="batch_rebalance"``: ``BatchRebalanceSampler(
  lengths, effective_batch_size=B * world, dp_size=world, grad_accum=1, rank,
  drop_last=False)`` as the ``batch_sampler`` of a ``DataLoader``, prepared by accelerate, then
  the Trainer's passthrough (``num_processes = 1`` on the ``BatchSamplerShard``).
* ``speechbrain``: ``DynamicBatchSampler(max_batch_length=max_tokens, num_buckets=200,
  lengths_list, shuffle=True, batch_ordering="random")`` wrapped, as SpeechBrain's ``Brain``
  does under DDP, in ``DistributedSamplerWrapper(shuffle=True)`` (pads by repeating batches).
  SpeechBrain imports ``torchaudio``, which has no wheel for torch 2.13 (PyPI's latest, 2.11.1,
  is a CUDA build whose ``_torchaudio.so`` fails to load ``libc10_cuda.so``); the sampler never
  calls it, so an empty ``torchaudio`` module stands in when the real one does not import.
* ``deepspeed``: ``batch_by_seqlens(key, max_tokens, effective_batch_size=world)`` with the
  config's default ``sequence_picking_order="dataloader"``, dealt by DeepSpeed's own
  ``dataloader_for_variable_batch_size`` (``DistributedSampler(shuffle=False)``). It sums
  *unpadded* lengths and drops the trailing micro-batches that do not fill a round.
* ``fairseq_alg``: fairseq's ``batch_by_size`` algorithm (fairseq does not install on 3.11, see
  :mod:`benchmarks.planning.baselines_libs`):
  :func:`benchmarks.planning.baselines.greedy_plan` (sort, greedy cut under the padded budget,
  shuffled batches), dealt ``batches[rank::world]``.
* ``fixed_random``: Lightning's default for fixed batches: ``DistributedSampler(shuffle=True)``
  + ``BatchSampler(B)``.
* ``fixed_sorted``: examples sorted by key, cut into batches of ``B``, batch order shuffled,
  dealt by ``DistributedSampler(shuffle=False)`` over the batches (pads by repeating batches).

:func:`deal` dispatches; :func:`workaround` names what a peer's users do when its ranks get
unequal batch counts (which would hang the gradient all-reduce) and applies it.
"""

from __future__ import annotations

import functools
import importlib.machinery
import importlib.metadata
import importlib.util
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

Batches = list[list[int]]


@dataclass(frozen=True)
class Peer:
    """One row of the benchmark: a peer's batching and what its one setting is."""

    name: str
    label: str
    packages: tuple[str, ...]
    """Distributions whose versions are stated (empty: plain torch / this repository)."""
    setting: str
    """``max_tokens`` (a token budget) or ``batch_size`` (examples per micro-batch)."""
    fixed_size: bool = False
    """Fixed-size batches: at the memory limit sized for the longest example."""


PEERS: tuple[Peer, ...] = (
    Peer("ours", "ours: TokenBudgetBatchSampler", ("lightning_varbatch",), "max_tokens"),
    Peer("lhotse", "lhotse DynamicBucketing", ("lhotse",), "max_tokens"),
    Peer(
        "hf_group",
        "HF group_by_length+accelerate",
        ("transformers", "accelerate"),
        "batch_size",
        fixed_size=True,
    ),
    Peer("hf_rebalance", "HF batch_rebalance", ("transformers", "accelerate"), "batch_size"),
    Peer("speechbrain", "SpeechBrain DynamicBatch", ("speechbrain",), "max_tokens"),
    Peer("deepspeed", "DeepSpeed batch_by_seqlens", ("deepspeed",), "max_tokens"),
    Peer("fairseq_alg", "fairseq algorithm (not pkg)", (), "max_tokens"),
    Peer("fixed_random", "fixed random B (Lightning)", (), "batch_size", fixed_size=True),
    Peer("fixed_sorted", "fixed sorted B", (), "batch_size", fixed_size=True),
)
BY_NAME = {p.name: p for p in PEERS}

SPEECHBRAIN_BUCKETS = 200
"""``num_buckets`` of SpeechBrain's LibriSpeech transformer/conformer recipes."""
TORCHAUDIO_STUB = "2.13.0+stub"
SPEECHBRAIN_TORCHAUDIO = ["-"]
"""How SpeechBrain's torchaudio import was satisfied in this process."""


def versions(peer: Peer) -> dict[str, str]:
    """``{distribution: version}`` of the packages a peer runs through."""
    out = {p: importlib.metadata.version(p) for p in peer.packages}
    if peer.name == "speechbrain":
        out["torchaudio"] = speechbrain_sampler_module()[1]
    return out


def unavailable(peer: Peer) -> str | None:
    """``None`` when the peer's packages import here, else why not (``not installed: ...``)."""
    modules = {
        "lhotse": ["lhotse"],
        "hf_group": ["transformers", "accelerate"],
        "hf_rebalance": ["transformers", "accelerate"],
        "speechbrain": ["speechbrain"],
        "deepspeed": ["deepspeed"],
    }.get(peer.name, [])
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if missing:
        return "not installed: " + ", ".join(missing)
    if peer.name == "hf_rebalance":
        import transformers.trainer_pt_utils as tpu

        if not hasattr(tpu, "BatchRebalanceSampler"):
            return (
                f"transformers {importlib.metadata.version('transformers')} has no batch_rebalance"
            )
    return None


PRELOAD = {
    "ours": ("lightning_varbatch",),
    "lhotse": ("lhotse.dataset.sampling.dynamic_bucketing", "benchmarks.planning.baselines_libs"),
    "hf_group": (
        "transformers.trainer_pt_utils",
        "transformers.trainer_utils",
        "accelerate.data_loader",
    ),
    "hf_rebalance": ("transformers.trainer_pt_utils", "accelerate.data_loader"),
    "deepspeed": ("deepspeed.runtime.data_pipeline.data_sampling.variable_batch_size_and_lr",),
    "fairseq_alg": ("benchmarks.planning.baselines",),
}


def preload(name: str) -> None:
    """Import what peer ``name`` runs through (so that its planning time leaves imports out)."""
    import importlib

    import torch.utils.data  # noqa: F401

    if name == "speechbrain":
        speechbrain_sampler_module()
    for module in PRELOAD.get(name, ()):
        importlib.import_module(module)


# -- the peers -----------------------------------------------------------------------------------


def _ours(key: np.ndarray, tl: np.ndarray, m: int, rank: int, world: int, seed: int) -> Batches:
    from lightning_varbatch import TokenBudgetBatchSampler

    sampler = TokenBudgetBatchSampler(tl, m, rank=rank, world_size=world, seed=seed)
    return [list(map(int, b)) for b in sampler]


def _lhotse(key: np.ndarray, tl: np.ndarray, m: int, rank: int, world: int, seed: int) -> Batches:
    from benchmarks.planning.baselines_libs import lhotse_items, lhotse_rank

    _, out = lhotse_rank(lhotse_items(key), m, world, rank, seed, 0, 10)
    return [b.tolist() for b in out]


def prepared_loader(dataloader: Any, rank: int, world: int) -> Any:
    """``dataloader`` as Hugging Face's Trainer prepares it for rank ``rank`` of ``world``."""
    from accelerate.data_loader import prepare_data_loader

    return prepare_data_loader(
        dataloader, num_processes=world, process_index=rank, even_batches=True, put_on_device=False
    )


def _hf_group(key: np.ndarray, tl: np.ndarray, b: int, rank: int, world: int, seed: int) -> Batches:
    from torch.utils.data import DataLoader
    from transformers import set_seed
    from transformers.trainer_pt_utils import LengthGroupedSampler

    set_seed(seed)  # Trainer.__init__: the same global seed on every rank
    sampler = LengthGroupedSampler(b, lengths=key.tolist())
    loader = DataLoader(
        list(range(key.size)), batch_size=b, sampler=sampler, drop_last=False, collate_fn=list
    )
    return [list(map(int, x)) for x in prepared_loader(loader, rank, world)]


def _hf_rebalance(
    key: np.ndarray, tl: np.ndarray, b: int, rank: int, world: int, seed: int
) -> Batches:
    from torch.utils.data import DataLoader
    from transformers.trainer_pt_utils import BatchRebalanceSampler

    sampler = BatchRebalanceSampler(
        lengths=key.tolist(),
        effective_batch_size=b * world,
        dp_size=world,
        grad_accum=1,
        rank=rank,
        drop_last=False,
    )
    loader = prepared_loader(
        DataLoader(list(range(key.size)), batch_sampler=sampler, collate_fn=list), rank, world
    )
    shard = getattr(loader, "batch_sampler", None)  # Trainer._get_dataloader's passthrough
    if shard is not None and getattr(shard, "batch_sampler", None) is sampler:
        shard.num_processes, shard.process_index = 1, 0
    return [list(map(int, x)) for x in loader]


def speechbrain_sampler_module() -> tuple[Any, str]:
    """SpeechBrain's sampler module and how torchaudio was satisfied (real version or stub).

    Without a working torchaudio, an empty module stands in while SpeechBrain is imported and is
    removed from ``sys.modules`` afterwards, so that later probes (transformers, torchmetrics)
    still find no torchaudio.
    """
    if "speechbrain.dataio.sampler" in sys.modules:
        return sys.modules["speechbrain.dataio.sampler"], SPEECHBRAIN_TORCHAUDIO[0]
    try:
        import torchaudio

        SPEECHBRAIN_TORCHAUDIO[0] = f"torchaudio {torchaudio.__version__}"
        import speechbrain.dataio.sampler as sampler

        return sampler, SPEECHBRAIN_TORCHAUDIO[0]
    except Exception:  # not installed, or a wheel built for another torch
        pass
    for name in [m for m in sys.modules if m.split(".")[0] == "torchaudio"]:
        del sys.modules[name]
    stub = types.ModuleType("torchaudio")
    stub.__version__ = TORCHAUDIO_STUB  # type: ignore[attr-defined]
    stub.__spec__ = importlib.machinery.ModuleSpec("torchaudio", None)
    sys.modules["torchaudio"] = stub
    try:
        import speechbrain.dataio.sampler as sampler
    finally:
        del sys.modules["torchaudio"]
    SPEECHBRAIN_TORCHAUDIO[0] = "torchaudio stub (no torchaudio wheel loads with this torch)"
    return sampler, SPEECHBRAIN_TORCHAUDIO[0]


def speechbrain_sampler(key: np.ndarray, max_tokens: int, seed: int) -> Any:
    """SpeechBrain's ``DynamicBatchSampler`` as its LibriSpeech recipes build it: 200 buckets,
    ``shuffle=True``, ``batch_ordering="random"`` (every rank builds the same one)."""
    sb, _ = speechbrain_sampler_module()
    return sb.DynamicBatchSampler(
        list(range(key.size)),
        max_batch_length=max_tokens,
        num_buckets=SPEECHBRAIN_BUCKETS,
        lengths_list=key.tolist(),
        shuffle=True,
        batch_ordering="random",
        seed=seed,
    )


def _speechbrain(
    key: np.ndarray, tl: np.ndarray, m: int, rank: int, world: int, seed: int
) -> Batches:
    sb, _ = speechbrain_sampler_module()
    inner = speechbrain_sampler(key, m, seed)
    outer = sb.DistributedSamplerWrapper(inner, num_replicas=world, rank=rank, shuffle=True)
    outer.set_epoch(0)
    return [list(map(int, x)) for x in outer]


@functools.lru_cache(maxsize=4)
def deepspeed_microbatches(
    key: tuple[int, ...], m: int, world: int, seed: int
) -> tuple[list[Any], list[int]]:
    """``batch_by_seqlens``' (micro-batch ids, max seqlens); cached for the parent's search,
    which asks every rank's batches of one setting (each rank computes them once)."""
    from deepspeed.runtime.data_pipeline.data_sampling import variable_batch_size_and_lr as v

    microbatch_ids, _, batch_max_seqlens = v.batch_by_seqlens(
        list(key), m, effective_batch_size=world, sequence_picking_order="dataloader", seed=seed
    )
    return microbatch_ids, batch_max_seqlens


def _deepspeed(
    key: np.ndarray, tl: np.ndarray, m: int, rank: int, world: int, seed: int
) -> Batches:
    from deepspeed.runtime.data_pipeline.data_sampling import variable_batch_size_and_lr as v

    microbatch_ids, batch_max_seqlens = deepspeed_microbatches(tuple(key.tolist()), m, world, seed)
    loader, _ = v.dataloader_for_variable_batch_size(
        list(range(key.size)),
        microbatch_ids,
        batch_max_seqlens,
        dataloader_rank=rank,
        dataloader_num_replicas=world,
        dataloader_num_workers=0,
    )
    return [list(map(int, x)) for x in loader]


def _fairseq_alg(
    key: np.ndarray, tl: np.ndarray, m: int, rank: int, world: int, seed: int
) -> Batches:
    from benchmarks.planning.baselines import greedy_plan

    ids, starts, sizes, perm = greedy_plan(key, m, seed, 0)
    batches = [ids[starts[j] : starts[j] + sizes[j]].tolist() for j in perm.tolist()]
    return batches[rank::world]


def _fixed_random(
    key: np.ndarray, tl: np.ndarray, b: int, rank: int, world: int, seed: int
) -> Batches:
    from torch.utils.data import BatchSampler, DistributedSampler

    sampler: DistributedSampler[int] = DistributedSampler(
        list(range(key.size)), num_replicas=world, rank=rank, shuffle=True, seed=seed
    )
    sampler.set_epoch(0)
    return [list(map(int, x)) for x in BatchSampler(sampler, b, drop_last=False)]


def _fixed_sorted(
    key: np.ndarray, tl: np.ndarray, b: int, rank: int, world: int, seed: int
) -> Batches:
    from torch.utils.data import DistributedSampler

    order = np.argsort(key, kind="stable")
    cut = [order[i : i + b].tolist() for i in range(0, key.size, b)]
    cut = [cut[i] for i in np.random.default_rng([seed, 7]).permutation(len(cut))]
    sampler: DistributedSampler[int] = DistributedSampler(
        list(range(len(cut))), num_replicas=world, rank=rank, shuffle=False
    )
    return [cut[i] for i in sampler]


DEALERS: dict[str, Callable[[np.ndarray, np.ndarray, int, int, int, int], Batches]] = {
    "ours": _ours,
    "lhotse": _lhotse,
    "hf_group": _hf_group,
    "hf_rebalance": _hf_rebalance,
    "speechbrain": _speechbrain,
    "deepspeed": _deepspeed,
    "fairseq_alg": _fairseq_alg,
    "fixed_random": _fixed_random,
    "fixed_sorted": _fixed_sorted,
}


def deal(
    name: str, tensor_lengths: np.ndarray, setting: int, rank: int, world: int, seed: int
) -> Batches:
    """One rank's micro-batches of epoch 0 from peer ``name`` at ``setting``.

    Args:
        name: a key of :data:`BY_NAME`.
        tensor_lengths: (n, 2) source and ``[BOS] + target`` lengths; the key is their max.
        setting: the peer's ``max_tokens`` or batch size (:attr:`Peer.setting`).
        rank: this rank.
        world: the number of ranks.
        seed: the run's seed (peers that take one).
    """
    key = tensor_lengths.max(axis=1).astype(np.int64)
    return DEALERS[name](key, tensor_lengths, int(setting), rank, world, seed)


def deal_all(
    name: str, tensor_lengths: np.ndarray, setting: int, world: int, seed: int
) -> list[Batches]:
    """Every rank's micro-batches (each rank's sampler run in this process)."""
    return [deal(name, tensor_lengths, setting, r, world, seed) for r in range(world)]


# -- unequal batch counts ------------------------------------------------------------------------

WORKAROUNDS = {
    "fairseq_alg": "fairseq's own: ShardedIterator(fill_value=[]) + trainer dummy batch "
    "(the rank's first batch, ignore_grad: loss x 0)",
}
"""What a peer's users do when ranks get unequal batch counts (a peer not listed has none)."""


def workaround(name: str, mine: Batches, counts: list[int]) -> tuple[Batches, list[float]] | None:
    """This rank's batches and loss weights after the peer's workaround; ``None`` if it has none.

    Only called when ``counts`` (every rank's batch count) differ.
    """
    if name not in WORKAROUNDS:
        return None
    weights = [1.0] * len(mine)
    extra = max(counts) - len(mine)
    return mine + [mine[0]] * extra, weights + [0.0] * extra
