"""The examples' batch-size schedule: ``data.batch_schedule`` (docs/batch-schedule.md).

On the command line (quote a schedule with spaces; Hydra keeps the colons)::

    python examples/translation/train.py data.batch_schedule="0:0.25 2M:0.5 8M:1"
    python examples/lm/train.py data.batch_schedule=ramp:0.25:8M

:func:`check_batch_schedule` refuses a value that cannot work before anything is built: the
library's own check of the setting (:class:`~lightning_varbatch.PlanConfig`), its error named
by the Hydra key, and the ``data`` settings the schedule cannot go with.
:func:`batch_schedule_settings` gives the DataModule the keyword when it is set.

Example:
    >>> from omegaconf import OmegaConf
    >>> data = OmegaConf.create({"max_tokens": 2048, "batch_schedule": "0:0.25 2M:0.5 8M:1"})
    >>> check_batch_schedule(OmegaConf.create({"data": data}))
    >>> batch_schedule_settings(data)
    {'batch_schedule': '0:0.25 2M:0.5 8M:1'}
    >>> batch_schedule_settings(OmegaConf.create({"batch_schedule": None}))
    {}
"""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from examples.common.config_checks import ConfigError, passed_setting
from lightning_varbatch import PlanConfig

__all__ = ["KEY", "batch_schedule_settings", "check_batch_schedule"]

#: The ``data`` key of the schedule, as the planner names it (PlanConfig).
KEY = "batch_schedule"


def _value(data: DictConfig) -> Any:
    """``data.batch_schedule`` as plain Python (a list or mapping override becomes one)."""
    value = data.get(KEY)
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def _refusals(cfg: DictConfig) -> dict[str, str]:
    """The settings on in ``cfg`` that rule out a schedule: ``{what is on: what to change}``."""
    data, out = cfg.data, {}
    if data.get("stream"):
        out["data.stream=true (a stream is planned one window at a time)"] = "set data.stream=false"
    if data.get("corpora"):
        out[f"data.corpora={sorted(data.corpora)} (a mixture of corpora)"] = (
            "set data.corpora={} (data=default)"
        )
    if data.get("max_shapes") is not None:
        how = " (set by compile=true)" if cfg.get("compile") else ""
        out[f"data.max_shapes={data.max_shapes}{how} (a shape budget for the full step)"] = (
            "set compile=false and data.max_shapes=null"
        )
    if data.get("length_warmup") is not None:
        out[f"data.length_warmup={data.length_warmup} (both choose the first steps' examples)"] = (
            "set data.length_warmup=null"
        )
    return out


def check_batch_schedule(cfg: DictConfig) -> None:
    """Refuse a ``data.batch_schedule`` that cannot work, naming the setting.

    Raises:
        ConfigError: for a schedule the library refuses (``data.batch_schedule=...: <why>``),
            or one set together with ``data.stream``, ``data.corpora``, ``data.max_shapes``
            (``compile=true``) or ``data.length_warmup``.
    """
    data = cfg.data
    value = _value(data)
    if value is None:
        return
    try:
        PlanConfig(max_tokens=data.max_tokens, batch_schedule=value)
    except (TypeError, ValueError) as error:
        named = passed_setting(data, error) or f"data.{KEY}={value!r}: {error}"
        raise ConfigError(named) from error
    for reason, fix in _refusals(cfg).items():
        raise ConfigError(
            f"data.{KEY}={value!r} cannot be used with {reason}: {fix}, or set "
            f"data.{KEY}=null (docs/batch-schedule.md)."
        )


def batch_schedule_settings(data: DictConfig) -> dict[str, Any]:
    """The DataModule's keyword of the schedule: ``{"batch_schedule": value}`` when it is set."""
    value = _value(data)
    return {} if value is None else {KEY: value}
