"""One epoch's plan: optimizer steps × ranks × micro-batches of example ids.

Pure numpy, no torch.distributed and no Lightning: every rank computes the same plan from the
same ``(lengths, config, epoch, world_size, accumulate_grad_batches)`` and reads its own slice,
so every rank gets the same number of micro-batches by construction.

How a plan is made (see ``docs/planning.md`` for the reasoning):

1. Examples are sorted by decreasing (bucketed) length once; the sorted order is cut greedily
   into micro-batches that fit ``max_tokens`` (:mod:`lightning_varbatch.planner.layout`).
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
from lightning_varbatch.planner.layout import Layout, SortedGroups
from lightning_varbatch.planner.lengths import PreparedLengths, prepare_lengths
from lightning_varbatch.planner.settings import PlanConfig, TailPolicy
from lightning_varbatch.planner.shapes import choose_shape_lengths, shape_rows
from lightning_varbatch.planner.tail import effective_tail, select_tiles, tail_layout

__all__ = ["EpochPlan", "EpochPlanner", "PlanConfig", "plan_epoch"]


class EpochPlanner:
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
        self._exact_totals = (
            not self.prepared.pairs
            and loss_lengths is None
            and config.bucket_width == 1
            and config.max_shapes is None
        )
        self._groups: SortedGroups | None = None
        self._shape_lengths: np.ndarray | None = None
        self._layouts: dict[int, Layout] = {}

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
        """Micro-batches of one pass before the tail policy (the data's size in budgets)."""
        return self._layout().num_tiles

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
    def shape_lengths(self) -> np.ndarray | None:
        """The shape budget's padded lengths, ascending (``None`` without ``max_shapes``).

        Chosen once from the planned examples' lengths (:mod:`~lightning_varbatch.planner.shapes`),
        so resumed and re-planned epochs keep the same shapes.
        """
        if self.config.max_shapes is None:
            return None
        if self._shape_lengths is None:
            kept = self.prepared.kept
            key = self.prepared.key if kept is None else self.prepared.key[kept]
            self._shape_lengths = choose_shape_lengths(
                key, self.config.max_shapes, self.config.pad_to_multiple_of
            )
        return self._shape_lengths

    def use_shape_lengths(self, lengths: np.ndarray) -> None:
        """Plan with these shape lengths (a mixture chooses them over all its datasets).

        Raises:
            ValueError: without ``max_shapes``, with more lengths than it allows, or when an
                example is longer than the longest.
        """
        limit = self.config.max_shapes
        lengths = np.unique(np.asarray(lengths, dtype=np.int64))
        if limit is None or lengths.size > limit or lengths.size == 0:
            raise SettingValueError(
                f"use_shape_lengths needs PlanConfig(max_shapes=...) and 1 to max_shapes="
                f"{limit} lengths, got {lengths.size}.",
                setting="shape lengths",
                value=lengths,
            )
        kept = self.prepared.kept
        key = self.prepared.key if kept is None else self.prepared.key[kept]
        if key.size and int(key.max()) > int(lengths[-1]):
            raise ValueError(
                f"An example of length {int(key.max())} does not fit the longest shape "
                f"length {int(lengths[-1])}."
            )
        self._shape_lengths = lengths
        self._groups = None
        self._layouts = {}

    @property
    def shapes(self) -> np.ndarray | None:
        """``(k, 2)`` ``(rows, length)`` of every shape, by length (``None``: free shapes)."""
        lengths = self.shape_lengths
        if lengths is None:
            return None
        return np.stack([shape_rows(lengths, self.config), lengths], axis=1)

    @property
    def groups(self) -> SortedGroups:
        """The sorted order of all planned examples (computed once)."""
        if self._groups is None:
            self._groups = SortedGroups.build(
                self.prepared.key, self.prepared.kept, self.config.bucket_width, self.shape_lengths
            )
        return self._groups

    def _layout(self, tail: TailPolicy = "pad", multiple: int = 1) -> Layout:
        """The layout of all planned examples under ``tail`` (cached per step size)."""
        if 1 not in self._layouts:
            self._layouts[1] = Layout.build(self.groups, self.config)
        key = multiple if tail == "spread" else 1
        if key not in self._layouts:
            self._layouts[key] = tail_layout(self._layouts[1], self.groups, tail, key, self.config)
        return self._layouts[key]

    def plan(
        self,
        epoch: int,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        *,
        exclude: np.ndarray | None = None,
        salt: int = 0,
    ) -> EpochPlan:
        """Plan one epoch.

        Args:
            epoch: the epoch (the plan depends only on ``config.seed``, ``epoch`` and ``salt``).
            world_size: number of ranks.
            accumulate_grad_batches: micro-batches per rank per optimizer step.
            exclude: boolean mask over all examples; ``True`` ones are left out (resume with
                another world size re-plans what an interrupted epoch has not consumed).
            salt: extra randomness for re-plans, so they differ from the original plan.

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
        if exclude is None:
            groups = self.groups
        else:
            exclude = np.asarray(exclude)
            if exclude.dtype != np.bool_:
                raise SettingTypeError(
                    f"exclude must be a boolean mask over the {self.num_examples} examples, "
                    f"got dtype {exclude.dtype}; build it with np.zeros(n, dtype=bool) and set "
                    "the excluded ids to True (a list of ids is not a mask).",
                    setting="exclude",
                    value=exclude,
                )
            if exclude.shape != (self.num_examples,):
                raise SettingValueError(
                    f"exclude must be a boolean mask of {self.num_examples} examples, "
                    f"got shape {exclude.shape}.",
                    setting="exclude",
                    value=exclude,
                )
            kept = self.prepared.kept
            keep = np.flatnonzero(~exclude) if kept is None else kept[~exclude[kept]]
            groups = SortedGroups.build(
                self.prepared.key, keep, cfg.bucket_width, self.shape_lengths
            )
            if groups.size == 0:
                return self._empty_plan(epoch, world, acc)
        replanned = exclude is not None
        tail = effective_tail(cfg, groups.size, world, acc, replanned=replanned)
        rng = np.random.default_rng([cfg.seed, epoch, salt])
        if replanned:
            layout = tail_layout(Layout.build(groups, cfg), groups, tail, wa, cfg)
        else:
            layout = self._layout(tail, wa)
        order = groups.ids.copy()
        if cfg.shuffle:
            starts = groups.starts
            for g in np.flatnonzero(np.diff(starts) > 1):
                rng.shuffle(order[starts[g] : starts[g + 1]])
        selected = select_tiles(layout, tail, world, acc, rng, cfg)
        tiles = selected.tiles
        if cfg.layout == "packed":
            # Packed rows of equal tokens differ in compute (Σ L²): steps take micro-batches
            # of neighbouring compute, so that dealing can even the ranks out.
            tiles = tiles[np.argsort(-layout.work[tiles], kind="stable")]
        assign = deal_steps(tiles.reshape(-1, wa), layout.work, world, acc)
        if cfg.shuffle:
            assign = assign[rng.permutation(assign.shape[0])]
        if self.rotate_ranks and world > 1:
            # Dealing gives rank 0 each step's largest micro-batch: over a few steps (a window
            # of a stream) that skews the ranks' real tokens; a random rank order per step
            # evens them out (loads per step are unchanged).
            ranks = rng.permuted(np.tile(np.arange(world), (assign.shape[0], 1)), axis=1)
            assign = np.take_along_axis(
                assign, np.broadcast_to(ranks[:, :, None], assign.shape), axis=1
            )
        prep = self.prepared
        return EpochPlan(
            epoch=epoch,
            world_size=world,
            accumulate_grad_batches=acc,
            order=order,
            tile_start=layout.starts,
            tile_size=layout.sizes,
            tile_cost=layout.cost,
            tile_work=layout.work if cfg.layout == "packed" else None,
            tile_shape=self._tile_shapes(groups, layout),
            assign=assign,
            num_dropped=selected.num_dropped,
            num_duplicated=selected.num_duplicated,
            num_skipped=prep.num_skipped,
            num_truncated=prep.num_truncated,
            _loss=prep.loss,
            _exact_tokens=layout.total if self._exact_totals else None,
        )

    def _tile_shapes(self, groups: SortedGroups, layout: Layout) -> np.ndarray | None:
        """``(m, 2)`` the static ``(rows, length)`` of every tile (``None``: free shapes)."""
        shapes = self.shapes
        if shapes is None:
            return None
        longest = groups.longest[groups.group_of(layout.starts)]
        out = shapes[np.searchsorted(shapes[:, 1], longest)]
        assert (layout.sizes <= out[:, 0]).all(), "a tile has more examples than its shape"
        return out

    def plan_resumed(
        self,
        epoch: int,
        world_size: int,
        accumulate_grad_batches: int,
        history: Sequence[tuple[int, int, int]] = (),
    ) -> EpochPlan:
        """Plan what is left of ``epoch`` after topology changes.

        Args:
            epoch: the epoch.
            world_size: the current number of ranks.
            accumulate_grad_batches: the current accumulation.
            history: ``(world_size, accumulate_grad_batches, consumed micro-batches per rank)``
                of each earlier topology of this epoch, oldest first.

        Returns:
            The plan of the examples the earlier topologies did not consume (the whole epoch
            when ``history`` is empty).
        """
        history = check_history(history)
        exclude: np.ndarray | None = None
        for depth, (world, acc, consumed) in enumerate(history):
            done = self.plan(epoch, world, acc, exclude=exclude, salt=depth)
            if exclude is None:
                exclude = np.zeros(self.num_examples, dtype=bool)
            exclude[done.consumed_ids(consumed)] = True
        return self.plan(
            epoch, world_size, accumulate_grad_batches, exclude=exclude, salt=len(history)
        )

    def _empty_plan(self, epoch: int, world: int, acc: int) -> EpochPlan:
        empty = np.zeros(0, dtype=np.int64)
        return EpochPlan(
            epoch=epoch,
            world_size=world,
            accumulate_grad_batches=acc,
            order=empty.astype(np.int32),
            tile_start=empty,
            tile_size=empty,
            tile_cost=empty.astype(np.float64),
            assign=np.zeros((0, world, acc), dtype=np.int64),
            tile_shape=None if self.shapes is None else np.zeros((0, 2), dtype=np.int64),
            num_skipped=self.prepared.num_skipped,
            num_truncated=self.prepared.num_truncated,
        )


def check_history(history: object) -> list[tuple[int, int, int]]:
    """Validate ``plan_resumed``'s history: ``(world_size, accumulation, consumed)`` triples.

    Raises:
        ValueError: naming the bad entry and what it should be.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, (Sequence, np.ndarray)):
        raise SettingTypeError(
            f"history must be a sequence of (world_size, accumulate_grad_batches, consumed "
            f"micro-batches per rank) triples, got {type(history).__name__} {history!r:.60}.",
            setting="history",
            value=history,
        )
    out = []
    for i, entry in enumerate(history):
        if (
            isinstance(entry, (str, bytes))
            or not isinstance(entry, (Sequence, np.ndarray))
            or len(entry) != 3
        ):
            raise SettingValueError(
                f"history[{i}] is {entry!r}: each entry must be a (world_size, "
                "accumulate_grad_batches, consumed micro-batches per rank) triple.",
                setting="history",
                value=history,
            )
        world, acc, consumed = entry
        out.append(
            (
                check_count(f"history[{i}] world_size", world),
                check_count(f"history[{i}] accumulate_grad_batches", acc),
                check_count(f"history[{i}] consumed micro-batches", consumed, minimum=0),
            )
        )
    return out


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
        >>> plan.tile_size[plan.rank_tiles(0)].tolist()
        [2]
    """
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, **config), loss_lengths)
    return planner.plan(epoch, world_size, accumulate_grad_batches)
