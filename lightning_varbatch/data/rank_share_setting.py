"""The shares a sampler plans its next epochs with, and the budgets they give.

Fixed shares come from ``PlanConfig.rank_shares``; a run may replace them
(:meth:`~lightning_varbatch.TokenBudgetBatchSampler.set_rank_shares`, e.g. from
:class:`~lightning_varbatch.callbacks.RankShareBalancer`). The planner cuts each rank's
micro-batches to the budgets they give (:func:`~.rank_shares.rank_budgets`). Shares a run sets
are raised where needed so that every rank's budget still holds the longest example, also at the
batch schedule's first fraction; fixed shares that cannot are refused when built, naming the rank.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> setting = RankShareSetting(EpochPlanner([30, 40, 50], PlanConfig(max_tokens=100)))
    >>> setting.budgets(2)
    (100, 100)
    >>> setting.set((1.0, 0.1), world_size=2)
    >>> setting.budgets(2)  # rank 1's budget raised to hold the longest example
    (100, 50)
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from lightning_varbatch.data.sampler_state import EpochPosition
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.rank_shares import check_rank_shares, rank_budgets

__all__ = ["LANE_PLANNERS", "RankShareSetting", "RankShares"]


class RankShareSetting:
    """The shares in force for the epochs a sampler plans next.

    Args:
        planner: the sampler's planner (one dataset, or a ``mixing="per_step"`` mixture).

    Attributes:
        shares: the shares (``None``: equal, or the memory budgets alone).
        set_by_run: whether a run set them (they are saved with the sampler's state).
    """

    def __init__(self, planner: Planner) -> None:
        self.planner = planner
        self.shares: tuple[float, ...] | None = planner.config.rank_shares
        self.set_by_run = False

    def set(self, shares: Sequence[float] | None, world_size: int) -> None:
        """Replace the shares (``None``: back to the config's).

        Raises:
            SettingValueError: a bad share (rank named), a wrong count, a ``"per_batch"`` mixture.
        """
        planner = self.planner
        if isinstance(planner, MixturePlanner):
            planner.refuse_lanes(given=True)
        checked = check_rank_shares(shares)
        if checked is not None and len(checked) != world_size:
            raise SettingValueError(
                f"set_rank_shares got {len(checked)} shares but world_size={world_size}: give "
                "one share per rank (rank 0 first).",
                setting="rank_shares",
                value=checked,
            )
        self.shares = planner.config.rank_shares if checked is None else checked
        self.set_by_run = checked is not None

    def restore(self, shares: Sequence[float] | None, world_size: int) -> None:
        """A run's saved shares (``None``: none set; of another world size: warned, dropped)."""
        if shares is None:
            return
        if len(shares) != world_size:
            warnings.warn(
                f"The sampler state holds shares a run set for {len(shares)} ranks "
                f"({list(shares)}); this run has {world_size}: the next epochs plan with "
                "rank_shares as set (a RankShareBalancer measures them again).",
                UserWarning,
                stacklevel=4,  # the caller of load_state_dict
            )
            return
        self.set(shares, world_size)

    def budgets(self, world_size: int) -> tuple[int, ...] | None:
        """Every rank's budget for ``world_size`` ranks (``None``: a planner without them).

        Equal ones are explicit too (``max_tokens`` each): a saved plan resumes as it was made.
        """
        planner = self.planner
        config = planner.config
        if not isinstance(planner, LANE_PLANNERS):
            return None
        if self.shares is None and config.rank_max_tokens is None:
            budgets = (config.max_tokens,) * world_size
        else:
            floor = 0
            if self.set_by_run:
                floor = (
                    planner.least_rank_budget
                    if isinstance(planner, EpochPlanner)
                    else planner.longest_cost
                )
            budgets = rank_budgets(
                config.max_tokens, world_size, self.shares, config.rank_max_tokens, floor=floor
            )
        if isinstance(planner, EpochPlanner):  # the schedule's first fraction holds them
            planner.check_schedule(budgets)
        return budgets


#: The planners that plan ranks of their own budgets (``plan_resumed(..., rank_budgets=)``).
LANE_PLANNERS = (EpochPlanner, MixturePlanner)


class RankShares:
    """The per-rank half of ``TokenBudgetBatchSampler``: the current and next budgets, shares."""

    planner: Planner
    world_size: int
    _position: EpochPosition
    _shares: RankShareSetting

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan (the sampler's)."""
        raise NotImplementedError

    @property
    def rank_budgets(self) -> tuple[int, ...]:
        """Every rank's micro-batch budget in the current plan (``max_tokens`` when equal)."""
        budget = self.plan.rank_budget
        if budget is None:
            return (self.planner.config.max_tokens,) * self.world_size
        return tuple(int(b) for b in budget)

    @property
    def rank_shares(self) -> tuple[float, ...] | None:
        """The ranks' shares in the current plan (largest 1), ``None`` when all are equal.

        They are the budgets' ratios: ``rank_shares`` as set, unless a rank's memory budget
        (``rank_max_tokens``) or the longest example moved them.

        Example:
            >>> from lightning_varbatch import TokenBudgetBatchSampler
            >>> s = TokenBudgetBatchSampler([5] * 40, 20, rank=0, world_size=2, rank_shares=[2, 1])
            >>> s.rank_budgets, s.rank_shares
            ((20, 10), (1.0, 0.5))
        """
        budget = self.plan.rank_budget
        if budget is None:
            return None
        return tuple(float(b) / float(budget.max()) for b in budget)

    def set_rank_shares(self, shares: Sequence[float] | None) -> None:
        """Plan the next epochs with these shares (relative speeds, one per rank).

        They take effect when the next epoch is first planned (at once if the current epoch
        has not started): the rest of an epoch keeps its plan, so no example is lost or
        repeated. A share too small for the longest example is raised to hold it. They are
        saved with :meth:`state_dict`. Every rank must set the same shares.

        Args:
            shares: one positive share per rank, or ``None`` for the config's (``rank_shares``).

        Raises:
            SettingValueError: a bad share (naming the rank), a wrong count, ``mixing="per_batch"``.

        Example:
            >>> from lightning_varbatch import TokenBudgetBatchSampler
            >>> s = TokenBudgetBatchSampler([5] * 40, 20, rank=0, world_size=2)
            >>> s.set_rank_shares([1.0, 0.5])
            >>> s.rank_budgets
            (20, 10)
        """
        self._shares.set(shares, self.world_size)
        position = self._position
        if not position.consumed and not position.history and not position.restored:
            position.budgets_set = False
