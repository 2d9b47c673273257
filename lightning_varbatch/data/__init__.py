"""The torch side of the data path: sampler, collate, loader and the LightningDataModule.

Submodules: ``sampler`` (:class:`~lightning_varbatch.TokenBudgetBatchSampler`) is one rank's view
of a :mod:`lightning_varbatch.planner` plan, yielding ``micro_batch`` lists; ``collate``
(:class:`~lightning_varbatch.PaddingCollate`) pads a micro-batch and puts the plan's counts on
it; ``loader`` (:func:`~lightning_varbatch.token_budget_dataloader`) and ``datamodule``
(:class:`~lightning_varbatch.TokenBudgetDataModule`) assemble them so that Lightning leaves the
batches alone. By idea: ``plan_settings`` (planner settings as keywords or one ``PlanConfig``),
``sampler_state`` (the position in the epoch and its saved state), ``sampler_resume`` (resuming
it, also elastically, through the remainder guard), ``plan_items`` (what the plan attaches to a
micro-batch's items), ``token_fields`` (reading token fields), ``split_inputs`` (a DataModule's
splits, read and checked), ``split_loaders`` (a split's sampler, loader, collate and
``check()``), ``datamodule_settings`` (the DataModules' construction checks),
``datamodule_state`` (their versioned state and resume) and ``rank_agreement`` (every rank
plans the same data). Each public name has one home: import it from :mod:`lightning_varbatch`
(or its defining module); this package re-exports nothing.

Example:
    >>> from lightning_varbatch import TokenBudgetBatchSampler
    >>> sampler = TokenBudgetBatchSampler([3, 5, 2, 7, 4], max_tokens=10, rank=0, world_size=1)
    >>> sorted(i for batch in sampler for i in batch)
    [0, 1, 2, 3, 4]
"""
