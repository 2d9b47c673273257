"""Resume a sampler's position from a saved state: refuse, restart, continue or re-plan.

A state saved for other data or settings is refused (``ResumeMismatchError`` naming what
changed) or restarts its epoch (``on_mismatch="restart_epoch"``). Else the saved plan is remade
from its topology and budgets, its rest must pass the remainder guard, and the examples it
consumed must be those of the state's ledger (else a change no setting names, e.g. a custom cost
of the same name, is refused). The position then continues that plan, or re-plans the rest for
another topology or a rank whose memory budget is now lower. :class:`ResumableSampler` is the
sampler's ``state_dict`` / ``load_state_dict``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

from lightning_varbatch.checks import check_choice, check_count
from lightning_varbatch.data.rank_share_setting import LANE_PLANNERS, RankShareSetting
from lightning_varbatch.data.sampler_state import (
    EpochPosition,
    SavedState,
    lengths_digest,
    read_state,
    save_state,
    state_differences,
)
from lightning_varbatch.errors import ResumeMismatchError, SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.remainder_guard import consumed_ledger, guard_remainder

__all__ = ["ON_MISMATCH", "OnMismatch", "ResumableSampler", "resume_position", "saved_plan"]

OnMismatch: TypeAlias = Literal["error", "restart_epoch"]
ON_MISMATCH: tuple[OnMismatch, ...] = ("error", "restart_epoch")

_FIX = (
    "Resume with the same dataset, lengths, seed and batching settings (max_tokens, cost, "
    "tail, ...), or start that epoch afresh: load_state_dict(state, "
    "on_mismatch='restart_epoch') (TokenBudgetDataModule(on_resume_mismatch='restart_epoch'); "
    "in the examples the data.on_resume_mismatch setting)."
)


def _difference(name: str, saved: Any, now: Any) -> str:
    """One difference between a saved sampler state and the run, in words."""
    if name == "lengths":
        return (
            "the lengths (or loss lengths) differ from those the saved plan was made from "
            f"(lengths digest: saved {saved!r}, now {now!r})"
        )
    if name == "fingerprint":  # the settings' hash, when the state cannot name them
        return (
            f"fingerprint: saved {saved!r}, now {now!r} (the settings that change the plan; "
            "(source, target) pairs saved before pair_order existed were ordered by "
            "max(source, target): resume those with pair_order='max')"
        )
    return f"{name}: saved {saved!r}, now {now!r}"


def _unproven(saved: SavedState, wrong: list[str], restart: bool) -> list[str]:
    """A version-1 state (no lengths digest): warn and resume, or restart the epoch."""
    if saved.version != 1 or wrong:
        return wrong
    reason = "cannot prove that the lengths are unchanged (it has no lengths digest)"
    if restart:
        return [reason]
    warnings.warn(
        f"The sampler state is from an older lightning_varbatch and {reason}: resuming as "
        "saved. If the data's lengths changed since, resume with on_mismatch='restart_epoch' "
        "to start the epoch afresh.",
        UserWarning,
        stacklevel=4,  # the caller of load_state_dict
    )
    return wrong


def saved_plan(planner: Planner, saved: SavedState) -> EpochPlan:
    """The plan the state was saved in: its epoch, topology, history and budgets."""
    args = (saved.epoch, *saved.topology, saved.history)
    if saved.budgets is None:
        return planner.plan_resumed(*args)
    return planner.plan_resumed(*args, rank_budgets=saved.budgets)  # type: ignore[call-arg]


def _consumed_elsewhere(planner: Planner, saved: SavedState, plan: EpochPlan) -> str | None:
    """Why the saved plan's consumed part is not the state's, or ``None`` when it is."""
    total = plan.num_micro_batches_per_rank
    if saved.consumed > total:
        return (
            f"the state says {saved.consumed} micro-batches of epoch {saved.epoch} were consumed, "
            f"but the current settings plan {total}"
        )
    ledger = guard_remainder(planner, plan, saved.consumed)
    if saved.ledger is not None and (ledger.consumed, ledger.digest) != saved.ledger:
        return (
            f"the current settings plan other examples for the {saved.counted} micro-batches "
            f"epoch {saved.epoch} consumed before the checkpoint ({ledger.consumed} examples, "
            f"ledger {ledger.digest:016x}; the state recorded {saved.ledger[0]} examples, "
            f"{saved.ledger[1]:016x}): a setting the state cannot name changed (a custom cost "
            "or length_warmup_schedule with other values under the same name?)"
        )
    return None


def resume_position(
    position: EpochPosition,
    planner: Planner,
    saved: SavedState,
    differences: Mapping[str, Any],
    *,
    restart: bool,
    topology: tuple[int, int],
    memory: Sequence[int] | None,
) -> None:
    """Resume ``position`` from ``saved`` (see ``TokenBudgetBatchSampler.load_state_dict``).

    Args:
        position: the sampler's position, changed in place.
        planner: the sampler's planner.
        saved: the checked state.
        differences: :func:`~lightning_varbatch.data.sampler_state.state_differences` of it.
        restart: ``on_mismatch="restart_epoch"``: start a mismatching epoch afresh.
        topology: this sampler's ``(world_size, accumulate_grad_batches)``.
        memory: every rank's memory budget now (``rank_max_tokens``, else ``max_tokens``);
            a saved plan that gives a rank more is re-planned (``None``: no per-rank budgets).

    Raises:
        ResumeMismatchError: without ``restart``, a state of other data, settings or consumed part.
        RemainderError: when the rest of the saved epoch fails the guard (a bug).
    """
    wrong = [_difference(k, s, n) for k, (s, n) in differences.items()]
    changed = list(differences)
    if not wrong:
        why = _consumed_elsewhere(planner, saved, saved_plan(planner, saved))
        if why is not None:
            wrong, changed = [why], ["consumed"]
    if wrong and not restart:
        raise ResumeMismatchError(
            "The sampler state was saved for other data or settings ("
            + "; ".join(wrong)
            + f"). Resuming epoch {saved.epoch} from it would train some of its examples twice "
            f"and never others. {_FIX}",
            changed=changed,
        )
    wrong = _unproven(saved, wrong, restart)
    position.epoch, position.restored = saved.epoch, True
    if wrong:
        warnings.warn(
            f"Starting epoch {saved.epoch} afresh (on_mismatch='restart_epoch'): the sampler "
            "state was saved for other data or settings (" + "; ".join(wrong) + "). Every "
            f"example of epoch {saved.epoch} is trained once from its start; {saved.counted} "
            "micro-batch(es) of it trained before the checkpoint are not undone.",
            UserWarning,
            stacklevel=3,  # the caller of load_state_dict
        )
        position.consumed, position.history, position.offset = 0, [], saved.counted
        position.budgets_set = False
        return
    position.history, position.offset = list(saved.history), saved.offset
    position.consumed, position.budgets, position.budgets_set = saved.consumed, saved.budgets, True
    over = (
        memory is not None
        and saved.budgets is not None
        and len(memory) == len(saved.budgets)
        and any(b > m for b, m in zip(saved.budgets, memory, strict=True))
    )
    if saved.topology != topology or over:  # the rest of the epoch for this topology, budgets
        position.leave_topology(*saved.topology)


class ResumableSampler:
    """The checkpoint half of ``TokenBudgetBatchSampler`` (``state_dict``, ``load_state_dict``)."""

    planner: Planner
    world_size: int
    accumulate_grad_batches: int
    _position: EpochPosition
    _shares: RankShareSetting
    _digest: str | None

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan (the sampler's)."""
        raise NotImplementedError

    @property
    def lengths_digest(self) -> str:
        """Digest of the lengths this sampler plans from (see :func:`lengths_digest`)."""
        if self._digest is None:
            self._digest = lengths_digest(self.planner)
        return self._digest

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, to resume exactly there.

        Args:
            consumed: micro-batches of this epoch this rank has *trained* on, counted from its
                start as the loop counts them (:attr:`consumed`, :attr:`epoch_length`); default:
                the number taken, ahead of training when a DataLoader prefetches.

        Returns:
            Plain values, the same on every rank: the lengths' digest (``lengths_digest``), the
            budgets of the epoch's plans and its ledger (count and digest of examples consumed).

        Raises:
            ValueError: for ``consumed`` outside the epoch, or less than ran before its plan.
        """
        position = self._position
        plan = self.plan
        before, total = position.counted_before, plan.num_micro_batches_per_rank
        count = position.consumed
        if consumed is not None:
            count = check_count("consumed", consumed, minimum=0) - before
        if not 0 <= count <= total:
            raise SettingValueError(
                f"consumed must be in [{before}, {before + total}] for this epoch (the "
                f"micro-batches trained since its start; {before} ran before its current "
                f"plan), got {consumed!r}.",
                setting="consumed",
                value=consumed,
            )
        saved = EpochPosition(
            position.epoch, count, history=position.history, offset=position.offset
        )
        saved.budgets = position.budgets
        state = save_state(
            saved,
            self.planner,
            self.world_size,
            self.accumulate_grad_batches,
            self.lengths_digest,
            consumed_ledger(plan, count),
        )
        if self._shares.set_by_run and self._shares.shares is not None:
            state["rank_shares"] = list(self._shares.shares)
        return state

    def load_state_dict(
        self, state: Mapping[str, Any], *, on_mismatch: OnMismatch = "error"
    ) -> None:
        """Resume from :meth:`state_dict`, also with another world size or accumulation.

        The state must match the data (lengths and loss lengths, by digest), the settings and
        the examples the saved plan consumed (module docstring); the rest is guarded first.

        Args:
            state: a :meth:`state_dict`.
            on_mismatch: ``"error"`` (default) refuses a state of other data or settings;
                ``"restart_epoch"`` restarts the saved epoch on the current ones, warning
                (examples trained before the checkpoint run again; :attr:`epoch_length` keeps
                counting the loop's earlier micro-batches, as Lightning restores its counter).
                A version-1 state (no lengths digest) resumes with a warning under ``"error"``.

        Raises:
            TypeError: when ``state`` is not a mapping.
            SettingValueError: for an unknown ``on_mismatch``.
            ValueError: for a state with missing, unknown or damaged entries.
            ResumeMismatchError: under ``"error"``, for a state saved for other data or
                settings; ``.changed`` names what differs (``"lengths"``, ``"seed"``, a
                setting, ``"consumed"``) and the message how to start the epoch afresh.
            RemainderError: when the rest of the epoch fails the guard (a bug).

        Example:
            >>> from lightning_varbatch import TokenBudgetBatchSampler
            >>> s = TokenBudgetBatchSampler([3, 4, 5, 6], 8, rank=0, world_size=1)
            >>> _ = next(iter(s)); state = s.state_dict()
            >>> t = TokenBudgetBatchSampler([3, 4, 5, 5], 8, rank=0, world_size=1)
            >>> t.load_state_dict(state)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            lightning_varbatch.errors.ResumeMismatchError: The sampler state was saved for other...
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore")
            ...     t.load_state_dict(state, on_mismatch="restart_epoch")
            >>> len(t) == t.plan.num_micro_batches_per_rank, t.epoch_length - len(t)
            (True, 1)
        """
        check_choice(
            "on_mismatch",
            on_mismatch,
            ON_MISMATCH,
            what=" (what to do with a state saved for other data or settings)",
        )
        saved = read_state(state, self._equal_budgets)
        self._shares.restore(state.get("rank_shares"), self.world_size)
        resume_position(
            self._position,
            self.planner,
            saved,
            state_differences(saved, self.planner, self.lengths_digest),
            restart=on_mismatch == "restart_epoch",
            topology=(self.world_size, self.accumulate_grad_batches),
            memory=self._memory() if isinstance(self.planner, LANE_PLANNERS) else None,
        )
        self.plan  # noqa: B018  (the rest of the epoch, guarded, before anything is yielded)

    def _equal_budgets(self, world_size: int) -> tuple[int, ...] | None:
        """``max_tokens`` on every rank (``None`` for a planner without per-rank budgets)."""
        if not isinstance(self.planner, LANE_PLANNERS):
            return None
        return (self.planner.config.max_tokens,) * world_size

    def _memory(self) -> tuple[int, ...]:
        """Every rank's memory budget now: ``rank_max_tokens``, else ``max_tokens``."""
        config = self.planner.config
        memory = config.rank_max_tokens
        return memory if memory is not None else (config.max_tokens,) * self.world_size
