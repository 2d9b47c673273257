"""A DataLoader over a token-budget batch sampler that Lightning leaves alone.

Lightning replaces a loader's sampler with a ``DistributedSampler`` only when the loader's
``sampler`` is not one already (``_requires_distributed_sampler`` in Lightning 2.6's
``trainer/connectors/data_connector.py``), and it calls ``set_epoch`` only on
``dataloader.sampler`` / ``dataloader.batch_sampler.sampler``. Our loader's ``sampler`` is such
a ``DistributedSampler`` (:class:`_EpochRelay`) that relays ``set_epoch`` to the batch sampler,
so the trainer's default ``use_distributed_sampler=True`` needs no change.

Example:
    >>> from lightning_varbatch import TokenBudgetBatchSampler
    >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7)]
    >>> loader = token_budget_dataloader(data, TokenBudgetBatchSampler([3, 5, 2, 7], 10,
    ...                                  rank=0, world_size=1))
    >>> len(loader), sorted(int(b["nexamples"]) for b in loader)
    (3, [1, 1, 2])
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader, DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from lightning_varbatch.collate import BatchInfoDataset, PaddingCollate
from lightning_varbatch.sampler import TokenBudgetBatchSampler

__all__ = ["TokenBudgetDataLoader", "token_budget_dataloader"]


class _EpochRelay(DistributedSampler[int]):
    """The loader's ``sampler``: marks it sharded for Lightning and relays ``set_epoch``.

    The batch sampler drives the DataLoader; this object is never iterated by it. Being a
    ``DistributedSampler`` makes Lightning's ``_requires_distributed_sampler`` false, so the
    loader is not rebuilt; ``set_epoch`` reaches the batch sampler through it.
    """

    def __init__(self, dataset: Any, batch_sampler: TokenBudgetBatchSampler, fixed: bool) -> None:
        super().__init__(
            dataset,
            num_replicas=batch_sampler.world_size,
            rank=batch_sampler.rank,
            shuffle=False,
        )
        self.batch_sampler = batch_sampler
        self.fixed = fixed

    def set_epoch(self, epoch: int) -> None:
        super().set_epoch(epoch)
        if not self.fixed:
            self.batch_sampler.set_epoch(epoch)


class TokenBudgetDataLoader(DataLoader[Any]):
    """A DataLoader over a :class:`~lightning_varbatch.TokenBudgetBatchSampler`.

    Its ``len`` is the epoch's micro-batch count as Lightning counts it (also after a resume),
    Lightning neither replaces its sampler nor needs ``use_distributed_sampler=False``, and its
    ``set_epoch`` calls reach the batch sampler. Build it with :func:`token_budget_dataloader`.

    Args:
        dataset: a map-style dataset (wrapped in :class:`BatchInfoDataset` unless it is one).
        batch_sampler: the token-budget sampler, already set to this rank.
        collate_fn: default :class:`PaddingCollate` (with the sampler's truncation).
        num_workers: DataLoader worker processes.
        pin_memory: pin batches in memory.
        evaluation: start every iteration from the first micro-batch and keep the plan of
            epoch 0 (validation and test); otherwise iteration resumes where it stopped.
        **kwargs: other DataLoader arguments (``prefetch_factor``, ``persistent_workers``...).
    """

    def __init__(
        self,
        dataset: Any,
        batch_sampler: TokenBudgetBatchSampler,
        collate_fn: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        evaluation: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(batch_sampler, TokenBudgetBatchSampler):
            raise TypeError(
                "batch_sampler must be a TokenBudgetBatchSampler, got "
                f"{type(batch_sampler).__name__}."
            )
        wrapped = dataset if isinstance(dataset, BatchInfoDataset) else BatchInfoDataset(dataset)
        if collate_fn is None:
            collate_fn = PaddingCollate(pad_to_multiple_of=batch_sampler.config.pad_to_multiple_of)
            collate_fn = collate_fn.with_truncation(batch_sampler.truncate_to)
        super().__init__(
            wrapped,
            batch_sampler=batch_sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
            **kwargs,
        )
        self.evaluation = evaluation
        # DataLoader forbids assigning `sampler` after __init__ and forbids passing it together
        # with a batch_sampler; it is only read by Lightning (see _EpochRelay), never iterated.
        self.__dict__["sampler"] = _EpochRelay(wrapped, batch_sampler, fixed=evaluation)

    @property
    def token_sampler(self) -> TokenBudgetBatchSampler:
        """The token-budget batch sampler."""
        sampler = self.batch_sampler
        assert isinstance(sampler, TokenBudgetBatchSampler)
        return sampler

    def __len__(self) -> int:
        """Micro-batches of the epoch on this rank, counted from the epoch's start."""
        return self.token_sampler.epoch_length

    def __iter__(self) -> _BaseDataLoaderIter:
        if self.evaluation:
            sampler = self.token_sampler
            sampler.set_epoch(1)  # a different epoch resets the position: evaluate from the start
            sampler.set_epoch(0)
        return super().__iter__()


def token_budget_dataloader(
    dataset: Any,
    sampler: TokenBudgetBatchSampler,
    collate_fn: Callable[[Any], Any] | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    **kwargs: Any,
) -> TokenBudgetDataLoader:
    """A DataLoader for your own DataModule or LightningModule; Lightning leaves it alone.

    Set the sampler's rank, world size and accumulation from the trainer first
    (``sampler.set_distributed(trainer.global_rank, trainer.world_size,
    trainer.accumulate_grad_batches)``); the trainer's default ``use_distributed_sampler=True``
    is fine. For validation, build the sampler with ``shuffle=False`` and pass
    ``evaluation=True``.

    Args:
        dataset: a map-style dataset of items for ``collate_fn``.
        sampler: the token-budget sampler of this rank.
        collate_fn: default :class:`PaddingCollate` with the sampler's padding and truncation.
        num_workers: DataLoader worker processes.
        pin_memory: pin batches in memory.
        **kwargs: other :class:`TokenBudgetDataLoader` / DataLoader arguments.

    Returns:
        The loader; its batches carry the step's token count for
        :func:`~lightning_varbatch.loss.step_token_mean`.

    Example:
        >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7)]
        >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7], 10, rank=0, world_size=1)
        >>> loader = token_budget_dataloader(data, sampler)
        >>> sum(int(b["ntokens"]) for b in loader), len(loader)
        (17, 3)
    """
    return TokenBudgetDataLoader(
        dataset,
        sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **kwargs,
    )
