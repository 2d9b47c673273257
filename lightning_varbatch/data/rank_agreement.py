"""Every rank must plan the same data: a digest of what each planned, compared once.

Ranks that plan from different lengths, settings or shards get different numbers of
micro-batches and hang at the epoch's end: both DataModules compare a digest of every rank's
plan when they build the training loader, and every rank raises together when they differ.
"""

from __future__ import annotations

import hashlib
from typing import Any

import torch

from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.data.streaming import StreamingBatches

__all__ = [
    "check_ranks_agree",
    "check_same_plan_everywhere",
    "check_same_stream_everywhere",
    "plan_digest",
    "stream_digest",
]


def plan_digest(sampler: TokenBudgetBatchSampler) -> int:
    """A 63-bit digest of everything a plan depends on: lengths, loss lengths, settings, budgets.

    Example:
        >>> a = TokenBudgetBatchSampler([3, 4, 5], 8, rank=0, world_size=1)
        >>> b = TokenBudgetBatchSampler([3, 4, 6], 8, rank=0, world_size=1)
        >>> plan_digest(a) == plan_digest(a), plan_digest(a) == plan_digest(b)
        (True, False)
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(sampler.lengths_digest.encode())  # cached on the sampler: computed once
    h.update(sampler.planner.fingerprint().encode())
    # the ranks' budgets, out of the fingerprint (a resume may change them), must agree too;
    # read from the settings, so nothing is planned here (a resume re-plans after loading)
    h.update(repr((sampler.config.rank_shares, sampler.config.rank_max_tokens)).encode())
    return int.from_bytes(h.digest(), "little") >> 1


def check_ranks_agree(trainer: Any, digest: int, problem: str) -> None:
    """Raise on every rank when the ranks' ``digest`` differ (one all-gather of 8 bytes).

    Args:
        trainer: the Trainer (its strategy gathers).
        digest: this rank's 63-bit digest of what it planned.
        problem: the message, with ``{groups}`` where the ranks grouped by digest go.

    Raises:
        RuntimeError: ``problem``, naming the groups of ranks that agree.
    """
    if int(trainer.world_size) < 2:
        return
    mine = torch.tensor([digest], dtype=torch.int64, device=trainer.strategy.root_device)
    digests = trainer.strategy.all_gather(mine).reshape(-1).tolist()
    if len(set(digests)) > 1:
        groups: dict[int, list[int]] = {}
        for rank, value in enumerate(digests):
            groups.setdefault(value, []).append(rank)
        raise RuntimeError(problem.format(groups=sorted(groups.values())))


def check_same_plan_everywhere(trainer: Any, sampler: TokenBudgetBatchSampler) -> None:
    """Every rank must plan from the same data and settings, else the ranks would hang."""
    check_ranks_agree(
        trainer,
        plan_digest(sampler),
        "The ranks planned from different training data or settings (ranks grouped by what "
        "they planned: {groups}): every rank must see the same lengths, max_tokens, seed, "
        "planner settings and rank_shares / rank_max_tokens, or they get different batches "
        "and hang. Check that the data is "
        "loaded and tokenized identically on every rank.",
    )


def stream_digest(stream: StreamingBatches) -> int:
    """A 63-bit digest of the stream's shards and plan settings."""
    digest = hashlib.blake2b(stream.fingerprint().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def check_same_stream_everywhere(trainer: Any, stream: StreamingBatches) -> None:
    """Every rank must plan the same stream, else ranks get different counts and hang."""
    check_ranks_agree(
        trainer,
        stream_digest(stream),
        "The ranks stream different shards or plan settings (ranks grouped by what they "
        "planned: {groups}): every rank must be given the same shard files in the same order "
        "and the same max_tokens, window and planner settings.",
    )
