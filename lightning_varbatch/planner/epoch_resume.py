"""The resume side of the epoch planner: the rest of an epoch after topology changes.

:meth:`EpochResume.plan_resumed` replays the epoch's history (each earlier topology's plan made
again, its consumed micro-batches counted), plans the examples none consumed for the current
topology (``plan(exclude=...)``) and passes it the guard, :func:`~.remainder_guard.guard_remainder`.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> planner = EpochPlanner(np.arange(1, 41), PlanConfig(max_tokens=60))
    >>> rest = planner.plan_resumed(0, 2, 1, [(3, 1, 2)])  # 2 micro-batches on 3 ranks, then 2
    >>> done = planner.plan(0, 3).consumed_ids(2)
    >>> sorted([*done.tolist(), *rest.example_ids().tolist()]) == list(range(40))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.lane_budgets import uniform
from lightning_varbatch.planner.pair_buckets import pair_width
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.remainder_guard import guard_remainder
from lightning_varbatch.planner.resume_inputs import check_exclude, check_history
from lightning_varbatch.planner.shape_budget import ShapeBudget
from lightning_varbatch.planner.sorted_cut import SortedGroups
from lightning_varbatch.planner.warmup_plan import warmup_position

__all__ = ["EpochResume"]


class EpochResume(ShapeBudget):
    """The resuming part of ``EpochPlanner``; uses its ``plan`` and ``_last`` (last resumed)."""

    plan: Callable[..., EpochPlan]
    _last: tuple[tuple[Any, ...], EpochPlan] | None
    _pair_width: float | None  # pairs' bucket width (pair_buckets), chosen at the first build

    def plan_resumed(
        self,
        epoch: int,
        world_size: int,
        accumulate_grad_batches: int,
        history: Sequence[tuple[Any, ...]] = (),
        *,
        rank_budgets: Sequence[int] | None = None,
    ) -> EpochPlan:
        """Plan what is left of ``epoch`` after topology changes.

        Args:
            epoch: the epoch.
            world_size: the current number of ranks.
            accumulate_grad_batches: the current accumulation.
            history: ``(world_size, accumulate_grad_batches, consumed micro-batches per rank)``
                of each earlier topology, oldest first, optionally with its plan's rank budgets.
            rank_budgets: the ranks' budgets for the rest of the epoch (``None``: the config's).

        Returns:
            The plan of the examples earlier topologies did not consume (all if no ``history``).
        """
        history = check_history(history)
        given = self.config.rank_budgets(world_size) if rank_budgets is None else rank_budgets
        budgets = None if given is None else tuple(int(b) for b in given)
        same = None if budgets is None or uniform(budgets, self.config.max_tokens) else budgets
        key = (epoch, world_size, accumulate_grad_batches, tuple(history), same)
        if self._last is not None and self._last[0] == key:
            # In one process (tests, simulations, a DataModule's check) ranks share the plan
            return self._last[1]
        plan = self._plan_rest(epoch, world_size, accumulate_grad_batches, history, budgets)
        self._last = (key, plan)  # the sampler holds the same plan: no extra memory
        return plan

    def _plan_rest(
        self,
        epoch: int,
        world_size: int,
        accumulate_grad_batches: int,
        history: list[tuple[Any, ...]],
        rank_budgets: tuple[int, ...] | None,
    ) -> EpochPlan:
        """:meth:`plan_resumed` without its cache."""
        exclude: np.ndarray | None = None
        counts = np.zeros(self.prepared.num_examples, dtype=np.int32)  # runs of each example
        first, floor = 0, 0  # where the length warm-up stands
        for depth, (world, acc, consumed, *budgets) in enumerate(history):
            done = self.plan(
                epoch,
                world,
                acc,
                exclude=exclude,
                salt=depth,
                first_step=first,
                cap_floor=floor,
                rank_budgets=budgets[0] if budgets else None,
            )
            np.add.at(counts, done.consumed_ids(consumed), 1)
            exclude = counts > 0
            first, floor = warmup_position(done, consumed, first, floor)
        plan = self.plan(
            epoch,
            world_size,
            accumulate_grad_batches,
            exclude=exclude,
            salt=len(history),
            first_step=first,
            cap_floor=floor,
            rank_budgets=rank_budgets,
        )
        if history:
            guard_remainder(cast(Planner, self), plan, consumed=counts)
        return plan

    def _groups_without(self, exclude: np.ndarray) -> SortedGroups:
        """The sorted order of the planned examples that ``exclude`` does not mark."""
        exclude = check_exclude(exclude, self.prepared.num_examples)
        kept = self.prepared.kept
        return self._groups_of(np.flatnonzero(~exclude) if kept is None else kept[~exclude[kept]])

    def _groups_of(self, ids: np.ndarray | None) -> SortedGroups:
        """The sorted order of the planned examples ``ids`` (sorted ids; ``None``: all)."""
        diff = self.prepared.diff if self.config.pair_order == "two_sided" else None
        if self._pair_width is None:  # chosen once, on all the data: every re-plan keeps it
            self._pair_width = pair_width(self.prepared, self.config)
        return SortedGroups.build(
            self.prepared.key,
            ids,
            self.config.bucket_width,
            self.shape_lengths,
            diff,
            self._pair_width,
        )

    def _empty_plan(self, epoch: int, world: int, acc: int) -> EpochPlan:
        """The rest of an epoch that its earlier topologies consumed whole."""
        empty = np.zeros(0, dtype=np.int64)
        return EpochPlan(
            epoch=epoch,
            world_size=world,
            accumulate_grad_batches=acc,
            order=empty.astype(np.int32),
            micro_batch_start=empty,
            micro_batch_size=empty,
            micro_batch_cost=empty.astype(np.float64),
            assign=np.zeros((0, world, acc), dtype=np.int64),
            micro_batch_shape=None if self.shapes is None else np.zeros((0, 2), dtype=np.int64),
            num_skipped=self.prepared.num_skipped,
            num_truncated=self.prepared.num_truncated,
        )
