"""The torch side of the data path: sampler, collate, loader and the LightningDataModule.

:class:`TokenBudgetBatchSampler` is one rank's view of a :mod:`lightning_varbatch.planner`
plan; :class:`PaddingCollate` pads a micro-batch and puts the plan's counts on it;
:func:`token_budget_dataloader` and :class:`TokenBudgetDataModule` assemble them so that
Lightning leaves the batches alone.

Example:
    >>> from lightning_varbatch.data import TokenBudgetBatchSampler
    >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7, 4], max_tokens=10, rank=0, world_size=1)
    >>> sorted(i for batch in sampler for i in batch)
    [0, 1, 2, 3, 4]
"""

from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.datamodule import TokenBudgetDataModule
from lightning_varbatch.data.loader import TokenBudgetDataLoader, token_budget_dataloader
from lightning_varbatch.data.micro_batch import MicroBatch
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler

__all__ = [
    "MicroBatch",
    "PaddingCollate",
    "TokenBudgetBatchSampler",
    "TokenBudgetDataLoader",
    "TokenBudgetDataModule",
    "token_budget_dataloader",
]
