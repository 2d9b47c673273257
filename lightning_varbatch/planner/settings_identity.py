"""What identifies a plan's settings in a checkpoint: their plain values and fingerprint.

A sampler state saves the settings (:func:`plain_settings`) and a hash of those that change the
plan (:func:`fingerprint_of`): a later setting (:data:`LATER_SETTINGS`) left out at its default, the
per-rank ones (:data:`RANK_SETTINGS`) always, a callable warm-up schedule by values, a cost by name.

Example:
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> "rank_shares" in PlanConfig(64, rank_shares=[1, 0.5]).plain()
    False
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from lightning_varbatch.planner.length_warmup import WARMUP_DEFAULTS, schedule_values

__all__ = [
    "LATER_SETTINGS",
    "RANK_SETTINGS",
    "fingerprint_of",
    "pair_fingerprint",
    "plain_settings",
]

#: Settings added after checkpoints were first saved, with their defaults: at its default one is
#: left out of the plain values and the fingerprint, so older states still resume.
LATER_SETTINGS: dict[str, Any] = {
    "loss_offset": 0,
    **WARMUP_DEFAULTS,
    "rank_shares": None,
    "rank_max_tokens": None,
    "batch_schedule": None,
    # at its default, left out: older states of pairs (by max) fail pair_fingerprint, refused
    "pair_order": "two_sided",
}
#: Settings that say how the work is shared between ranks, not which examples go together:
#: like the world size, they are left out of both (a saved plan records its budgets).
RANK_SETTINGS: tuple[str, ...] = ("rank_shares", "rank_max_tokens")


def _schedule(values: Mapping[str, Any]) -> str:
    return schedule_values(values["length_warmup_schedule"], values["length_warmup"])


def plain_settings(values: Mapping[str, Any]) -> dict[str, Any]:
    """A ``PlanConfig``'s fields by name as plain values (a custom cost by name), for diffs."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        if name in RANK_SETTINGS or (name in LATER_SETTINGS and value == LATER_SETTINGS[name]):
            continue  # as before the setting existed: saved states compare equal
        if callable(value):
            value = getattr(value, "__qualname__", repr(value))
            if name == "length_warmup_schedule":  # what it is: its values
                value += f" ({_schedule(values)})"
        keep = isinstance(value, (bool, int, float, str, type(None)))
        out[name] = value if keep else str(value)
    return out


def fingerprint_of(values: dict[str, Any]) -> str:
    """A short hash of every setting that changes the plan (``values``: the fields by name)."""
    schedule = _schedule(values)
    if values["layout"] == "padded":
        del values["layout"], values["flop_attention"]
    if values["max_shapes"] is None:
        del values["max_shapes"]
    # the pair order changes only plans of pairs: their planner adds it (pair_fingerprint)
    del values["pair_order"]
    for name, default in LATER_SETTINGS.items():
        if name in values and (values[name] == default or name in RANK_SETTINGS):
            del values[name]
    if callable(values["cost"]):
        values["cost"] = getattr(values["cost"], "__qualname__", repr(values["cost"]))
    if "length_warmup_schedule" in values:  # a callable by its values
        values["length_warmup_schedule"] = schedule
    blob = json.dumps(values, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:16]


def pair_fingerprint(fingerprint: str, pairs: bool, pair_order: str) -> str:
    """A planner's fingerprint: its settings' (``fingerprint``), marked for two-sided pairs.

    Pairs in the two-sided order plan otherwise than under ``"max"`` (the order of plans made
    before the setting existed, and the only one for one length per example).

    Example:
        >>> pair_fingerprint("abc", pairs=False, pair_order="two_sided")
        'abc'
    """
    if not pairs or pair_order == "max":
        return fingerprint
    return hashlib.sha1(f"{fingerprint}-pairs-{pair_order}".encode()).hexdigest()[:16]
