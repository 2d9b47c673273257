"""Resume a sampler's position from a saved state: refuse, restart, continue or re-plan.

:func:`resume_position` is what :meth:`~lightning_varbatch.TokenBudgetBatchSampler.
load_state_dict` does with a checked state (:mod:`~lightning_varbatch.data.sampler_state`):

1. A state saved for other data or settings is refused (``ResumeMismatchError`` naming what
   changed) or, with ``on_mismatch="restart_epoch"``, starts its epoch afresh.
2. Otherwise the saved plan is made again from the saved topology and budgets, and the one guard
   (:func:`~lightning_varbatch.planner.remainder_guard.guard_remainder`) checks its rest. The
   examples it says the epoch consumed must be those the state recorded (its ledger): a change
   the state cannot name (a custom cost or schedule of the same name and other values, say)
   would otherwise lose and repeat examples without a word; it is refused like the others.
3. The position continues the saved plan when the topology is the same and every rank's saved
   budget is within its memory budget now; otherwise the rest of the epoch is re-planned for
   this topology and these budgets (an elastic resume: the consumed part becomes history).

Example:
    >>> from lightning_varbatch.data.sampler_state import EpochPosition, lengths_digest
    >>> from lightning_varbatch.data.sampler_state import read_state, save_state
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> from lightning_varbatch.planner.remainder_guard import consumed_ledger
    >>> planner = EpochPlanner([3, 4, 5, 6, 2], PlanConfig(max_tokens=8))
    >>> ledger = consumed_ledger(planner.plan(0, 1, 1), 2)
    >>> state = save_state(EpochPosition(consumed=2, budgets=(8,)), planner, 1, 1,
    ...                    lengths_digest(planner), ledger)
    >>> position = EpochPosition()
    >>> resume_position(position, planner, read_state(state, lambda w: (8,) * w), {},
    ...                 restart=False, topology=(2, 1), memory=(8, 8))
    >>> position.history  # another world size: the consumed part is history, re-planned
    [(1, 1, 2, (8,))]
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeAlias

from lightning_varbatch.data.sampler_state import EpochPosition, SavedState
from lightning_varbatch.errors import ResumeMismatchError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.remainder_guard import guard_remainder

__all__ = ["ON_MISMATCH", "OnMismatch", "resume_position", "saved_plan"]

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
        ResumeMismatchError: without ``restart``, for a state saved for other data or
            settings, or whose consumed part the current settings plan otherwise.
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
