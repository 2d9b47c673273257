"""One rank's view of the epoch plan, as a torch batch sampler that resumes mid-epoch.

Checkpoints: :mod:`~lightning_varbatch.data.sampler_resume`; rank shares: ``.rank_share_setting``.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Sequence
from typing import Any

import numpy.typing as npt
from torch.utils.data import Sampler

from lightning_varbatch.checks import check_count
from lightning_varbatch.data.micro_batch import (
    MicroBatch,
    check_loss_tokens,
    micro_batch_of,
    process_group_topology,
    resolve_rank_world,
)
from lightning_varbatch.data.plan_settings import (
    PLAN_SETTINGS,
    check_accumulate,
    check_topology,
    plain,
    plain_settings,
    plan_config,
    reject_unknown,
)
from lightning_varbatch.data.rank_share_setting import LANE_PLANNERS, RankShares, RankShareSetting
from lightning_varbatch.data.sampler_resume import ON_MISMATCH, OnMismatch, ResumableSampler
from lightning_varbatch.data.sampler_state import EpochPosition
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.lengths import check_loss_lengths
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import DataSource, MixingPolicy, Weights
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.sources.arrow_lengths import source_with_column_lengths

__all__ = ["ON_MISMATCH", "OnMismatch", "TokenBudgetBatchSampler"]


def _own_arguments() -> frozenset[str]:
    """The sampler's own keyword arguments (not planner settings, not private)."""
    names = inspect.signature(TokenBudgetBatchSampler.__init__).parameters
    return frozenset(n for n in names if n not in ("self", "settings") and n[0] != "_")


class TokenBudgetBatchSampler(ResumableSampler, RankShares, Sampler[list[int]]):
    """Token-budgeted micro-batches of one rank; every rank gets the same number.

    All ranks build the same plan from the same lengths and settings (no collective) and each
    iterates its slice: step ``s``'s micro-batches in order ``(s, micro 0), (s, micro 1), ...``, as
    :class:`MicroBatch` lists carrying their and the step's token counts (exact loss normalisation).

    Args:
        lengths: ``(n,)`` lengths or ``(n, 2)`` (source, target) lengths, one per dataset item.
        max_tokens: token budget of one micro-batch on one rank (:class:`PlanConfig`); not with
            ``config``.
        config: every planner setting at once (then no planner setting as a keyword).
        rank: this rank; default: torch.distributed, else the ``RANK`` environment variable.
        world_size: number of ranks; default: torch.distributed, else ``WORLD_SIZE``.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        loss_lengths: loss tokens per example when they are not the lengths / target column
            (not with ``loss_offset``, which derives them: see :class:`PlanConfig`).
        epoch: the starting epoch.
        **settings: the other planner settings: :class:`PlanConfig`'s fields, names and defaults.

    Raises:
        SettingTypeError: for an unknown setting (the closest valid name is suggested).
        ValueError: for bad lengths or settings; the message names the setting to change.

    Example:
        >>> import numpy as np
        >>> sampler = TokenBudgetBatchSampler(np.array([[3, 4], [9, 2], [5, 5]]), 12,
        ...                                   rank=0, world_size=1)
        >>> [(list(b), b.ntokens, b.step_ntokens) for b in sampler]
        [([1], 2, 2), ([2, 0], 9, 9)]
        >>> same = TokenBudgetBatchSampler([[3, 4], [9, 2], [5, 5]], rank=0, world_size=1,
        ...                                config=sampler.config)
        >>> [list(b) for b in same] == [list(b) for b in sampler]
        True
    """

    def __init__(
        self,
        lengths: npt.ArrayLike,
        max_tokens: int | None = None,
        *,
        config: PlanConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        loss_lengths: npt.ArrayLike | None = None,
        epoch: int = 0,
        _planner: Planner | None = None,
        **settings: Any,
    ) -> None:
        reject_unknown("TokenBudgetBatchSampler", settings, PLAN_SETTINGS | _own_arguments())
        planner: Planner
        if _planner is None:
            plan = plan_config({"max_tokens": max_tokens, **settings}, config)
            check_accumulate(accumulate_grad_batches)
            check_loss_lengths(plan, loss_lengths)
            planner = EpochPlanner(lengths, plan, loss_lengths)
        else:  # from_planner: the lengths and settings are the planner's
            check_accumulate(accumulate_grad_batches)
            planner = _planner
        self.planner = planner
        self._shares = RankShareSetting(planner)
        # Found in the environment (not given): re-read from the process group once it exists.
        self._inferred = rank is None or world_size is None
        self.rank, self.world_size = resolve_rank_world(*check_topology(rank, world_size))
        self.accumulate_grad_batches = 1
        self._position = EpochPosition()
        self._cache: tuple[tuple[Any, ...], EpochPlan] | None = None
        self._digest: str | None = None
        self.set_distributed(self.rank, self.world_size, plain(accumulate_grad_batches))
        self.set_epoch(plain(epoch))
        self._shares.budgets(self.world_size)  # rank lists of another length fail now

    @classmethod
    def from_sources(
        cls,
        sources: Sequence[DataSource | npt.ArrayLike],
        max_tokens: int,
        *,
        mixing: MixingPolicy = "per_step",
        weights: Weights = "size",
        temperature: float = 1.0,
        steps_per_epoch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        epoch: int = 0,
        **settings: Any,
    ) -> TokenBudgetBatchSampler:
        """A sampler over several datasets (see :mod:`lightning_varbatch.planner.mixture`).

        Indices are global, as in a ``ConcatDataset``; a :class:`MicroBatch` names its ``.dataset``.

        Args:
            sources: the datasets' lengths (arrays, or ``DataSource`` with its own budgets, say).
            max_tokens: the common budget of one micro-batch.
            mixing: ``"per_step"`` or ``"per_batch"`` (see :class:`MixturePlanner`).
            weights: ``"size"`` or one weight per dataset.
            temperature: shares ``∝ weight ** (1 / temperature)``.
            steps_per_epoch: ``None`` for one pass over everything, else steps per epoch.
            rank: this rank (as for the constructor, and the next two).
            world_size: number of ranks.
            accumulate_grad_batches: micro-batches per rank per optimizer step.
            epoch: the starting epoch.
            **settings: other :class:`PlanConfig` settings.

        Raises:
            ValueError: for bad datasets, weights or settings; the message names them.

        Example:
            >>> import numpy as np
            >>> s = TokenBudgetBatchSampler.from_sources(
            ...     [np.full(16, 2048), np.full(8, 4096)], 16384, rank=0, world_size=2)
            >>> [(b.dataset, len(b)) for b in s]
            [(1, 4), (0, 8)]
        """
        if isinstance(sources, (list, tuple)):  # DataSource lengths may name Arrow columns
            sources = [
                source_with_column_lengths(s, f"sources[{i}]") if isinstance(s, DataSource) else s
                for i, s in enumerate(sources)
            ]
        config = PlanConfig(**plain_settings(max_tokens=max_tokens, **settings))
        for source in sources:
            if isinstance(source, DataSource):
                check_loss_lengths(config, source.loss_lengths)
        planner = MixturePlanner(
            sources,
            config,
            mixing=mixing,
            weights=weights,
            temperature=temperature,
            steps_per_epoch=steps_per_epoch,
        )
        return cls.from_planner(
            planner,
            rank=rank,
            world_size=world_size,
            accumulate_grad_batches=plain(accumulate_grad_batches),
            epoch=plain(epoch),
        )

    @classmethod
    def from_planner(
        cls,
        planner: Planner,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        epoch: int = 0,
    ) -> TokenBudgetBatchSampler:
        """A sampler sharing an existing planner (its sort is computed once for all ranks).

        The planner's lengths and :class:`PlanConfig` replace the planner arguments.

        Example:
            >>> import numpy as np
            >>> planner = EpochPlanner(np.arange(1, 9), PlanConfig(max_tokens=16))
            >>> s = TokenBudgetBatchSampler.from_planner(planner, rank=1, world_size=2)
            >>> s.rank, len(s) > 0
            (1, True)
        """
        return cls(
            (),  # unused: the planner holds the lengths and the settings
            planner.config.max_tokens,
            rank=rank,
            world_size=world_size,
            accumulate_grad_batches=accumulate_grad_batches,
            epoch=epoch,
            _planner=planner,
        )

    @property
    def config(self) -> PlanConfig:
        """The planner settings."""
        return self.planner.config

    @property
    def max_tokens(self) -> int:
        """Token budget of one micro-batch."""
        return self.config.max_tokens

    @property
    def truncate_to(self) -> int | None:
        """Length oversize examples were cut to (``oversize="truncate"``), else ``None``."""
        return self.planner.truncate_to

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._position.epoch

    @property
    def consumed(self) -> int:
        """Micro-batches of this epoch this rank has taken (yielded or restored).

        Counted from the epoch's start as a training loop counts them (also across a resume on
        another topology), like :attr:`epoch_length` and ``state_dict(consumed=...)``.
        """
        return self._position.counted_before + self._position.consumed

    @property
    def epoch_length(self) -> int:
        """Micro-batches of this epoch as a training loop counts them on this rank.

        Those run under earlier topologies (or before a fresh restart) plus the current plan's:
        what a DataLoader reports to Lightning, which restores its batch counter on resume.
        """
        return self._position.counted_before + self.plan.num_micro_batches_per_rank

    def consumed_from_epoch_count(self, trained: int) -> int:
        """Convert an epoch-level count of trained micro-batches to the current plan's count.

        Example:
            >>> import numpy as np
            >>> TokenBudgetBatchSampler(np.arange(1, 9), 8, rank=0, world_size=1
            ...                         ).consumed_from_epoch_count(2)
            2
        """
        return trained - self._position.counted_before

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``; the same epoch keeps a restored mid-epoch position.

        Raises:
            ValueError: for a negative epoch.
        """
        epoch = check_count("epoch", epoch, minimum=0)
        if epoch != self._position.epoch:
            self._position.start(epoch)

    def set_distributed(
        self, rank: int, world_size: int, accumulate_grad_batches: int | None = None
    ) -> None:
        """Change rank, world size or accumulation (e.g. once the trainer is known).

        Mid-epoch, another world size or accumulation re-plans the unconsumed rest (none lost).

        Raises:
            ValueError: for a rank outside ``[0, world_size)`` or a non-positive accumulation.
        """
        acc = (
            self.accumulate_grad_batches
            if accumulate_grad_batches is None
            else check_accumulate(accumulate_grad_batches)
        )
        rank, world_size = resolve_rank_world(*check_topology(rank, world_size))
        changed = (world_size, acc) != (self.world_size, self.accumulate_grad_batches)
        if changed:
            self._position.leave_topology(self.world_size, self.accumulate_grad_batches)
        self.rank, self.world_size, self.accumulate_grad_batches = rank, world_size, acc

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan (re-planned remainder after a topology change)."""
        position = self._position
        if not position.budgets_set:  # a new plan takes the shares in force
            position.budgets = self._shares.budgets(self.world_size)
            position.budgets_set = True
        key = (
            position.epoch,
            tuple(position.history),
            self.world_size,
            self.accumulate_grad_batches,
            position.budgets,
        )
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        args = (position.epoch, self.world_size, self.accumulate_grad_batches, position.history)
        if isinstance(self.planner, LANE_PLANNERS):
            plan = self.planner.plan_resumed(*args, rank_budgets=position.budgets)
        else:
            plan = self.planner.plan_resumed(*args)
        check_loss_tokens(plan, self.config)
        self._cache = (key, plan)
        return plan

    def _sync_with_process_group(self) -> None:
        """Follow torch.distributed's topology (or refuse a contradiction)."""
        found = process_group_topology(self.rank, self.world_size, self._inferred)
        if found is not None:
            self.set_distributed(*found)

    def __len__(self) -> int:
        """Micro-batches the next iteration yields (the rest of the epoch after a resume)."""
        self._sync_with_process_group()
        total = self.plan.num_micro_batches_per_rank
        position = self._position
        if position.consumed >= total and not position.restored:
            return total  # a finished epoch iterated again starts over
        return total - position.consumed

    def __iter__(self) -> Iterator[list[int]]:
        """Yield this rank's :class:`MicroBatch` es from the current position."""
        self._sync_with_process_group()
        plan = self.plan
        total = plan.num_micro_batches_per_rank
        position = self._position
        if position.consumed >= total and not position.restored:
            position.consumed = 0  # a finished epoch iterated again starts over
        position.restored = False
        for j in range(position.consumed, total):
            position.consumed = j + 1
            yield self.micro_batch(j)

    def micro_batch(self, position: int) -> MicroBatch:
        """The :class:`MicroBatch` this rank runs at ``position`` of the epoch (no advance).

        Raises:
            IndexError: when ``position`` is not in ``[0, micro-batches per rank)``.

        Example:
            >>> sampler = TokenBudgetBatchSampler([3, 3, 5], 6, rank=0, world_size=1, shuffle=False)
            >>> list(sampler.micro_batch(1)), sampler.micro_batch(1).step
            ([0, 1], 1)
        """
        return micro_batch_of(
            self.plan,
            self.planner,
            self.rank,
            position,
            epoch=self._position.epoch,
            first_step=self._position.steps_before,
        )
