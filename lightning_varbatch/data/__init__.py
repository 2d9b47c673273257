"""The torch side of the data path: sampler, collate, loader and the LightningDataModule.

Submodules: ``sampler`` (:class:`~lightning_varbatch.TokenBudgetBatchSampler`) is one rank's view of
a :mod:`lightning_varbatch.planner` plan, yielding ``micro_batch`` lists; ``collate``
(:class:`~lightning_varbatch.PaddingCollate`) pads a micro-batch and puts the plan's counts on it;
``loader`` (:func:`~lightning_varbatch.token_budget_dataloader`) and ``datamodule``
(:class:`~lightning_varbatch.TokenBudgetDataModule`) assemble them so that Lightning leaves the
batches alone; the other modules' roles: ``docs/architecture.md``. Each public name has one home:
import it from :mod:`lightning_varbatch` (or its defining module); this package re-exports nothing.

Example:
    >>> from lightning_varbatch import TokenBudgetBatchSampler
    >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7, 4], max_tokens=10, rank=0, world_size=1)
    >>> sorted(i for batch in sampler for i in batch)
    [0, 1, 2, 3, 4]
"""
