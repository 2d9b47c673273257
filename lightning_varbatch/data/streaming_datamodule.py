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
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from lightning.pytorch import LightningDataModule

from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.datamodule import check_evaluation, check_ranks_agree
from lightning_varbatch.data.loader import TokenBudgetDataLoader
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.data.streaming import StreamingBatches
from lightning_varbatch.data.streaming_loader import StreamingDataLoader
from lightning_varbatch.planner.settings import check_count
from lightning_varbatch.sources.arrow_lengths import column_lengths, is_column_spec
from lightning_varbatch.sources.shards import ShardedSource

__all__ = ["StreamingDataModule"]

_STATE_KEYS = frozenset({"stream", "trained"})


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


class StreamingDataModule(LightningDataModule):
    """Token-budget training micro-batches streamed from shards; optional map-style validation.

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
        collate: turns a micro-batch's items into a batch (default :class:`PaddingCollate`),
            for training and validation.
        num_workers: DataLoader workers of each loader.
        pin_memory: pin batches in memory.
        val_dataset: optional map-style validation dataset (every example evaluated exactly
            once across ranks).
        val_lengths: one length per validation item (``(n,)`` or ``(n, 2)``), or for a Hugging
            Face dataset the name of a length / token-id column (or a pair of them).
        val_max_tokens: budget of validation micro-batches (default ``max_tokens``).
        **plan_settings: other planner settings (``seed``, ``cost``, ``tail``,
            ``pad_to_multiple_of``, ...), for training; validation shares them except
            ``shuffle=False, tail="spread"``.

    Raises:
        TypeError: for a ``train_source`` that is not a :class:`ShardedSource`, a bad
            ``collate``, or unknown planner settings.
        ValueError: for bad budgets, counts, window, validation data or settings.

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
        max_tokens: int,
        *,
        window: int | None = None,
        shuffle_shards: bool = True,
        collate: Callable[[Any], Any] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        val_dataset: Any = None,
        val_lengths: Any = None,
        val_max_tokens: int | None = None,
        **plan_settings: Any,
    ) -> None:
        super().__init__()
        if not isinstance(train_source, ShardedSource):
            raise TypeError(
                "train_source must be a ShardedSource (from shards_from_files, "
                "shards_from_hf_iterable or shards_from_litdata), got "
                f"{type(train_source).__name__}; for a map-style dataset use "
                "TokenBudgetDataModule."
            )
        if collate is not None and not callable(collate):
            raise TypeError(
                f"collate must be callable (e.g. PaddingCollate(...)) or None, got "
                f"{type(collate).__name__} {collate!r}."
            )
        if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 0:
            raise ValueError(
                f"num_workers must be an integer >= 0 (0: load in the main process), got "
                f"{num_workers!r}."
            )
        if not isinstance(pin_memory, bool):
            raise TypeError(f"pin_memory must be True or False, got {pin_memory!r}.")
        for name in ("rank", "world_size", "accumulate_grad_batches"):
            if name in plan_settings:
                raise TypeError(
                    f"StreamingDataModule reads {name} from the Trainer: do not pass {name}=."
                )
        self.train_source = train_source
        self.max_tokens = check_count(
            "max_tokens", max_tokens, what=" (the padded tokens one micro-batch may hold)"
        )
        self.window = window
        self.shuffle_shards = shuffle_shards
        if collate is None:  # training and validation count loss tokens the same way
            offset = int(plan_settings.get("loss_offset", 0) or 0)
            collate = PaddingCollate(loss_offset=offset)
        self.collate = collate
        self.num_workers = num_workers
        self.pin_memory = pin_memory
        self.plan_settings = dict(plan_settings)
        # Settings are checked now, before any Trainer exists: a 1-rank stream plans nothing
        # until iterated, so this costs only the checks.
        self._stream_for(0, 1, 1)
        self.stream: StreamingBatches | None = None
        self._pending: dict[str, Any] | None = None
        self._base: tuple[int, int] | None = None  # (epoch, trained count) of the restore
        self._val_setup(val_dataset, val_lengths, val_max_tokens)

    # -- training ------------------------------------------------------------------------

    def _stream_for(self, rank: int | None, world: int | None, accumulate: int) -> StreamingBatches:
        return StreamingBatches(
            self.train_source,
            self.max_tokens,
            window=self.window,
            collate=self.collate,
            rank=rank,
            world_size=world,
            accumulate_grad_batches=accumulate,
            shuffle_shards=self.shuffle_shards,
            **self.plan_settings,
        )

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
        return StreamingDataLoader(
            stream,
            epoch=self._epoch if trainer is not None else None,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
        )

    def _restore(self, stream: StreamingBatches, state: Mapping[str, Any]) -> None:
        stream.load_state_dict(state["stream"])
        self._base = (stream.epoch, int(state["trained"]))

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The stream position after the micro-batches trained so far this epoch.

        Returns ``{"stream": ..., "trained": n}``: the :class:`StreamingBatches` state and the
        fit loop's count of micro-batches trained this epoch (``batch_progress.current.
        processed``, which already includes the batch whose ``on_train_batch_end`` saves).
        A position at the end of an epoch restores as that epoch, finished: the next
        epoch's ``set_epoch`` starts it.
        """
        stream = self.stream
        if stream is None:
            return {} if self._pending is None else dict(self._pending)
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
        return {"stream": stream.state_dict(trained - base), "trained": trained}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a saved position; it is applied when the training stream is built.

        Raises:
            TypeError: when ``state_dict`` is not a mapping.
            ValueError: when it is not a :class:`StreamingDataModule` state.
        """
        if not isinstance(state_dict, Mapping):
            raise TypeError(
                "StreamingDataModule.load_state_dict expects the dict returned by its "
                f"state_dict(), got {type(state_dict).__name__}."
            )
        if not state_dict:
            return
        if set(state_dict) != _STATE_KEYS or not isinstance(state_dict["stream"], Mapping):
            raise ValueError(
                f"Not a StreamingDataModule state: keys {sorted(map(str, state_dict))}, "
                f"expected {sorted(_STATE_KEYS)}; the checkpoint is from another DataModule "
                "(e.g. TokenBudgetDataModule) or version."
            )
        state = {"stream": dict(state_dict["stream"]), "trained": int(state_dict["trained"])}
        if self.stream is not None:
            self._restore(self.stream, state)
        else:
            self._pending = state

    # -- validation ----------------------------------------------------------------------

    def _val_setup(self, dataset: Any, lengths: Any, budget: int | None) -> None:
        if (dataset is None) != (lengths is None):
            raise ValueError("val_dataset and val_lengths go together: pass both or neither.")
        self.val_dataset = dataset
        self.val_max_tokens = self.max_tokens
        self.val_lengths: np.ndarray | None = None
        self.val_sampler: TokenBudgetBatchSampler | None = None
        if dataset is None:
            return
        if budget is not None:
            self.val_max_tokens = check_count(
                "val_max_tokens", budget, what=" (the padded tokens one micro-batch may hold)"
            )
        if is_column_spec(lengths):
            lengths = column_lengths(dataset, lengths, "val_lengths")
        try:
            self.val_lengths = np.asarray(lengths)
        except ValueError as error:
            raise ValueError(
                f"val_lengths is ragged or not numeric ({error}): pass one integer length per "
                "item, shape (n,), or one (source, target) pair per item, shape (n, 2)."
            ) from None
        n = len(dataset)
        if self.val_lengths.ndim == 0 or self.val_lengths.shape[0] != n:
            raise ValueError(
                f"val_lengths has {self.val_lengths.size} entries but val_dataset has {n} items: "
                "pass one length per item."
            )
        self._val_sampler(0, 1)  # checks the settings now

    def _val_sampler(self, rank: int | None, world: int | None) -> TokenBudgetBatchSampler:
        skip = ("shuffle", "tail", "loss_offset")
        settings = {k: v for k, v in self.plan_settings.items() if k not in skip}
        assert self.val_lengths is not None
        lengths: Any = self.val_lengths
        offset = int(self.plan_settings.get("loss_offset", 0) or 0)
        if offset:  # the stream's loss_offset, as the sampler's loss lengths
            if is_column_spec(lengths):
                lengths = column_lengths(self.val_dataset, lengths)
            lengths = np.asarray(lengths)
            counted = lengths[:, 1] if lengths.ndim == 2 else lengths
            settings["loss_lengths"] = np.maximum(counted.astype(np.int64) - offset, 0)
        sampler = TokenBudgetBatchSampler(
            lengths,
            self.val_max_tokens,
            rank=rank,
            world_size=world,
            shuffle=False,
            tail="spread",
            **settings,
        )
        check_evaluation("val", sampler)
        return sampler

    def val_dataloader(self) -> TokenBudgetDataLoader | list[Any]:
        """This rank's validation loader (every example once across ranks), or ``[]``."""
        if self.val_dataset is None:
            return []
        trainer = self._trainer
        rank, world = (None, None) if trainer is None else (trainer.global_rank, trainer.world_size)
        self.val_sampler = self._val_sampler(rank, world)
        return TokenBudgetDataLoader(
            self.val_dataset,
            self.val_sampler,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            evaluation=True,
        )
