"""One epoch's plan: which examples form each micro-batch of each rank.

Example:
    >>> from lightning_varbatch.planner import plan_epoch
    >>> plan = plan_epoch(np.array([4, 4, 4, 4]), max_tokens=8, world_size=2)
    >>> plan.num_steps, plan.micro_batch(0, 1).tolist()
    (1, [1, 3])
"""

from __future__ import annotations

import functools
import itertools
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError

if TYPE_CHECKING:
    from lightning_varbatch.planner.length_warmup import LengthWarmupTrace

__all__ = ["DEPRECATED_NAMES", "EpochPlan"]

#: Earlier versions' names of the plan's attributes, methods and arguments (a micro-batch was a
#: "tile") -> their names now; the old ones still work, with a :class:`DeprecationWarning`.
DEPRECATED_NAMES: dict[str, str] = {
    "tile_start": "micro_batch_start",
    "tile_size": "micro_batch_size",
    "tile_cost": "micro_batch_cost",
    "tile_dataset": "micro_batch_dataset",
    "tile_work": "micro_batch_work",
    "tile_shape": "micro_batch_shape",
    "tile_load": "micro_batch_load",
    "tile_tokens": "micro_batch_tokens",
    "tile_ids": "micro_batch_ids",
    "rank_tiles": "rank_micro_batches",
    "ids_of_tiles": "ids_of_micro_batches",
    "consumed_tiles": "consumed_micro_batches",
}


def _warn_renamed(old: str, stacklevel: int = 3) -> None:
    warnings.warn(
        f"EpochPlan.{old} is deprecated: use EpochPlan.{DEPRECATED_NAMES[old]} (a plan's "
        "micro-batches were once called tiles).",
        DeprecationWarning,
        stacklevel=stacklevel,
    )


class _Renamed:
    """The old name of an :class:`EpochPlan` attribute or method: reads the new one, warns."""

    def __init__(self, old: str) -> None:
        self.old = old

    def __get__(self, plan: object, owner: type | None = None) -> Any:
        if plan is None:
            return self
        _warn_renamed(self.old)
        return getattr(plan, DEPRECATED_NAMES[self.old])


@dataclass(frozen=True)
class EpochPlan:
    """Which examples form each micro-batch of each rank in one epoch.

    Micro-batch ``b`` holds ``order[micro_batch_start[b] : micro_batch_start[b] +
    micro_batch_size[b]]`` (every ``micro_batch_*`` array has one entry per micro-batch id);
    ``assign[step, rank, micro]`` is the micro-batch ``rank`` runs in slot ``micro`` of
    ``step``. Earlier versions' names (``tile_start``, ...) warn: :data:`DEPRECATED_NAMES`.

    Attributes:
        epoch: the epoch this plan is for.
        world_size: number of ranks.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        order: example ids in micro-batch order (this epoch's shuffle).
        micro_batch_start: first position of every micro-batch in ``order``.
        micro_batch_size: examples in every micro-batch.
        micro_batch_cost: every micro-batch's cost under the cost model (<= ``max_tokens``).
        assign: ``(num_steps, world_size, accumulate_grad_batches)`` micro-batch ids.
        num_dropped: examples the epoch leaves out (``tail="drop"``).
        num_duplicated: extra example runs (``tail="pad"``...); both count a re-plan's whole epoch.
        num_skipped: examples left out by ``oversize="skip"``.
        num_truncated: examples cut by ``oversize="truncate"``.
        micro_batch_dataset: the dataset of every micro-batch of a mixture (``None``: 0).
        micro_batch_work: what ranks were balanced by (packed: compute); ``None``: the cost.
        micro_batch_shape: ``(m, 2)`` each micro-batch's static ``(rows, length)`` (``None``: free).
        rank_budget: ``(world_size,)`` the budget each rank's micro-batches fit when ranks
            have their own (``rank_shares`` / ``rank_max_tokens``); ``None``: ``max_tokens``.
        consumed_counts: for the re-planned rest of an epoch, the runs of each example under
            the epoch's earlier topologies (``None``: a whole epoch); not compared.
        step_fraction: each step's fraction of the full step (``None``: no schedule); not compared.
    """

    epoch: int
    world_size: int
    accumulate_grad_batches: int
    order: np.ndarray
    micro_batch_start: np.ndarray
    micro_batch_size: np.ndarray
    micro_batch_cost: np.ndarray
    assign: np.ndarray
    num_dropped: int = 0
    num_duplicated: int = 0
    num_skipped: int = 0
    num_truncated: int = 0
    micro_batch_dataset: np.ndarray | None = None
    micro_batch_work: np.ndarray | None = None
    micro_batch_shape: np.ndarray | None = None
    rank_budget: np.ndarray | None = None
    consumed_counts: np.ndarray | None = field(default=None, repr=False, compare=False)
    step_fraction: np.ndarray | None = field(default=None, repr=False, compare=False)
    _loss: np.ndarray | None = field(default=None, repr=False)
    _exact_tokens: np.ndarray | None = field(default=None, repr=False)
    #: What the length warm-up did (``None``: none); set by the planner, not a field (no compare).
    length_warmup: ClassVar[LengthWarmupTrace | None] = None

    @property
    def micro_batch_load(self) -> np.ndarray:
        """What ranks are balanced by: ``micro_batch_work``, else ``micro_batch_cost``."""
        return self.micro_batch_cost if self.micro_batch_work is None else self.micro_batch_work

    @property
    def num_steps(self) -> int:
        """Optimizer steps in the epoch."""
        return int(self.assign.shape[0])

    @property
    def num_micro_batches_per_rank(self) -> int:
        """Micro-batches every rank runs this epoch (the same on every rank)."""
        return int(self.assign.shape[0] * self.assign.shape[2])

    @cached_property
    def micro_batch_tokens(self) -> np.ndarray:
        """Loss tokens of every micro-batch (target tokens for source/target pairs), int64."""
        if self._exact_tokens is not None:
            return self._exact_tokens.astype(np.int64)
        if self.micro_batch_start.size == 0 or self._loss is None:
            return np.zeros(self.micro_batch_start.shape, dtype=np.int64)
        return _micro_batch_sums(self._loss, self.order, self.micro_batch_start)

    @cached_property
    def step_tokens(self) -> np.ndarray:
        """``(num_steps,)`` loss tokens of each optimizer step, summed over ranks and micros."""
        return self.micro_batch_tokens[self.assign].sum(axis=(1, 2))

    @cached_property
    def step_dataset(self) -> np.ndarray:
        """``(num_steps, world_size, accumulate_grad_batches)`` dataset of every micro-batch."""
        if self.micro_batch_dataset is None:
            return np.zeros(self.assign.shape, dtype=np.int64)
        return self.micro_batch_dataset[self.assign]

    @cached_property
    def step_examples(self) -> np.ndarray:
        """``(num_steps,)`` examples in each optimizer step, summed over ranks and micros."""
        return self.micro_batch_size[self.assign].sum(axis=(1, 2))

    def rank_micro_batches(self, rank: int) -> np.ndarray:
        """Micro-batch ids of ``rank`` in the order it runs them.

        Raises:
            ValueError: when ``rank`` is not in ``[0, world_size)``.
        """
        kind = _index_error(rank)
        if kind is SettingTypeError or not 0 <= rank < self.world_size:
            raise kind(
                f"rank must be an integer in [0, {self.world_size}) (world_size="
                f"{self.world_size}), got {rank!r}; pass this process's rank.",
                setting="rank",
                value=rank,
            )
        return self.assign[:, rank, :].reshape(-1)

    def micro_batch_ids(self, micro_batch: int) -> np.ndarray:
        """Example ids of one micro-batch."""
        start = int(self.micro_batch_start[micro_batch])
        return self.order[start : start + int(self.micro_batch_size[micro_batch])]

    def micro_batch(self, step: int, rank: int, micro: int = 0) -> np.ndarray:
        """Example ids of ``rank``'s micro-batch ``micro`` in optimizer step ``step``."""
        return self.micro_batch_ids(int(self.assign[step, rank, micro]))

    def example_ids(self, rank: int | None = None) -> np.ndarray:
        """All example ids this epoch (of one rank, or of all), in run order."""
        micro_batches = self.assign.reshape(-1) if rank is None else self.rank_micro_batches(rank)
        return self.ids_of_micro_batches(micro_batches)

    def consumed_micro_batches(self, micro_batches: int) -> tuple[np.ndarray, np.ndarray]:
        """The ids of all ranks' first ``micro_batches`` micro-batches, and of those after them.

        Raises:
            ValueError: when ``micro_batches`` is outside ``[0, num_micro_batches_per_rank]``.
        """
        total = self.num_micro_batches_per_rank
        kind = _index_error(micro_batches)
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

    def positions(self, micro_batches: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Positions in ``order`` of ``micro_batches``' examples, and where each one starts.

        Example:
            >>> from lightning_varbatch.planner import plan_epoch
            >>> plan = plan_epoch(np.array([4, 4, 4]), max_tokens=8, shuffle=False)
            >>> [p.tolist() for p in plan.positions(np.array([1, 0]))]
            [[2, 0, 1], [0, 1]]
        """
        micro_batches = np.asarray(micro_batches, dtype=np.int64).reshape(-1)
        sizes = self.micro_batch_size[micro_batches].astype(np.int64)
        firsts = np.concatenate(([0], np.cumsum(sizes)[:-1])).astype(np.int64)
        starts = self.micro_batch_start[micro_batches].astype(np.int64)
        return np.repeat(starts - firsts, sizes) + np.arange(int(sizes.sum())), firsts

    def ids_of_micro_batches(self, micro_batches: np.ndarray) -> np.ndarray:
        """Example ids of ``micro-batches``, concatenated in that order."""
        return self.order[self.positions(micro_batches)[0]]

    def consumed_ids(self, micro_batches: int) -> np.ndarray:
        """Ids of all ranks' first ``micro_batches`` micro-batches (what a resume skips).

        Raises:
            ValueError: when ``micro_batches`` is outside ``[0, num_micro_batches_per_rank]``.
        """
        return self.ids_of_micro_batches(self.consumed_micro_batches(micro_batches)[0])


def _index_error(value: object) -> type[SettingError]:
    """The error for a bad index: a type error for anything but an integer."""
    whole = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    return SettingValueError if whole else SettingTypeError


def _accept_old_arguments(init: Any) -> Any:
    """Let ``EpochPlan(tile_start=...)`` (the old argument names) build a plan, with a warning."""

    @functools.wraps(init)
    def __init__(self: EpochPlan, *args: Any, **kwargs: Any) -> None:
        for old in [name for name in kwargs if name in DEPRECATED_NAMES]:
            _warn_renamed(old)
            kwargs[DEPRECATED_NAMES[old]] = kwargs.pop(old)
        init(self, *args, **kwargs)

    return __init__


EpochPlan.__init__ = _accept_old_arguments(EpochPlan.__init__)  # type: ignore[method-assign]
for _old in DEPRECATED_NAMES:  # the names of earlier versions: they read the new ones and warn
    setattr(EpochPlan, _old, _Renamed(_old))


_SUM_CHUNK = 1 << 20


def _micro_batch_sums(values: np.ndarray, order: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """``values[order]`` summed over each micro-batch, a chunk at a time (bounded memory)."""
    out = np.empty(starts.size, dtype=np.int64)
    bounds = np.searchsorted(starts, np.arange(0, order.size, _SUM_CHUNK), side="left")
    bounds = np.unique(np.concatenate((bounds, [starts.size])))
    for a, b in itertools.pairwise(bounds.tolist()):
        end = int(starts[b]) if b < starts.size else order.size
        part = values[order[int(starts[a]) : end]]
        out[a:b] = np.add.reduceat(part, starts[a:b] - starts[a], dtype=np.int64)
    return out
