"""One epoch's plan: optimizer steps × ranks × micro-batches of example ids.

Pure numpy, no torch.distributed and no Lightning: every rank computes the same plan from the
same ``(lengths, config, epoch, world_size, accumulate_grad_batches)`` and reads its own slice,
so every rank gets the same number of micro-batches by construction.

How a plan is made (see ``docs/planning.md`` for the reasoning):

1. Examples are sorted by decreasing (bucketed) length once; the sorted order is cut greedily
   into micro-batches that fit ``max_tokens`` (:mod:`lightning_varbatch.planner.sorted_cut`).
   This depends only on the lengths, so it is cached and reused every epoch.
2. Each epoch, examples of equal bucket are shuffled among themselves (batch composition
   changes, padding does not), the tail policy (:mod:`lightning_varbatch.planner.tail`) makes
   the number of micro-batches a multiple of ``world_size * accumulate_grad_batches``,
   consecutive micro-batches form one optimizer step (similar shapes on every rank: no
   stragglers), a step's micro-batches are dealt to ranks largest first to the least-loaded
   rank (balanced load, :mod:`lightning_varbatch.planner.dealing`), and the steps are shuffled.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch.planner.epoch_planner import plan_epoch
    >>> plan = plan_epoch(np.array([3, 5, 2, 7, 4, 6]), max_tokens=10, world_size=2)
    >>> plan.num_micro_batches_per_rank, sorted(plan.example_ids().tolist())
    (2, [0, 1, 2, 3, 4, 5])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.dealing import deal_steps
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.length_warmup import LengthWarmupTrace, light_steps, warmup_order
from lightning_varbatch.planner.lengths import PreparedLengths, prepare_lengths
from lightning_varbatch.planner.packed_rows import cuts_each_epoch, exact_groups, packed_cut
from lightning_varbatch.planner.rank_lanes import (
    Lane,
    lane_budgets,
    lane_config,
    lane_cuts,
    lane_plan,
    single_example_cost,
    uniform,
)
from lightning_varbatch.planner.remainder_guard import guard_remainder
from lightning_varbatch.planner.resume_inputs import check_exclude, check_history
from lightning_varbatch.planner.settings import PlanConfig, TailPolicy
from lightning_varbatch.planner.shape_budget import ShapeBudget
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups
from lightning_varbatch.planner.tail import effective_tail, select_micro_batches, tail_cut
from lightning_varbatch.planner.warmup_plan import (
    check_warmup_acts,
    step_longest,
    warmup_caps,
    warmup_position,
)

__all__ = ["EpochPlan", "EpochPlanner", "PlanConfig", "plan_epoch"]


class EpochPlanner(ShapeBudget):
    """Plans epochs over fixed lengths, caching the sort and the cut between epochs.

    Args:
        lengths: ``(n,)`` lengths, or ``(n, 2)`` (source, target) lengths; pairs are planned by
            ``max(source, target)`` (fairseq's rule) and count target tokens as loss tokens.
        config: the planner settings.
        loss_lengths: loss tokens per example, when they are not the lengths (1-D) or the
            target column (pairs).
        rotate_ranks: give the ranks each step's micro-batches in a random order (a plan of
            few steps, such as a window of a stream, would otherwise give rank 0 the largest
            micro-batch of every step). Off by default: it changes the plan.

    Raises:
        ValueError: for bad lengths or an example over the budget (see :class:`PlanConfig`).

    Example:
        >>> import numpy as np
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
        if not isinstance(config, PlanConfig):
            raise SettingTypeError(
                f"config must be a PlanConfig, got {type(config).__name__} {config!r:.60}; "
                "pass config=PlanConfig(max_tokens=...) (e.g. PlanConfig(**settings) for a "
                "dict).",
                setting="config",
                value=config,
            )
        self.config = config
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
            kept = self.prepared.kept
            key = self.prepared.key if kept is None else self.prepared.key[kept]
            check_warmup_acts(config, [int(key.max())], [config.length_warmup_min], ["data"])
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
        """Micro-batches of one pass before the tail policy (the data's size in budgets).

        With packed rows over buckets wider than 1, each epoch cuts its own rows
        (:mod:`~lightning_varbatch.planner.packed_rows`): this is the count of the sorted
        order's, which an epoch's may differ from by a few.
        """
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
        return self.config.fingerprint()

    @property
    def groups(self) -> SortedGroups:
        """The sorted order of all planned examples (computed once)."""
        if self._groups is None:
            self._groups = SortedGroups.build(
                self.prepared.key, self.prepared.kept, self.config.bucket_width, self.shape_lengths
            )
        return self._groups

    def _cut(self, tail: TailPolicy = "pad", multiple: int = 1, budget: int = 0) -> SortedCut:
        """The cut of all planned examples under ``tail`` (cached per step size and budget).

        ``budget``: every rank's budget when it is below ``max_tokens`` (0: ``max_tokens``).
        """
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
            exclude: boolean mask over all examples; ``True`` ones are left out (resume with
                another world size re-plans what an interrupted epoch has not consumed).
            salt: extra randomness for re-plans, so they differ from the original plan.
            first_step: the run's optimizer step the plan's first step is (a re-planned
                remainder of epoch 0 continues the length warm-up there).
            cap_floor: the length warm-up's cap already reached before ``first_step``.
            rank_budgets: each rank's micro-batch budget (``None``: the config's,
                :meth:`PlanConfig.rank_budgets`, which is ``max_tokens`` on every rank unless
                ``rank_shares`` / ``rank_max_tokens`` are set); unequal budgets plan in lanes
                (:mod:`~lightning_varbatch.planner.rank_lanes`).
            remainder: these lengths are the rest of an epoch (a mixture's re-plan), as with
                ``exclude``: the tail policy's rule for re-plans applies
                (:func:`~lightning_varbatch.planner.tail.effective_tail`).

        Returns:
            The plan.

        Raises:
            ValueError: for a non-positive ``world_size`` / ``accumulate_grad_batches``, or when
                the data cannot give every rank a micro-batch (more ranks than batches).
        """
        epoch = check_count("epoch", epoch, minimum=0)
        world = check_count("world_size", world_size)
        acc = check_count("accumulate_grad_batches", accumulate_grad_batches)
        wa = world * acc
        cfg = self.config
        groups = self.groups if exclude is None else self._groups_without(exclude)
        if groups.size == 0 and exclude is not None:
            return self._empty_plan(epoch, world, acc)
        replanned = exclude is not None or remainder
        tail = effective_tail(cfg, groups.size, world, acc, replanned=replanned)
        rng = np.random.default_rng([cfg.seed, epoch, salt])
        order = groups.ids.copy()
        if cfg.shuffle:
            starts = groups.starts
            for g in np.flatnonzero(np.diff(starts) > 1):
                rng.shuffle(order[starts[g] : starts[g + 1]])
        budgets = lane_budgets(cfg, world, rank_budgets, lambda: self.longest_cost)
        caps = warmup_caps(cfg, self.prepared, epoch, first_step)
        floor = check_count("cap_floor", cap_floor, minimum=0)
        if budgets is not None and len(set(budgets)) > 1:
            lanes = lane_plan(
                self._lanes(groups, order, budgets, replanned, acc),
                order,
                cfg,
                acc,
                tail,
                rng,
                replanned,
            )
            warm = None if caps is None else (caps, floor, lanes.order, first_step)
            assign, trace = self._order_steps(lanes.cut, lanes.steps(acc), rng, warm)
            return self._epoch_plan(
                epoch,
                world,
                acc,
                lanes.order,
                lanes.cut,
                assign,
                trace,
                dropped=lanes.num_dropped,
                duplicated=lanes.num_duplicated,
                rank_budget=np.asarray(budgets, dtype=np.int64),
            )
        budget = 0 if budgets is None else budgets[0]  # one budget below max_tokens: no lanes
        cut_config = cfg if not budget else lane_config(cfg, budget)
        if cuts_each_epoch(cfg):  # packed rows cut on this epoch's exact lengths
            groups = exact_groups(order, self.prepared.key)
            cut = tail_cut(packed_cut(groups, cut_config), groups, tail, wa, cut_config)
        elif replanned:
            cut = tail_cut(SortedCut.build(groups, cut_config), groups, tail, wa, cut_config)
        else:
            cut = self._cut(tail, wa, budget)
        selected = select_micro_batches(cut, tail, world, acc, rng, cfg, replanned)
        warm = None if caps is None else (caps, floor, order, first_step)
        assign, trace = self._deal(cut, selected.micro_batches, world, acc, rng, warm)
        return self._epoch_plan(
            epoch,
            world,
            acc,
            order,
            cut,
            assign,
            trace,
            dropped=selected.num_dropped,
            duplicated=selected.num_duplicated,
            shapes=self._micro_batch_shapes(groups, cut),
            rank_budget=None if budgets is None else np.asarray(budgets, dtype=np.int64),
        )

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

    @property
    def longest_cost(self) -> int:
        """The cost of the longest planned example alone: no rank's budget may be lower."""
        if self._longest_cost is None:
            self._longest_cost = single_example_cost(self.prepared, self.config)
        return self._longest_cost

    def _epoch_plan(
        self,
        epoch: int,
        world: int,
        acc: int,
        order: np.ndarray,
        cut: SortedCut,
        assign: np.ndarray,
        trace: LengthWarmupTrace | None,
        *,
        dropped: int,
        duplicated: int,
        shapes: np.ndarray | None = None,
        rank_budget: np.ndarray | None = None,
    ) -> EpochPlan:
        prep = self.prepared
        plan = EpochPlan(
            epoch=epoch,
            world_size=world,
            accumulate_grad_batches=acc,
            order=order,
            micro_batch_start=cut.starts,
            micro_batch_size=cut.sizes,
            micro_batch_cost=cut.cost,
            micro_batch_work=cut.work if self.config.layout == "packed" else None,
            micro_batch_shape=shapes,
            assign=assign,
            num_dropped=dropped,
            num_duplicated=duplicated,
            num_skipped=prep.num_skipped,
            num_truncated=prep.num_truncated,
            rank_budget=rank_budget,
            _loss=prep.loss,
            _exact_tokens=cut.total if self._exact_totals else None,
        )
        if trace is not None:
            object.__setattr__(plan, "length_warmup", trace)
        return plan

    def _groups_without(self, exclude: np.ndarray) -> SortedGroups:
        """The sorted order of the planned examples that ``exclude`` does not mark."""
        exclude = check_exclude(exclude, self.num_examples)
        kept = self.prepared.kept
        keep = np.flatnonzero(~exclude) if kept is None else kept[~exclude[kept]]
        return SortedGroups.build(
            self.prepared.key, keep, self.config.bucket_width, self.shape_lengths
        )

    def _deal(
        self,
        cut: SortedCut,
        run: np.ndarray,
        world: int,
        acc: int,
        rng: np.random.Generator,
        warm: tuple[np.ndarray, int, np.ndarray, int] | None = None,
    ) -> tuple[np.ndarray, LengthWarmupTrace | None]:
        """``(steps, world, acc)`` micro-batch ids: ``run`` formed into steps, dealt, ordered.

        ``warm`` (the length warm-up: scheduled caps, the cap already reached, the epoch's
        order, the first step) reorders the steps after the shuffle (:func:`warmup_order`).
        """
        if self.config.layout == "packed":
            # Packed rows of equal tokens differ in compute (Σ L²): steps take micro-batches
            # of neighbouring compute, so that dealing can even the ranks out.
            run = run[np.argsort(-cut.work[run], kind="stable")]
        assign = deal_steps(run.reshape(-1, world * acc), cut.work, world, acc)
        assign, trace = self._order_steps(cut, assign, rng, warm)
        if self.rotate_ranks and world > 1:
            # Dealing gives rank 0 each step's largest micro-batch: over a few steps (a window
            # of a stream) that skews the ranks' real tokens; a random rank order per step
            # evens them out (loads per step are unchanged).
            ranks = rng.permuted(np.tile(np.arange(world), (assign.shape[0], 1)), axis=1)
            assign = np.take_along_axis(
                assign, np.broadcast_to(ranks[:, :, None], assign.shape), axis=1
            )
        return assign, trace

    def _order_steps(
        self,
        cut: SortedCut,
        assign: np.ndarray,
        rng: np.random.Generator,
        warm: tuple[np.ndarray, int, np.ndarray, int] | None,
    ) -> tuple[np.ndarray, LengthWarmupTrace | None]:
        """The steps shuffled, then ordered by the length warm-up (``warm``) when it is on."""
        if self.config.shuffle:
            assign = assign[rng.permutation(assign.shape[0])]
        trace = None
        if warm is not None:
            caps, floor, order, first = warm
            longest = step_longest(self.prepared.key, cut.starts, cut.sizes, order, assign)
            perm, realised = warmup_order(longest, caps, floor, light_steps(cut.cost, assign))
            assign, longest = assign[perm], longest[perm]
            trace = LengthWarmupTrace(first, caps[: realised.shape[0]], realised, longest)
        return assign, trace

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
                of each earlier topology of this epoch, oldest first, each optionally with a
                fourth item: the ranks' budgets its plan was made with (``None``: the
                config's).
            rank_budgets: the ranks' budgets for the rest of the epoch (``None``: the
                config's; see :meth:`plan`).

        Returns:
            The plan of the examples the earlier topologies did not consume (the whole epoch
            when ``history`` is empty).
        """
        history = check_history(history)
        given = self.config.rank_budgets(world_size) if rank_budgets is None else rank_budgets
        budgets = None if given is None else tuple(int(b) for b in given)
        if budgets is not None and uniform(budgets, self.config.max_tokens):
            budgets = None  # one key for equal budgets, given or not
        key = (epoch, world_size, accumulate_grad_batches, tuple(history), budgets)
        if self._last is not None and self._last[0] == key:
            # Every rank's sampler plans the same epoch: in one process (tests, simulations,
            # a DataModule's check) they share the plan instead of planning it again.
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
        counts = np.zeros(self.num_examples, dtype=np.int32)  # runs of each example so far
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
            ids = done.consumed_ids(consumed)
            np.add.at(counts, ids, 1)
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
            guard_remainder(self, plan, consumed=counts)
        return plan

    def _empty_plan(self, epoch: int, world: int, acc: int) -> EpochPlan:
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


def plan_epoch(
    lengths: npt.ArrayLike,
    max_tokens: int,
    *,
    epoch: int = 0,
    world_size: int = 1,
    accumulate_grad_batches: int = 1,
    loss_lengths: npt.ArrayLike | None = None,
    **config: Any,
) -> EpochPlan:
    """Plan one epoch in one call (see :class:`EpochPlanner` to plan many epochs).

    Args:
        lengths: ``(n,)`` or ``(n, 2)`` lengths.
        max_tokens: the token budget of one micro-batch.
        epoch: the epoch.
        world_size: number of ranks.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        loss_lengths: loss tokens per example, when not the lengths / target column.
        **config: any other :class:`PlanConfig` setting (``cost``, ``seed``, ``tail``, ...).

    Returns:
        The plan.

    Example:
        >>> import numpy as np
        >>> plan = plan_epoch(np.array([4, 4, 4, 4]), max_tokens=8, world_size=2)
        >>> plan.micro_batch_size[plan.rank_micro_batches(0)].tolist()
        [2]
    """
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, **config), loss_lengths)
    return planner.plan(epoch, world_size, accumulate_grad_batches)
