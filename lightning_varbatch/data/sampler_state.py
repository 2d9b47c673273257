"""Where a sampler stands in its epoch, and its saved state (also for another topology).

:class:`EpochPosition` is one rank's position: the epoch, the micro-batches of the current plan
consumed, those consumed under earlier topologies of the epoch (the *history* an elastic resume
re-plans the rest from) and every plan's budgets as they were, so a state resumes the same plan
whatever ``rank_shares`` / ``rank_max_tokens`` are now (version 2 left equal budgets out:
``max_tokens`` on every rank). :func:`save_state` writes it with the epoch's ledger,
:func:`read_state` checks a saved one and :func:`state_differences` says what differs now.

Example:
    >>> from lightning_varbatch.planner.epoch_planner import EpochPlanner
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> planner = EpochPlanner([3, 4, 5, 6], PlanConfig(max_tokens=8))
    >>> state = save_state(EpochPosition(consumed=1), planner, 1, 1, lengths_digest(planner),
    ...                    (2, 17))
    >>> saved = read_state(state, lambda world: (8,) * world)
    >>> saved.epoch, saved.consumed, saved.budgets, saved.ledger  # no budgets saved: equal
    (0, 1, (8,), (2, 17))
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings_identity import LATER_SETTINGS

__all__ = [
    "STATE_VERSION",
    "EpochPosition",
    "SavedState",
    "lengths_digest",
    "read_state",
    "save_state",
    "state_differences",
]

STATE_VERSION = 3
_KEYS_V1 = frozenset(
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
_KEYS_V2 = _KEYS_V1 | {"lengths_digest", "restart_offset", "settings"}
_KEYS = {1: _KEYS_V1, 2: _KEYS_V2, 3: _KEYS_V2 | {"rank_budgets", "ledger"}}
#: Keys a state has only sometimes: a version-2 state's budgets (ranks of their own), run shares.
_OPTIONAL = {1: frozenset(), 2: frozenset({"rank_budgets", "rank_shares"}), 3: {"rank_shares"}}

#: (world_size, accumulate_grad_batches, consumed, its budgets or None) of an earlier topology.
Topology = tuple[Any, ...]
Budgets = tuple[int, ...] | None


def lengths_digest(planner: Planner) -> str:
    """A 16-hex-digit digest of the lengths a plan is made from.

    Of every example's planning length (after truncation), loss length and skip, whatever the
    dtype: any change of the lengths changes it (about 10 ms a million examples, once per sampler).

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
        history: ``(world_size, accumulation, consumed, budgets)`` of earlier topologies.
        offset: micro-batches the loop counted before the epoch restarted afresh.
        budgets: the ranks' budgets of the current plan (``None``: a planner without them).
        budgets_set: whether they are decided (a new epoch takes the shares in force).

    Example:
        >>> p = EpochPosition(epoch=2, consumed=3, history=[(2, 2, 3, None)])
        >>> p.counted_before, p.steps_before, p.start(3), (p.epoch, p.consumed, p.history)
        (3, 2, None, (3, 0, []))
    """

    epoch: int = 0
    consumed: int = 0
    restored: bool = False
    history: list[Topology] = field(default_factory=list)
    offset: int = 0
    budgets: Budgets = None
    budgets_set: bool = False

    @property
    def counted_before(self) -> int:
        """Micro-batches of this epoch counted before the current plan (not in it)."""
        return self.offset + sum(h[2] for h in self.history)

    @property
    def steps_before(self) -> int:
        """Optimizer steps of this epoch begun before the current plan (a started one counts)."""
        return sum(math.ceil(h[2] / h[1]) for h in self.history)

    def start(self, epoch: int) -> None:
        """Move to the start of ``epoch``."""
        self.epoch, self.consumed, self.restored, self.history, self.offset = epoch, 0, False, [], 0
        self.budgets_set = False

    def leave_topology(self, world_size: int, accumulate: int) -> None:
        """Record the current plan's consumed micro-batches as history (a re-plan follows)."""
        if self.consumed:
            self.history.append((world_size, accumulate, self.consumed, self.budgets))
        self.consumed, self.budgets_set = 0, False


def save_state(
    position: EpochPosition,
    planner: Planner,
    world_size: int,
    accumulate: int,
    digest: str,
    ledger: tuple[int, int],
) -> dict[str, Any]:
    """The sampler state of ``position``: plain Python values, the same on every rank.

    ``position.consumed`` is the count saved (the caller sets what was *trained*); ``ledger``:
    ``(examples, digest)`` the epoch consumed up to it (:func:`~.remainder_guard.consumed_ledger`).
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
        "history": [[*h[:3], None if h[3] is None else list(h[3])] for h in position.history],
        "restart_offset": position.offset,
        "rank_budgets": None if position.budgets is None else list(position.budgets),
        "ledger": {"examples": int(ledger[0]), "digest": f"{ledger[1]:016x}"},
    }


@dataclass(frozen=True)
class SavedState:
    """A checked sampler state (see :func:`read_state`).

    Attributes:
        ledger: ``(examples, digest)`` of what the epoch consumed (``None``: before version 3).
    """

    version: int
    epoch: int
    consumed: int
    topology: tuple[int, int]
    offset: int
    history: list[Topology]
    entries: Mapping[str, Any]
    budgets: Budgets = None
    ledger: tuple[int, int] | None = None

    @property
    def counted(self) -> int:
        """The training loop's count of this epoch's micro-batches when the state was saved."""
        return self.offset + sum(h[2] for h in self.history) + self.consumed


class _Damaged(ValueError):
    """One entry of a state is not what this sampler writes."""


def _damaged(problem: str) -> ValueError:
    return ValueError(
        f"The sampler state is damaged: {problem}. It is not what "
        "TokenBudgetBatchSampler.state_dict() writes; pass the saved state unchanged (in a "
        "Lightning checkpoint: ckpt['datamodule_state_dict']['train_sampler']), or train "
        "without it (resume from another checkpoint, or start the run afresh)."
    )


def _int(value: Any, what: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise _Damaged(f"{what} is {value!r}, not an integer >= {minimum}")
    return int(value)


def _budgets(value: Any, what: str) -> Budgets:
    if value is None:
        return None
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise _Damaged(f"{what} is {value!r}, not a list of budgets (one per rank) or null")
    return tuple(_int(b, f"{what} entry", 1) for b in value)


def _keys(state: Any) -> int:
    """The state's version, once it is a mapping with the keys of its version."""
    if not isinstance(state, Mapping):
        raise TypeError(
            "load_state_dict expects the dict returned by TokenBudgetBatchSampler."
            f"state_dict(), got {type(state).__name__}: {str(state)[:60]}. Pass the "
            "saved sampler state (in a Lightning checkpoint: "
            "ckpt['datamodule_state_dict'] or your own key)."
        )
    version = state.get("version", STATE_VERSION)  # none: its keys say what is missing
    if version not in _KEYS:
        raise ValueError(
            f"The sampler state has version {version!r}; this version of lightning_varbatch "
            f"reads versions 1 to {STATE_VERSION}: resume with the version of the library that "
            "wrote the checkpoint, or pass a TokenBudgetBatchSampler state."
        )
    keys = set(state) - _OPTIONAL[version]
    if keys != _KEYS[version]:
        raise ValueError(
            "Not a TokenBudgetBatchSampler state: missing keys "
            f"{sorted(_KEYS[version] - keys)}, unknown keys "
            f"{sorted(map(str, keys - _KEYS[version]))}. Pass the dict that "
            "TokenBudgetBatchSampler.state_dict() returned, unchanged (in a Lightning "
            "checkpoint: ckpt['datamodule_state_dict']['train_sampler'])."
        )
    return int(version)


def read_state(state: Any, uniform: Callable[[int], Budgets]) -> SavedState:
    """Check a saved sampler state (its keys, version and every entry).

    Args:
        state: a :func:`save_state` dict.
        uniform: ``world_size`` equal budgets (``max_tokens`` each), for states of version 1 or 2.

    Raises:
        TypeError: when ``state`` is not a mapping.
        ValueError: for missing or unknown keys, another version, or a damaged entry (named).
    """
    version = _keys(state)
    try:
        topology = (
            _int(state["world_size"], "world_size", 1),
            _int(state["accumulate_grad_batches"], "accumulate_grad_batches", 1),
        )
        history = [_entry(h, i, uniform) for i, h in enumerate(_list(state["history"]))]
        budgets = _budgets(state.get("rank_budgets"), "rank_budgets")  # None: equal (v2)
        budgets = uniform(topology[0]) if budgets is None else budgets
        ledger = _ledger(state["ledger"]) if version == 3 else None
        if budgets is not None and len(budgets) != topology[0]:
            raise _Damaged(f"rank_budgets has {len(budgets)} entries for {topology[0]} ranks")
        return SavedState(
            version,
            _int(state["epoch"], "epoch"),
            _int(state["consumed"], "consumed"),
            topology,
            _int(state["restart_offset"], "restart_offset") if version > 1 else 0,
            history,
            state,
            budgets,
            ledger,
        )
    except _Damaged as error:
        raise _damaged(str(error)) from None


def _list(value: Any) -> list[Any]:
    if isinstance(value, (str, bytes, Mapping)) or not hasattr(value, "__iter__"):
        raise _Damaged(f"history is {value!r}, not a list")
    return list(value)


def _entry(entry: Any, i: int, uniform: Callable[[int], Budgets]) -> Topology:
    what = f"history[{i}]"
    if isinstance(entry, (str, bytes, Mapping)) or not hasattr(entry, "__len__"):
        raise _Damaged(f"{what} is {entry!r}, not [world_size, accumulation, consumed, budgets]")
    if len(entry) not in (3, 4):
        raise _Damaged(f"{what} has {len(entry)} items, not 4")
    world = _int(entry[0], f"{what} world_size", 1)
    head = (world, _int(entry[1], f"{what} accumulation", 1), _int(entry[2], f"{what} consumed"))
    budgets = _budgets(entry[3], f"{what} budgets") if len(entry) == 4 else None
    return (*head, uniform(world) if budgets is None else budgets)  # None: equal (version 2)


def _ledger(value: Any) -> tuple[int, int]:
    if not isinstance(value, Mapping) or set(value) != {"examples", "digest"}:
        raise _Damaged(f"ledger is {value!r}, not {{'examples': ..., 'digest': ...}}")
    try:
        digest = int(str(value["digest"]), 16)
    except ValueError:
        raise _Damaged(f"ledger digest is {value['digest']!r}, not a hexadecimal number") from None
    return _int(value["examples"], "ledger examples"), digest


def _changed_settings(saved: Mapping[str, Any], now: Mapping[str, Any]) -> dict[str, Any]:
    """Settings (but the seed) saved at another value than now (a missing one: its default)."""
    names = [*now, *(k for k in LATER_SETTINGS if k in saved and k not in now)]
    return {
        k: (saved.get(k, LATER_SETTINGS.get(k)), now.get(k, LATER_SETTINGS.get(k)))
        for k in names
        if k != "seed" and saved.get(k, LATER_SETTINGS.get(k)) != now.get(k, LATER_SETTINGS.get(k))
    }


def state_differences(saved: SavedState, planner: Planner, digest: str) -> dict[str, Any]:
    """What ``saved`` was saved for that differs now, as ``name -> (saved, now)``.

    ``"lengths"``: the lengths digests differ; saved settings one by one (else ``"fingerprint"``).
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
