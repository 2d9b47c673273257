"""One epoch's plan: which examples form each micro-batch of each rank.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner.epoch_planner import plan_epoch
    >>> plan = plan_epoch(np.array([4, 4, 4, 4]), max_tokens=8, world_size=2)
    >>> plan.num_steps, plan.micro_batch(0, 1).tolist()
    (1, [1, 3])
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError

__all__ = ["EpochPlan"]


@dataclass(frozen=True)
class EpochPlan:
    """Which examples form each micro-batch of each rank in one epoch.

    Micro-batches are *tiles*: tile ``t`` holds ``order[tile_start[t] : tile_start[t] +
    tile_size[t]]``. ``assign[step, rank, micro]`` is the tile that ``rank`` runs as micro-batch
    ``micro`` of optimizer step ``step``; a rank iterates its tiles step by step, micro by micro.

    Attributes:
        epoch: the epoch this plan is for.
        world_size: number of ranks.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        order: example ids in tile order (this epoch's shuffle).
        tile_start: first position of every tile in ``order``.
        tile_size: examples in every tile.
        tile_cost: every tile's cost under the cost model (never above ``max_tokens``).
        assign: ``(num_steps, world_size, accumulate_grad_batches)`` tile ids.
        num_dropped: examples left out by ``tail="drop"`` this epoch.
        num_duplicated: examples repeated by ``tail="pad"`` this epoch.
        num_skipped: examples left out by ``oversize="skip"``.
        num_truncated: examples cut by ``oversize="truncate"``.
        tile_dataset: the dataset of every tile when several are mixed
            (:class:`~lightning_varbatch.planner.mixture.MixturePlanner`); ``None`` means dataset 0.
        tile_work: what ranks were balanced by when it is not the cost (``layout="packed"``:
            each tile's compute, :mod:`lightning_varbatch.planner.flops`); ``None``: the cost.
        tile_shape: ``(m, 2)`` the static ``(rows, length)`` every tile is padded to under a
            shape budget (``PlanConfig.max_shapes``); ``None``: free shapes.
    """

    epoch: int
    world_size: int
    accumulate_grad_batches: int
    order: np.ndarray
    tile_start: np.ndarray
    tile_size: np.ndarray
    tile_cost: np.ndarray
    assign: np.ndarray
    num_dropped: int = 0
    num_duplicated: int = 0
    num_skipped: int = 0
    num_truncated: int = 0
    tile_dataset: np.ndarray | None = None
    tile_work: np.ndarray | None = None
    tile_shape: np.ndarray | None = None
    _loss: np.ndarray | None = field(default=None, repr=False)
    _exact_tokens: np.ndarray | None = field(default=None, repr=False)

    @property
    def tile_load(self) -> np.ndarray:
        """What ranks are balanced by: ``tile_work``, else ``tile_cost``."""
        return self.tile_cost if self.tile_work is None else self.tile_work

    @property
    def num_steps(self) -> int:
        """Optimizer steps in the epoch."""
        return int(self.assign.shape[0])

    @property
    def num_micro_batches_per_rank(self) -> int:
        """Micro-batches every rank runs this epoch (the same on every rank)."""
        return int(self.assign.shape[0] * self.assign.shape[2])

    @cached_property
    def tile_tokens(self) -> np.ndarray:
        """Loss tokens of every tile (target tokens for source/target pairs), int64."""
        if self._exact_tokens is not None:
            return self._exact_tokens.astype(np.int64)
        if self.tile_start.size == 0 or self._loss is None:
            return np.zeros(self.tile_start.shape, dtype=np.int64)
        return _tile_sums(self._loss, self.order, self.tile_start)

    @cached_property
    def step_tokens(self) -> np.ndarray:
        """``(num_steps,)`` loss tokens of each optimizer step, summed over ranks and micros."""
        return self.tile_tokens[self.assign].sum(axis=(1, 2))

    @cached_property
    def step_dataset(self) -> np.ndarray:
        """``(num_steps, world_size, accumulate_grad_batches)`` dataset of every micro-batch."""
        if self.tile_dataset is None:
            return np.zeros(self.assign.shape, dtype=np.int64)
        return self.tile_dataset[self.assign]

    @cached_property
    def step_examples(self) -> np.ndarray:
        """``(num_steps,)`` examples in each optimizer step, summed over ranks and micros."""
        return self.tile_size[self.assign].sum(axis=(1, 2))

    def rank_tiles(self, rank: int) -> np.ndarray:
        """Tile ids of ``rank`` in the order it runs them.

        Raises:
            ValueError: when ``rank`` is not in ``[0, world_size)``.
        """
        kind: type[SettingError] = SettingValueError
        if isinstance(rank, (bool, np.bool_)) or not isinstance(rank, (int, np.integer)):
            kind = SettingTypeError
        if kind is SettingTypeError or not 0 <= rank < self.world_size:
            raise kind(
                f"rank must be an integer in [0, {self.world_size}) (world_size="
                f"{self.world_size}), got {rank!r}; pass this process's rank.",
                setting="rank",
                value=rank,
            )
        return self.assign[:, rank, :].reshape(-1)

    def tile_ids(self, tile: int) -> np.ndarray:
        """Example ids of one tile."""
        start = int(self.tile_start[tile])
        return self.order[start : start + int(self.tile_size[tile])]

    def micro_batch(self, step: int, rank: int, micro: int = 0) -> np.ndarray:
        """Example ids of ``rank``'s micro-batch ``micro`` in optimizer step ``step``."""
        return self.tile_ids(int(self.assign[step, rank, micro]))

    def example_ids(self, rank: int | None = None) -> np.ndarray:
        """All example ids this epoch (of one rank, or of all), in run order."""
        tiles = self.assign.reshape(-1) if rank is None else self.rank_tiles(rank)
        return self.ids_of_tiles(tiles)

    def consumed_tiles(self, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
        """Tiles of all ranks' first ``micro_batches`` micro-batches, and the tiles after them.

        Raises:
            ValueError: when ``micro_batches`` is outside ``[0, num_micro_batches_per_rank]``.
        """
        total = self.num_micro_batches_per_rank
        kind: type[SettingError] = SettingValueError
        if isinstance(micro_batches, (bool, np.bool_)) or not isinstance(
            micro_batches, (int, np.integer)
        ):
            kind = SettingTypeError
        if kind is SettingTypeError or not 0 <= micro_batches <= total:
            raise kind(
                f"consumed micro-batches must be in [0, {total}] for this epoch, "
                f"got {micro_batches}.",
                setting="consumed micro-batches",
                value=micro_batches,
            )
        steps, micros = divmod(micro_batches, self.accumulate_grad_batches)
        done, rest = self.assign[:steps].reshape(-1), self.assign[steps + 1 :].reshape(-1)
        if steps < self.num_steps:
            done = np.concatenate([done, self.assign[steps, :, :micros].reshape(-1)])
            rest = np.concatenate([self.assign[steps, :, micros:].reshape(-1), rest])
        return done, rest

    def ids_of_tiles(self, tiles: np.ndarray) -> np.ndarray:
        """Example ids of ``tiles``, concatenated in that order."""
        if tiles.size == 0:
            return np.zeros(0, dtype=self.order.dtype)
        return np.concatenate([self.tile_ids(int(t)) for t in tiles])

    def consumed_ids(self, micro_batches: int) -> np.ndarray:
        """Ids of all ranks' first ``micro_batches`` micro-batches (what a resume skips).

        Raises:
            ValueError: when ``micro_batches`` is outside ``[0, num_micro_batches_per_rank]``.
        """
        return self.ids_of_tiles(self.consumed_tiles(micro_batches)[0])


_SUM_CHUNK = 1 << 20


def _tile_sums(values: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``values[order]`` summed over each tile.

    Gathered a chunk of tiles at a time: bounded temporaries instead of an int64 copy of the
    whole epoch.
    """
    out = np.empty(starts.size, dtype=np.int64)
    bounds = np.searchsorted(starts, np.arange(0, order.size, _SUM_CHUNK), side="left")
    bounds = np.unique(np.concatenate((bounds, [starts.size])))
    for a, b in itertools.pairwise(bounds.tolist()):
        end = int(starts[b]) if b < starts.size else order.size
        part = values[order[int(starts[a]) : end]]
        out[a:b] = np.add.reduceat(part, starts[a:b] - starts[a], dtype=np.int64)
    return out
