"""Token-budget micro-batches streamed from shards: every rank equal counts, exact resume.

:class:`StreamingBatches` is the ``IterableDataset`` of one rank. It plans the epoch window by
window (:class:`~lightning_varbatch.planner.windows.WindowedPlanner`: the one offline planner
on consecutive windows of the shard stream), reads the rows its micro-batches need from the
window's shards front to back (:class:`~lightning_varbatch.sources.shards.ShardedSource`) and
yields them collated, with the plan's counts on each batch (the exact loss normaliser).

* **Equal counts, no hang**: every window gives every rank the same number of micro-batches,
  so the ranks end the epoch together whatever tokens their shards hold.
* **Workers**: with ``num_workers=k`` worker ``i`` builds the rank's micro-batches ``j`` with
  ``j % k == i``; the ``DataLoader`` takes them round robin, so the order is the plan's and
  every example is read by exactly one worker of one rank.
* **Resume**: :meth:`StreamingBatches.state_dict` saves the window and the micro-batches done
  in it; :meth:`~StreamingBatches.load_state_dict` starts there without reading the stream
  (another world size re-plans the rest of that window; nothing lost, nothing repeated).

Example:
    >>> import numpy as np
    >>> class Shard:  # any object with name, num_rows, lengths() and read(rows)
    ...     def __init__(self, name, rows): self.name, self.rows = name, rows
    ...     num_rows = property(lambda self: len(self.rows))
    ...     def lengths(self): return np.array([len(r) for r in self.rows])
    ...     def read(self, rows): return ({"tokens": np.array(self.rows[i])} for i in rows)
    >>> from lightning_varbatch.sources.shards import ShardedSource
    >>> source = ShardedSource([Shard("a", [[1, 2], [3]]), Shard("b", [[4, 5, 6]])])
    >>> batches = StreamingBatches(source, max_tokens=4, window=3, rank=0, world_size=1)
    >>> sorted(int(b["nexamples"]) for b in batches)
    [1, 2]
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset, get_worker_info

from lightning_varbatch.data.micro_batch import MicroBatch, micro_batch_of, resolve_rank_world
from lightning_varbatch.data.pairing import collate_for_plan, source_column_keys
from lightning_varbatch.data.plan_items import attach_plan
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.remainder_guard import consumed_ledger, guard_remainder
from lightning_varbatch.planner.settings import PlanConfig, check_count
from lightning_varbatch.planner.windows import WindowedPlanner, WindowPlan
from lightning_varbatch.sources.shards import ShardedSource, identity_changes

__all__ = ["StreamingBatches"]

_STATE_KEYS = ("epoch", "window", "consumed", "history", "settings", "shards", "num_examples")


class StreamingBatches(IterableDataset[dict[str, Any]]):
    """One rank's token-budget micro-batches of a sharded stream (see the module docstring).

    Use it with ``DataLoader(batches, batch_size=None, num_workers=k)``: it yields collated
    batches itself.

    Args:
        source: the shards (:func:`~lightning_varbatch.sources.shards.shards_from_files`, ...).
        max_tokens: the budget of one micro-batch.
        window: examples planned together; ``None`` (default): about 200 micro-batches' worth
            (:func:`~lightning_varbatch.planner.windows.auto_window`), which pads within about
            1 % of a whole-epoch plan; the padding depends on the micro-batches per window
            (see docs/streaming.md).
        collate: turns a micro-batch's items into a batch (default :class:`PaddingCollate`);
            it receives the items with the plan's counts attached, as in the map-style loader.
        rank: this process's rank (default: from the environment / process group).
        world_size: number of ranks (same default).
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        shuffle_shards: read the shards in a new random order each epoch.
        loss_offset: loss tokens per example are its (target) length minus this (1 for
            teacher forcing); the default collate gets the same ``loss_offset``.
        **plan_settings: other :class:`~lightning_varbatch.PlanConfig` settings (``cost``,
            ``seed``, ``tail``, ``layout``, ...).

    Raises:
        ValueError: for bad settings (the message names the setting).
    """

    def __init__(
        self,
        source: ShardedSource,
        max_tokens: int,
        *,
        window: int | None = None,
        collate: Callable[[Any], Any] | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        shuffle_shards: bool = True,
        loss_offset: int = 0,
        **plan_settings: Any,
    ) -> None:
        if not isinstance(source, ShardedSource):
            raise SettingTypeError(
                f"source must be a ShardedSource (shards_from_files, shards_from_hf_iterable, "
                f"shards_from_litdata), got {type(source).__name__}: build one with them.",
                setting="source",
                value=source,
            )
        self.source = source
        self.planner = WindowedPlanner(
            np.diff(source.offsets).tolist(),
            source.shard_lengths,
            PlanConfig(max_tokens=max_tokens, **plan_settings),
            window=window,
            shuffle_shards=shuffle_shards,
            loss_offset=loss_offset,
            shard_names=[shard.name for shard in source.shards],
        )
        # the plan's layout picks the default collate and refuses one that disagrees
        self.collate = collate_for_plan(
            self.planner.config,
            collate,
            loss_offset=loss_offset,
            keys=lambda: source_column_keys(source),
        )
        self.rank, self.world_size = resolve_rank_world(rank, world_size)
        self.accumulate_grad_batches = check_count(
            "accumulate_grad_batches", accumulate_grad_batches
        )
        self.epoch = 0
        self._window = 0  # where the next iteration starts
        self._consumed = 0  # micro-batches of that window already done
        self._history: list[tuple[Any, ...]] = []  # earlier topologies of that window
        self._steps = 0  # optimizer steps of the epoch before that window's plan
        self._seen: list[int] = []  # micro-batches per rank of windows 0, 1, ... this epoch

    # -- the epoch -------------------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start ``epoch`` from its beginning (unless a restored position is for it)."""
        epoch = check_count("epoch", epoch, minimum=0)
        if epoch != self.epoch:
            self.epoch, self._window, self._consumed, self._history = epoch, 0, 0, []
            self._seen, self._steps = [], 0

    @property
    def rank_budgets(self) -> tuple[int, ...]:
        """Every rank's budget in this topology's plans (``max_tokens`` when equal)."""
        config = self.planner.config
        return config.rank_budgets(self.world_size) or (config.max_tokens,) * self.world_size

    def window_plan(self, window: int) -> WindowPlan:
        """This topology's plan of ``window`` (its remainder when the position is inside it)."""
        history = self._history if window == self._window else []
        return self.planner.window_plan(
            self.epoch,
            window,
            self.world_size,
            self.accumulate_grad_batches,
            history,
            rank_budgets=self.rank_budgets,
        )

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """Yield this rank's (this worker's share of) collated micro-batches from the position."""
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        count = 0  # micro-batches of this rank from the start position, all workers
        steps = self._steps  # the epoch's optimizer steps before the window's plan
        for window in range(self._window, self.planner.num_windows):
            wp = self.window_plan(window)
            first = self._consumed if window == self._window else 0
            total = wp.plan.num_micro_batches_per_rank
            mine = [j for j in range(first, total) if (count + j - first) % workers == worker]
            count += total - first
            batches = [
                micro_batch_of(
                    wp.plan,
                    wp.planner,
                    self.rank,
                    j,
                    epoch=self.epoch,
                    ids=wp.ids,
                    first_step=steps,
                )
                for j in mine
            ]
            steps += wp.plan.num_steps
            items = self._read(batches)
            for mb in batches:
                yield self.collate(attach_plan([items[i] for i in mb], mb))

    def _read(self, batches: list[MicroBatch]) -> dict[int, Any]:
        """The items of ``batches``, read shard by shard, each shard's rows ascending."""
        wanted = np.unique(np.fromiter((i for mb in batches for i in mb), dtype=np.int64))
        shard_of = np.searchsorted(self.source.offsets, wanted, side="right") - 1
        items: dict[int, Any] = {}
        for shard in np.unique(shard_of).tolist():
            ids = wanted[shard_of == shard]
            rows = ids - int(self.source.offsets[shard])
            for gid, item in zip(ids.tolist(), self.source.read(shard, rows), strict=True):
                items[gid] = item
        return items

    # -- progress and checkpoints ----------------------------------------------------------

    def fingerprint(self) -> str:
        """The shards' content and the plan settings' fingerprint (the same on every rank).

        Content, not paths: ranks reading identical copies of the shards from their own
        node-local folders agree.
        """
        return f"{self.source.content_fingerprint()}-{self.planner.fingerprint()}"

    def settings(self) -> dict[str, Any]:
        """The plan settings and the window settings as plain values (checked on resume)."""
        planner = self.planner
        return {
            **planner.config.plain(),
            "window": planner.window,
            "shuffle_shards": planner.shuffle_shards,
            "loss_offset": planner.loss_offset,
        }

    def _window_size(self, window: int) -> int:
        """Micro-batches per rank of ``window`` under the current topology (from its start)."""
        while len(self._seen) <= window:
            w = len(self._seen)
            plan = self.planner.window_plan(
                self.epoch,
                w,
                self.world_size,
                self.accumulate_grad_batches,
                rank_budgets=self.rank_budgets,
            ).plan
            self._seen.append(plan.num_micro_batches_per_rank)
        return self._seen[window]

    def position_after(self, trained: int) -> tuple[int, int, int]:
        """``(window, micro-batches done in it, steps before its plan)`` after ``trained``.

        ``trained`` counts the micro-batches of this run from the position this iteration
        started at (the restored one); the steps count the epoch's optimizer steps before the
        window's plan.
        """
        window, consumed, steps = self._window, self._consumed, self._steps
        left = check_count("trained micro-batches", trained, minimum=0)
        while left:
            if window >= self.planner.num_windows:
                raise ValueError(
                    f"{trained} micro-batches is more than this epoch holds from the position "
                    f"(window {self._window}, micro-batch {self._consumed})."
                )
            size = (
                self.window_plan(window).plan.num_micro_batches_per_rank
                if window == self._window
                else self._window_size(window)
            )
            step = min(left, size - consumed)
            consumed += step
            left -= step
            if consumed == size:
                window, consumed, steps = (
                    window + 1,
                    0,
                    steps + size // self.accumulate_grad_batches,
                )
        return window, consumed, steps

    def state_dict(self, trained: int = 0) -> dict[str, Any]:
        """The position after ``trained`` micro-batches of this iteration, to resume there.

        A position at the end of the epoch is saved as window ``num_windows``: a stream
        restored there yields nothing until :meth:`set_epoch` starts the next epoch (as a
        restored :class:`~lightning_varbatch.TokenBudgetBatchSampler` does). Inside a window
        the state holds the budgets of its plan and the window's ledger (how many examples it
        consumed and a digest of which), so a resume runs exactly the rest.

        Args:
            trained: micro-batches this rank trained on since the iteration started (the
                training loop's count; 0 saves the start position).
        """
        window, consumed, steps = self.position_after(trained)
        history = list(self._history) if window == self._window else []
        ledger = None
        if window < self.planner.num_windows:
            plan = (self.window_plan(window) if window == self._window else self._plan(window)).plan
            examples, digest = consumed_ledger(plan, consumed)
            ledger = {"examples": examples, "digest": f"{digest:016x}"}
        return {
            "epoch": self.epoch,
            "window": window,
            "consumed": consumed,
            "history": [[*h[:3], list(h[3])] for h in history],
            "world_size": self.world_size,
            "accumulate_grad_batches": self.accumulate_grad_batches,
            "rank_budgets": list(self.rank_budgets),
            "steps": steps,
            "ledger": ledger,
            "settings": self.settings(),
            "shards": self.source.fingerprint(),
            "shard_identity": self.source.identity(),
            "num_examples": self.planner.num_examples,
        }

    def _budgets_then(self, saved: Any, world: int) -> tuple[int, ...]:
        """The budgets a saved plan of ``world`` ranks had.

        A state of an earlier version left them out: the settings' now (they could not change
        at run time then).
        """
        if saved is not None:
            return tuple(int(b) for b in saved)
        config = self.planner.config
        try:
            return config.rank_budgets(int(world)) or (config.max_tokens,) * int(world)
        except SettingValueError:  # per-rank lists of another length: equal then
            return (config.max_tokens,) * int(world)

    def _plan(self, window: int) -> WindowPlan:
        """This topology's plan of ``window`` from its start."""
        return self.planner.window_plan(
            self.epoch,
            window,
            self.world_size,
            self.accumulate_grad_batches,
            rank_budgets=self.rank_budgets,
        )

    def resume_changes(self, state: Mapping[str, Any]) -> list[tuple[str, str]]:
        """What differs between a saved state (:meth:`state_dict`) and this stream.

        ``(name, description)`` per difference: each plan or window setting that changed,
        then ``"shards"`` when the shards' content differs. Shards are compared by content
        (:meth:`~lightning_varbatch.sources.shards.ShardedSource.identity`: file name, rows,
        size and a digest of the lengths), so identical shards under another folder resume;
        the description says whether the same shards were reordered (which moved) or which
        files changed and how. A state saved before identities were saved is compared by
        the shards' paths, as it was then.

        Example:
            >>> import numpy as np
            >>> class Shard:
            ...     def __init__(self, name, rows): self.name, self.rows = name, rows
            ...     num_rows = property(lambda self: len(self.rows))
            ...     def lengths(self): return np.array([len(r) for r in self.rows])
            ...     def read(self, rows): return ({"tokens": np.array(self.rows[i])} for i in rows)
            >>> from lightning_varbatch.sources.shards import ShardedSource
            >>> a, b = Shard("a", [[1, 2], [3]]), Shard("b", [[4, 5, 6]])
            >>> saved = StreamingBatches(ShardedSource([a, b]), 4, rank=0, world_size=1)
            >>> now = StreamingBatches(ShardedSource([b, a]), 4, rank=0, world_size=1)
            >>> now.resume_changes(saved.state_dict())  # doctest: +ELLIPSIS
            [('shards', 'shards: the same 2 shards in another order: a was shards[0], ...')]
        """
        now = self.settings()
        saved = dict(state.get("settings") or {})
        changed = [
            (k, f"{k}: saved {saved.get(k)!r}, now {now.get(k)!r}")
            for k in sorted(set(now) | set(saved))
            if saved.get(k) != now.get(k)
        ]
        identity = state.get("shard_identity")
        if isinstance(identity, Mapping) and "shards" in identity:
            ours = self.source.identity()
            notes = []
            if identity.get("columns") != ours["columns"]:
                notes.append(f"columns saved {identity.get('columns')!r}, now {ours['columns']!r}")
            moved = identity_changes(list(identity["shards"]), ours["shards"])
            if moved:
                notes.append(moved)
            if notes:
                changed.append(("shards", "shards: " + "; ".join(notes)))
        elif state.get("shards") != self.source.fingerprint():
            changed.append(
                (
                    "shards",
                    f"shards: saved {state.get('num_examples')} examples (fingerprint "
                    f"{state.get('shards')!r}), now {self.planner.num_examples} (fingerprint "
                    f"{self.source.fingerprint()!r}): other files, rows, columns or paths (this "
                    "position was saved by a version that identified shards by their paths: "
                    "resume from the shards' original folder)",
                )
            )
        return changed

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume at a saved position (:meth:`state_dict`).

        Another world size or accumulation re-plans the rest of the interrupted window:
        nothing is lost and nothing repeated. The shards are compared by content
        (:meth:`resume_changes`): the same files in another folder resume.

        Raises:
            ResumeMismatchError: when the state is not this stream's (other shards or plan
                settings); ``.changed`` names them and the message says what differs.
            ValueError: for a dict that is not a :class:`StreamingBatches` state.
        """
        missing = [k for k in _STATE_KEYS if k not in state]
        if missing:
            raise ValueError(
                f"Not a StreamingBatches state: it has no {missing}. Pass the dict that "
                "StreamingBatches.state_dict() returned (a checkpoint of another loader, or "
                "a damaged one, cannot resume the stream)."
            )
        changed = self.resume_changes(state)
        if changed:
            raise ResumeMismatchError(
                "The stream position was saved for other data or settings; "
                + "; ".join(text for _, text in changed)
                + ". Resume with the same shards and settings (or start the epoch afresh).",
                changed=[name for name, _ in changed],
            )
        try:
            epoch = check_count("epoch", state["epoch"], minimum=0)
            window = check_count("window", state["window"], minimum=0)
            consumed = check_count("consumed", state["consumed"], minimum=0)
            old = (int(state["world_size"]), int(state["accumulate_grad_batches"]))
            history = [
                (*map(int, h[:3]), self._budgets_then(h[3] if len(h) == 4 else None, h[0]))
                for h in state["history"]
            ]
            budgets = self._budgets_then(state.get("rank_budgets"), old[0])
        except (TypeError, ValueError, IndexError):
            raise ValueError(
                "The stream position is damaged: its epoch, window, consumed, history or "
                f"rank_budgets are not what StreamingBatches.state_dict() writes ({state!r:.200})."
                " Pass the saved state unchanged, or resume from another checkpoint."
            ) from None
        ledger = state.get("ledger")
        if ledger is not None and window < self.planner.num_windows:
            wp = self.planner.window_plan(epoch, window, *old, history, rank_budgets=budgets)
            got = guard_remainder(wp.planner, wp.plan, consumed)
            if (got.consumed, f"{got.digest:016x}") != (ledger["examples"], ledger["digest"]):
                raise ResumeMismatchError(
                    f"The stream position was saved for other data or settings: window {window} "
                    f"of epoch {epoch} is planned with other examples for the {consumed} "
                    "micro-batches it consumed before the checkpoint (a setting the position "
                    "cannot name changed). Resume with the same shards and settings (or start "
                    "the epoch afresh).",
                    changed=["consumed"],
                )
        self.epoch, self._window, self._steps = epoch, window, int(state.get("steps", 0))
        self._seen = []
        if (old, budgets) == ((self.world_size, self.accumulate_grad_batches), self.rank_budgets):
            self._history, self._consumed = history, consumed
        elif consumed == 0:
            self._history, self._consumed = history, 0
        else:  # another topology or budgets: the consumed part becomes history of the window
            self._history, self._consumed = [*history, (*old, consumed, budgets)], 0
            self._steps += -(-consumed // old[1])
        if self._window > self.planner.num_windows:
            raise ValueError(
                f"window {self._window} is past this epoch's {self.planner.num_windows} windows "
                "(the state is damaged or from other data)."
            )
