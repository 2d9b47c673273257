"""Where a sampler stands in its epoch, saved and restored (also onto another topology).

:class:`EpochPosition` is the position one rank's
:class:`~lightning_varbatch.TokenBudgetBatchSampler` keeps: the epoch, the micro-batches of the
current plan consumed, and those consumed under earlier topologies of the same epoch (the
*history*, which the planner re-plans the rest of the epoch from: the elastic resume).
:func:`save_state` writes it as the sampler's ``state_dict``; :func:`read_state` checks a saved
one, :func:`state_differences` says what it was saved for that differs now, and
:func:`restore_position` resumes from it (or starts the epoch afresh under
``on_mismatch="restart_epoch"``).

Example:
    >>> from lightning_varbatch.planner.epoch_planner import EpochPlanner
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> planner = EpochPlanner([3, 4, 5, 6], PlanConfig(max_tokens=8))
    >>> state = save_state(EpochPosition(consumed=1), planner, 1, 1, lengths_digest(planner))
    >>> saved = read_state(state)
    >>> saved.epoch, saved.consumed, state_differences(saved, planner, lengths_digest(planner))
    (0, 1, {})
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

import numpy as np

from lightning_varbatch.errors import ResumeMismatchError
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import LATER_SETTINGS

__all__ = [
    "ON_MISMATCH",
    "STATE_VERSION",
    "EpochPosition",
    "OnMismatch",
    "SavedState",
    "lengths_digest",
    "read_state",
    "restore_position",
    "save_state",
    "state_differences",
]

OnMismatch: TypeAlias = Literal["error", "restart_epoch"]
ON_MISMATCH: tuple[OnMismatch, ...] = ("error", "restart_epoch")

STATE_VERSION = 2
_STATE_KEYS_V1 = frozenset(
    {
        "version",
        "epoch",
        "seed",
        "num_examples",
        "fingerprint",
        "world_size",
        "accumulate_grad_batches",
        "consumed",
        "history",
    }
)
_STATE_KEYS = _STATE_KEYS_V1 | {"lengths_digest", "restart_offset", "settings"}
#: Keys a version-2 state has only when ranks have budgets of their own: the budgets of the
#: saved plan, and the shares a run set for the epochs after it.
_OPTIONAL_KEYS = frozenset({"rank_budgets", "rank_shares"})

#: (world_size, accumulate_grad_batches, micro-batches consumed) of an earlier topology, and
#: the ranks' budgets of its plan when they had their own.
Topology = tuple[Any, ...]


def lengths_digest(planner: Planner) -> str:
    """A 16-hex-digit digest of the lengths a plan is made from.

    It covers every example's planning length (after truncation), loss length and whether it
    is skipped, so any change of the data's lengths (a re-tokenised corpus, a lowered
    ``max_length``, an edited file with the same line count) changes it. It does not depend
    on the dtype the lengths were given in. About 10 ms per million examples, computed once
    per sampler.

    Example:
        >>> from lightning_varbatch.planner.epoch_planner import EpochPlanner
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> a = EpochPlanner([3, 4, 5], PlanConfig(max_tokens=8))
        >>> b = EpochPlanner([3, 4, 6], PlanConfig(max_tokens=8))
        >>> lengths_digest(a) == lengths_digest(a), lengths_digest(a) == lengths_digest(b)
        (True, False)
    """
    prepared = planner.prepared
    h = hashlib.blake2b(digest_size=8)
    h.update(np.ascontiguousarray(prepared.key, dtype=np.int32).data)
    h.update(np.ascontiguousarray(prepared.loss, dtype=np.int32).data)
    if prepared.kept is not None:
        h.update(b"kept")
        h.update(np.ascontiguousarray(prepared.kept, dtype=np.int64).data)
    return h.hexdigest()


@dataclass
class EpochPosition:
    """Where one rank stands in its epoch.

    Attributes:
        epoch: the current epoch.
        consumed: micro-batches of the current plan taken (yielded or restored).
        restored: a restored position is honoured even at the epoch's end.
        history: micro-batches consumed under earlier topologies of this epoch.
        budgets: the ranks' budgets of the current plan (``None``: ``max_tokens`` on every
            rank), fixed for the rest of the epoch once :attr:`budgets_set`.
        budgets_set: whether the current plan's budgets are decided (a new epoch takes the
            sampler's shares in force when it is first planned).
        offset: micro-batches the training loop counted in this epoch before it was restarted
            afresh (``on_mismatch="restart_epoch"``): counted, but no example is excluded.

    Example:
        >>> p = EpochPosition(epoch=2, consumed=3, history=[(2, 1, 4)])
        >>> p.counted_before, p.start(3), (p.epoch, p.consumed, p.history)
        (4, None, (3, 0, []))
    """

    epoch: int = 0
    consumed: int = 0
    restored: bool = False
    history: list[Topology] = field(default_factory=list)
    offset: int = 0
    budgets: tuple[int, ...] | None = None
    budgets_set: bool = False

    @property
    def counted_before(self) -> int:
        """Micro-batches of this epoch counted before the current plan (not in it)."""
        return self.offset + sum(h[2] for h in self.history)

    def start(self, epoch: int) -> None:
        """Move to the start of ``epoch``."""
        self.epoch, self.consumed, self.restored, self.history, self.offset = (
            epoch,
            0,
            False,
            [],
            0,
        )
        self.budgets_set = False

    def leave_topology(self, world_size: int, accumulate: int) -> None:
        """Record the current plan's consumed micro-batches as history (a topology change)."""
        if self.consumed:
            entry: Topology = (world_size, accumulate, self.consumed)
            if self.budgets is not None:
                entry = (*entry, self.budgets)
            self.history.append(entry)
        self.consumed, self.budgets_set = 0, False


def save_state(
    position: EpochPosition, planner: Planner, world_size: int, accumulate: int, digest: str
) -> dict[str, Any]:
    """The sampler state of ``position``: plain Python values, the same on every rank.

    ``position.consumed`` is the count saved (the caller sets what was *trained*).
    """
    return {
        "version": STATE_VERSION,
        "epoch": position.epoch,
        "seed": planner.config.seed,
        "num_examples": planner.num_examples,
        "fingerprint": planner.fingerprint(),
        "lengths_digest": digest,
        "settings": planner.config.plain(),
        "world_size": world_size,
        "accumulate_grad_batches": accumulate,
        "consumed": int(position.consumed),
        "history": [_plain_topology(h) for h in position.history],
        "restart_offset": position.offset,
        **({} if position.budgets is None else {"rank_budgets": list(position.budgets)}),
    }


def _plain_topology(entry: Topology) -> list[Any]:
    return [*entry[:3], *(list(b) for b in entry[3:])]


@dataclass(frozen=True)
class SavedState:
    """A checked sampler state (see :func:`read_state`)."""

    version: int
    epoch: int
    consumed: int
    topology: tuple[int, int]
    offset: int
    history: list[Topology]
    entries: Mapping[str, Any]
    budgets: tuple[int, ...] | None = None

    @property
    def counted(self) -> int:
        """The training loop's count of this epoch's micro-batches when the state was saved."""
        return self.offset + sum(h[2] for h in self.history) + self.consumed


def _state_int(state: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(
            f"Not a valid TokenBudgetBatchSampler state: {key}={value!r} must be an integer "
            f">= {minimum}; the checkpoint is damaged or was not written by this sampler."
        )
    return int(value)


def _check_keys(state: Any) -> int:
    """The state's version, once it is a mapping with the keys of its version."""
    if not isinstance(state, Mapping):
        raise TypeError(
            "load_state_dict expects the dict returned by TokenBudgetBatchSampler."
            f"state_dict(), got {type(state).__name__}: {str(state)[:60]}. Pass the "
            "saved sampler state (in a Lightning checkpoint: "
            "ckpt['datamodule_state_dict'] or your own key)."
        )
    version = state.get("version")
    keys = set(state) if version == 1 else set(state) - _OPTIONAL_KEYS
    allowed = _STATE_KEYS_V1 if version == 1 else _STATE_KEYS
    if keys != allowed:
        raise ValueError(
            "Not a TokenBudgetBatchSampler state: missing keys "
            f"{sorted(allowed - keys)}, unknown keys {sorted(map(str, keys - allowed))}. "
            "Pass the dict that TokenBudgetBatchSampler.state_dict() returned, unchanged "
            "(in a Lightning checkpoint: ckpt['datamodule_state_dict']['train_sampler'])."
        )
    if version not in (1, STATE_VERSION):
        raise ValueError(
            f"The sampler state has version {version!r}; this version of "
            f"lightning_varbatch reads versions 1 and {STATE_VERSION}: resume with the "
            "version of the library that wrote the checkpoint."
        )
    return int(version)


def read_state(state: Any) -> SavedState:
    """Check a saved sampler state (its keys, version and numbers).

    Raises:
        TypeError: when ``state`` is not a mapping.
        ValueError: when it has missing, unknown or invalid entries, or another version.
    """
    version = _check_keys(state)
    epoch = _state_int(state, "epoch")
    consumed = _state_int(state, "consumed")
    topology = (
        _state_int(state, "world_size", 1),
        _state_int(state, "accumulate_grad_batches", 1),
    )
    offset = _state_int(state, "restart_offset") if version != 1 else 0
    try:
        history = [_read_topology(h) for h in state["history"]]
        budgets = state.get("rank_budgets")
        budgets = None if budgets is None else tuple(int(b) for b in budgets)
    except (TypeError, ValueError):
        raise ValueError(
            "Not a valid TokenBudgetBatchSampler state: history must be a list of "
            f"[world_size, accumulate_grad_batches, consumed] triples (each optionally with "
            f"the ranks' budgets) and rank_budgets a list of integers, got history="
            f"{state['history']!r}, rank_budgets={state.get('rank_budgets')!r}."
        ) from None
    return SavedState(version, epoch, consumed, topology, offset, history, state, budgets)


def _read_topology(entry: Any) -> Topology:
    if len(entry) not in (3, 4):
        raise ValueError(f"history entry {entry!r}")
    head: Topology = tuple(int(x) for x in entry[:3])
    if len(entry) == 4 and entry[3] is not None:
        return (*head, tuple(int(b) for b in entry[3]))
    return head


def _changed_settings(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, Any]:
    """Settings (but the seed) saved with one value and planned with another now.

    A setting of :data:`~lightning_varbatch.planner.settings.LATER_SETTINGS` missing from
    either side had its default there.
    """
    names = [*now, *(k for k in LATER_SETTINGS if k in saved and k not in now)]
    return {
        k: (saved.get(k, LATER_SETTINGS.get(k)), now.get(k, LATER_SETTINGS.get(k)))
        for k in names
        if k != "seed" and saved.get(k, LATER_SETTINGS.get(k)) != now.get(k, LATER_SETTINGS.get(k))
    }


def state_differences(saved: SavedState, planner: Planner, digest: str) -> dict[str, Any]:
    """What ``saved`` was saved for that differs now, as ``name -> (saved, now)``.

    ``"lengths"`` compares the lengths digests; the settings are named one by one when the
    state holds them (else ``"fingerprint"``).
    """
    state = saved.entries
    expected = {
        "seed": planner.config.seed,
        "num_examples": planner.num_examples,
        "fingerprint": planner.fingerprint(),
    }
    differences: dict[str, tuple[Any, Any]] = {}
    if (
        saved.version != 1
        and state["num_examples"] == expected["num_examples"]  # else implied by the count
        and state["lengths_digest"] != digest
    ):
        differences["lengths"] = (state["lengths_digest"], digest)
    differences.update((k, (state[k], v)) for k, v in expected.items() if state[k] != v)
    saved_settings = state.get("settings")
    if isinstance(saved_settings, Mapping) and "fingerprint" in differences:
        # the saved settings say which ones changed: name them instead of the hash
        changed = _changed_settings(saved_settings, planner.config.plain())
        if changed or "seed" in differences:  # they explain the hash: name them only
            del differences["fingerprint"]
            differences.update(changed)
    return differences


def _difference(name: str, saved: Any, now: Any) -> str:
    """One difference between a saved sampler state and the run, in words."""
    if name == "lengths":
        return (
            "the lengths (or loss lengths) differ from those the saved plan was made from "
            f"(lengths digest: saved {saved!r}, now {now!r})"
        )
    return f"{name}: saved {saved!r}, now {now!r}"


def _refuse(saved: SavedState, differences: Mapping[str, Any], wrong: list[str]) -> None:
    raise ResumeMismatchError(
        "The sampler state was saved for other data or settings ("
        + "; ".join(wrong)
        + f"). Resuming epoch {saved.epoch} from it would train some of its examples twice "
        "and never others. Resume with the same dataset, lengths, seed and batching "
        "settings (max_tokens, cost, tail, ...), or start that epoch afresh: "
        "load_state_dict(state, on_mismatch='restart_epoch') "
        "(TokenBudgetDataModule(on_resume_mismatch='restart_epoch'); in the "
        "translation example the data.on_resume_mismatch setting).",
        changed=list(differences),
    )


def _unproven(saved: SavedState, wrong: list[str], restart: bool) -> list[str]:
    """A version-1 state (no lengths digest): warn and resume, or restart the epoch."""
    if saved.version != 1 or wrong:
        return wrong
    reason = "cannot prove that the lengths are unchanged (it has no lengths digest)"
    if restart:
        return [reason]
    warnings.warn(
        f"The sampler state is from an older lightning_varbatch and {reason}: "
        "resuming as saved. If the data's lengths changed since, resume with "
        "on_mismatch='restart_epoch' to start the epoch afresh.",
        UserWarning,
        stacklevel=4,  # the caller of load_state_dict
    )
    return wrong


def restore_position(
    position: EpochPosition,
    saved: SavedState,
    differences: Mapping[str, Any],
    *,
    restart: bool,
    topology: tuple[int, int],
    total: Callable[[], int],
) -> None:
    """Resume ``position`` from ``saved`` (see ``TokenBudgetBatchSampler.load_state_dict``).

    Args:
        position: the sampler's position, changed in place.
        saved: the checked state.
        differences: :func:`state_differences` of it.
        restart: ``on_mismatch="restart_epoch"``: start a mismatching epoch afresh.
        topology: this sampler's ``(world_size, accumulate_grad_batches)``.
        total: micro-batches per rank of the plan of ``position`` (called once it is set).

    Raises:
        ResumeMismatchError: without ``restart``, for a state saved for other data or
            settings, or with more micro-batches consumed than the epoch has.
    """
    wrong = [_difference(k, s, n) for k, (s, n) in differences.items()]
    if wrong and not restart:
        _refuse(saved, differences, wrong)
    wrong = _unproven(saved, wrong, restart)
    counted = saved.counted
    position.epoch, position.restored, position.consumed = saved.epoch, True, 0
    position.budgets, position.budgets_set = saved.budgets, not wrong
    if wrong:
        warnings.warn(
            f"Starting epoch {saved.epoch} afresh (on_mismatch='restart_epoch'): the sampler "
            "state was saved for other data or settings (" + "; ".join(wrong) + "). Every "
            f"example of epoch {saved.epoch} is trained once from its start; {counted} "
            "micro-batch(es) of it trained before the checkpoint are not undone.",
            UserWarning,
            stacklevel=3,  # the caller of load_state_dict
        )
        position.history, position.offset = [], counted
        return
    position.history, position.offset = list(saved.history), saved.offset
    if saved.topology != topology:
        position.consumed = saved.consumed
        position.leave_topology(*saved.topology)
        return
    epoch_total = total()
    if 0 <= saved.consumed <= epoch_total:
        position.consumed = saved.consumed
    elif restart:
        position.history, position.offset = [], counted
        position.budgets_set = False
    else:
        raise ResumeMismatchError(
            f"The sampler state says {saved.consumed} micro-batches were consumed but epoch "
            f"{saved.epoch} has {epoch_total}; the checkpoint does not match this data. Start "
            "the epoch afresh with load_state_dict(state, on_mismatch='restart_epoch').",
            changed=["consumed"],
        )
