"""Windowed plans for streamed data: the offline planner on consecutive windows of the stream.

Each epoch reads the shards in a random order, the *stream*, cut into windows of about ``window``
examples, each planned offline (own seed and guarantees), run in order. A position is a window and
its micro-batches done; another world size re-plans that window's rest and later windows.

Example:
    >>> shards = [np.array([3, 5, 2, 7]), np.array([4, 6]), np.array([1, 1, 8])]
    >>> wp = WindowedPlanner([s.size for s in shards], shards.__getitem__,
    ...                      PlanConfig(max_tokens=10), window=4)
    >>> wp.num_windows, np.diff(wp.window_bounds()).tolist()
    (3, [3, 3, 3])
    >>> ids = np.concatenate([wp.window_plan(0, w, 1).example_ids() for w in range(3)])
    >>> sorted(ids.tolist()) == list(range(9))
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.lengths import largest_fitting_length, single_cost
from lightning_varbatch.planner.settings import PlanConfig, check_config
from lightning_varbatch.planner.settings_identity import pair_fingerprint

__all__ = ["MIN_WINDOW", "WINDOW_BATCHES", "WindowPlan", "WindowedPlanner", "auto_window"]

#: Mixed into the shard order's random stream so it differs from any window's.
_ORDER_TAG = 0x5EA4


@dataclass(frozen=True)
class WindowPlan:
    """One window's plan and the global example ids its local ids stand for.

    Attributes:
        window: the window's index in the epoch's stream.
        plan: the offline plan of the window's examples (ids local to the window).
        ids: ``ids[local]`` is the global id (shard offset + row) of local example ``local``.
        planner: the planner that made ``plan`` (its lengths are the window's).
    """

    window: int
    plan: EpochPlan
    ids: np.ndarray
    planner: EpochPlanner

    def example_ids(self, rank: int | None = None) -> np.ndarray:
        """Global ids of the window's micro-batches (of one rank, or all), in run order."""
        return self.ids[self.plan.example_ids(rank)]

    def micro_batch_ids(self, micro_batch: int) -> np.ndarray:
        """Global ids of one micro-batch."""
        return self.ids[self.plan.micro_batch_ids(micro_batch)]


#: The default window holds about this many micro-batches' worth of examples: the padding of a
#: window plan then stays within about 1 % of a whole-epoch plan (benchmarks/RESULTS.md).
WINDOW_BATCHES = 200
#: The smallest default window, in examples.
MIN_WINDOW = 10_000


def auto_window(lengths: np.ndarray, config: PlanConfig) -> int:
    """Default window: ``max_tokens / mean length`` × :data:`WINDOW_BATCHES` (≥ :data:`MIN_WINDOW`).

    Example:
        >>> auto_window(np.full(100, 50), PlanConfig(max_tokens=16384))
        65400
    """
    key = np.asarray(lengths)
    key = key.max(axis=1) if key.ndim == 2 else key
    mean = max(float(key.mean()) if key.size else 1.0, 1.0)
    per_batch = max(1, int(config.max_tokens / mean))
    return max(MIN_WINDOW, WINDOW_BATCHES * per_batch)


class WindowedPlanner:
    """Plans an epoch of a sharded stream window by window (see the module docstring).

    Args:
        shard_rows: examples in each shard (global ids count shard after shard).
        shard_lengths: ``shard_lengths(s)`` gives shard ``s``'s ``(rows,)`` / ``(rows, 2)`` lengths.
        config: the planner settings (``max_shapes`` and ``length_warmup`` are refused).
        window: examples planned together (larger pads less, holds more; ``None``: auto_window).
        shuffle_shards: read the shards in a new random order each epoch (else in order).
        loss_offset: loss tokens per example are its (target) length minus this, at least 0.
        shard_names: each shard's name (its file) for errors naming a row (``None``: ``shard 3``).

    Raises:
        ValueError: for no shards, a negative row count, a bad ``window`` or ``max_shapes``.

    Example:
        >>> wp = WindowedPlanner([4, 4], lambda s: np.full(4, 2 + s), PlanConfig(max_tokens=8),
        ...                      window=8)
        >>> wp.window_plan(epoch=0, window=0, world_size=2).plan.num_micro_batches_per_rank
        2
    """

    def __init__(
        self,
        shard_rows: Sequence[int],
        shard_lengths: Callable[[int], np.ndarray],
        config: PlanConfig,
        *,
        window: int | None = None,
        shuffle_shards: bool = True,
        loss_offset: int = 0,
        shard_names: Sequence[str] | None = None,
    ) -> None:
        config = check_config(config)
        if config.max_shapes is not None:
            raise SettingValueError(
                "max_shapes cannot be used with streamed (windowed) data yet: a shape budget "
                "chooses its lengths from the whole data set. Unset max_shapes (or plan the "
                "data in memory with TokenBudgetDataModule).",
                setting="max_shapes",
                value=config.max_shapes,
            )
        if config.length_warmup is not None:
            raise SettingValueError(
                f"length_warmup={config.length_warmup} cannot be used with streamed "
                "(windowed) data yet: a stream is planned one window of a few steps at a "
                "time, and every example of a window must run within that window, so the long "
                "examples of the warm-up's windows could not move to later steps and the cap "
                "would be advanced at once. Unset length_warmup (or plan the data in memory "
                "with TokenBudgetDataModule).",
                setting="length_warmup",
                value=config.length_warmup,
            )
        if config.batch_schedule is not None:
            raise SettingValueError(
                f"batch_schedule={config.batch_schedule!r} cannot be used with streamed "
                "(windowed) data yet: a stream's epoch is planned one window at a time and "
                "its tokens are not known before it is read, so a window's steps cannot be "
                "placed on the schedule's clock of tokens trained. Unset batch_schedule (or "
                "plan the data in memory with TokenBudgetDataModule).",
                setting="batch_schedule",
                value=config.batch_schedule,
            )
        rows = [check_count(f"shard_rows[{i}]", r, minimum=0) for i, r in enumerate(shard_rows)]
        if not rows or sum(rows) == 0:
            raise ValueError("a stream needs at least one shard with at least one example.")
        self.config = config
        self.shuffle_shards = bool(shuffle_shards)
        self.loss_offset = check_count("loss_offset", loss_offset, minimum=0)
        self.shard_rows = np.array(rows, dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(self.shard_rows)))
        self.shard_names = None if shard_names is None else [str(n) for n in shard_names]
        self._shard_lengths = shard_lengths
        self._cache: dict[int, np.ndarray] = {}
        self._pairs: bool | None = None
        if window is None:
            window = auto_window(self._lengths(self._first_shard), config)
        self.window = check_count("window", window, what=" (examples planned together)")

    @property
    def num_examples(self) -> int:
        """Examples in all shards."""
        return int(self.offsets[-1])

    @property
    def num_windows(self) -> int:
        """Windows per epoch: ``ceil(num_examples / window)`` of (near) equal size."""
        return max(1, -(-self.num_examples // self.window))

    @property
    def _first_shard(self) -> int:
        return int(np.flatnonzero(self.shard_rows)[0])

    @property
    def pairs(self) -> bool:
        """Whether the shards hold (source, target) pairs (the first shard's lengths say)."""
        if self._pairs is None:  # read when first needed: a checkpoint's fingerprint
            self._pairs = self._lengths(self._first_shard).ndim == 2
        return self._pairs

    def fingerprint(self) -> str:
        """The settings' fingerprint plus the window (for checkpoint checks)."""
        settings = pair_fingerprint(self.config.fingerprint(), self.pairs, self.config.pair_order)
        return f"{settings}-w{self.window}-s{int(self.shuffle_shards)}-o{self.loss_offset}"

    def shard_order(self, epoch: int) -> np.ndarray:
        """The order the shards are read in during ``epoch``."""
        n = self.shard_rows.size
        if not self.shuffle_shards:
            return np.arange(n)
        rng = np.random.default_rng([self.config.seed, epoch, _ORDER_TAG])
        return rng.permutation(n)

    def window_bounds(self) -> np.ndarray:
        """``(num_windows + 1,)`` stream positions where the windows start (then the end)."""
        w = self.num_windows
        return (np.arange(w + 1, dtype=np.int64) * self.num_examples) // w

    def window_spans(self, epoch: int, window: int) -> list[tuple[int, int, int]]:
        """``(shard, first row, end row)`` of every shard piece in ``window``, in read order."""
        window = check_count("window", window, minimum=0)
        if window >= self.num_windows:
            raise ValueError(f"window {window} is not in [0, {self.num_windows}).")
        order = self.shard_order(epoch)
        stream_ends = np.cumsum(self.shard_rows[order])
        bounds = self.window_bounds()
        lo, hi = int(bounds[window]), int(bounds[window + 1])
        spans = []
        first = int(np.searchsorted(stream_ends, lo, side="right"))
        for k in range(first, order.size):
            start = int(stream_ends[k] - self.shard_rows[order[k]])
            if start >= hi:
                break
            a, b = max(lo, start) - start, min(hi, int(stream_ends[k])) - start
            if b > a:
                spans.append((int(order[k]), a, b))
        return spans

    def _lengths(self, shard: int) -> np.ndarray:
        if shard not in self._cache:
            lengths = np.asarray(self._shard_lengths(shard))
            if lengths.shape[0] != self.shard_rows[shard]:
                raise ValueError(
                    f"shard {shard} has {int(self.shard_rows[shard])} rows but its lengths "
                    f"have {lengths.shape[0]}: the lengths must describe the shard's rows."
                )
            if len(self._cache) >= 4:  # a window spans few shards: hold only those
                self._cache.pop(next(iter(self._cache)))
            self._cache[shard] = lengths
        return self._cache[shard]

    def shard_name(self, shard: int) -> str:
        """How errors name shard ``shard`` (its file when ``shard_names`` were given)."""
        if self.shard_names is not None and 0 <= shard < len(self.shard_names):
            return f"shard {shard} ({self.shard_names[shard]})"
        return f"shard {shard}"

    def where(self, global_id: int) -> str:
        """``shard s (file), row r``: where a global example id lives."""
        shard = int(np.searchsorted(self.offsets, global_id, side="right") - 1)
        return f"{self.shard_name(shard)}, row {global_id - int(self.offsets[shard])}"

    def window_planner(self, epoch: int, window: int) -> tuple[EpochPlanner, np.ndarray]:
        """The offline planner of ``window``'s examples and their global ids."""
        spans = self.window_spans(epoch, window)
        ids = np.concatenate(
            [np.arange(a, b, dtype=np.int64) + self.offsets[s] for s, a, b in spans]
        )
        lengths = np.concatenate([self._lengths(s)[a:b] for s, a, b in spans])
        seed = int(np.random.SeedSequence([self.config.seed, epoch, window]).generate_state(1)[0])
        # the planner derives the loss tokens from the offset, exactly after truncation
        offset = self.loss_offset or self.config.loss_offset
        config = replace(self.config, seed=seed, loss_offset=offset)
        try:
            planner = EpochPlanner(lengths, config, rotate_ranks=True)
        except SettingValueError as error:
            if error.setting == "max_tokens" and self.config.oversize == "error":
                self._over_budget(window, lengths, ids)
            raise
        return planner, ids

    def _over_budget(self, window: int, lengths: np.ndarray, ids: np.ndarray) -> None:
        """Raise naming the shard and row of the window's first example over the budget."""
        lengths = np.asarray(lengths)
        key = lengths.max(axis=1) if lengths.ndim == 2 else lengths
        fit = largest_fitting_length(self.config, int(key.max()))
        over = np.flatnonzero(key > fit)
        if not over.size:
            return
        first = int(over[0])
        length = int(key[first])
        needed = int(np.ceil(single_cost(self.config, length)))
        raise SettingValueError(
            f"{self.where(int(ids[first]))} (window {window} of the stream) has length "
            f"{length}, over the budget max_tokens={self.config.max_tokens} on its own "
            f"({over.size} example(s) of this window are over it): set max_tokens >= "
            f"{needed}, or oversize='skip' to leave such examples out or oversize='truncate' "
            "to cut them.",
            setting="max_tokens",
            value=self.config.max_tokens,
        )

    def _too_small(
        self, planner: EpochPlanner, epoch: int, window: int, world_size: int, acc: int
    ) -> bool:
        """Whether ``window`` cannot form one optimizer step under its tail policy.

        ``"spread"`` needs as many examples as a step has micro-batches, ``"drop"`` as many
        micro-batches. The run's first window refuses that (the error names the fix); a later one
        (windows differ by an example; a resume may change the topology) is planned as an epoch's
        rest, counted, with a warning: ``"spread"`` repeats examples, ``"drop"`` drops the window.

        Raises:
            SettingValueError: for window 0 of epoch 0 (naming ``window``; ``tail``: all too small).
        """
        needed, tail = world_size * acc, self.config.tail
        have = planner.num_planned if tail == "spread" else planner.num_micro_batches
        if tail == "pad" or have >= needed:
            return False
        total = self.num_examples
        setting = "window"
        if tail == "spread" and total < needed:
            setting = "tail"
            problem = (
                f"the stream has only {total} examples, but world_size={world_size} x "
                f"accumulate_grad_batches={acc} = {needed} micro-batches are needed per "
                "optimizer step (tail='spread')"
            )
            fix = f"set tail='pad', or accumulate_grad_batches <= {max(total // world_size, 1)}"
            fix += f" with world_size <= {total}" if total < world_size else ""
        elif tail == "spread":
            problem = (
                f"window={self.window} gives windows of only {have} examples, but world_size="
                f"{world_size} x accumulate_grad_batches={acc} = {needed} micro-batches are "
                "needed per optimizer step (tail='spread')"
            )
            fix = f"set window >= {-(-total // (total // needed))} (this stream has {total} "
            fix += "examples), or tail='pad'"
        else:
            problem = (
                f"tail='drop' with window={self.window}: window {window} holds only {have} "
                f"micro-batch(es) of max_tokens={self.config.max_tokens}, fewer than the "
                f"{needed} one optimizer step needs (world_size={world_size} x "
                f"accumulate_grad_batches={acc}), so it would drop them all"
            )
            fix = f"set window to about {-(-self.window * needed // max(have, 1))} or more, "
            fix += "or tail='spread' or tail='pad'"
        if (epoch, window) == (0, 0):
            raise SettingValueError(
                f"{problem}: {fix}.", setting=setting, value=getattr(self, setting, tail)
            )
        warnings.warn(
            f"{problem}: it is planned as the rest of an epoch is ("
            + ("repeats, counted in num_duplicated" if tail == "spread" else "all dropped, counted")
            + f"); {fix}.",
            UserWarning,
            stacklevel=3,
        )
        return True

    def window_plan(
        self,
        epoch: int,
        window: int,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        history: Sequence[tuple[Any, ...]] = (),
        rank_budgets: Sequence[int] | None = None,
    ) -> WindowPlan:
        """Plan ``window`` of ``epoch`` (its remainder after ``history``, see ``plan_resumed``).

        ``rank_budgets``: the ranks' budgets of this topology's plan (``None``: the config's).

        Raises:
            SettingValueError: for a window too small for the ranks (naming ``window`` and the
                least that works, or ``tail``) or an example over ``max_tokens`` (its shard, row).
            ValueError: for a window out of range.
        """
        planner, ids = self.window_planner(epoch, window)
        args = (epoch, world_size, accumulate_grad_batches)
        if not history and self._too_small(planner, epoch, window, *args[1:]):
            plan = planner.plan(*args, rank_budgets=rank_budgets, remainder=True)
        else:
            plan = planner.plan_resumed(*args, history, rank_budgets=rank_budgets)
        return WindowPlan(window=window, plan=plan, ids=ids, planner=planner)
