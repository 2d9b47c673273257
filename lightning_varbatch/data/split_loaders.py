"""What both DataModules do with a planned split: its sampler, loader, collate and ``check()``.

:class:`SplitLoaders` is their map-style splits' mixin; :func:`plan_split` builds a split's planner.

Example:
    >>> planner = plan_split("val", 8, {"seed": 1}, np.array([3, 4, 5]), None, budget_default=True)
    >>> planner.num_examples
    3
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.data.loader import TokenBudgetDataLoader
from lightning_varbatch.data.pairing import collate_for_plan, dataset_column_keys
from lightning_varbatch.data.plan_settings import plain_settings
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.data.splits import STAGES, check_evaluation, evaluation_config, split_error
from lightning_varbatch.errors import SettingError, SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.length_warmup import WARMUP_DEFAULTS
from lightning_varbatch.planner.lengths import check_loss_lengths
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import DataSource
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.settings_identity import RANK_SETTINGS

__all__ = ["SplitLoaders", "check_stages", "plan_split", "training_only"]


def plan_split(
    stage: str,
    budget: int,
    settings: Mapping[str, Any],
    lengths: np.ndarray | None,
    loss_lengths: np.ndarray | None,
    *,
    sources: list[DataSource] | None = None,
    mixing: Mapping[str, Any] | None = None,
    budget_default: bool,
) -> Planner:
    """The planner of one split: its lengths (or data sources) with its settings.

    An evaluation split replaces ``shuffle`` and ``tail`` (``splits.evaluation_config``) and drops
    :func:`training_only` settings; ``budget_default``: whether ``val_max_tokens`` defaulted.

    Raises:
        SettingError: the planner's, renamed after the DataModule's argument of ``stage``.
    """
    try:
        if stage == "train":
            config = PlanConfig(**plain_settings(max_tokens=budget, **settings))
        else:  # the evaluation rule both DataModules share; no length curriculum
            config = evaluation_config(budget, training_only(settings))
        if sources is None:
            assert lengths is not None  # a plain split has lengths
            check_loss_lengths(config, loss_lengths)
            return EpochPlanner(lengths, config, loss_lengths)
        for source in sources:
            check_loss_lengths(config, source.loss_lengths)
        if stage != "train":  # a dataset's own warm-up bounds are training settings too
            sources = [replace(s, length_warmup_min=None, length_warmup_max=None) for s in sources]
        return MixturePlanner(sources, config, **dict(mixing or {}))
    except SettingError as error:  # named after this DataModule's argument and split
        longest = None
        if sources is None and lengths is not None and np.size(lengths):
            longest = int(np.max(lengths))
        raise split_error(
            error, stage, budget, budget_default=budget_default, longest=longest
        ) from error


def training_only(settings: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` without those of training alone, for an evaluation split.

    The length warm-up, the batch-size schedule (an evaluation step updates nothing) and the
    ranks' own budgets (``rank_shares`` / ``rank_max_tokens`` divide the training budget;
    evaluation plans ``val_max_tokens`` on every rank: set it for the smallest card).

    Example:
        >>> training_only({"seed": 1, "length_warmup": 10, "batch_schedule": "0:0.5 1K:1"})
        {'seed': 1}
    """
    training = {*WARMUP_DEFAULTS, *RANK_SETTINGS, "batch_schedule"}
    return {k: v for k, v in settings.items() if k not in training}


def check_stages(stages: Sequence[str]) -> None:
    """Refuse anything but a sequence of ``"train"``, ``"val"`` and ``"test"``.

    Raises:
        SettingValueError: naming ``stages``.

    Example:
        >>> check_stages(("val",))
    """
    if isinstance(stages, str) or any(s not in STAGES for s in stages):
        raise SettingValueError(
            f"stages must be a sequence of {', '.join(STAGES)}, got {stages!r}.",
            setting="stages",
            value=stages,
        )


class SplitLoaders:
    """The loaders, samplers, collates and ``check()`` of a DataModule's planned splits.

    A mixin of both DataModules, which keep the attributes below and say where a split's items
    are (:meth:`_dataset`) and how its training split is planned (:meth:`_train_plan`).

    Example:
        >>> from lightning_varbatch import TokenBudgetDataModule
        >>> dm = TokenBudgetDataModule([{"tokens": [1, 2]}] * 3, [2, 2, 2], 4,
        ...                            val_dataset=[{"tokens": [1]}], val_lengths=[1])
        >>> isinstance(dm, SplitLoaders), [int(b["nexamples"]) for b in dm.val_dataloader()]
        (True, [1])
    """

    _planners: Mapping[str, Planner]
    _columns: Mapping[str, Any]
    samplers: dict[str, TokenBudgetBatchSampler]
    collate: Callable[[Any], Any] | None
    num_workers: int
    pin_memory: bool

    def _dataset(self, stage: str) -> Any:
        """The items of ``stage`` (its loader indexes them)."""
        raise NotImplementedError

    def _default_keys(self) -> dict[str, str]:
        """The default collate's field names when a split's lengths name no columns."""
        return {}

    def _collate_loss_offset(self, config: PlanConfig) -> int | None:
        """The loss offset the default collate of a split planned with ``config`` gets."""
        # a packed plan without one counts lengths - 1 itself (TokenBudgetDataModule)
        return config.loss_offset or (None if config.layout == "packed" else 0)

    def _train_plan(self, world_size: int, accumulate: int, epoch: int) -> EpochPlan | None:
        """The training plan :meth:`check` reports (``None``: no training split)."""
        raise NotImplementedError

    @property
    def _trainer(self) -> Any:
        return getattr(self, "trainer", None)

    def _planner(self, stage: str) -> Planner:
        """The planner of ``stage`` (built at construction)."""
        return self._planners[stage]

    def _topology(self, stage: str) -> tuple[int | None, int | None, int]:
        """Rank, world size and accumulation of ``stage`` (``None``: outside a Trainer)."""
        trainer = self._trainer
        if trainer is None:
            return None, None, 1
        accumulate = int(trainer.accumulate_grad_batches) if stage == "train" else 1
        return int(trainer.global_rank), int(trainer.world_size), accumulate

    def _sampler(self, stage: str) -> TokenBudgetBatchSampler:
        """This rank's sampler of ``stage``: built once, then moved to the Trainer's ranks."""
        rank, world, accumulate = self._topology(stage)
        sampler = self.samplers.get(stage)
        if sampler is None:
            sampler = TokenBudgetBatchSampler.from_planner(
                self._planner(stage),
                rank=rank,
                world_size=world,
                accumulate_grad_batches=accumulate,
            )
            self.samplers[stage] = sampler
        elif rank is not None and world is not None:
            sampler.set_distributed(rank, world, accumulate)
        if stage != "train":
            check_evaluation(stage, sampler)
        return sampler

    def _loader(self, stage: str) -> TokenBudgetDataLoader:
        """The loader of ``stage`` over its sampler (built by :meth:`_sampler`)."""
        return TokenBudgetDataLoader(  # the truncation and the first-item check are the loader's
            self._dataset(stage),
            self.samplers[stage],
            collate_fn=self.collate_for(stage),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            evaluation=stage != "train",
        )

    def collate_for(self, stage: str) -> Callable[[Any], Any]:
        """The collate of ``stage``: the one given, or the plan's default for its columns.

        The default follows the plan's layout (``pairing.collate_for_plan``) and reads the
        lengths' fields: ``("src_ids", "tgt_ids")`` give ``PaddingCollate(source_key="src_ids",
        target_key="tgt_ids")``, ``"input_ids"`` gives ``tokens_key="input_ids"``.

        Raises:
            SettingValueError: for a given collate that does not fit the plan's layout.

        Example:
            >>> from lightning_varbatch import TokenBudgetDataModule
            >>> data = [{"input_ids": [1] * n} for n in (3, 5)]
            >>> dm = TokenBudgetDataModule(data, [3, 5], 8, layout="packed")
            >>> type(dm.collate_for("train")).__name__
            'PackingCollate'
        """
        config = self._planner(stage).config
        columns = self._columns.get(stage)
        return collate_for_plan(
            config,
            self.collate,
            loss_offset=self._collate_loss_offset(config),
            keys=lambda: (
                self._default_keys()
                if columns is None
                else dataset_column_keys(self._dataset(stage), columns)
            ),
        )

    def val_dataloader(self) -> TokenBudgetDataLoader | list[Any]:
        """The validation loader of this rank: every example exactly once across ranks.

        Without a ``val_dataset``: ``[]``, so ``fit`` skips validation (as without the method).
        """
        if "val" not in self._planners:
            return []
        self._sampler("val")
        return self._loader("val")

    def test_dataloader(self) -> TokenBudgetDataLoader:
        """The test loader of this rank: every example exactly once across ranks."""
        if "test" not in self._planners:
            raise ValueError(
                f"{type(self).__name__} has no test_dataset: pass test_dataset= and "
                "test_lengths= when you build it to run trainer.test."
            )
        self._sampler("test")
        return self._loader("test")

    def check(
        self,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        *,
        stages: Sequence[str] = STAGES,
        epoch: int = 0,
    ) -> dict[str, EpochPlan]:
        """Plan and check every split as a Trainer with this topology would, without one.

        Plans each split for ``world_size`` ranks (evaluation without accumulation, as
        Lightning does) and applies its loaders' checks (evaluation: every example once, one
        per rank at least); keeps nothing. A stream's training plan is its first window's.

        Args:
            world_size: number of ranks the run will have (``trainer.world_size``).
            accumulate_grad_batches: the Trainer's ``accumulate_grad_batches``.
            stages: the splits to check; those without data are left out.
            epoch: the training epoch to plan (evaluation always plans epoch 0).

        Returns:
            Every checked split's plan by name (``num_skipped``, ``num_micro_batches_per_rank``...).

        Raises:
            SettingValueError: for a bad topology or stage, or a split that cannot be
                planned or evaluated with it (``.stage`` names the split).
            RuntimeError: for an evaluation plan that would repeat or drop examples.

        Example:
            >>> from lightning_varbatch import TokenBudgetDataModule
            >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7, 4, 6)]
            >>> dm = TokenBudgetDataModule(data, [3, 5, 2, 7, 4, 6], 12,
            ...                            val_dataset=data[:3], val_lengths=[3, 5, 2])
            >>> plans = dm.check(world_size=2, accumulate_grad_batches=2)
            >>> sorted(plans), plans["train"].world_size, dm.samplers
            (['train', 'val'], 2, {})
        """
        check_stages(stages)
        world_size = check_count("world_size", world_size)
        accumulate = check_count("accumulate_grad_batches", accumulate_grad_batches)
        epoch = check_count("epoch", epoch, minimum=0)
        plans: dict[str, EpochPlan] = {}
        for stage in stages:
            if stage == "train":
                plan = self._train_plan(world_size, accumulate, epoch)
                if plan is not None:
                    plans[stage] = plan
            elif stage in self._planners:
                sampler = TokenBudgetBatchSampler.from_planner(
                    self._planners[stage], rank=0, world_size=world_size
                )
                check_evaluation(stage, sampler)
                plans[stage] = sampler.plan
        return plans
