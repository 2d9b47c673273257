"""One epoch's plan: optimizer steps × ranks × micro-batches of example ids.

Every rank computes the same plan and reads its own slice: equal micro-batch counts by
construction. ``EpochPlanner._plan`` is the epoch's pipeline, each policy in its order: (1)
order: sorted once (:mod:`~.sorted_cut`; pairs two-sided, :mod:`~.pair_order`), shuffled
within buckets; (2) budgets: one, or each rank's (:mod:`~.lane_budgets`); (3) cut to them
(cached; packed rows :mod:`~.packed_rows`, lanes :mod:`~.rank_lanes`); (4) tail
(:mod:`~.tail`) and (5) steps; (6) warm-up caps (:mod:`~.warmup_plan`); (7) deal, steps
shuffled (:mod:`~.dealing`); then ``plan`` (8) re-plans the steps before the batch schedule
reaches 1 (:mod:`~.scheduled_plan`). ``docs/planning.md`` explains each.

Example:
    >>> from lightning_varbatch.planner import plan_epoch
    >>> plan = plan_epoch(np.array([3, 5, 2, 7, 4, 6]), max_tokens=10, world_size=2)
    >>> plan.num_micro_batches_per_rank, sorted(plan.example_ids().tolist())
    (2, [0, 1, 2, 3, 4, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.batch_schedule import BatchSchedule
from lightning_varbatch.planner.dealing import deal_run, order_steps
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_resume import EpochResume
from lightning_varbatch.planner.lane_budgets import lane_budgets, single_example_cost
from lightning_varbatch.planner.lengths import PreparedLengths, prepare_lengths
from lightning_varbatch.planner.packed_rows import cuts_each_epoch, exact_groups, packed_cut
from lightning_varbatch.planner.pair_order import with_pair_work
from lightning_varbatch.planner.rank_lanes import Lane, lane_config, lane_cuts, lane_plan
from lightning_varbatch.planner.scheduled_plan import (
    fraction_budgets,
    least_budget,
    schedule_epoch,
)
from lightning_varbatch.planner.settings import PlanConfig, TailPolicy, check_config
from lightning_varbatch.planner.settings_identity import pair_fingerprint
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups
from lightning_varbatch.planner.tail import effective_tail, select_micro_batches, tail_cut
from lightning_varbatch.planner.warmup_plan import check_warmup_acts, warmup_caps

__all__ = ["EpochPlan", "EpochPlanner", "PlanConfig"]


class EpochPlanner(EpochResume):
    """Plans epochs over fixed lengths, caching the sort and the cut between epochs.

    Args:
        lengths: ``(n,)`` lengths, or ``(n, 2)`` (source, target) lengths; pairs are planned by
            ``max(source, target)`` (fairseq's rule) and count target tokens as loss tokens.
        config: the planner settings.
        loss_lengths: loss tokens per example, if not the lengths (1-D) or target column (pairs).
        rotate_ranks: give the ranks each step's micro-batches in a random order (for plans of
            few steps, such as a stream's windows). Off by default: it changes the plan.

    Raises:
        ValueError: for bad lengths or an example over the budget (see :class:`PlanConfig`).

    Example:
        >>> planner = EpochPlanner(np.array([[3, 4], [9, 2], [5, 5]]), PlanConfig(max_tokens=12))
        >>> plan = planner.plan(epoch=0, world_size=1)
        >>> int(plan.step_tokens.sum())  # target tokens of the whole epoch
        11
    """

    def __init__(
        self,
        lengths: npt.ArrayLike,
        config: PlanConfig,
        loss_lengths: npt.ArrayLike | None = None,
        *,
        rotate_ranks: bool = False,
    ) -> None:
        self.config = config = check_config(config)
        self.rotate_ranks = bool(rotate_ranks)
        self.prepared: PreparedLengths = prepare_lengths(lengths, config, loss_lengths)
        if config.layout == "packed" and self.prepared.pairs:
            raise SettingValueError(
                "layout='packed' concatenates each example's tokens into one row, so it needs "
                "one length per example, got (source, target) pairs: pass the length of the "
                "packed sequence (e.g. source + target for a decoder-only model), or use "
                "layout='padded' for pairs.",
                setting="layout",
                value=config.layout,
            )
        if config.length_warmup is not None and self.num_planned:
            longest = int(self.prepared.planned_key.max())
            check_warmup_acts(config, [longest], [config.length_warmup_min], ["data"])
        self._exact_totals = (
            not self.prepared.pairs
            and loss_lengths is None
            and config.loss_offset == 0
            and config.bucket_width == 1
            and config.max_shapes is None
        )
        self._groups: SortedGroups | None = None
        self._shape_lengths: np.ndarray | None = None
        self._cuts: dict[tuple[int, int], SortedCut] = {}
        self._longest_cost: int | None = None
        self._lane_cache: tuple[tuple[Any, ...], list[Lane]] | None = None  # last budgets'
        self._last: tuple[tuple[Any, ...], EpochPlan] | None = None  # plan_resumed's last plan
        self._epoch_tokens: int | None = None
        self._pair_width: float | None = None
        self.check_schedule()

    @property
    def num_examples(self) -> int:
        """Examples in the dataset, skipped ones included."""
        return self.prepared.num_examples

    @property
    def num_planned(self) -> int:
        """Examples that take part in every epoch (all but the skipped ones)."""
        kept = self.prepared.kept
        return self.num_examples if kept is None else int(kept.shape[0])

    @property
    def num_micro_batches(self) -> int:
        """Micro-batches of one pass before the tail policy (packed, wide buckets: ± a few)."""
        return self._cut().num_micro_batches

    @property
    def num_skipped(self) -> int:
        """Examples left out of every epoch by ``oversize="skip"`` (0 otherwise)."""
        return self.prepared.num_skipped

    @property
    def num_truncated(self) -> int:
        """Examples cut to :attr:`truncate_to` by ``oversize="truncate"`` (0 otherwise)."""
        return self.prepared.num_truncated

    @property
    def truncate_to(self) -> int | None:
        """Length over-budget examples are cut to (``oversize="truncate"``), else ``None``."""
        return self.prepared.truncate_to

    @property
    def names(self) -> list[str]:
        """The dataset's name, as a one-dataset mixture would name it: ``["0"]``."""
        return ["0"]

    @property
    def offsets(self) -> np.ndarray:
        """``[0, num_examples]``: the one dataset's ids (as a mixture's offsets)."""
        return np.array([0, self.num_examples], dtype=np.int64)

    def dataset_truncate_to(self, dataset: int) -> int | None:
        """Truncation length of ``dataset`` (a single dataset: always :attr:`truncate_to`)."""
        del dataset
        return self.truncate_to

    def fingerprint(self) -> str:
        """A short hash of the settings that change the plan (for checkpoint checks)."""
        return pair_fingerprint(
            self.config.fingerprint(), self.prepared.pairs, self.config.pair_order
        )

    @property
    def groups(self) -> SortedGroups:
        """The sorted order of all planned examples (computed once)."""
        if self._groups is None:
            self._groups = self._groups_of(self.prepared.kept)
        return self._groups

    def _cut(self, tail: TailPolicy = "pad", multiple: int = 1, budget: int = 0) -> SortedCut:
        """Cached cut of planned examples per ``tail``, step size, ``budget`` (0: max_tokens)."""
        config = self.config if not budget else lane_config(self.config, budget)
        if (budget, 1) not in self._cuts:
            if cuts_each_epoch(config):  # the rows of the sorted order, unshuffled
                exact = exact_groups(self.groups.ids, self.prepared.key)
                self._cuts[budget, 1] = packed_cut(exact, config)
            else:
                self._cuts[budget, 1] = SortedCut.build(self.groups, config)
        key = (budget, multiple if tail == "spread" else 1)
        if key not in self._cuts:
            self._cuts[key] = tail_cut(self._cuts[budget, 1], self.groups, tail, key[1], config)
        return self._cuts[key]

    def plan(
        self,
        epoch: int,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        *,
        exclude: np.ndarray | None = None,
        salt: int = 0,
        first_step: int = 0,
        cap_floor: int = 0,
        rank_budgets: Sequence[int] | None = None,
        remainder: bool = False,
    ) -> EpochPlan:
        """Plan one epoch.

        Args:
            epoch: the epoch (the plan depends only on ``config.seed``, ``epoch`` and ``salt``).
            world_size: number of ranks.
            accumulate_grad_batches: micro-batches per rank per optimizer step.
            exclude: mask over all examples; ``True``: left out (re-planning an interrupted epoch).
            salt: extra randomness for re-plans, so they differ from the original plan.
            first_step: the run's optimizer step of the plan's first step (for the warm-up).
            cap_floor: the length warm-up's cap already reached before ``first_step``.
            rank_budgets: each rank's budget (``None``: the config's); unequal: :mod:`~.rank_lanes`.
            remainder: the lengths are an epoch's rest (a mixture's re-plan): re-plan rules apply.

        Returns:
            The plan.

        Raises:
            ValueError: ``world_size``/``accumulate_grad_batches`` < 1, or more ranks than batches.
        """
        epoch = check_count("epoch", epoch, minimum=0)
        world = check_count("world_size", world_size)
        acc = check_count("accumulate_grad_batches", accumulate_grad_batches)
        args = (epoch, world, acc, salt, first_step, cap_floor, rank_budgets)
        groups = self.groups if exclude is None else self._groups_without(exclude)
        if groups.size == 0 and exclude is not None:
            return self._empty_plan(epoch, world, acc)
        replanned = exclude is not None or remainder
        plan = self._plan(groups, args, replanned)
        if self.config.batch_schedule is None or plan.num_steps == 0:
            return plan
        full = (
            (self.config.max_tokens,) * world
            if plan.rank_budget is None
            else tuple(int(b) for b in plan.rank_budget)
        )

        def part(ids: np.ndarray, fraction: float, tail: str | None, stage: int) -> EpochPlan:
            scaled = (
                full if fraction == 1.0 else fraction_budgets(full, fraction, self.longest_cost)
            )
            sub_args = (*args[:3], 10_000 + 1_000 * salt + stage + 1, 0, 0, scaled)
            return self._plan(self._groups_of(np.sort(ids)), sub_args, True, cast(TailPolicy, tail))

        return schedule_epoch(
            plan,
            BatchSchedule.parse(self.config.batch_schedule),
            epoch * self.epoch_tokens + self._tokens_of(exclude),
            self.prepared.key,
            part,
            effective_tail(self.config, groups.size, world, acc, replanned=replanned),
            full,
        )

    @property
    def epoch_tokens(self) -> int:
        """Planning tokens of one epoch (every planned example once): the schedule's clock."""
        if self._epoch_tokens is None:
            self._epoch_tokens = int(self.prepared.planned_key.sum(dtype=np.int64))
        return self._epoch_tokens

    def _tokens_of(self, exclude: np.ndarray | None) -> int:
        """Planning tokens of the planned examples ``exclude`` marks (consumed before)."""
        if exclude is None:
            return 0
        kept = self.prepared.kept
        marked = np.flatnonzero(exclude) if kept is None else kept[exclude[kept]]
        return int(self.prepared.key[marked].sum(dtype=np.int64))

    def _plan(
        self,
        groups: SortedGroups,
        args: tuple[Any, ...],
        replanned: bool,
        policy: TailPolicy | None = None,
    ) -> EpochPlan:
        """:meth:`plan` of ``groups`` without the schedule (``policy``: a part's tail)."""
        epoch, world, acc, salt, first_step, cap_floor, rank_budgets = args
        wa = world * acc
        cfg = self.config
        tail = effective_tail(cfg, groups.size, world, acc, replanned=replanned, policy=policy)
        rng = np.random.default_rng([cfg.seed, epoch, salt])
        order = groups.ids.copy()  # (1) order: sorted once, shuffled within buckets
        if cfg.shuffle:
            starts = groups.shuffle_starts
            for g in np.flatnonzero(np.diff(starts) > 1):
                rng.shuffle(order[starts[g] : starts[g + 1]])
        budgets = lane_budgets(cfg, world, rank_budgets, lambda: self.longest_cost)  # (2)
        caps = warmup_caps(cfg, self.prepared, epoch, first_step)  # (6) warm-up caps
        floor = check_count("cap_floor", cap_floor, minimum=0)
        key, shapes = self.prepared.key, None
        # dealt by a work: packed rows' FLOPs, two-sided pairs' slots (with_pair_work)
        pair_work = self.prepared.diff is not None and cfg.pair_order == "two_sided"
        if budgets is not None and len(set(budgets)) > 1:
            lanes = self._lanes(groups, order, budgets, replanned, acc)  # (3) cut per lane
            planned = lane_plan(lanes, order, cfg, acc, tail, rng, replanned)  # (4), (5)
            order, cut = planned.order, planned.cut
            warm = None if caps is None else (caps, floor, order, first_step)
            cut = with_pair_work(cut, order, self.prepared, cfg)
            assign, trace = order_steps(cut, planned.steps(acc), rng, cfg, key, warm)  # (7)
            dropped, duplicated = planned.num_dropped, planned.num_duplicated
        else:
            budget = 0 if budgets is None else budgets[0]  # one budget below max_tokens: no lanes
            cut_config = cfg if not budget else lane_config(cfg, budget)
            if cuts_each_epoch(cfg):  # packed rows cut on this epoch's exact lengths
                groups = exact_groups(order, key)
                cut = tail_cut(packed_cut(groups, cut_config), groups, tail, wa, cut_config)
            elif replanned:
                cut = tail_cut(SortedCut.build(groups, cut_config), groups, tail, wa, cut_config)
            else:
                cut = self._cut(tail, wa, budget)  # (3), (4): cut and tail, cached
            cut = with_pair_work(cut, order, self.prepared, cfg)
            selected = select_micro_batches(cut, tail, world, acc, rng, cfg, replanned)  # (5)
            warm = None if caps is None else (caps, floor, order, first_step)
            run = selected.micro_batches
            assign, trace = deal_run(  # (7) deal, steps shuffled
                cut, run, (world, acc), rng, cfg, key, warm, rotate=self.rotate_ranks
            )
            dropped, duplicated = selected.num_dropped, selected.num_duplicated
            shapes = self._micro_batch_shapes(groups, cut)
        plan = EpochPlan(
            epoch=epoch,
            world_size=world,
            accumulate_grad_batches=acc,
            order=order,
            micro_batch_start=cut.starts,
            micro_batch_size=cut.sizes,
            micro_batch_cost=cut.cost,
            micro_batch_work=cut.work if cfg.layout == "packed" or pair_work else None,
            micro_batch_shape=shapes,
            assign=assign,
            num_dropped=dropped,
            num_duplicated=duplicated,
            num_skipped=self.prepared.num_skipped,
            num_truncated=self.prepared.num_truncated,
            rank_budget=None if budgets is None else np.asarray(budgets, dtype=np.int64),
            _loss=self.prepared.loss,
            _exact_tokens=cut.total if self._exact_totals else None,
        )
        if trace is not None:
            object.__setattr__(plan, "length_warmup", trace)
        return plan

    def _lanes(
        self,
        groups: SortedGroups,
        order: np.ndarray,
        budgets: tuple[int, ...],
        replanned: bool,
        acc: int,
    ) -> list[Lane]:
        """The lanes of ``budgets`` (cut once and reused, as the one-budget cut is)."""
        cut = (groups, order, self.prepared.key, budgets, self.config, acc)
        if replanned or cuts_each_epoch(self.config):
            return lane_cuts(*cut)
        if self._lane_cache is None or self._lane_cache[0] != (budgets, acc):
            self._lane_cache = ((budgets, acc), lane_cuts(*cut))
        return self._lane_cache[1]

    def check_schedule(self, budgets: Sequence[int] | None = None) -> None:
        """Refuse ``budgets`` (``None``: the settings') too small at the first fraction.

        Raises:
            SettingValueError: naming ``batch_schedule`` (see :func:`fraction_budgets`).
        """
        if self.config.batch_schedule is not None and self.num_planned:
            if budgets is None:
                cfg = self.config
                world = len(cfg.rank_shares or cfg.rank_max_tokens or (0,))
                budgets = cfg.rank_budgets(world) or (cfg.max_tokens,)
            smallest = BatchSchedule.parse(self.config.batch_schedule).smallest
            fraction_budgets(tuple(int(b) for b in budgets), smallest, self.longest_cost)

    @property
    def least_rank_budget(self) -> int:
        """The least rank budget: the longest example's cost at the first fraction."""
        if self.config.batch_schedule is None:
            return self.longest_cost
        smallest = BatchSchedule.parse(self.config.batch_schedule).smallest
        return least_budget(self.longest_cost, smallest)

    @property
    def longest_cost(self) -> int:
        """The cost of the longest planned example alone: no rank's budget may be lower."""
        if self._longest_cost is None:
            self._longest_cost = single_example_cost(self.prepared, self.config)
        return self._longest_cost
