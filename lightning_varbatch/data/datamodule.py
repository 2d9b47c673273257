"""A LightningDataModule serving token-budgeted batches that Lightning leaves alone.

How it fits Lightning 2.6 (checked in its source):

- Its loaders (:mod:`~lightning_varbatch.data.loader`) keep Lightning from injecting a
  ``DistributedSampler`` under the default ``use_distributed_sampler=True`` and relay
  ``set_epoch`` to the token-budget sampler; no trainer state is touched.
- Lightning sizes the epoch with ``len(dataloader)`` and restores its batch counter on a resume:
  our loader's length is the whole epoch's (``TokenBudgetBatchSampler.epoch_length``).
- On ``fit(ckpt_path=...)`` the datamodule's ``load_state_dict`` runs (``restore_datamodule``)
  before ``train_dataloader()`` (``FitLoop.setup_data``): the position waits for the sampler.

Example:
    >>> data = [{"tokens": list(range(1, n + 1))} for n in (3, 5, 2, 7, 4)]
    >>> dm = TokenBudgetDataModule(data, [3, 5, 2, 7, 4], max_tokens=10)
    >>> loader = dm.train_dataloader()  # outside a Trainer: rank 0 of 1
    >>> sorted(i for batch in loader.batch_sampler for i in batch), len(loader)
    ([0, 1, 2, 3, 4], 3)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch  # noqa: F401  (first: without torch the import error names torch)
from lightning.pytorch import LightningDataModule

from lightning_varbatch.data.datamodule_settings import (
    check_budgets,
    check_loader_settings,
    check_sampler_kwargs,
    with_loss_offset,
)
from lightning_varbatch.data.datamodule_state import (
    ResumableState,
    trained_this_epoch,
    versioned,
)
from lightning_varbatch.data.lightning_loop import fit_epoch
from lightning_varbatch.data.loader import TokenBudgetDataLoader
from lightning_varbatch.data.rank_agreement import (
    check_ranks_agree,
    check_same_plan_everywhere,
    plan_digest,
)
from lightning_varbatch.data.sampler import OnMismatch, TokenBudgetBatchSampler
from lightning_varbatch.data.split_inputs import (
    check_loss_inputs,
    check_no_mixing,
    read_lengths,
    read_loss_lengths,
    read_split,
)
from lightning_varbatch.data.split_loaders import SplitLoaders, plan_split
from lightning_varbatch.data.splits import STAGES, check_evaluation
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.mixture_datasets import DataSource, MixingPolicy, Weights
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.rank_shares import check_rank_shares
from lightning_varbatch.sources.arrow_lengths import Columns, is_column_spec

__all__ = ["TokenBudgetDataModule", "check_evaluation", "check_ranks_agree", "plan_digest"]

Lengths = npt.ArrayLike | Columns | Callable[[Any], npt.ArrayLike]


class TokenBudgetDataModule(SplitLoaders, ResumableState, LightningDataModule):
    """Token-budgeted train/val/test loaders, sharded by rank, resumable mid-epoch.

    Reads rank, world size and ``accumulate_grad_batches`` from the trainer; every rank plans
    the same epoch and takes its own slice, so ranks run the same number of micro-batches.
    Validation and test use ``shuffle=False, tail="spread"``: every example is evaluated exactly
    once across ranks. ``state_dict`` saves how far the epoch was *trained* (not prefetched).

    Several datasets: pass a list of :class:`~lightning_varbatch.DataSource` as ``*_dataset``,
    no ``*_lengths``, and choose the mixing (:mod:`lightning_varbatch.planner.mixture`); batches
    then carry ``keys.DATASET``, their dataset's index.

    Args:
        train_dataset: a map-style dataset (items for ``collate``) or a list of ``DataSource``.
        train_lengths: one length per item (``(n,)`` or ``(n, 2)`` source/target), a
            callable ``dataset -> lengths`` evaluated once, or, for a Hugging Face dataset,
            the name of a length or token-id column or a (source, target) pair of them
            (:func:`~lightning_varbatch.sources.column_lengths`). ``None`` with data sources.
        max_tokens: token budget of one training micro-batch on one rank.
        mixing: with several training datasets, ``"per_step"`` (every optimizer step on all
            ranks from one dataset) or ``"per_batch"`` (every micro-batch from one dataset).
        weights: several training datasets: ``"size"`` or one weight each (``steps_per_epoch``).
        temperature: shares ``∝ weight ** (1 / temperature)`` (needs ``steps_per_epoch``).
        steps_per_epoch: ``None``: one pass over every dataset; else the epoch's steps, by weight.
        val_dataset: optional validation dataset (or list of data sources).
        val_lengths: its lengths (or callable); required with ``val_dataset``.
        test_dataset: optional test dataset.
        test_lengths: its lengths (or callable); required with ``test_dataset``.
        val_max_tokens: budget for validation and test (default ``max_tokens``).
        train_loss_lengths: loss tokens per training item when not its length (the target's for
            pairs) minus ``loss_offset``: an array, a column name or a callable; a
            :class:`~lightning_varbatch.DataSource` carries its own (planner setting refused).
        val_loss_lengths: the same for ``val_dataset``.
        test_loss_lengths: the same for ``test_dataset``.
        collate: the collate function (default: the plan's, :class:`PaddingCollate` or
            :class:`PackingCollate`, for the fields the lengths name); a library collate gets
            the sampler's truncation and is refused when it does not fit the plan.
        num_workers: DataLoader worker processes.
        pin_memory: pin batches in memory.
        loss_offset: every split's loss tokens per example are its length (the target's for
            pairs) minus this, after ``oversize="truncate"`` (1 for teacher forcing); the
            default collate gets it too. Not with ``*_loss_lengths``.
        on_resume_mismatch: for a checkpoint whose training data or settings differ: ``"error"``
            (default) refuses it, listing what changed; ``"restart_epoch"`` trains its epoch
            afresh, every example once (:meth:`TokenBudgetBatchSampler.load_state_dict`).
        **sampler_kwargs: planner settings: :class:`~lightning_varbatch.PlanConfig`'s fields
            but ``max_tokens`` (``cost``, ``seed``, ``tail``, ``oversize``, ...).

    Raises:
        TypeError: for an unknown planner setting, or an iterable-style dataset.
        ValueError: for missing lengths or a wrong count of them, bad budgets or loader
            settings, or fewer evaluation examples than ranks.

    Example:
        >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7, 4, 6)]
        >>> dm = TokenBudgetDataModule(data, lambda d: [len(x["tokens"]) for x in d], 12,
        ...                            val_dataset=data[:3], val_lengths=[3, 5, 2], seed=1)
        >>> sorted(i for b in dm.val_dataloader().batch_sampler for i in b)
        [0, 1, 2]
    """

    def __init__(
        self,
        train_dataset: Any,
        train_lengths: Lengths | None = None,
        max_tokens: int | None = None,
        *,
        mixing: MixingPolicy = "per_step",
        weights: Weights = "size",
        temperature: float = 1.0,
        steps_per_epoch: int | None = None,
        val_dataset: Any = None,
        val_lengths: Lengths | None = None,
        test_dataset: Any = None,
        test_lengths: Lengths | None = None,
        val_max_tokens: int | None = None,
        train_loss_lengths: Lengths | None = None,
        val_loss_lengths: Lengths | None = None,
        test_loss_lengths: Lengths | None = None,
        collate: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        on_resume_mismatch: OnMismatch = "error",
        loss_offset: int = 0,
        **sampler_kwargs: Any,
    ) -> None:
        super().__init__()
        check_sampler_kwargs(sampler_kwargs)
        check_no_mixing(train_dataset, mixing, weights, temperature, steps_per_epoch)
        self.max_tokens, self.val_max_tokens, self._val_budget_default = check_budgets(
            max_tokens, val_max_tokens
        )
        self.collate, self.num_workers, self.pin_memory, self.on_resume_mismatch = (
            check_loader_settings(collate, num_workers, pin_memory, on_resume_mismatch)
        )
        self.sources: dict[str, list[DataSource] | None] = {}
        self.datasets: dict[str, Any] = {}
        self._lengths_in: dict[str, Lengths | None] = {
            "train": train_lengths,
            "val": val_lengths,
            "test": test_lengths,
        }
        for name in STAGES:
            data = {"train": train_dataset, "val": val_dataset, "test": test_dataset}[name]
            self.sources[name], self.datasets[name] = read_split(name, data, self._lengths_in[name])
        self._loss_in: dict[str, Lengths | None] = {
            "train": train_loss_lengths,
            "val": val_loss_lengths,
            "test": test_loss_lengths,
        }
        for name, loss in self._loss_in.items():
            check_loss_inputs(name, loss, self.datasets[name], self.sources[name])
        self.mixing: dict[str, Any] = {
            "mixing": mixing,
            "weights": weights,
            "temperature": temperature,
            "steps_per_epoch": steps_per_epoch,
        }
        # the columns the lengths name: the default collate reads the same fields
        self._columns = {k: v if is_column_spec(v) else None for k, v in self._lengths_in.items()}
        self.sampler_kwargs = with_loss_offset(sampler_kwargs, loss_offset)
        self.samplers: dict[str, TokenBudgetBatchSampler] = {}
        self._pending_state: dict[str, Any] | None = None
        self._run_shares: tuple[float, ...] | None = None  # set_rank_shares before the loader
        self._restored = False  # whether a checkpoint gave this DataModule a state
        # Check lengths and settings now; the planners (and their sort) serve later samplers.
        self._planners: dict[str, Planner] = {}
        for name in STAGES:
            if self.datasets[name] is not None:
                self._planner(name)
                self.collate_for(name)  # a collate that disagrees with the plan fails now

    def _lengths(self, stage: str) -> np.ndarray:
        lengths = read_lengths(stage, self.datasets[stage], self._lengths_in[stage])
        self._lengths_in[stage] = lengths  # read (or computed) once
        return lengths

    def _loss_lengths(self, stage: str) -> np.ndarray | None:
        given = read_loss_lengths(stage, self.datasets[stage], self._loss_in[stage])
        self._loss_in[stage] = given  # read (or computed) once
        if given is None and self._packed_default(stage) and not self.loss_offset:
            # the default PackingCollate counts each example's length minus one label
            return np.maximum(self._lengths(stage).astype(np.int64) - 1, 0)
        return given

    @property
    def loss_offset(self) -> int:
        """Loss tokens per example are its length (the target's) minus this, in every split."""
        return int(self.sampler_kwargs.get("loss_offset", 0))

    def _packed_default(self, stage: str) -> bool:
        """Whether ``stage`` is packed by the default collate (1-D lengths of one field)."""
        settings = self.sampler_kwargs
        return (
            self.collate is None
            and settings.get("layout") == "packed"
            and settings.get("max_shapes") is None
            and np.ndim(self._lengths(stage)) == 1
        )

    def _planner(self, stage: str) -> Planner:
        """The stage's planner: lengths and settings checked, built once (at construction)."""
        planner = self._planners.get(stage)
        if planner is None:
            sources = self.sources[stage]
            plain = sources is None
            planner = plan_split(
                stage,
                self.max_tokens if stage == "train" else self.val_max_tokens,
                self.sampler_kwargs,
                self._lengths(stage) if plain else None,
                self._loss_lengths(stage) if plain else None,
                sources=sources,
                # evaluation: one pass over every dataset
                mixing=self.mixing if stage == "train" else {"mixing": "per_batch"},
                budget_default=self._val_budget_default,
            )
            self._planners[stage] = planner
        return planner

    def _dataset(self, stage: str) -> Any:
        return self.datasets[stage]

    def _train_plan(self, world_size: int, accumulate: int, epoch: int) -> EpochPlan | None:
        if self.datasets["train"] is None:
            return None
        return TokenBudgetBatchSampler.from_planner(
            self._planner("train"),
            rank=0,
            world_size=world_size,
            accumulate_grad_batches=accumulate,
            epoch=epoch,
        ).plan

    def planner(self, stage: str) -> Planner:
        """The planner every rank uses for ``stage`` (``"train"``, ``"val"`` or ``"test"``).

        Raises:
            ValueError: for an unknown stage or one without a dataset.
        """
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}.")
        if self.datasets[stage] is None:
            raise ValueError(f"TokenBudgetDataModule has no {stage}_dataset.")
        return self._planner(stage)

    def train_dataloader(self) -> TokenBudgetDataLoader:
        """The training loader of this rank (the sampler is built once, then reused)."""
        sampler = self._sampler("train")
        trainer = self._trainer
        if trainer is not None:
            # Lightning sets the epoch after its first iter(): set it now for the prefetch.
            sampler.set_epoch(fit_epoch(trainer))
            check_same_plan_everywhere(trainer, sampler)
        if self._run_shares is not None:
            sampler.set_rank_shares(self._run_shares)
        if self._pending_state is not None:
            sampler.load_state_dict(self._pending_state, on_mismatch=self.on_resume_mismatch)
            self._pending_state = None
        self._check_restored()
        sampler.plan  # noqa: B018  (plan now: a topology the data cannot serve fails here)
        return self._loader("train")

    @property
    def rank_shares(self) -> tuple[float, ...] | None:
        """The training shares (largest 1; ``None``: equal); before the loader, those set."""
        sampler = self.samplers.get("train")
        if sampler is not None:
            return sampler.rank_shares
        return self._run_shares or self._planner("train").config.rank_shares

    def set_rank_shares(self, shares: Sequence[float] | None) -> None:
        """Train the next epochs with these shares (``TokenBudgetBatchSampler.set_rank_shares``).

        Raises:
            SettingValueError: for a bad share (the rank is named) or the wrong number.

        Example:
            >>> dm = TokenBudgetDataModule([{"tokens": [1]}] * 8, [1] * 8, 4)
            >>> dm.set_rank_shares([1.0, 0.5]); dm.rank_shares
            (1.0, 0.5)
        """
        sampler = self.samplers.get("train")
        if sampler is not None:
            sampler.set_rank_shares(shares)
        self._run_shares = check_rank_shares(shares)

    def state_dict(self) -> dict[str, Any]:
        """The training position: micro-batches *trained* this epoch, the saving one included."""
        sampler = self.samplers.get("train")
        if sampler is None:
            if self._pending_state is None:
                return versioned()
            return versioned(train_sampler=self._pending_state)
        trainer = self._trainer
        if trainer is None:
            return versioned(train_sampler=sampler.state_dict())
        return versioned(train_sampler=sampler.state_dict(consumed=trained_this_epoch(trainer)))

    def _read_state(self, state_dict: Mapping[str, Any]) -> dict[str, Any] | None:
        unknown = sorted(map(str, set(state_dict) - {"train_sampler", "version"}))
        if unknown:
            raise ValueError(
                f"Not a TokenBudgetDataModule state: unknown keys {unknown} (expected "
                "'version' and 'train_sampler'); the checkpoint is from another DataModule or "
                "version."
            )
        self._check_version(state_dict)
        state = state_dict.get("train_sampler")
        if state is not None and not isinstance(state, Mapping):
            raise TypeError(
                "The datamodule state's 'train_sampler' entry must be a sampler state dict, got "
                f"{type(state).__name__}: the checkpoint is damaged or from another DataModule."
            )
        return None if state is None else dict(state)

    def _keep_state(self, state: dict[str, Any]) -> None:
        self._pending_state = state  # applied when the training sampler is (re)built
