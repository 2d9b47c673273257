r"""A LightningDataModule streaming token-budget micro-batches from shards, resumable mid-epoch.

How it fits Lightning 2.6 (checked in its source and in 2-process gloo runs):

- The training loader wraps an ``IterableDataset`` (:class:`StreamingBatches`), so Lightning
  never injects a ``DistributedSampler`` (``_requires_distributed_sampler`` is false for
  iterable datasets, whatever ``use_distributed_sampler``): the stream shards by rank itself.
- It has no ``len``: ``trainer.num_training_batches`` is ``inf`` and the epoch ends when the
  stream does. Every window of the stream gives every rank the same number of micro-batches,
  so all ranks end the epoch together (no hang, no gloo "connection closed").
- Lightning's ``set_epoch`` relay reaches only ``loader.sampler`` (for an iterable dataset an
  ``_InfiniteConstantSampler``). :class:`StreamingDataLoader` sets the dataset's epoch in its
  own ``__iter__``, from the fit loop's epoch counter, *before* the DataLoader starts (and
  pickles the dataset to) its workers; Lightning calls ``iter()`` once per epoch.
- ``state_dict`` counts the micro-batches *trained* this epoch with the fit loop's
  ``batch_progress.current.processed`` (not the loader's prefetch); on
  ``fit(ckpt_path=...)``, ``load_state_dict`` runs before ``train_dataloader()``, so the
  position is kept pending and applied to the stream when it is built. The stream then starts
  at the saved window without reading anything before it; another world size re-plans the
  rest of the interrupted window (nothing lost, nothing repeated).

Example:
    >>> import json, tempfile
    >>> from pathlib import Path
    >>> from lightning_varbatch.sources.shards import shards_from_files
    >>> folder = Path(tempfile.mkdtemp())
    >>> for s, rows in enumerate([[3, 5, 2], [7, 4]]):
    ...     lines = [json.dumps({"tokens": list(range(1, n + 1))}) for n in rows]
    ...     _ = (folder / f"part-{s}.jsonl").write_text("\n".join(lines) + "\n")
    >>> source = shards_from_files(folder, "tokens", cache_dir=None)
    >>> dm = StreamingDataModule(source, max_tokens=10, window=8)
    >>> loader = dm.train_dataloader()  # outside a Trainer: rank 0 of 1
    >>> sorted(int(b["nexamples"]) for b in loader), dm.state_dict()["stream"]["window"]
    ([1, 2, 2], 0)
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from lightning.pytorch import LightningDataModule

from lightning_varbatch.checks import check_choice, check_count, check_flag
from lightning_varbatch.data.collate import check_map_style
from lightning_varbatch.data.datamodule import check_ranks_agree
from lightning_varbatch.data.loader import TokenBudgetDataLoader
from lightning_varbatch.data.pairing import (
    collate_for_plan,
    dataset_column_keys,
    source_column_keys,
)
from lightning_varbatch.data.sampler import ON_MISMATCH, OnMismatch, TokenBudgetBatchSampler
from lightning_varbatch.data.splits import (
    STAGES,
    STATE_VERSION,
    check_evaluation,
    check_position_restored,
    check_state_version,
    evaluation_config,
    split_error,
)
from lightning_varbatch.data.streaming import StreamingBatches
from lightning_varbatch.data.streaming_loader import StreamingDataLoader
from lightning_varbatch.errors import (
    ResumeMismatchError,
    SettingError,
    SettingTypeError,
    SettingValueError,
)
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.sources import DataSource
from lightning_varbatch.sources.arrow_lengths import column_lengths, is_column_spec
from lightning_varbatch.sources.shards import ShardedSource

__all__ = ["REFUSED", "StreamingDataModule"]

_STATE_KEYS = frozenset({"stream", "trained"})
_EVAL = ("val", "test")

#: What :class:`~lightning_varbatch.TokenBudgetDataModule` takes and a stream cannot do: the
#: argument, why, and what to do instead (each refused with a ``SettingValueError``).
REFUSED: dict[str, str] = {
    "train_lengths": "a stream's lengths come from its shards: pass the columns when you "
    "open them instead (shards_from_files(paths, columns=...))",
    "train_loss_lengths": "a stream counts its training loss tokens as each example's length "
    "(the target's for pairs) minus loss_offset: pass loss_offset=1 for teacher forcing",
    "mixing": "a stream reads one ShardedSource; to mix datasets, list all their files in "
    "one ShardedSource, or use TokenBudgetDataModule with a list of DataSource",
    "weights": "a stream reads every shard once per epoch in (shuffled) order and cannot "
    "sample by weight: use TokenBudgetDataModule with a list of DataSource and "
    "steps_per_epoch",
    "temperature": "a stream cannot sample datasets by weight: use TokenBudgetDataModule "
    "with a list of DataSource and steps_per_epoch",
    "steps_per_epoch": "a stream's epoch is one pass over its shards; its length is not known "
    "in advance: stop training with Trainer(max_steps=...) instead",
}


def _stream_digest(stream: StreamingBatches) -> int:
    """A 63-bit digest of the stream's shards and plan settings."""
    digest = hashlib.blake2b(stream.fingerprint().encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _check_same_stream_everywhere(trainer: Any, stream: StreamingBatches) -> None:
    """Every rank must plan the same stream, else ranks get different counts and hang."""
    check_ranks_agree(
        trainer,
        _stream_digest(stream),
        "The ranks stream different shards or plan settings (ranks grouped by what they "
        "planned: {groups}): every rank must be given the same shard files in the same order "
        "and the same max_tokens, window and planner settings.",
    )


def _lengths_of(stage: str, dataset: Any, given: Any, what: str = "lengths") -> np.ndarray:
    """One length (or loss length) per item of ``dataset``, from an array, columns or callable."""
    name = f"{stage}_{what}"
    if is_column_spec(given):
        given = column_lengths(dataset, given, name)
    elif callable(given):
        given = given(dataset)
    try:
        lengths = np.asarray(given)
    except ValueError as error:
        raise SettingValueError(
            f"{name} is ragged or not numeric ({error}): pass one integer length per "
            "item, shape (n,), or one (source, target) pair per item, shape (n, 2).",
            setting=name,
            value=given,
            stage=stage,
        ) from None
    n = len(dataset)
    if lengths.ndim == 0 or lengths.shape[0] != n:
        raise SettingValueError(
            f"{name} has {lengths.size} entries but {stage}_dataset has {n} items: pass one "
            "length per item.",
            setting=name,
            value=given,
            stage=stage,
        )
    return lengths


class StreamingDataModule(LightningDataModule):
    """Token-budget training micro-batches streamed from shards; map-style validation and test.

    The same contract as :class:`~lightning_varbatch.TokenBudgetDataModule` wherever a stream
    can keep it (docs/datamodules.md puts the two side by side): the same argument names and
    meanings for the evaluation splits, budgets, collate, loader settings, planner settings,
    ``on_resume_mismatch``, ``check()``, a versioned state and a public ``max_tokens``. Swap
    one for the other by changing the training data argument only::

        dm = TokenBudgetDataModule(ds, "input_ids", **common)
        dm = StreamingDataModule(shards_from_files(files, "input_ids"), **common)

    Every rank streams the same windows of the shard stream and takes its own micro-batches of
    each (:class:`StreamingBatches`), so ranks run the same number of micro-batches and
    optimizer steps however unequal the shards. Rank, world size and
    ``accumulate_grad_batches`` come from the trainer; the epoch is set at each ``iter()`` of
    the loader (also in worker processes). ``state_dict`` saves the stream position after the
    micro-batches *trained* so far; resuming starts there without replaying the stream, also
    with another world size or accumulation.

    Args:
        train_source: the training shards (:func:`~lightning_varbatch.shards_from_files`,
            :func:`~lightning_varbatch.shards_from_hf_iterable`,
            :func:`~lightning_varbatch.shards_from_litdata`).
        max_tokens: token budget of one training micro-batch on one rank.
        window: examples planned together (see :class:`StreamingBatches`).
        shuffle_shards: read the shards in a new random order each epoch.
        val_dataset: optional map-style validation dataset (every example evaluated exactly
            once across ranks).
        val_lengths: one length per validation item (``(n,)`` or ``(n, 2)``), a callable
            ``dataset -> lengths``, or for a Hugging Face dataset the name of a length /
            token-id column (or a pair of them).
        test_dataset: optional map-style test dataset (for ``trainer.test``).
        test_lengths: its lengths, as ``val_lengths``.
        val_max_tokens: budget of validation and test micro-batches (default ``max_tokens``).
        val_loss_lengths: loss tokens per validation item (default: its length, the target's
            for pairs, minus ``loss_offset``).
        test_loss_lengths: the same for ``test_dataset``.
        collate: turns a micro-batch's items into a batch, for every split (default: the
            plan's, :func:`~lightning_varbatch.data.pairing.collate_for_plan`, reading the
            fields the shards' columns name); a library collate that disagrees with the
            plan's layout is refused.
        num_workers: DataLoader workers of each loader.
        pin_memory: pin batches in memory.
        on_resume_mismatch: resuming from a state saved on other shards or plan settings:
            ``"error"`` (default) raises :class:`~lightning_varbatch.errors.
            ResumeMismatchError` listing what changed; ``"restart_epoch"`` starts the saved
            epoch afresh on the current shards (the epoch number is kept and the stream reads
            that epoch from its first window, every example once).
        loss_offset: loss tokens per example are its length (the target's for pairs) minus
            this, in training and (by default) in evaluation; 1 for teacher forcing.
        **plan_settings: other planner settings (``seed``, ``cost``, ``tail``, ``layout``,
            ``pad_to_multiple_of``, ...), for training; evaluation shares them
            except ``shuffle=False, tail="spread"``. The map-style DataModule's
            ``train_lengths``, ``train_loss_lengths``, ``mixing``, ``weights``,
            ``temperature`` and ``steps_per_epoch`` are refused (:data:`REFUSED` says why
            and what to do instead).

    Raises:
        SettingTypeError: for a ``train_source`` that is not a :class:`ShardedSource` (a list
            of DataSource names the alternative), or a setting of the wrong type.
        SettingValueError: for a refused or bad setting (``.setting`` names it and
            ``.stage`` the split a planning error came from).
        TypeError: for unknown planner settings.

    Example:
        >>> import numpy as np
        >>> from lightning_varbatch.sources.shards import ShardedSource
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
        if isinstance(train_source, (list, tuple)) and any(
            isinstance(s, DataSource) for s in train_source
        ):
            raise SettingTypeError(
                "train_source is a list of DataSource, a mixture of map-style datasets; a "
                "stream reads one ShardedSource: pass TokenBudgetDataModule(train_dataset=[...]) "
                "for the mixture, or put every dataset's files in one shards_from_files(...).",
                setting="train_source",
                value=train_source,
            )
        if not isinstance(train_source, ShardedSource):
            raise SettingTypeError(
                "train_source must be a ShardedSource (from shards_from_files, "
                "shards_from_hf_iterable or shards_from_litdata), got "
                f"{type(train_source).__name__}; for a map-style dataset use "
                "TokenBudgetDataModule.",
                setting="train_source",
                value=train_source,
            )
        for name, why in REFUSED.items():
            if name in plan_settings:
                raise SettingValueError(
                    f"StreamingDataModule does not take {name}=: {why}.",
                    setting=name,
                    value=plan_settings[name],
                )
        for name in ("rank", "world_size", "accumulate_grad_batches"):
            if name in plan_settings:
                raise SettingTypeError(
                    f"StreamingDataModule reads {name} from the Trainer: do not pass {name}=.",
                    setting=name,
                    value=plan_settings[name],
                )
        if collate is not None and not callable(collate):
            raise SettingTypeError(
                f"collate must be callable (e.g. PaddingCollate(...)) or None, got "
                f"{type(collate).__name__} {collate!r}.",
                setting="collate",
                value=collate,
            )
        self.num_workers = check_count(
            "num_workers", num_workers, minimum=0, what=" (0: load in the main process)"
        )
        self.pin_memory = check_flag("pin_memory", pin_memory)
        self.on_resume_mismatch: OnMismatch = check_choice(
            "on_resume_mismatch", on_resume_mismatch, ON_MISMATCH
        )
        self.train_source = train_source
        self.max_tokens = check_count("max_tokens", max_tokens)  # as the planner checks it
        self.window = window
        self.shuffle_shards = check_flag("shuffle_shards", shuffle_shards)
        self.plan_settings = dict(plan_settings)
        if check_count("loss_offset", loss_offset, minimum=0):  # the stream's own check
            self.plan_settings["loss_offset"] = loss_offset
        self._collate_given = collate
        # Settings are checked now, before any Trainer exists: a 1-rank stream plans nothing
        # until iterated, so this costs only the checks. Its collate is the plan's.
        self.collate: Callable[[Any], Any] = self._stream_for(0, 1, 1).collate
        self.stream: StreamingBatches | None = None
        self._pending: dict[str, Any] | None = None
        self._restored = False  # whether a checkpoint gave this DataModule a state
        self._base: tuple[int, int] | None = None  # (epoch, trained count) of the restore
        self._val_budget_default = val_max_tokens is None
        self.val_max_tokens = (
            self.max_tokens
            if val_max_tokens is None
            else check_count("val_max_tokens", val_max_tokens)
        )
        self.val_dataset, self.test_dataset = val_dataset, test_dataset
        self.val_lengths: np.ndarray | None = None
        self.test_lengths: np.ndarray | None = None
        self.val_sampler: TokenBudgetBatchSampler | None = None
        self._columns: dict[str, Any] = {}
        self._planners: dict[str, EpochPlanner] = {}
        self.samplers: dict[str, TokenBudgetBatchSampler] = {}
        for stage, dataset, lengths, loss in (
            ("val", val_dataset, val_lengths, val_loss_lengths),
            ("test", test_dataset, test_lengths, test_loss_lengths),
        ):
            self._eval_setup(stage, dataset, lengths, loss)

    # -- training ------------------------------------------------------------------------

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
    def _trainer(self) -> Any:
        return getattr(self, "trainer", None)

    def _epoch(self) -> int:
        """The epoch the fit loop is in (0 outside a Trainer: the stream's own epoch)."""
        trainer = self._trainer
        if trainer is None:
            return self.stream.epoch if self.stream is not None else 0
        return int(trainer.fit_loop.epoch_progress.current.processed)

    def train_dataloader(self) -> StreamingDataLoader:
        """This rank's training loader (the stream is built once per topology, then reused)."""
        trainer = self._trainer
        if trainer is None:
            rank, world, accumulate = None, None, 1
        else:
            rank, world = int(trainer.global_rank), int(trainer.world_size)
            accumulate = int(trainer.accumulate_grad_batches)
        stream = self.stream
        if stream is None or (
            trainer is not None
            and (stream.rank, stream.world_size, stream.accumulate_grad_batches)
            != (rank, world, accumulate)
        ):
            stream = self._stream_for(rank, world, accumulate)
            self.stream, self._base = stream, None
        if trainer is not None:
            _check_same_stream_everywhere(trainer, stream)
        if self._pending is not None:
            self._restore(stream, self._pending)
            self._pending = None
        check_position_restored(trainer, type(self).__name__, self._restored)
        return StreamingDataLoader(
            stream,
            epoch=self._epoch if trainer is not None else None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )

    # -- planning without a Trainer -------------------------------------------------------

    def check(
        self,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        *,
        stages: Sequence[str] = STAGES,
        epoch: int = 0,
    ) -> dict[str, EpochPlan]:
        """Plan and check every split as a Trainer with this topology would, without one.

        As :meth:`TokenBudgetDataModule.check`: evaluation splits are planned for
        ``world_size`` ranks and checked (every example once, at least one per rank). The
        training split of a stream is planned window by window while it is read; its entry
        is the plan of the epoch's first window (the whole epoch is not known in advance).
        Nothing is kept.

        Args:
            world_size: number of ranks the run will have.
            accumulate_grad_batches: the Trainer's ``accumulate_grad_batches``.
            stages: the splits to check; those without data are left out.
            epoch: the training epoch to plan.

        Returns:
            The plan of every checked split, by name.

        Raises:
            SettingValueError: for a bad topology or stage, or a split that cannot be
                planned or evaluated with it (``.stage`` names the split).

        Example:
            >>> import numpy as np
            >>> from lightning_varbatch.sources.shards import ShardedSource
            >>> class Shard:
            ...     def __init__(self, name, rows): self.name, self.rows = name, rows
            ...     num_rows = property(lambda self: len(self.rows))
            ...     def lengths(self): return np.array([len(r) for r in self.rows])
            ...     def read(self, rows): return ({"tokens": np.array(r)} for r in rows)
            >>> dm = StreamingDataModule(ShardedSource([Shard("a", [[1, 2], [3], [4]])]),
            ...                          max_tokens=4, val_dataset=[{"tokens": [1]}] * 2,
            ...                          val_lengths=[1, 1])
            >>> plans = dm.check(world_size=2)
            >>> sorted(plans), plans["val"].world_size
            (['train', 'val'], 2)
        """
        if isinstance(stages, str) or any(s not in STAGES for s in stages):
            raise SettingValueError(
                f"stages must be a sequence of {', '.join(STAGES)}, got {stages!r}.",
                setting="stages",
                value=stages,
            )
        world_size = check_count("world_size", world_size)
        accumulate = check_count("accumulate_grad_batches", accumulate_grad_batches)
        epoch = check_count("epoch", epoch, minimum=0)
        plans: dict[str, EpochPlan] = {}
        for stage in stages:
            if stage == "train":
                stream = self._stream_for(0, world_size, accumulate)
                stream.set_epoch(epoch)
                if stream.planner.num_windows:
                    plans[stage] = stream.window_plan(0).plan
            elif stage in self._planners:
                plans[stage] = self._eval_sampler(stage, 0, world_size).plan
        return plans

    def planner(self, stage: str) -> Any:
        """The planner of ``stage``, as :meth:`TokenBudgetDataModule.planner`.

        For ``"val"`` and ``"test"`` the split's :class:`~lightning_varbatch.planner.
        epoch_planner.EpochPlanner` (``num_examples``, ``truncate_to``, ``config``); for
        ``"train"`` the stream's windowed planner.

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
        """Check that a saved state (:meth:`state_dict`) can continue on these shards.

        For a run that resumes from a checkpoint: call it with the checkpoint's state of this
        DataModule before training; with ``on_resume_mismatch="error"`` it raises what
        resuming would raise.

        Raises:
            ResumeMismatchError: for a state saved on other shards or plan settings
                (``.changed`` lists them) or by another version.
            ValueError: for something that is not a :class:`StreamingDataModule` state.
        """
        state = self._checked_state(state_dict)
        if state is not None:
            self._restore(self._stream_for(0, 1, 1), state, on_mismatch="error")

    # -- checkpointing -------------------------------------------------------------------

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

        Returns ``{"version": 1, "stream": ..., "trained": n}``: the :class:`StreamingBatches`
        state and the fit loop's count of micro-batches trained this epoch
        (``batch_progress.current.processed``, which already includes the batch whose
        ``on_train_batch_end`` saves). A position at the end of an epoch restores as that
        epoch, finished: the next epoch's ``set_epoch`` starts it.
        """
        version = {"version": STATE_VERSION}
        stream = self.stream
        if stream is None:
            return version if self._pending is None else {**version, **self._pending}
        trainer = self._trainer
        trained = 0
        if trainer is not None:
            trained = int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)
        base = 0
        if self._base is not None and self._base[0] == stream.epoch:
            base = self._base[1]
        if trained < base:
            raise RuntimeError(
                f"the fit loop counts {trained} micro-batches trained this epoch, fewer than the "
                f"{base} the stream was restored after: the Trainer's progress and the "
                "datamodule's position disagree (was load_state_dict called by hand?)."
            )
        return {**version, "stream": stream.state_dict(trained - base), "trained": trained}

    def _checked_state(self, state_dict: Any) -> dict[str, Any] | None:
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                "StreamingDataModule.load_state_dict expects the dict returned by its "
                f"state_dict(), got {type(state_dict).__name__}."
            )
        check_state_version("StreamingDataModule", state_dict)
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

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a saved position; it is applied when the training stream is built.

        States saved before states had a version load as version 1.

        Raises:
            TypeError: when ``state_dict`` is not a mapping.
            ValueError: when it is not a :class:`StreamingDataModule` state.
            ResumeMismatchError: for another state version; when applied, for other shards
                or settings under ``on_resume_mismatch="error"``.
        """
        state = self._checked_state(state_dict)
        self._restored = True
        if state is None:
            return
        if self.stream is not None:
            self._restore(self.stream, state)
        else:
            self._pending = state

    # -- validation and test ---------------------------------------------------------------

    def _eval_setup(self, stage: str, dataset: Any, lengths: Any, loss: Any) -> None:
        if (dataset is None) != (lengths is None):
            raise SettingValueError(
                f"{stage}_dataset and {stage}_lengths go together: pass both or neither.",
                setting=f"{stage}_lengths" if dataset is not None else f"{stage}_dataset",
                value=None,
                stage=stage,
            )
        if dataset is None:
            if loss is not None:
                raise SettingValueError(
                    f"{stage}_loss_lengths was given without {stage}_dataset: pass both or "
                    "neither.",
                    setting=f"{stage}_loss_lengths",
                    value=loss,
                    stage=stage,
                )
            return
        if isinstance(dataset, (list, tuple)) and any(isinstance(d, DataSource) for d in dataset):
            raise SettingTypeError(
                f"{stage}_dataset is a list of DataSource: StreamingDataModule evaluates one "
                "map-style dataset per split; concatenate them (and their lengths), or use "
                "TokenBudgetDataModule for a mixture.",
                setting=f"{stage}_dataset",
                value=dataset,
                stage=stage,
            )
        check_map_style(dataset, f"{stage}_dataset")
        self._columns[stage] = lengths if is_column_spec(lengths) else None
        array = _lengths_of(stage, dataset, lengths)
        setattr(self, f"{stage}_lengths", array)
        if loss is not None:
            loss = _lengths_of(stage, dataset, loss, "loss_lengths")
        elif self.loss_offset:  # the stream's loss_offset, as the evaluation loss lengths
            counted = array[:, 1] if array.ndim == 2 else array
            loss = np.maximum(counted.astype(np.int64) - self.loss_offset, 0)
        settings = {k: v for k, v in self.plan_settings.items() if k != "loss_offset"}
        try:  # the evaluation rule TokenBudgetDataModule uses
            config = evaluation_config(self.val_max_tokens, settings)
            self._planners[stage] = EpochPlanner(array, config, loss)
        except SettingError as error:
            raise split_error(
                error,
                stage,
                self.val_max_tokens,
                budget_default=self._val_budget_default,
                longest=int(array.max()) if array.size else None,
            ) from error
        self.collate_for(stage)  # a collate that disagrees with the plan fails now
        self._eval_sampler(stage, 0, 1)  # checks the split now

    def collate_for(self, stage: str) -> Callable[[Any], Any]:
        """The collate of ``stage``, as :meth:`TokenBudgetDataModule.collate_for`.

        The stream's for training; for an evaluation split the given one, or the plan's
        default for its columns.

        Raises:
            SettingValueError: for a collate that does not fit the split's plan.
        """
        if stage == "train":
            return self.collate
        columns = self._columns.get(stage)
        dataset = getattr(self, f"{stage}_dataset")
        return collate_for_plan(
            self._planners[stage].config,
            self.collate,
            loss_offset=self.loss_offset,
            keys=lambda: (
                source_column_keys(self.train_source)
                if columns is None
                else dataset_column_keys(dataset, columns)
            ),
        )

    def _eval_sampler(
        self, stage: str, rank: int | None, world: int | None
    ) -> TokenBudgetBatchSampler:
        sampler = TokenBudgetBatchSampler.from_planner(
            self._planners[stage], rank=rank, world_size=world
        )
        check_evaluation(stage, sampler)
        return sampler

    def _eval_loader(self, stage: str) -> TokenBudgetDataLoader:
        trainer = self._trainer
        rank, world = (None, None) if trainer is None else (trainer.global_rank, trainer.world_size)
        sampler = self._eval_sampler(stage, rank, world)
        self.samplers[stage] = sampler
        if stage == "val":
            self.val_sampler = sampler
        return TokenBudgetDataLoader(
            getattr(self, f"{stage}_dataset"),
            sampler,
            collate_fn=self.collate_for(stage),
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            evaluation=True,
        )

    def val_dataloader(self) -> TokenBudgetDataLoader | list[Any]:
        """This rank's validation loader (every example once across ranks), or ``[]``."""
        if "val" not in self._planners:
            return []
        return self._eval_loader("val")

    def test_dataloader(self) -> TokenBudgetDataLoader:
        """This rank's test loader (every example once across ranks)."""
        if "test" not in self._planners:
            raise ValueError(
                "StreamingDataModule has no test_dataset: pass test_dataset= and "
                "test_lengths= when you build it to run trainer.test."
            )
        return self._eval_loader("test")
