"""The ranks of a mixture: their budgets, and the rest of an epoch after topology changes.

Ranks of their own budgets plan each dataset's steps in lanes at its ``max_tokens`` scale
(``mixing="per_batch"``: refused); a resume re-plans per dataset what earlier topologies did not run
(:mod:`~.epoch_resume`), through :mod:`~.remainder_guard`.

Example:
    >>> from lightning_varbatch.planner import MixturePlanner, PlanConfig
    >>> planner = MixturePlanner([np.full(40, 4), np.full(20, 8)], PlanConfig(max_tokens=16))
    >>> rest = planner.plan_resumed(0, 2, 1, [(1, 1, 3)])  # 3 micro-batches on 1 rank, then 2
    >>> done = planner.plan(0, 1).consumed_ids(3)
    >>> sorted([*done.tolist(), *rest.example_ids().tolist()]) == list(range(60))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, cast

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.interleave import Part
from lightning_varbatch.planner.lane_budgets import check_budgets_hold, uniform
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.mixture_datasets import MixingPolicy
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.rank_shares import scaled_budgets
from lightning_varbatch.planner.remainder_guard import guard_remainder
from lightning_varbatch.planner.resume_inputs import check_history
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.warmup_plan import warmup_position

__all__ = ["MixtureTopology"]


class MixtureTopology:
    """The part of :class:`~lightning_varbatch.planner.mixture.MixturePlanner` that handles ranks.

    Needs the mixture's ``config``, ``mixing``, ``planners``, ``offsets``, ``prepared``,
    ``steps_per_epoch`` and planning steps (``plan``, ``_part``, ``_compose``, ``_warm``).
    """

    config: PlanConfig
    mixing: MixingPolicy
    planners: list[EpochPlanner]
    offsets: np.ndarray
    steps_per_epoch: int | None
    plan: Callable[..., EpochPlan]
    _part: Callable[[int, EpochPlan, np.ndarray | int], Part]
    _compose: Callable[..., EpochPlan]
    _warm: Callable[[EpochPlan, int, int], EpochPlan]

    @property
    def prepared(self) -> PreparedLengths:
        """All datasets' lengths in global id order (the mixture's own)."""
        raise NotImplementedError

    def refuse_lanes(self, given: bool = False) -> None:
        """Refuse own rank budgets (``given``: a run's shares) with ``mixing="per_batch"``."""
        config = self.config
        own = given or config.rank_shares is not None or config.rank_max_tokens is not None
        if self.mixing != "per_batch" or not own:
            return
        raise SettingValueError(
            "rank_shares / rank_max_tokens cut each rank's micro-batches to its own budget, "
            "which mixing='per_batch' would re-deal over the ranks: use mixing='per_step' "
            "with per-rank budgets, or unset them.",
            setting="mixing",
            value=self.mixing,
        )

    @property
    def longest_cost(self) -> int:
        """The least common-scale budget a rank may have: every dataset's longest must fit."""
        common = self.config.max_tokens
        return max(-(-p.longest_cost * common // p.config.max_tokens) for p in self.planners)

    def _budgets(self, world: int, given: Sequence[int] | None) -> tuple[int, ...] | None:
        """The ranks' common-scale budgets: ``given``, else the config's (``None``: equal)."""
        budgets = self.config.rank_budgets(world) if given is None else tuple(map(int, given))
        if uniform(budgets, self.config.max_tokens):
            return None
        self.refuse_lanes(given=True)
        assert budgets is not None
        check_budgets_hold(budgets, self.longest_cost, self.config)  # named in common terms
        return budgets

    def _dataset_budgets(
        self, dataset: int, budgets: tuple[int, ...] | None
    ) -> tuple[int, ...] | None:
        """The ranks' budgets in dataset ``dataset``'s own budget (:func:`scaled_budgets`)."""
        if budgets is None:
            return None
        own = self.planners[dataset].config.max_tokens
        return scaled_budgets(budgets, own, self.config.max_tokens)

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

        As ``EpochPlanner.plan_resumed`` (the same arguments): the micro-batches the earlier
        topologies did not run are re-planned per dataset for the new one (repeats included, so
        upsampling survives the change); the shares of the rest of the epoch stay what they were.
        """
        history = check_history(history)
        if not history:
            return self.plan(epoch, world_size, accumulate_grad_batches, rank_budgets=rank_budgets)
        world, acc, consumed, *budgets = history[0]
        plan = self.plan(epoch, world, acc, rank_budgets=budgets[0] if budgets else None)
        counts = np.zeros(int(self.offsets[-1]), dtype=np.int32)  # runs of each example so far
        first, floor = 0, 0  # where the length warm-up stands (the run's step, its level)
        later = [*history[1:], (world_size, accumulate_grad_batches, 0, rank_budgets)]
        for depth, (world, acc, next_consumed, *budgets) in enumerate(later, start=1):
            done, left = plan.consumed_micro_batches(consumed)
            np.add.at(counts, plan.ids_of_micro_batches(done), 1)
            first, floor = warmup_position(plan, consumed, first, floor)
            given = budgets[0] if budgets else None
            plan = self._plan_remainder(
                plan, left, epoch, world, acc, salt=depth, budgets=given, consumed=counts
            )
            plan = self._warm(plan, first, floor)
            consumed = next_consumed
        guard_remainder(cast(Planner, self), plan, consumed=counts)
        return plan

    def _plan_remainder(
        self,
        plan: EpochPlan,
        micro_batches: np.ndarray,
        epoch: int,
        world: int,
        acc: int,
        salt: int,
        budgets: Sequence[int] | None = None,
        consumed: np.ndarray | None = None,
    ) -> EpochPlan:
        """Re-plan the rest of the epoch for a new topology.

        One pass re-plans every planned example not ``consumed``; a sampled epoch
        (``steps_per_epoch``) the examples of ``micro_batches`` not run yet, repeats kept.
        """
        common = self._budgets(world, budgets)
        if self.steps_per_epoch is None and consumed is not None:
            kept = self.prepared.kept
            ids = np.flatnonzero(consumed == 0) if kept is None else kept[consumed[kept] == 0]
        else:
            ids = plan.ids_of_micro_batches(micro_batches).astype(np.int64)
        owner = np.searchsorted(self.offsets, ids, side="right") - 1
        parts = []
        for i in np.unique(owner).tolist():
            occ = ids[owner == i]
            local = occ - int(self.offsets[i])
            prep, cfg = self.planners[i].prepared, self.planners[i].config
            # the loss tokens are counted already: no offset to derive them again
            sub = EpochPlanner(
                prep.key[local], replace(cfg, loss_offset=0), loss_lengths=prep.loss[local]
            )
            shape_lengths = self.planners[i].shape_lengths
            if shape_lengths is not None:
                sub.use_shape_lengths(shape_lengths)  # the epoch's shapes, not the rest's
            sub_plan = sub.plan(
                epoch,
                world,
                acc,
                salt=salt,
                rank_budgets=self._dataset_budgets(i, common),
                remainder=True,
            )
            parts.append(self._part(i, sub_plan, occ))
        return self._compose(parts, epoch, world, acc, salt=salt, budgets=common)
