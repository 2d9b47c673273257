"""The examples' sequence-length warm-up settings: ``data.length_warmup*`` (docs/length-warmup.md).

Both examples take the planner's length warm-up as Hydra overrides of their ``data`` group, all
null by default (no warm-up: the plan is the one without these keys)::

    python examples/translation/train.py data.length_warmup=200 data.length_warmup_schedule=root
    python examples/lm/train.py data.length_warmup=100 data.length_warmup_min=16

:func:`check_length_warmup` refuses a value that cannot work before anything is built;
:func:`length_warmup_settings` gives the DataModule the keys that are set (the library refuses
``length_warmup_min``/``_max``/``_schedule`` without ``length_warmup``, and so does the check).

Example:
    >>> from omegaconf import OmegaConf
    >>> data = OmegaConf.create({"length_warmup": 200, "length_warmup_schedule": "root"})
    >>> check_length_warmup(data)
    >>> length_warmup_settings(data)
    {'length_warmup': 200, 'length_warmup_schedule': 'root'}
    >>> length_warmup_settings(OmegaConf.create({"length_warmup": None}))
    {}
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig

from examples.common.config_checks import ConfigError, check_choice, check_int
from lightning_varbatch import PlanConfig
from lightning_varbatch.planner import LENGTH_WARMUP_SCHEDULES

__all__ = ["KEYS", "check_length_warmup", "length_warmup_settings"]

#: The ``data`` keys of the warm-up, as the planner names them (PlanConfig).
KEYS = ("length_warmup", "length_warmup_min", "length_warmup_max", "length_warmup_schedule")


def check_length_warmup(data: DictConfig, *, refused_with: dict[str, str] | None = None) -> None:
    """Refuse ``data.length_warmup*`` values that cannot work, naming the setting.

    Args:
        data: the ``data`` group.
        refused_with: settings that rule the warm-up out, ``{reason: what to change}`` for
            those that are on (e.g. a streamed corpus).

    Raises:
        ConfigError: naming the ``data.length_warmup*`` setting and what is allowed.
    """
    warmup = data.get("length_warmup")
    check_int(
        "data.length_warmup",
        warmup,
        1,
        nullable=True,
        extra=" (optimizer steps of the warm-up from the start of the run; null: none)",
    )
    check_int("data.length_warmup_min", data.get("length_warmup_min"), 1, nullable=True)
    check_int("data.length_warmup_max", data.get("length_warmup_max"), 1, nullable=True)
    schedule = data.get("length_warmup_schedule")
    if schedule is not None:
        check_choice("data.length_warmup_schedule", schedule, LENGTH_WARMUP_SCHEDULES)
    if warmup is None:
        given = [f"data.{k}={data.get(k)!r}" for k in KEYS[1:] if data.get(k) is not None]
        if given:
            raise ConfigError(
                f"{', '.join(given)} given without data.length_warmup: set "
                "data.length_warmup=N (the optimizer steps of the warm-up) or leave them null."
            )
        return
    low, high = data.get("length_warmup_min"), data.get("length_warmup_max")
    least = PlanConfig(max_tokens=1).length_warmup_min if low is None else low
    if high is not None and least > high:  # null: the planner's default minimum
        shown = f"={low}" if low is not None else f" (null: the default, {least})"
        raise ConfigError(
            f"data.length_warmup_min{shown} is above data.length_warmup_max={high}: the cap "
            "grows from the minimum to the maximum; lower the one or raise the other."
        )
    for reason, fix in (refused_with or {}).items():
        raise ConfigError(
            f"data.length_warmup={warmup} cannot be used with {reason}: {fix}, or set "
            "data.length_warmup=null (docs/length-warmup.md)."
        )


def length_warmup_settings(data: DictConfig) -> dict[str, Any]:
    """The DataModule's keywords of the warm-up: the ``data.length_warmup*`` keys that are set."""
    return {k: data.get(k) for k in KEYS if data.get(k) is not None}
