"""Token-budget micro-batches streamed from shards: every rank equal counts, exact resume.

:class:`StreamingBatches` is the ``IterableDataset`` of one rank. It plans the epoch window by
window (:class:`~lightning_varbatch.planner.windows.WindowedPlanner`), reads the rows its
micro-batches need from the window's shards front to back and yields them collated, with the
plan's counts on each batch (the exact loss normaliser).

* **Equal counts, no hang**: every window gives every rank the same number of micro-batches,
  so the ranks end the epoch together whatever tokens their shards hold.
* **Workers**: worker ``i`` of ``k`` builds the rank's micro-batches ``j % k == i``; the
  ``DataLoader`` takes them round robin: the plan's order, each example read once.
* **Resume**: exact, without reading the stream (:mod:`~.streaming_state`).

Example:
    >>> class Shard:  # any object with name, num_rows, lengths() and read(rows)
    ...     def __init__(self, name, rows): self.name, self.rows = name, rows
    ...     num_rows = property(lambda self: len(self.rows))
    ...     def lengths(self): return np.array([len(r) for r in self.rows])
    ...     def read(self, rows): return ({"tokens": np.array(self.rows[i])} for i in rows)
    >>> source = ShardedSource([Shard("a", [[1, 2], [3]]), Shard("b", [[4, 5, 6]])])
    >>> batches = StreamingBatches(source, max_tokens=4, window=3, rank=0, world_size=1)
    >>> sorted(int(b["nexamples"]) for b in batches)
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from lightning_varbatch.data.micro_batch import MicroBatch, micro_batch_of, resolve_rank_world
from lightning_varbatch.data.pairing import collate_for_plan, source_column_keys
from lightning_varbatch.data.plan_items import attach_plan
from lightning_varbatch.data.streaming_state import ResumableStream
from lightning_varbatch.errors import SettingTypeError
from lightning_varbatch.planner.settings import PlanConfig, check_count
from lightning_varbatch.planner.windows import WindowedPlanner, WindowPlan
from lightning_varbatch.sources.shards import ShardedSource

__all__ = ["StreamingBatches"]


class StreamingBatches(ResumableStream, IterableDataset[dict[str, Any]]):
    """One rank's token-budget micro-batches of a sharded stream (see the module docstring).

    Use ``DataLoader(batches, batch_size=None, num_workers=k)``: it yields collated batches itself.

    Args:
        source: the shards (:func:`~lightning_varbatch.sources.shards.shards_from_files`, ...).
        max_tokens: the budget of one micro-batch.
        window: examples per plan (``None``: about 200 micro-batches' worth, :func:`~.auto_window`).
        collate: items to a batch (default :class:`PaddingCollate`), given with the plan's counts.
        rank: this process's rank (default: from the environment / process group).
        world_size: number of ranks (same default).
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        shuffle_shards: read the shards in a new random order each epoch.
        loss_offset: loss tokens per example: its (target) length minus this, also in the collate.
        **plan_settings: other ``PlanConfig`` settings (``cost``, ``seed``, ``tail``, ...).

    Raises:
        ValueError: for bad settings (the message names the setting).
    """

    def __init__(
        self,
        source: ShardedSource,
        max_tokens: int,
        *,
        window: int | None = None,
        collate: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        shuffle_shards: bool = True,
        loss_offset: int = 0,
        **plan_settings: Any,
    ) -> None:
        if not isinstance(source, ShardedSource):
            raise SettingTypeError(
                f"source must be a ShardedSource (shards_from_files, shards_from_hf_iterable, "
                f"shards_from_litdata), got {type(source).__name__}: build one with them.",
                setting="source",
                value=source,
            )
        self.source = source
        self.planner = WindowedPlanner(
            np.diff(source.offsets).tolist(),
            source.shard_lengths,
            PlanConfig(max_tokens=max_tokens, **plan_settings),
            window=window,
            shuffle_shards=shuffle_shards,
            loss_offset=loss_offset,
            shard_names=[shard.name for shard in source.shards],
        )
        # the plan's layout picks the default collate and refuses one that disagrees
        self.collate = collate_for_plan(
            self.planner.config,
            collate,
            loss_offset=loss_offset,
            keys=lambda: source_column_keys(source),
        )
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.accumulate_grad_batches = check_count(
            "accumulate_grad_batches", accumulate_grad_batches
        )
        self.epoch, self._window, self._consumed, self._steps = 0, 0, 0, 0  # the position
        self._history: list[tuple[Any, ...]] = []
        self._seen: dict[int, int] = {}

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (unless a restored position is for it)."""
        epoch = check_count("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self.epoch, self._window, self._consumed, self._history = epoch, 0, 0, []
            self._seen, self._steps = {}, 0

    def window_plan(self, window: int) -> WindowPlan:
        """This topology's plan of ``window`` (its remainder when the position is inside it)."""
        history = self._history if window == self._window else []
        return self.planner.window_plan(
            self.epoch,
            window,
            self.world_size,
            self.accumulate_grad_batches,
            history,
            rank_budgets=self.rank_budgets,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield this rank's (this worker's share of) collated micro-batches from the position."""
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        count = 0  # micro-batches of this rank from the start position, all workers
        steps = self._steps  # the epoch's optimizer steps before the window's plan
        for window in range(self._window, self.planner.num_windows):
            wp = self.window_plan(window)
            first = self._consumed if window == self._window else 0
            total = wp.plan.num_micro_batches_per_rank
            mine = [j for j in range(first, total) if (count + j - first) % workers == worker]
            count += total - first
            batches = [
                micro_batch_of(
                    wp.plan,
                    wp.planner,
                    self.rank,
                    j,
                    epoch=self.epoch,
                    ids=wp.ids,
                    first_step=steps,
                )
                for j in mine
            ]
            steps += wp.plan.num_steps
            items = self._read(batches)
            for mb in batches:
                yield self.collate(attach_plan([items[i] for i in mb], mb))

    def _read(self, batches: list[MicroBatch]) -> dict[int, Any]:
        """The items of ``batches``, read shard by shard, each shard's rows ascending."""
        wanted = np.unique(np.fromiter((i for mb in batches for i in mb), dtype=np.int64))
        shard_of = np.searchsorted(self.source.offsets, wanted, side="right") - 1
        items: dict[int, Any] = {}
        for shard in np.unique(shard_of).tolist():
            ids = wanted[shard_of == shard]
            rows = ids - int(self.source.offsets[shard])
            for gid, item in zip(ids.tolist(), self.source.read(shard, rows), strict=True):
                items[gid] = item
        return items
