"""The torch side of the data path: sampler, collate, loader and the LightningDataModule.

:mod:`~lightning_varbatch.data.sampler` (:class:`~lightning_varbatch.TokenBudgetBatchSampler`)
is one rank's view of a :mod:`lightning_varbatch.planner` plan, yielding
:mod:`~lightning_varbatch.data.micro_batch` lists;
:mod:`~lightning_varbatch.data.collate` (:class:`~lightning_varbatch.PaddingCollate`) pads a
micro-batch and puts the plan's counts on it; :mod:`~lightning_varbatch.data.loader`
(:func:`~lightning_varbatch.token_budget_dataloader`) and
:mod:`~lightning_varbatch.data.datamodule` (:class:`~lightning_varbatch.TokenBudgetDataModule`)
assemble them so that Lightning leaves the batches alone. By idea:
:mod:`~lightning_varbatch.data.plan_settings` (planner settings as keywords or one
``PlanConfig``), :mod:`~lightning_varbatch.data.sampler_state` (the position in the epoch and
its saved state), :mod:`~lightning_varbatch.data.sampler_resume` (resuming it, also
elastically, through the remainder guard), :mod:`~lightning_varbatch.data.plan_items` (what the plan
attaches to a micro-batch's items), :mod:`~lightning_varbatch.data.token_fields` (reading token
fields), :mod:`~lightning_varbatch.data.split_inputs` (a DataModule's splits, read and checked),
:mod:`~lightning_varbatch.data.split_loaders` (a split's sampler, loader, collate and
``check()``), :mod:`~lightning_varbatch.data.datamodule_settings` (the DataModules'
construction checks), :mod:`~lightning_varbatch.data.datamodule_state` (their versioned state
and resume) and :mod:`~lightning_varbatch.data.rank_agreement` (every rank plans the same data).

Each public name has one home: import it from :mod:`lightning_varbatch` (or from the module
that defines it); this package re-exports nothing.

Example:
    >>> from lightning_varbatch import TokenBudgetBatchSampler
    >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7, 4], max_tokens=10, rank=0, world_size=1)
    >>> sorted(i for batch in sampler for i in batch)
    [0, 1, 2, 3, 4]
"""
