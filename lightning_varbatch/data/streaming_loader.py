"""The DataLoader of one rank's stream: it sets the stream's epoch before every iteration.

It has no length: Lightning runs each epoch to the stream's end (every example once).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.utils.data import DataLoader
from torch.utils.data.dataloader import _BaseDataLoaderIter

from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.data.streaming import StreamingBatches

__all__ = ["StreamingDataLoader"]


class StreamingDataLoader(DataLoader[Any]):
    """A DataLoader over a :class:`StreamingBatches` that sets the stream's epoch on ``iter()``.

    Lightning relays ``set_epoch`` to samplers only: this loader asks ``epoch()`` at every
    ``iter()`` and sets it on the dataset before the DataLoader copies it into its workers.

    Args:
        dataset: the rank's stream of collated micro-batches.
        epoch: gives the epoch at each ``iter()`` (``None``: call ``dataset.set_epoch`` yourself).
        num_workers: workers (worker ``i`` of ``k`` builds micro-batches ``j % k == i``, in order).
        pin_memory: pin batches in memory.
        **kwargs: other DataLoader arguments (``prefetch_factor``, ``multiprocessing_context``, ...)
            but the stream's own (``batch_size``, ``sampler``, ``batch_sampler``, ``collate_fn``);
            ``persistent_workers=True`` is refused (workers would keep their first epoch).

    Raises:
        TypeError: for a dataset that is not a :class:`StreamingBatches`, or a bad ``epoch``.
        ValueError: for a bad ``num_workers`` or an argument the stream owns.

    Example:
        >>> import numpy as np
        >>> from lightning_varbatch.sources.shards import ShardedSource
        >>> class Shard:
        ...     def __init__(self, name, rows): self.name, self.rows = name, rows
        ...     num_rows = property(lambda self: len(self.rows))
        ...     def lengths(self): return np.array([len(r) for r in self.rows])
        ...     def read(self, rows): return ({"tokens": np.array(self.rows[i])} for i in rows)
        >>> source = ShardedSource([Shard("a", [[1, 2], [3]]), Shard("b", [[4, 5, 6]])])
        >>> stream = StreamingBatches(source, max_tokens=4, window=3, rank=0, world_size=1)
        >>> loader = StreamingDataLoader(stream, epoch=lambda: 3)
        >>> _ = iter(loader); stream.epoch
        3
    """

    def __init__(
        self,
        dataset: StreamingBatches,
        epoch: Callable[[], int] | None = None,
        num_workers: int = 0,
        pin_memory: bool = False,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dataset, StreamingBatches):
            raise TypeError(
                f"dataset must be a StreamingBatches (the stream of one rank), got "
                f"{type(dataset).__name__}; for a map-style dataset use TokenBudgetDataLoader."
            )
        if epoch is not None and not callable(epoch):
            raise TypeError(f"epoch must be a callable returning an int or None, got {epoch!r}.")
        num_workers = check_count(
            "num_workers", num_workers, minimum=0, what=" (0: load in the main process)"
        )
        pin_memory = check_flag("pin_memory", pin_memory)
        owned = sorted(
            k for k in ("batch_size", "sampler", "batch_sampler", "collate_fn") if k in kwargs
        )
        if owned:
            raise ValueError(
                f"{', '.join(owned)} cannot be set: the stream yields collated micro-batches "
                "itself (pass collate= to StreamingBatches / StreamingDataModule instead)."
            )
        if kwargs.get("persistent_workers"):
            raise ValueError(
                "persistent_workers=True would keep each worker's copy of the stream in the "
                "epoch it started in (and ignore a restored position): leave it False."
            )
        super().__init__(
            dataset, batch_size=None, num_workers=num_workers, pin_memory=pin_memory, **kwargs
        )
        self.epoch = epoch

    def __len__(self) -> int:
        """Refused with a TypeError, which Lightning reads as "no length" (an ``inf`` epoch)."""
        raise TypeError(
            "A StreamingDataLoader has no len(): the stream is planned window by window while "
            "it is read, so its micro-batch count is known only at the epoch's end. Limit "
            "training with Trainer(max_steps=...), or use TokenBudgetDataModule (map-style "
            "data) for a known epoch length."
        )

    @property
    def max_tokens(self) -> int:
        """The token budget of one micro-batch (the stream's ``max_tokens``)."""
        return int(self.dataset.planner.config.max_tokens)  # type: ignore[attr-defined]

    def __iter__(self) -> _BaseDataLoaderIter:
        """Set the stream's epoch (if ``epoch`` was given), then iterate as a DataLoader."""
        if self.epoch is not None:
            self.dataset.set_epoch(int(self.epoch()))  # type: ignore[attr-defined]
        return super().__iter__()
