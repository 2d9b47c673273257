"""A LightningDataModule serving token-budgeted batches that Lightning leaves alone.

How it fits Lightning 2.6 (checked in its source):

- Lightning replaces a loader's sampler with a ``DistributedSampler`` only when
  ``_requires_distributed_sampler`` holds (``trainer/connectors/data_connector.py``): the
  trainer's ``use_distributed_sampler`` is on, the run is distributed and ``dataloader.sampler``
  is *not* already a ``DistributedSampler``. Our loaders' ``sampler`` is such a sampler
  (:class:`_EpochRelay`, unused for indexing since the batch sampler drives the loader), so the
  default ``use_distributed_sampler=True`` needs no change and no trainer state is touched.
- Lightning calls ``set_epoch`` only on ``dataloader.sampler`` and
  ``dataloader.batch_sampler.sampler`` (``fabric/utilities/data.py`` ``_set_sampler_epoch``, from
  ``FitLoop.on_advance_start`` and the evaluation loop), never on the batch sampler itself: the
  relay forwards the call to the token-budget sampler.
- Lightning sizes the epoch with ``len(dataloader)`` and, on a mid-epoch resume, restores its
  batch counter; our loader's length is therefore the whole epoch's
  (:attr:`~lightning_varbatch.TokenBudgetBatchSampler.epoch_length`), not what is left.
- On ``fit(ckpt_path=...)`` the datamodule's ``load_state_dict`` runs (``Trainer._run`` ->
  ``_restore_modules_and_callbacks`` -> ``restore_datamodule``) before the fit loop calls
  ``train_dataloader()`` (``_run_stage`` -> ``FitLoop.setup_data``), so the restored position is
  kept pending and applied when the sampler is built.

Example:
    >>> import numpy as np
    >>> data = [{"tokens": list(range(1, n + 1))} for n in (3, 5, 2, 7, 4)]
    >>> dm = TokenBudgetDataModule(data, [3, 5, 2, 7, 4], max_tokens=10)
    >>> loader = dm.train_dataloader()  # outside a Trainer: rank 0 of 1
    >>> sorted(i for batch in loader.batch_sampler for i in batch), len(loader)
    ([0, 1, 2, 3, 4], 3)
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import torch
from lightning.pytorch import LightningDataModule
from torch.utils.data import ConcatDataset

from lightning_varbatch.checks import check_choice, check_count, check_flag
from lightning_varbatch.data.collate import check_map_style
from lightning_varbatch.data.loader import TokenBudgetDataLoader
from lightning_varbatch.data.pairing import collate_for_plan, dataset_column_keys
from lightning_varbatch.data.sampler import (
    ON_MISMATCH,
    OnMismatch,
    TokenBudgetBatchSampler,
    plain_settings,
)
from lightning_varbatch.data.splits import (
    STAGES,
    STATE_VERSION,
    check_evaluation,
    check_position_restored,
    check_state_version,
    evaluation_config,
    split_error,
)
from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sources import DataSource, MixingPolicy, Weights
from lightning_varbatch.sources.arrow_lengths import (
    Columns,
    column_lengths,
    is_column_spec,
    source_with_column_lengths,
)

__all__ = ["TokenBudgetDataModule", "check_evaluation"]

Lengths = npt.ArrayLike | Columns | Callable[[Any], npt.ArrayLike]
_FIXED = {
    "lengths",
    "max_tokens",
    "rank",
    "world_size",
    "accumulate_grad_batches",
    "epoch",
    "loss_lengths",  # per stage: train_loss_lengths, val_loss_lengths, test_loss_lengths
    "_planner",
}
_SAMPLER_KWARGS = frozenset(
    name
    for name, p in inspect.signature(TokenBudgetBatchSampler.__init__).parameters.items()
    if p.kind is not inspect.Parameter.VAR_KEYWORD and not name.startswith("_")
) - {"self", *_FIXED}


def _as_sources(stage: str, data: Any, lengths: Any) -> list[DataSource] | None:
    """``data`` as a list of data sources, or ``None`` when it is one plain dataset."""
    if not isinstance(data, (list, tuple)) or not any(isinstance(d, DataSource) for d in data):
        return None
    if not all(isinstance(d, DataSource) for d in data):
        raise TypeError(
            f"{stage}_dataset mixes DataSource and other items: pass a list of DataSource "
            "(one per dataset) or a single dataset."
        )
    if lengths is not None:
        raise ValueError(
            f"{stage}_lengths must be None when {stage}_dataset is a list of DataSource: each "
            "DataSource carries its own lengths."
        )
    resolved = []
    for i, source in enumerate(data):
        if source.dataset is None:
            raise ValueError(
                f"{stage}_dataset[{i}] ({source.name or i!s}) has no dataset: set "
                "DataSource(dataset=...) so that the loader can fetch its items."
            )
        label = f"{stage}_dataset[{i}] ({source.name or i!s})"
        check_map_style(source.dataset, label)
        source = source_with_column_lengths(source, label)
        resolved.append(source)
        if len(source.dataset) != len(np.asarray(source.lengths)):
            raise ValueError(
                f"{stage}_dataset[{i}] ({source.name or i!s}) has {len(source.dataset)} items "
                f"but {len(np.asarray(source.lengths))} lengths: pass one length per item."
            )
    return resolved


def plan_digest(sampler: TokenBudgetBatchSampler) -> int:
    """A 63-bit digest of everything a plan depends on: lengths, loss lengths, settings.

    Example:
        >>> a = TokenBudgetBatchSampler([3, 4, 5], 8, rank=0, world_size=1)
        >>> b = TokenBudgetBatchSampler([3, 4, 6], 8, rank=0, world_size=1)
        >>> plan_digest(a) == plan_digest(a), plan_digest(a) == plan_digest(b)
        (True, False)
    """
    h = hashlib.blake2b(digest_size=8)
    h.update(sampler.lengths_digest.encode())  # cached on the sampler: computed once
    h.update(sampler.planner.fingerprint().encode())
    return int.from_bytes(h.digest(), "little") >> 1


def _as_lengths(stage: str, given: Any) -> np.ndarray:
    """``given`` as an array, with a message naming the argument for ragged input."""
    try:
        return np.asarray(given)
    except ValueError as error:
        raise ValueError(
            f"{stage}_lengths is ragged or not numeric ({error}): pass one integer length per "
            "item, shape (n,), or one (source, target) pair per item, shape (n, 2)."
        ) from None


def _dataset_size(stage: str, dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError:
        raise TypeError(
            f"{stage}_dataset ({type(dataset).__name__}) has no len(): a map-style dataset "
            "needs __len__ and __getitem__ so that its lengths can be checked against it."
        ) from None


def _budget(name: str, value: object) -> int:
    return check_count(name, value)  # the planner's own check and message


def check_ranks_agree(trainer: Any, digest: int, problem: str) -> None:
    """Raise on every rank when the ranks' ``digest`` differ (they planned different data).

    One all-gather of an 8-byte digest, on every rank (Lightning builds the training loader on
    all of them), so every rank raises together instead of some waiting forever.

    Args:
        trainer: the Trainer (its strategy gathers).
        digest: this rank's 63-bit digest of what it planned.
        problem: the message's start; the ranks grouped by digest follow, then nothing else.

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


def _check_same_plan_everywhere(trainer: Any, sampler: TokenBudgetBatchSampler) -> None:
    """Every rank must plan from the same data and settings, else the ranks would hang."""
    check_ranks_agree(
        trainer,
        plan_digest(sampler),
        "The ranks planned from different training data or settings (ranks grouped by what "
        "they planned: {groups}): every rank must see the same lengths, max_tokens, seed and "
        "planner settings, or they get different batches and hang. Check that the data is "
        "loaded and tokenized identically on every rank.",
    )


class TokenBudgetDataModule(LightningDataModule):
    """Token-budgeted train/val/test loaders, sharded by rank, resumable mid-epoch.

    Reads rank, world size and ``accumulate_grad_batches`` from the trainer; every rank plans
    the same epoch and takes its own slice, so ranks run the same number of micro-batches.
    Validation and test use ``shuffle=False, tail="spread"``: every example is evaluated exactly
    once across ranks. ``state_dict`` saves how far the epoch was *trained* (not prefetched).

    Several datasets: pass a list of :class:`~lightning_varbatch.DataSource` (each with its
    ``dataset``, ``lengths`` and optionally its own ``max_tokens``/``max_examples``) as
    ``train_dataset`` (and ``val_dataset``/``test_dataset``), no ``*_lengths``, and choose the
    mixing (see :mod:`lightning_varbatch.planner.mixture`). Batches then carry ``keys.DATASET``, the
    index of the dataset they come from; evaluation covers every example of every dataset
    once.

    Args:
        train_dataset: map-style training dataset (items for ``collate``), or a list of
            :class:`~lightning_varbatch.DataSource`.
        train_lengths: one length per item (``(n,)`` or ``(n, 2)`` source/target), a
            callable ``dataset -> lengths`` evaluated once, or, for a Hugging Face dataset,
            the name of a length or token-id column or a (source, target) pair of them, read
            vectorised from Arrow (:func:`~lightning_varbatch.sources.column_lengths`).
            ``None`` with data sources (a :class:`~lightning_varbatch.DataSource` may name
            columns of its own dataset the same way).
        max_tokens: token budget of one training micro-batch on one rank.
        mixing: with several training datasets, ``"per_step"`` (every optimizer step on all
            ranks from one dataset) or ``"per_batch"`` (every micro-batch from one dataset).
        weights: with several training datasets, ``"size"`` or one weight per dataset
            (needs ``steps_per_epoch``).
        temperature: shares ``∝ weight ** (1 / temperature)`` (needs ``steps_per_epoch``).
        steps_per_epoch: ``None`` for one pass over every training dataset, else the optimizer
            steps of an epoch, sampled by weight.
        val_dataset: optional validation dataset (or list of data sources).
        val_lengths: its lengths (or callable); required with ``val_dataset``.
        test_dataset: optional test dataset.
        test_lengths: its lengths (or callable); required with ``test_dataset``.
        val_max_tokens: budget for validation and test (default ``max_tokens``).
        train_loss_lengths: loss tokens per training item when they are not its length (1-D
            lengths) or its target length (pairs), e.g. target minus one for teacher forcing
            (with ``PaddingCollate(loss_offset=1)``); an array, a column name or a callable
            ``dataset -> loss lengths``. Only for a plain dataset: a
            :class:`~lightning_varbatch.DataSource` carries its own ``loss_lengths``.
        val_loss_lengths: the same for ``val_dataset``.
        test_loss_lengths: the same for ``test_dataset``. Each stage has its own: the
            planner setting ``loss_lengths`` is refused (it would describe one split's items
            only), with a message pointing here.
        collate: the collate function (default :class:`PaddingCollate` with the sampler's
            ``pad_to_multiple_of``); a :class:`PaddingCollate` gets the sampler's truncation.
        num_workers: DataLoader worker processes.
        pin_memory: pin batches in memory.
        on_resume_mismatch: what resuming from a checkpoint whose training data or settings
            differ does (lengths, loss lengths, number of examples, seed, batching settings):
            ``"error"`` (default) refuses it with a message that lists what changed;
            ``"restart_epoch"`` starts the checkpoint's epoch afresh on the current data: the
            epoch number is kept and every example of that epoch is trained exactly once from
            its start (see :meth:`TokenBudgetBatchSampler.load_state_dict`).
        **sampler_kwargs: planner settings, the fields of
            :class:`~lightning_varbatch.PlanConfig` but ``max_tokens`` (``cost``,
            ``max_examples``, ``batch_size_multiple``, ``pad_to_multiple_of``,
            ``bucket_width``, ``seed``, ``tail``, ``oversize``, ``shuffle``, ...).

    Raises:
        TypeError: for an unknown planner setting, or an iterable-style dataset (a map-style
            one is needed).
        ValueError: for a dataset without lengths, lengths whose count differs from the
            dataset's size (both counts named), bad budgets or loader settings, or fewer
            evaluation examples than ranks.

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
        **sampler_kwargs: Any,
    ) -> None:
        super().__init__()
        if "loss_lengths" in sampler_kwargs:
            raise SettingTypeError(
                "TokenBudgetDataModule takes loss lengths per split: pass train_loss_lengths= "
                "(and val_loss_lengths= / test_loss_lengths= for the evaluation splits) instead "
                "of loss_lengths=, which would describe the items of one split only.",
                setting="loss_lengths",
                value=sampler_kwargs["loss_lengths"],
            )
        unknown = sorted(set(sampler_kwargs) - _SAMPLER_KWARGS)
        if unknown:
            raise SettingTypeError(
                f"Unknown planner setting(s) {unknown} for TokenBudgetDataModule; valid: "
                f"{sorted(_SAMPLER_KWARGS)}.",
                setting=unknown[0],
                value=sampler_kwargs[unknown[0]],
            )
        if not isinstance(train_dataset, (list, tuple)) or not any(
            isinstance(d, DataSource) for d in train_dataset
        ):
            ignored = [
                (name, value)
                for name, value, default in (
                    ("mixing", mixing, "per_step"),
                    ("weights", weights, "size"),
                    ("temperature", temperature, 1.0),
                    ("steps_per_epoch", steps_per_epoch, None),
                )
                if not (isinstance(value, str) and value == default)
                and not (value is None and default is None)
                and not (
                    isinstance(value, (int, float, np.number))
                    and not isinstance(value, bool)
                    and value == default
                )
            ]
            if ignored:
                raise SettingValueError(
                    f"{', '.join(f'{n}={v!r}' for n, v in ignored)} set how several training "
                    "datasets are mixed, but train_dataset is a single dataset, so they would "
                    "be ignored: pass a list of DataSource (one per dataset) as train_dataset, "
                    "or leave them unset.",
                    setting=ignored[0][0],
                    value=ignored[0][1],
                )
        max_tokens = _budget("max_tokens", max_tokens)
        if val_max_tokens is not None:
            val_max_tokens = _budget("val_max_tokens", val_max_tokens)
        num_workers = check_count(
            "num_workers", num_workers, minimum=0, what=" (0: load in the main process)"
        )
        pin_memory = check_flag("pin_memory", pin_memory)
        on_resume_mismatch = check_choice("on_resume_mismatch", on_resume_mismatch, ON_MISMATCH)
        if collate is not None and not callable(collate):
            raise SettingTypeError(
                f"collate must be callable (e.g. PaddingCollate(...)) or None, got "
                f"{type(collate).__name__} {collate!r}.",
                setting="collate",
                value=collate,
            )
        self.sources: dict[str, list[DataSource] | None] = {}
        self.datasets = {}
        for name, data, lengths in (
            ("train", train_dataset, train_lengths),
            ("val", val_dataset, val_lengths),
            ("test", test_dataset, test_lengths),
        ):
            self.sources[name] = _as_sources(name, data, lengths)
            if self.sources[name] is None and data is not None and lengths is None:
                raise SettingValueError(
                    f"{name}_dataset was given without {name}_lengths: pass {name}_lengths= "
                    "(one length per item, (n, 2) source/target lengths for pairs, or a "
                    "callable dataset -> lengths).",
                    setting=f"{name}_lengths",
                    value=None,
                    stage=name,
                )
            if data is None and lengths is not None:
                raise SettingValueError(
                    f"{name}_lengths was given without {name}_dataset: pass both or neither.",
                    setting=f"{name}_dataset",
                    value=None,
                    stage=name,
                )
            sources = self.sources[name]
            if sources is None and data is not None:
                check_map_style(data, f"{name}_dataset")
            self.datasets[name] = (
                data if sources is None else ConcatDataset([s.dataset for s in sources])
            )
        self._loss_in: dict[str, Lengths | None] = {
            "train": train_loss_lengths,
            "val": val_loss_lengths,
            "test": test_loss_lengths,
        }
        for name, loss in self._loss_in.items():
            if loss is None:
                continue
            if self.datasets[name] is None:
                raise ValueError(
                    f"{name}_loss_lengths was given without {name}_dataset: pass both or neither."
                )
            if self.sources[name] is not None:
                raise ValueError(
                    f"{name}_loss_lengths describes the items of one plain dataset, but "
                    f"{name}_dataset is a list of DataSource: give each DataSource its own "
                    "loss_lengths (DataSource(lengths, dataset=..., loss_lengths=...)) instead."
                )
        self.mixing: dict[str, Any] = {
            "mixing": mixing,
            "weights": weights,
            "temperature": temperature,
            "steps_per_epoch": steps_per_epoch,
        }
        self._lengths_in: dict[str, Lengths | None] = {
            "train": train_lengths,
            "val": val_lengths,
            "test": test_lengths,
        }
        # the columns the lengths name: the default collate reads the same fields
        self._columns = {k: v if is_column_spec(v) else None for k, v in self._lengths_in.items()}
        self.on_resume_mismatch: OnMismatch = on_resume_mismatch
        self.max_tokens = max_tokens
        self.val_max_tokens = max_tokens if val_max_tokens is None else val_max_tokens
        self._val_budget_default = val_max_tokens is None
        self.collate = collate
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.sampler_kwargs = sampler_kwargs
        self.samplers: dict[str, TokenBudgetBatchSampler] = {}
        self._pending_state: dict[str, Any] | None = None
        self._restored = False  # whether a checkpoint gave this DataModule a state
        # Lengths, counts and settings are checked now, before any loader or Trainer exists;
        # the planners (with their sort) are reused by every sampler built later.
        self._planners: dict[str, Planner] = {}
        for name in ("train", "val", "test"):
            if self.datasets[name] is not None:
                self._planner(name)
                self.collate_for(name)  # a collate that disagrees with the plan fails now

    # -- building ------------------------------------------------------------------------

    def _lengths(self, stage: str) -> np.ndarray:
        given = self._lengths_in[stage]
        if is_column_spec(given):
            given = column_lengths(self.datasets[stage], given, f"{stage}_lengths")
            self._lengths_in[stage] = given  # read once
        elif callable(given):
            try:
                computed = given(self.datasets[stage])
            except Exception as error:
                raise type(error)(
                    f"{stage}_lengths (a callable) raised {type(error).__name__}: {error} while "
                    f"computing the lengths of {stage}_dataset; it must return one length per "
                    "item (shape (n,) or (n, 2)) from items as the dataset returns them."
                ) from error
            given = _as_lengths(stage, computed)
            self._lengths_in[stage] = given  # computed once
        lengths = _as_lengths(stage, given)
        n = _dataset_size(stage, self.datasets[stage])
        count = lengths.shape[0] if lengths.ndim else 0
        if count != n:
            raise ValueError(
                f"{stage}_lengths has {count} entries but {stage}_dataset has {n} "
                f"items: pass one length per item."
            )
        return lengths

    def _loss_lengths(self, stage: str) -> np.ndarray | None:
        given = self._loss_in[stage]
        if is_column_spec(given):
            given = column_lengths(self.datasets[stage], given, f"{stage}_loss_lengths")
            self._loss_in[stage] = given  # read once
        elif callable(given):
            try:
                given = given(self.datasets[stage])
            except Exception as error:
                raise type(error)(
                    f"{stage}_loss_lengths (a callable) raised {type(error).__name__}: {error} "
                    f"while computing the loss lengths of {stage}_dataset; it must return one "
                    "loss length per item."
                ) from error
            self._loss_in[stage] = given  # computed once
        if given is None and self._packed_default(stage):
            # the default PackingCollate counts each example's length minus one label
            return np.maximum(self._lengths(stage).astype(np.int64) - 1, 0)
        return None if given is None else np.asarray(given)

    def _longest(self, stage: str) -> int | None:
        """The longest planning length of a plain split (``None`` for data sources)."""
        if self.sources[stage] is not None:
            return None
        lengths = self._lengths(stage)
        return int(lengths.max()) if lengths.size else None

    def _packed_default(self, stage: str) -> bool:
        """Whether ``stage`` is packed by the default collate (1-D lengths of one field)."""
        settings = self.sampler_kwargs
        return (
            self.collate is None
            and settings.get("layout") == "packed"
            and settings.get("max_shapes") is None
            and np.ndim(self._lengths(stage)) == 1
        )

    def _topology(self, stage: str) -> tuple[int | None, int | None, int]:
        trainer = self._trainer
        if trainer is None:
            return None, None, 1
        accumulate = int(trainer.accumulate_grad_batches) if stage == "train" else 1
        return int(trainer.global_rank), int(trainer.world_size), accumulate

    def _planner(self, stage: str) -> Planner:
        """The stage's planner: lengths and settings checked, built once (at construction)."""
        planner = self._planners.get(stage)
        if planner is not None:
            return planner
        budget = self.max_tokens if stage == "train" else self.val_max_tokens
        mixing: dict[str, Any] = dict(self.mixing)
        if stage != "train":
            mixing = {"mixing": "per_batch"}  # one pass over every dataset
        sources = self.sources[stage]
        try:
            if stage == "train":
                config = PlanConfig(**plain_settings(max_tokens=budget, **self.sampler_kwargs))
            else:  # the evaluation rule both DataModules share
                config = evaluation_config(budget, self.sampler_kwargs)
            if sources is None:
                lengths = self._lengths(stage)
                planner = EpochPlanner(lengths, config, self._loss_lengths(stage))
            else:
                planner = MixturePlanner(sources, config, **mixing)
        except SettingError as error:  # named after this DataModule's argument and split
            raise split_error(
                error,
                stage,
                budget,
                budget_default=self._val_budget_default,
                longest=self._longest(stage),
            ) from error
        self._planners[stage] = planner
        return planner

    def _sampler(self, stage: str) -> TokenBudgetBatchSampler:
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

    def collate_for(self, stage: str) -> Callable[[Any], Any]:
        """The collate of ``stage``: the one given, or the plan's default for its columns.

        The default follows the plan's layout (:func:`~lightning_varbatch.data.pairing.
        collate_for_plan`) and reads the fields the lengths were read from: lengths given as
        ``("src_ids", "tgt_ids")`` give ``PaddingCollate(source_key="src_ids",
        target_key="tgt_ids")``, ``"input_ids"`` gives ``tokens_key="input_ids"``.

        Raises:
            SettingValueError: for a given collate that does not fit the plan's layout.

        Example:
            >>> data = [{"input_ids": [1] * n} for n in (3, 5)]
            >>> dm = TokenBudgetDataModule(data, [3, 5], 8, layout="packed")
            >>> type(dm.collate_for("train")).__name__
            'PackingCollate'
        """
        planner = self.planner(stage)
        columns = self._columns[stage]
        return collate_for_plan(
            planner.config,
            self.collate,
            keys=lambda: (
                {} if columns is None else dataset_column_keys(self.datasets[stage], columns)
            ),
        )

    def _loader(self, stage: str) -> TokenBudgetDataLoader:
        sampler = self.samplers[stage]
        return TokenBudgetDataLoader(  # the truncation and the first-item check are the loader's
            self.datasets[stage],
            sampler,
            collate_fn=self.collate_for(stage),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            evaluation=stage != "train",
        )

    # -- planning without a Trainer -------------------------------------------------------

    def planner(self, stage: str) -> Planner:
        """The planner of ``stage`` (``"train"``, ``"val"`` or ``"test"``), built at construction.

        Its ``num_examples``, ``truncate_to`` (``oversize="truncate"``) and ``config`` say
        what every rank's sampler of that stage plans with.

        Raises:
            ValueError: for an unknown stage or one without a dataset.
        """
        if stage not in STAGES:
            raise ValueError(f"stage must be one of {', '.join(STAGES)}, got {stage!r}.")
        if self.datasets[stage] is None:
            raise ValueError(f"TokenBudgetDataModule has no {stage}_dataset.")
        return self._planner(stage)

    def check(
        self,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        *,
        stages: Sequence[str] = STAGES,
        epoch: int = 0,
    ) -> dict[str, EpochPlan]:
        """Plan and check every stage as a Trainer with this topology would, without one.

        Lengths and settings are checked when the DataModule is built; this also plans each
        stage for ``world_size`` ranks (training with ``accumulate_grad_batches``; evaluation
        with 1, as Lightning does) and applies the checks its loaders apply (evaluation sees
        every example exactly once, with at least one example per rank). Nothing is kept:
        the loaders a Trainer asks for later are built for its own topology.

        Args:
            world_size: number of ranks the run will have (``trainer.world_size``).
            accumulate_grad_batches: the Trainer's ``accumulate_grad_batches``.
            stages: the stages to check; those without a dataset are left out.
            epoch: the training epoch to plan (evaluation always plans epoch 0).

        Returns:
            The plan of every checked stage, by stage name (``plan.num_skipped``,
            ``plan.num_truncated``, ``plan.num_micro_batches_per_rank``, ...).

        Raises:
            ValueError: for a bad topology or stage, or a stage that cannot be planned or
                evaluated with it; the message names the stage's setting, and a
                :class:`~lightning_varbatch.errors.SettingError` carries it in ``.setting``
                and the stage in ``.stage``.
            RuntimeError: for an evaluation plan that would repeat or drop examples.

        Example:
            >>> data = [{"tokens": [1] * n} for n in (3, 5, 2, 7, 4, 6)]
            >>> dm = TokenBudgetDataModule(data, [3, 5, 2, 7, 4, 6], 12,
            ...                            val_dataset=data[:3], val_lengths=[3, 5, 2])
            >>> plans = dm.check(world_size=2, accumulate_grad_batches=2)
            >>> sorted(plans), plans["train"].world_size, dm.samplers
            (['train', 'val'], 2, {})
        """
        unknown = [s for s in stages if s not in STAGES]
        if isinstance(stages, str) or unknown:
            raise ValueError(f"stages must be a sequence of {', '.join(STAGES)}, got {stages!r}.")
        plans: dict[str, EpochPlan] = {}
        for stage in stages:
            if self.datasets[stage] is None:
                continue
            sampler = TokenBudgetBatchSampler.from_planner(
                self._planner(stage),
                rank=0,
                world_size=world_size,
                accumulate_grad_batches=accumulate_grad_batches if stage == "train" else 1,
                epoch=epoch if stage == "train" else 0,
            )
            if stage != "train":
                check_evaluation(stage, sampler)
            plans[stage] = sampler.plan
        return plans

    @property
    def _trainer(self) -> Any:
        return getattr(self, "trainer", None)

    # -- loaders -------------------------------------------------------------------------

    def train_dataloader(self) -> TokenBudgetDataLoader:
        """The training loader of this rank (the sampler is built once, then reused)."""
        sampler = self._sampler("train")
        trainer = self._trainer
        if trainer is not None:
            # Lightning sets the epoch only after its first iter() of the loader (FitLoop.setup_data
            # then on_advance_start): set it now so that a prefetch starts in the right epoch.
            sampler.set_epoch(int(trainer.fit_loop.epoch_progress.current.processed))
            _check_same_plan_everywhere(trainer, sampler)
        if self._pending_state is not None:
            sampler.load_state_dict(self._pending_state, on_mismatch=self.on_resume_mismatch)
            self._pending_state = None
        check_position_restored(trainer, type(self).__name__, self._restored)
        sampler.plan  # noqa: B018  (plan now: a topology the data cannot serve fails here)
        return self._loader("train")

    def val_dataloader(self) -> TokenBudgetDataLoader | list[Any]:
        """The validation loader of this rank: every example exactly once across ranks.

        Without a ``val_dataset`` it is an empty list: ``fit`` skips validation, as it does
        for a DataModule that defines no ``val_dataloader``.
        """
        if self.datasets["val"] is None:
            return []
        self._sampler("val")
        return self._loader("val")

    def test_dataloader(self) -> TokenBudgetDataLoader:
        """The test loader of this rank: every example exactly once across ranks."""
        if self.datasets["test"] is None:
            raise ValueError(
                "TokenBudgetDataModule has no test_dataset: pass test_dataset= and "
                "test_lengths= when you build it to run trainer.test."
            )
        self._sampler("test")
        return self._loader("test")

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The training sampler's position, counted in micro-batches *trained* this epoch.

        The count is the fit loop's ``batch_progress.current.processed``: it already includes
        the batch whose ``on_train_batch_end`` saves the checkpoint (Lightning increments it
        before that hook), and it is not ahead like the loader's prefetching.
        """
        sampler = self.samplers.get("train")
        version = {"version": STATE_VERSION}
        if sampler is None:
            if self._pending_state is None:
                return version
            return {**version, "train_sampler": self._pending_state}
        trainer = self._trainer
        if trainer is None:
            return {**version, "train_sampler": sampler.state_dict()}
        trained = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        consumed = sampler.consumed_from_epoch_count(trained)
        return {**version, "train_sampler": sampler.state_dict(consumed=consumed)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep the saved position; it is applied when the training sampler is (re)built.

        Raises:
            TypeError: when ``state_dict`` (or its ``train_sampler`` entry) is not a mapping.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                "TokenBudgetDataModule.load_state_dict expects the dict returned by its "
                f"state_dict(), got {type(state_dict).__name__}: {str(state_dict)[:60]}."
            )
        unknown = sorted(map(str, set(state_dict) - {"train_sampler", "version"}))
        if unknown:
            raise ValueError(
                f"Not a TokenBudgetDataModule state: unknown keys {unknown} (expected "
                "'version' and 'train_sampler'); the checkpoint is from another DataModule or "
                "version."
            )
        check_state_version("TokenBudgetDataModule", state_dict)
        self._restored = True
        state = state_dict.get("train_sampler")
        if state is None:
            return
        if not isinstance(state, Mapping):
            raise TypeError(
                "The datamodule state's 'train_sampler' entry must be a sampler state dict, got "
                f"{type(state).__name__}: the checkpoint is damaged or from another DataModule."
            )
        self._pending_state = dict(state)
