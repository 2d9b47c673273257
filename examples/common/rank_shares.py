"""The examples' mixed-cluster settings: ``data.rank_shares`` and ``data.rank_max_tokens``.

Both examples take each rank's share of a step's work and its own memory budget as Hydra
overrides of their ``data`` group, null by default (ranks of equal speed and memory), and the
balancing callback as ``callbacks.rank_balance.enabled=true`` (docs/mixed-clusters.md)::

    python examples/translation/train.py trainer.devices=2 data.rank_shares=[1.0,0.5]
    python examples/lm/train.py trainer.devices=2 data.rank_max_tokens=[2048,1500]

:func:`check_rank_settings` refuses a value that cannot work before anything is built (with the
library's own checks, and one entry per rank of ``trainer.devices`` x ``trainer.num_nodes``);
:func:`rank_settings` gives the DataModule the keys that are set, as plain tuples (Hydra hands
lists as ``ListConfig``).

Example:
    >>> from omegaconf import OmegaConf
    >>> data = OmegaConf.create({"rank_shares": [1.0, 0.5], "rank_max_tokens": None})
    >>> check_rank_settings(data, OmegaConf.create({"devices": 2}))
    >>> rank_settings(data)
    {'rank_shares': (1.0, 0.5)}
    >>> rank_settings(OmegaConf.create({"rank_shares": None}))
    {}
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from examples.common.config_checks import ConfigError, is_int, passed_setting
from lightning_varbatch import PlanConfig, SettingError

__all__ = ["KEYS", "check_rank_settings", "planned_ranks", "rank_settings"]

#: The ``data`` keys of a mixed cluster, as the planner names them (PlanConfig).
KEYS = ("rank_shares", "rank_max_tokens")


def _ranks(trainer: DictConfig) -> int | None:
    """The run's number of ranks, when the config fixes it (``trainer.devices`` not ``auto``)."""
    devices, nodes = trainer.get("devices", 1), trainer.get("num_nodes", 1)
    if is_int(devices) and is_int(nodes):
        return int(devices) * int(nodes)
    return None


def check_rank_settings(data: DictConfig, trainer: DictConfig) -> None:
    """Refuse ``data.rank_shares`` / ``data.rank_max_tokens`` values that cannot work.

    Args:
        data: the ``data`` group.
        trainer: the ``trainer`` group (its ``devices`` x ``num_nodes`` is the number of ranks
            each list must have an entry for; ``devices=auto`` is checked by the planner).

    Raises:
        ConfigError: naming the ``data.rank_*`` setting, the rank and what is allowed.
    """
    settings = rank_settings(data)
    if not settings:
        return
    budget = data.get("max_tokens")
    try:  # the library's own checks of the values (each entry, and against max_tokens)
        PlanConfig(max_tokens=budget if is_int(budget) and budget > 0 else 2**62, **settings)
    except SettingError as error:
        raise ConfigError(passed_setting(data, error) or f"data: {error}") from error
    ranks = _ranks(trainer)
    for key, values in settings.items():
        if ranks is not None and len(values) != ranks:
            raise ConfigError(
                f"data.{key} has {len(values)} entries but the run has {ranks} rank(s) "
                f"(trainer.devices={trainer.get('devices', 1)} x "
                f"trainer.num_nodes={trainer.get('num_nodes', 1)}): give one entry per rank, "
                f"rank 0 first, or set data.{key}=null."
            )


def planned_ranks(data: DictConfig) -> int:
    """The world size to plan the splits for before the Trainer exists.

    One rank, as the examples check their plans, unless ``data.rank_*`` lists one entry per
    rank: then their length (:func:`check_rank_settings` has matched it to the trainer).

    Example:
        >>> from omegaconf import OmegaConf
        >>> planned_ranks(OmegaConf.create({"rank_shares": [1, 2, 2], "rank_max_tokens": None}))
        3
    """
    lengths = [len(data[k]) for k in KEYS if data.get(k) is not None]
    return lengths[0] if lengths else 1


def rank_settings(data: DictConfig) -> dict[str, Any]:
    """The DataModule's keywords of a mixed cluster: the ``data.rank_*`` keys that are set."""
    out = {}
    for key in KEYS:
        value = data.get(key)
        if value is not None:
            plain = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
            out[key] = tuple(plain) if isinstance(plain, (list, tuple)) else plain
    return out
