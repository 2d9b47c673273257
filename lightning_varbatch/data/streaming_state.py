"""The checkpoint side of a stream: its position saved, compared and restored.

A position is a window of the epoch's stream and the micro-batches done in it, with its plan's
budgets and ledger. A load starts there without reading the stream; another world size,
accumulation or budgets re-plan the rest of that window, and :mod:`~.remainder_guard` checks the
window's plan consumed what the state recorded. Shards are compared by content, not path.

Example:
    >>> import numpy as np
    >>> class Shard:
    ...     def __init__(self, name, rows): self.name, self.rows = name, rows
    ...     num_rows = property(lambda self: len(self.rows))
    ...     def lengths(self): return np.array([len(r) for r in self.rows])
    ...     def read(self, rows): return ({"tokens": np.array(self.rows[i])} for i in rows)
    >>> from lightning_varbatch.data.streaming import StreamingBatches
    >>> a, b = Shard("a", [[1, 2], [3]]), Shard("b", [[4, 5, 6]])
    >>> saved = StreamingBatches(ShardedSource([a, b]), 4, rank=0, world_size=1)
    >>> now = StreamingBatches(ShardedSource([b, a]), 4, rank=0, world_size=1)
    >>> now.resume_changes(saved.state_dict())  # doctest: +ELLIPSIS
    [('shards', 'shards: the same 2 shards in another order: a was shards[0], ...')]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import ResumeMismatchError, SettingValueError
from lightning_varbatch.planner.remainder_guard import consumed_ledger, guard_remainder
from lightning_varbatch.planner.windows import WindowedPlanner, WindowPlan
from lightning_varbatch.sources.shards import ShardedSource, identity_changes

__all__ = ["ResumableStream"]

_STATE_KEYS = ("epoch", "window", "consumed", "history", "settings", "shards", "num_examples")


class ResumableStream:
    """The checkpoint half of :class:`~lightning_varbatch.data.streaming.StreamingBatches`.

    The stream gives the attributes below and ``window_plan`` (a window's plan, or its rest).
    """

    planner: WindowedPlanner
    source: ShardedSource
    epoch: int
    world_size: int
    accumulate_grad_batches: int
    _window: int  # where the next iteration starts
    _consumed: int  # micro-batches of that window already done
    _history: list[tuple[Any, ...]]  # earlier topologies of that window
    _steps: int  # optimizer steps of the epoch before that window's plan
    _seen: dict[int, int]  # micro-batches per rank of windows of this epoch
    window_plan: Callable[[int], WindowPlan]

    @property
    def rank_budgets(self) -> tuple[int, ...]:
        """Every rank's budget in this topology's plans (``max_tokens`` when equal)."""
        config = self.planner.config
        return config.rank_budgets(self.world_size) or (config.max_tokens,) * self.world_size

    def fingerprint(self) -> str:
        """The shards' content (not paths: node-local copies agree) and settings' fingerprint."""
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
        """Micro-batches per rank of ``window`` under the current topology (from the position)."""
        if window not in self._seen or window == self._window:  # the position's: its rest
            self._seen[window] = self.window_plan(window).plan.num_micro_batches_per_rank
        return self._seen[window]

    def position_after(self, trained: int) -> tuple[int, int, int]:
        """``(window, micro-batches done in it, steps before its plan)`` after ``trained``.

        ``trained``: micro-batches since this iteration's (restored) start; steps: the epoch's.
        """
        window, consumed, steps = self._window, self._consumed, self._steps
        left = check_count("trained micro-batches", trained, minimum=0)
        while left:
            if window >= self.planner.num_windows:
                raise ValueError(
                    f"{trained} micro-batches is more than this epoch holds from the position "
                    f"(window {self._window}, micro-batch {self._consumed})."
                )
            size = self._window_size(window)
            step = min(left, size - consumed)
            consumed += step
            left -= step
            if consumed == size:
                window, consumed = window + 1, 0
                steps += size // self.accumulate_grad_batches
        return window, consumed, steps

    def state_dict(self, trained: int = 0) -> dict[str, Any]:
        """The position after ``trained`` micro-batches of this iteration, to resume there.

        The end of the epoch is window ``num_windows``: a stream restored there yields nothing
        until ``set_epoch`` starts the next epoch (as a restored sampler does).

        Args:
            trained: micro-batches trained since the iteration began (the loop's count; 0: start).
        """
        window, consumed, steps = self.position_after(trained)
        history = list(self._history) if window == self._window else []
        ledger = None
        if window < self.planner.num_windows:
            examples, digest = consumed_ledger(self.window_plan(window).plan, consumed)
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
        """The budgets a saved plan of ``world`` ranks had (an older state's: the settings')."""
        if saved is not None:
            return tuple(int(b) for b in saved)
        config = self.planner.config
        try:
            return config.rank_budgets(int(world)) or (config.max_tokens,) * int(world)
        except SettingValueError:  # per-rank lists of another length: equal then
            return (config.max_tokens,) * int(world)

    def resume_changes(self, state: Mapping[str, Any]) -> list[tuple[str, str]]:
        """What differs between a saved state (:meth:`state_dict`) and this stream.

        ``(name, description)`` per difference: each plan or window setting that changed, then
        ``"shards"`` when the shards' content (``ShardedSource.identity``) differs, saying
        which moved or changed and how (a state of an older version: their paths).
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
        """Resume at a :meth:`state_dict` position; another topology re-plans its window's rest.

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
            if window > self.planner.num_windows:
                raise ValueError(f"window {window} of {self.planner.num_windows}")
        except (TypeError, ValueError, IndexError):
            raise ValueError(
                "The stream position is damaged: its epoch, window (past this epoch's "
                f"{self.planner.num_windows} windows?), consumed, history or rank_budgets are "
                f"not what StreamingBatches.state_dict() writes ({state!r:.200}). Pass the saved "
                "state unchanged, or resume from another checkpoint."
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
        self._seen = {}
        if (old, budgets) == ((self.world_size, self.accumulate_grad_batches), self.rank_budgets):
            self._history, self._consumed = history, consumed
        elif consumed == 0:
            self._history, self._consumed = history, 0
        else:  # another topology or budgets: the consumed part becomes history of the window
            self._history, self._consumed = [*history, (*old, consumed, budgets)], 0
            self._steps += -(-consumed // old[1])
