"""A DataLoader over a token-budget batch sampler that Lightning leaves alone.

Lightning replaces a loader's sampler with a ``DistributedSampler`` only when its ``sampler`` is
not one already (``_requires_distributed_sampler``, Lightning 2.6), and calls ``set_epoch`` only
on ``dataloader.sampler`` / ``dataloader.batch_sampler.sampler``. Our loader's ``sampler`` is such
a ``DistributedSampler`` (:class:`_EpochRelay`) relaying ``set_epoch`` to the batch sampler, so
the default ``use_distributed_sampler=True`` needs no change; a training loader makes Lightning
run each epoch's length (:mod:`~lightning_varbatch.data.lightning_loop`).
:func:`token_budget_dataloader` is the constructor the docs teach.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.dataloader import _BaseDataLoaderIter

from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.columnar import fetch_rows
from lightning_varbatch.data.lightning_loop import calling_trainer, follow_epoch_length
from lightning_varbatch.data.packed_collate import PackingCollate
from lightning_varbatch.data.pairing import PLAN_COLLATES, collate_for_plan
from lightning_varbatch.data.plan_items import attach_plan, check_map_style
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.errors import SettingTypeError

__all__ = [
    "TokenBudgetDataLoader",
    "check_dataset_size",
    "check_first_items_of",
    "token_budget_dataloader",
]


class _BatchInfoDataset(Dataset[Any]):
    """Wrap a map-style dataset so that each fetched micro-batch keeps the plan's counts.

    ``__getitems__`` takes the sampler's :class:`~lightning_varbatch.MicroBatch` as it is, reads
    its rows in one call where it can (``columnar.fetch_rows``) and attaches the plan.

    Example:
        >>> from lightning_varbatch.data.micro_batch import MicroBatch
        >>> data = _BatchInfoDataset([{"tokens": [1, 2]}, {"tokens": [3]}])
        >>> mb = MicroBatch([1, 0], epoch=0, step=0, micro=0, rank=0, ntokens=3,
        ...                 step_ntokens=3, step_nexamples=2)
        >>> items = data.__getitems__(mb)
        >>> items, items.info["step_ntokens"]
        ([{'tokens': [3]}, {'tokens': [1, 2]}], 3)
    """

    def __init__(self, dataset: Any, columnar: bool = False) -> None:
        check_map_style(dataset, "dataset")
        self.dataset = dataset
        self.columnar = columnar

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> Sequence[Any]:
        """The items at ``indices`` with the micro-batch's plan counts."""
        items = fetch_rows(self.dataset, indices, self.columnar)
        return attach_plan(items, indices)


class _EpochRelay(DistributedSampler[int]):
    """The loader's ``sampler`` (never iterated): marks it sharded and relays ``set_epoch``."""

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
            follow_epoch_length(calling_trainer())


def check_dataset_size(
    dataset: Any, sampler: TokenBudgetBatchSampler, name: str = "dataset"
) -> None:
    """The dataset must have exactly one item per length the sampler plans with.

    Fewer lengths train only the first items, more index past the end; no ``__len__``: not checked.

    Raises:
        ValueError: when the counts differ; the message names both.

    Example:
        >>> s = TokenBudgetBatchSampler([3, 5, 2], 10, rank=0, world_size=1)
        >>> check_dataset_size([{"tokens": [1]}] * 4, s)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: dataset has 4 items but the sampler plans with 3 lengths: ...
    """
    try:
        size = len(dataset)
    except TypeError:
        return
    planned = sampler.planner.num_examples
    if size != planned:
        raise ValueError(
            f"{name} has {size} items but the sampler plans with {planned} lengths: pass one "
            f"length per item (lengths of shape ({size},) or ({size}, 2))."
        )


def check_first_items_of(
    dataset: Any, sampler: TokenBudgetBatchSampler, collate: PaddingCollate | PackingCollate
) -> None:
    """Check the first item of the dataset (of every dataset of a mixture) with ``collate``.

    Raises:
        TypeError, ValueError: as ``collate.check_item``.

    Example:
        >>> s = TokenBudgetBatchSampler([3, 1], 10, rank=0, world_size=1)
        >>> collate = PaddingCollate()
        >>> check_first_items_of([{"tokens": [1, 2, 3]}, {"tokens": [4]}], s, collate)
        >>> check_first_items_of([{"tokens": ["a"]}], s, collate)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: Field 'tokens' of dataset item 0 is not a sequence of integer token ids ...
    """
    planner = sampler.planner
    offsets = getattr(planner, "offsets", None)
    starts = [0] if offsets is None else [int(o) for o in offsets[:-1]]
    sizes = [planner.num_examples] if offsets is None else list(np.diff(offsets).tolist())
    key = planner.prepared.key
    for which, (start, size) in enumerate(zip(starts, sizes, strict=True)):
        if size < 1:
            continue
        collate.check_item(
            dataset[start], start, int(key[start]), planner.dataset_truncate_to(which)
        )


class TokenBudgetDataLoader(DataLoader[Any]):
    """A DataLoader over a :class:`~lightning_varbatch.TokenBudgetBatchSampler`.

    Its ``len``: each epoch's micro-batches as Lightning counts them (also after a resume).

    Args:
        dataset: a map-style dataset.
        batch_sampler: the token-budget sampler, already set to this rank.
        collate_fn: default: the plan's (``pairing.collate_for_plan``), with the sampler's
            padding and truncation; a library collate must fit the plan, a plain callable is used.
        num_workers: DataLoader worker processes.
        pin_memory: pin batches in memory.
        evaluation: start every iteration from the first micro-batch and keep the plan of
            epoch 0 (validation and test); otherwise iteration resumes where it stopped.
        check_first_items: with a library collate, check each dataset's first item now, not later.
        **kwargs: other DataLoader arguments (``prefetch_factor``, ``persistent_workers``...).

    Raises:
        TypeError: for a non-token-budget batch sampler, an iterable-style dataset, a bad item.
        SettingValueError: for a collate that does not fit the plan or a bad ``num_workers``.
        ValueError: for a dataset whose size is not the sampler's, or a bad first item.
    """

    def __init__(
        self,
        dataset: Any,
        batch_sampler: TokenBudgetBatchSampler,
        collate_fn: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        evaluation: bool = False,
        check_first_items: bool = True,
        **kwargs: Any,
    ) -> None:
        if not isinstance(batch_sampler, TokenBudgetBatchSampler):
            raise SettingTypeError(
                "batch_sampler must be a TokenBudgetBatchSampler, got "
                f"{type(batch_sampler).__name__}: build one from the lengths "
                "(TokenBudgetBatchSampler(lengths, max_tokens, ...)).",
                setting="batch_sampler",
                value=batch_sampler,
            )
        num_workers = check_count(
            "num_workers", num_workers, minimum=0, what=" (0: load in the main process)"
        )
        pin_memory = check_flag("pin_memory", pin_memory)
        evaluation = check_flag("evaluation", evaluation)
        inner = dataset.dataset if isinstance(dataset, _BatchInfoDataset) else dataset
        check_map_style(inner, "dataset")
        check_dataset_size(inner, batch_sampler)
        # the plan's layout decides the default and refuses a library collate that disagrees
        collate_fn = collate_for_plan(
            batch_sampler.config,
            collate_fn,
            loss_offset=batch_sampler.config.loss_offset or None,  # the plan's, when it has one
            setting="collate_fn",
        )
        ours = isinstance(collate_fn, PLAN_COLLATES)
        if isinstance(collate_fn, PLAN_COLLATES):
            collate_fn = collate_fn.with_truncation(batch_sampler.truncate_to)
            if check_first_items:
                check_first_items_of(inner, batch_sampler, collate_fn)
        # Our collates read Arrow columns: one batched read per micro-batch of a HF dataset.
        wrapped = _BatchInfoDataset(inner, columnar=ours)
        super().__init__(
            wrapped,
            batch_sampler=batch_sampler,
            collate_fn=collate_fn,
            num_workers=num_workers,
            pin_memory=pin_memory,
            **kwargs,
        )
        self.evaluation = evaluation
        # DataLoader forbids assigning `sampler` after __init__ or with a batch_sampler
        self.__dict__["sampler"] = _EpochRelay(wrapped, batch_sampler, fixed=evaluation)

    @property
    def max_tokens(self) -> int:
        """The token budget of one micro-batch (the plan's ``max_tokens``)."""
        return int(self.token_sampler.config.max_tokens)

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
        else:  # shares set in on_train_epoch_start apply to this epoch: count them
            follow_epoch_length(calling_trainer())
        return super().__iter__()


_BATCHING = {"batch_size", "shuffle", "sampler", "drop_last", "batch_sampler"}


def token_budget_dataloader(
    dataset: Any,
    sampler: TokenBudgetBatchSampler,
    /,
    collate_fn: Callable[[Any], Any] | None = None,
    num_workers: int = 0,
    pin_memory: bool = False,
    **kwargs: Any,
) -> TokenBudgetDataLoader:
    """A DataLoader for your own DataModule or LightningModule; Lightning leaves it alone.

    First set the sampler's topology: ``sampler.set_distributed(trainer.global_rank,
    trainer.world_size, trainer.accumulate_grad_batches)``; ``use_distributed_sampler=True`` is
    fine. Validation: a ``shuffle=False`` sampler and ``evaluation=True``.

    Args:
        dataset: a map-style dataset of items for ``collate_fn``.
        sampler: the token-budget sampler of this rank.
        collate_fn: as :class:`TokenBudgetDataLoader`'s.
        num_workers: DataLoader worker processes.
        pin_memory: pin batches in memory.
        **kwargs: other :class:`TokenBudgetDataLoader` / DataLoader arguments.

    Returns:
        The loader; its batches carry ``step_ntokens`` for
        :func:`~lightning_varbatch.loss.step_token_mean`.

    Example:
        >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7)]
        >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7], 10, rank=0, world_size=1)
        >>> loader = token_budget_dataloader(data, sampler)
        >>> sum(int(b["ntokens"]) for b in loader), len(loader)
        (17, 3)
    """
    batching = sorted(_BATCHING & set(kwargs))
    if batching:
        raise SettingTypeError(
            f"token_budget_dataloader does not take {batching}: the token-budget sampler "
            "decides every batch. Set max_tokens, shuffle, tail, ... on the "
            "TokenBudgetBatchSampler instead and leave these out.",
            setting=batching[0],
            value=kwargs[batching[0]],
        )
    return TokenBudgetDataLoader(
        dataset,
        sampler,
        collate_fn=collate_fn,
        num_workers=num_workers,
        pin_memory=pin_memory,
        **kwargs,
    )
