r"""A LightningDataModule streaming token-budget micro-batches from shards, resumable mid-epoch.

How it fits Lightning 2.6 (checked in its source and in 2-process gloo runs):

- The training loader wraps an ``IterableDataset`` (:class:`StreamingBatches`), so Lightning
  never injects a ``DistributedSampler``: the stream shards by rank itself.
- It has no ``len``: the epoch ends when the stream does. Every window gives every rank the
  same number of micro-batches, so all ranks end the epoch together.
- Lightning relays ``set_epoch`` to samplers only: :class:`StreamingDataLoader` sets the
  dataset's epoch in its own ``__iter__``, before the DataLoader pickles it to its workers.
- ``fit(ckpt_path=...)`` runs ``load_state_dict`` before ``train_dataloader()``: the position
  waits for the stream, built to start at the saved window (:mod:`~.streaming_state`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from lightning.pytorch import LightningDataModule

from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.data.datamodule_settings import (
    REFUSED,
    check_budgets,
    check_loader_settings,
    check_stream_arguments,
    with_loss_offset,
)
from lightning_varbatch.data.datamodule_state import (
    ResumableState,
    read_state_mapping,
    trained_this_epoch,
    versioned,
)
from lightning_varbatch.data.lightning_loop import fit_epoch
from lightning_varbatch.data.pairing import source_column_keys
from lightning_varbatch.data.rank_agreement import check_same_stream_everywhere
from lightning_varbatch.data.sampler import OnMismatch, TokenBudgetBatchSampler
from lightning_varbatch.data.split_inputs import read_stream_split
from lightning_varbatch.data.split_loaders import SplitLoaders, plan_split
from lightning_varbatch.data.streaming import StreamingBatches
from lightning_varbatch.data.streaming_loader import StreamingDataLoader
from lightning_varbatch.errors import ResumeMismatchError, SettingError, SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.sources.arrow_lengths import is_column_spec
from lightning_varbatch.sources.shards import ShardedSource

__all__ = ["REFUSED", "StreamingDataModule"]

_STATE_KEYS = frozenset({"stream", "trained"})


class StreamingDataModule(SplitLoaders, ResumableState, LightningDataModule):
    """Token-budget training micro-batches streamed from shards; map-style validation and test.

    The contract of :class:`~lightning_varbatch.TokenBudgetDataModule` wherever a stream can
    keep it (docs/datamodules.md compares them): swap them by changing the training data only::

        dm = TokenBudgetDataModule(ds, "input_ids", **common)
        dm = StreamingDataModule(shards_from_files(files, "input_ids"), **common)

    Every rank streams the same windows and takes its own micro-batches: equal counts however
    unequal the shards. Rank, world size and accumulation come from the trainer. ``state_dict``
    saves the position after the micro-batches *trained*; resumes start there, on any topology.

    Args:
        train_source: the training shards (e.g. :func:`~lightning_varbatch.shards_from_files`).
        max_tokens: token budget of one training micro-batch on one rank.
        window: examples planned together (see :class:`StreamingBatches`).
        shuffle_shards: read the shards in a new random order each epoch.
        val_dataset, val_lengths, test_dataset, test_lengths, val_max_tokens, val_loss_lengths,
            test_loss_lengths, collate, num_workers, pin_memory, loss_offset: as
            ``TokenBudgetDataModule``'s (evaluation splits are map-style; the default collate
            reads the fields the shards' columns name).
        on_resume_mismatch: for a state saved on other shards or plan settings, ``"error"``
            (default) raises :class:`~lightning_varbatch.errors.ResumeMismatchError` listing what
            changed; ``"restart_epoch"`` rereads the saved epoch from its first window.
        **plan_settings: other planner settings, as TokenBudgetDataModule's, but
            ``train_lengths``, ``train_loss_lengths``, ``mixing``, ``weights``, ``temperature``
            and ``steps_per_epoch`` only at their defaults (:data:`REFUSED`: why, what instead).

    Raises:
        SettingTypeError: a non-``ShardedSource`` ``train_source``, a mistyped or unknown setting.
        SettingValueError: a refused or bad setting (``.setting``; ``.stage``: the split).

    Example:
        >>> class Shard:
        ...     def __init__(self, name, rows): self.name, self.rows = name, rows
        ...     num_rows = property(lambda self: len(self.rows))
        ...     def lengths(self): return np.array([len(r) for r in self.rows])
        ...     def read(self, rows): return ({"tokens": np.array(self.rows[i])} for i in rows)
        >>> source = ShardedSource([Shard("a", [[1, 2], [3]]), Shard("b", [[4, 5, 6]])])
        >>> dm = StreamingDataModule(source, max_tokens=4, window=3,
        ...                          val_dataset=[{"tokens": [1, 2]}], val_lengths=[2])
        >>> sum(int(b["nexamples"]) for b in dm.train_dataloader())
        3
        >>> [int(b["nexamples"]) for b in dm.val_dataloader()]
        [1]
    """

    def __init__(
        self,
        train_source: ShardedSource,
        max_tokens: int | None = None,
        *,
        window: int | None = None,
        shuffle_shards: bool = True,
        val_dataset: Any = None,
        val_lengths: Any = None,
        test_dataset: Any = None,
        test_lengths: Any = None,
        val_max_tokens: int | None = None,
        val_loss_lengths: Any = None,
        test_loss_lengths: Any = None,
        collate: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        on_resume_mismatch: OnMismatch = "error",
        loss_offset: int = 0,
        **plan_settings: Any,
    ) -> None:
        super().__init__()
        check_stream_arguments(train_source, plan_settings)
        self._collate_given, self.num_workers, self.pin_memory, self.on_resume_mismatch = (
            check_loader_settings(collate, num_workers, pin_memory, on_resume_mismatch)
        )
        self.train_source = train_source
        self.max_tokens, self.val_max_tokens, self._val_budget_default = check_budgets(
            max_tokens, val_max_tokens
        )
        self.window = window
        self.shuffle_shards = check_flag("shuffle_shards", shuffle_shards)
        self.plan_settings = with_loss_offset(plan_settings, loss_offset)
        # Check settings now, before any Trainer (cheap: a stream plans only when iterated).
        self.collate: Callable[[Any], Any] = self._stream_for(0, 1, 1).collate
        self.stream: StreamingBatches | None = None
        self._pending: dict[str, Any] | None = None
        self._restored = False  # whether a checkpoint gave this DataModule a state
        self._base: tuple[int, int] | None = None  # (epoch, trained count) of the restore
        self.val_dataset, self.test_dataset = val_dataset, test_dataset
        self.val_lengths: np.ndarray | None = None
        self.test_lengths: np.ndarray | None = None
        self._columns: dict[str, Any] = {}
        self._planners: dict[str, Planner] = {}
        self.samplers: dict[str, TokenBudgetBatchSampler] = {}
        for stage, dataset, lengths, loss in (
            ("val", val_dataset, val_lengths, val_loss_lengths),
            ("test", test_dataset, test_lengths, test_loss_lengths),
        ):
            self._eval_setup(stage, dataset, lengths, loss)

    def _stream_for(self, rank: int | None, world: int | None, accumulate: int) -> StreamingBatches:
        try:
            return StreamingBatches(
                self.train_source,
                self.max_tokens,
                window=self.window,
                collate=self._collate_given,
                rank=rank,
                world_size=world,
                accumulate_grad_batches=accumulate,
                shuffle_shards=self.shuffle_shards,
                **self.plan_settings,
            )
        except SettingError as error:  # the training split's planning error
            raise error.renamed(error.setting, str(error), stage="train") from error

    @property
    def loss_offset(self) -> int:
        """Loss tokens per example are its length (the target's) minus this (training too)."""
        return int(self.plan_settings.get("loss_offset", 0) or 0)

    @property
    def val_sampler(self) -> TokenBudgetBatchSampler | None:
        """This rank's validation sampler, once :meth:`val_dataloader` built it."""
        return self.samplers.get("val")

    def _epoch(self) -> int:
        """The epoch the fit loop is in (0 outside a Trainer: the stream's own epoch)."""
        if self._trainer is None:
            return self.stream.epoch if self.stream is not None else 0
        return fit_epoch(self._trainer)

    def train_dataloader(self) -> StreamingDataLoader:
        """This rank's training loader (the stream is built once per topology, then reused)."""
        trainer = self._trainer
        rank, world, accumulate = self._topology("train")
        stream = self.stream
        if stream is None or (
            trainer is not None
            and (stream.rank, stream.world_size, stream.accumulate_grad_batches)
            != (rank, world, accumulate)
        ):
            stream = self._stream_for(rank, world, accumulate)
            self.stream, self._base = stream, None
        if trainer is not None:
            check_same_stream_everywhere(trainer, stream)
        if self._pending is not None:
            self._restore(stream, self._pending)
            self._pending = None
        self._check_restored()
        return StreamingDataLoader(
            stream,
            epoch=self._epoch if trainer is not None else None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )

    def _train_plan(self, world_size: int, accumulate: int, epoch: int) -> EpochPlan | None:
        stream = self._stream_for(0, world_size, accumulate)
        stream.set_epoch(epoch)
        return stream.window_plan(0).plan if stream.planner.num_windows else None

    def set_rank_shares(self, shares: Sequence[float] | None) -> None:
        """Refused (a SettingValueError): a stream's shares are fixed when it is built."""
        raise SettingValueError(
            f"StreamingDataModule cannot change rank shares during a run (got set_rank_shares("
            f"{shares!r})): a stream plans window by window as it reads its shards. Pass fixed "
            "shares when you build it, StreamingDataModule(..., rank_shares=[...]) (now "
            f"{self.plan_settings.get('rank_shares')!r}), or use TokenBudgetDataModule, whose "
            "set_rank_shares (and RankShareBalancer) re-plans the next epochs.",
            setting="rank_shares",
            value=shares,
        )

    def planner(self, stage: str) -> Any:
        """The planner of ``stage``, as :meth:`TokenBudgetDataModule.planner` (train: windowed).

        Raises:
            SettingValueError: for an unknown stage or one without data.
        """
        if stage == "train":
            return self._stream_for(0, 1, 1).planner
        if stage not in self._planners:
            raise SettingValueError(
                f"stage must be 'train' or an evaluation split given to StreamingDataModule "
                f"({', '.join(self._planners) or 'none given'}), got {stage!r}.",
                setting="stage",
                value=stage,
            )
        return self._planners[stage]

    def check_state(self, state_dict: Mapping[str, Any]) -> None:
        """Check before training that a :meth:`state_dict` resumes here (as ``"error"`` would).

        Raises:
            ResumeMismatchError: a state of other shards, settings (``.changed``) or version.
            ValueError: for something that is not a :class:`StreamingDataModule` state.
        """
        state = self._read_state(read_state_mapping(type(self).__name__, state_dict))
        if state is not None:
            self._restore(self._stream_for(0, 1, 1), state, on_mismatch="error")

    def _restore(
        self,
        stream: StreamingBatches,
        state: Mapping[str, Any],
        on_mismatch: OnMismatch | None = None,
    ) -> None:
        saved = state["stream"]
        try:  # the stream compares the shards (by content) and the plan settings
            stream.load_state_dict(saved)
        except ResumeMismatchError as error:
            if (on_mismatch or self.on_resume_mismatch) == "error":
                raise ResumeMismatchError(
                    f"{error} Or pass on_resume_mismatch='restart_epoch' to start the saved "
                    "epoch afresh on the current shards.",
                    changed=error.changed,
                ) from error
            # restart_epoch: the saved epoch from its first window, on these shards
            epoch = check_count("epoch", saved["epoch"], minimum=0)
            stream.set_epoch(epoch + 1)
            stream.set_epoch(epoch)
        self._base = (stream.epoch, int(state["trained"]))

    def state_dict(self) -> dict[str, Any]:
        """The stream position after the micro-batches trained so far this epoch.

        ``{"version": 1, "stream": ..., "trained": n}``: the :class:`StreamingBatches` state
        and the fit loop's count; a position at an epoch's end restores as that epoch, finished.
        """
        stream = self.stream
        if stream is None:
            return versioned() if self._pending is None else versioned(**self._pending)
        trained = trained_this_epoch(self._trainer)
        if trained == 0 and self._trainer is not None and self._epoch() != stream.epoch:
            stream.set_epoch(self._epoch())  # the fit loop is at an epoch's start, not yet iterated
        base = 0
        if self._base is not None and self._base[0] == stream.epoch:
            base = self._base[1]
        if trained < base:
            raise RuntimeError(
                f"the fit loop counts {trained} micro-batches trained this epoch, fewer than the "
                f"{base} the stream was restored after: the Trainer's progress and the "
                "datamodule's position disagree (was load_state_dict called by hand?)."
            )
        return versioned(stream=stream.state_dict(trained - base), trained=trained)

    def _read_state(self, state_dict: Mapping[str, Any]) -> dict[str, Any] | None:
        self._check_version(state_dict)
        rest = {k: v for k, v in state_dict.items() if k != "version"}
        if not rest:
            return None
        if set(rest) != _STATE_KEYS or not isinstance(rest["stream"], Mapping):
            raise ValueError(
                f"Not a StreamingDataModule state: keys {sorted(map(str, state_dict))}, "
                f"expected {sorted(_STATE_KEYS | {'version'})}; the checkpoint is from another "
                "DataModule (e.g. TokenBudgetDataModule) or version."
            )
        return {"stream": dict(rest["stream"]), "trained": int(rest["trained"])}

    def _keep_state(self, state: dict[str, Any]) -> None:
        if self.stream is not None:
            self._restore(self.stream, state)
        else:
            self._pending = state

    def _eval_setup(self, stage: str, dataset: Any, lengths: Any, loss: Any) -> None:
        split = read_stream_split(stage, dataset, lengths, loss)
        if split is None:
            return
        array, loss = split
        self._columns[stage] = lengths if is_column_spec(lengths) else None
        setattr(self, f"{stage}_lengths", array)
        settings = dict(self.plan_settings)
        if loss is not None:  # given loss lengths take precedence over the loss_offset
            settings.pop("loss_offset", None)
        # else the planner derives them from loss_offset, after truncation (lengths.loss_tokens)
        self._planners[stage] = plan_split(
            stage,
            self.val_max_tokens,
            settings,
            array,
            loss,
            budget_default=self._val_budget_default,
        )
        self.collate_for(stage)  # a collate that disagrees with the plan fails now
        self.check(stages=(stage,))  # at least one example a rank, each once

    def _dataset(self, stage: str) -> Any:
        return getattr(self, f"{stage}_dataset")

    def _default_keys(self) -> dict[str, str]:
        return source_column_keys(self.train_source)

    def _collate_loss_offset(self, config: PlanConfig) -> int | None:
        return self.loss_offset  # the stream's, whatever the split's loss lengths

    def collate_for(self, stage: str) -> Callable[[Any], Any]:
        """The collate of ``stage``, as :meth:`TokenBudgetDataModule.collate_for` (the stream's).

        Raises:
            SettingValueError: for a collate that does not fit the split's plan.
        """
        if stage == "train":
            return self.collate
        return super().collate_for(stage)
