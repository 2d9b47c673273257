"""Checks of the examples' settings, before anything is built or written.

Every check raises :class:`ConfigError` with a message that names the setting
(``data.bucket_width``, ``trainer.max_steps``, ``ckpt_path``, ...), the value received and
what is allowed; :func:`~examples.common.cli.run_entry` turns it into exit status 2. Each
example checks its own ``data``/``model`` groups with these helpers, and both check the
``trainer`` group (:func:`check_trainer`) and the settings of their entry config
(:func:`check_run_settings`) here.

Example:
    >>> check_int("data.max_tokens", 4096, 1)
    >>> try:
    ...     check_int("data.max_tokens", 0, 1)
    ... except ConfigError as error:
    ...     print(error)
    data.max_tokens must be a positive integer, got 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from omegaconf import DictConfig

from lightning_varbatch import ON_MISMATCH
from lightning_varbatch.planner import OVERSIZE_POLICIES, PAIR_ORDERS, TAIL_POLICIES

__all__ = [
    "GROUPS",
    "RUN_KEYS",
    "ConfigError",
    "check_batching",
    "check_bool",
    "check_choice",
    "check_int",
    "check_number",
    "check_path",
    "check_run_settings",
    "check_trainer",
    "is_int",
    "is_number",
    "passed_setting",
]

#: The config groups both entry configs must hold.
GROUPS = ("strategy", "data", "model", "trainer", "callbacks")
#: The top-level keys both entry configs may hold (their groups and the run's own settings);
#: each example adds its own (:func:`check_run_settings`).
RUN_KEYS = frozenset(
    {*GROUPS, "logger", "seed", "output_dir", "ckpt_path", "on_resume_mismatch", "cpu_threads"}
)


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the setting to change."""


def is_int(value: Any) -> bool:
    """Whether ``value`` is an integer (not a bool).

    Example:
        >>> is_int(3), is_int(True), is_int(3.0)
        (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """Whether ``value`` is a finite int or float (not a bool).

    Example:
        >>> is_number(0.5), is_number(float("nan")), is_number(False)
        (True, False, False)
    """
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def check_int(
    key: str, value: Any, minimum: int, *, nullable: bool = False, extra: str = ""
) -> None:
    """Refuse ``value`` unless it is an integer ``>= minimum`` (or null when ``nullable``).

    Args:
        key: the setting, for the message.
        value: its value.
        minimum: the smallest value allowed.
        nullable: whether null is allowed.
        extra: appended to the message (what the setting means).

    Raises:
        ConfigError: naming ``key``.

    Example:
        >>> check_int("data.max_length", None, 2, nullable=True)
    """
    if (value is None and nullable) or (is_int(value) and value >= minimum):
        return
    what = {0: "an integer >= 0", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
    raise ConfigError(
        f"{key} must be {what}{' or null' if nullable else ''}, got {value!r}{extra}."
    )


def check_number(
    key: str,
    value: Any,
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    nullable: bool = False,
) -> None:
    """Refuse ``value`` unless it is a finite number in the interval from ``low`` to ``high``.

    Raises:
        ConfigError: naming ``key`` and the interval.

    Example:
        >>> check_number("model.dropout", 0.1, 0, 1, high_open=True)
    """
    if value is None and nullable:
        return
    if is_number(value):
        v = float(value)
        above = v > low if low_open else v >= low
        below = v < high if high_open else v <= high
        if above and below:
            return
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"
    span = f"{lo}{low:g}, {high:g}{hi}" if math.isfinite(high) else f"{lo}{low:g}, inf)"
    raise ConfigError(
        f"{key} must be a number in {span}{' or null' if nullable else ''}, got {value!r}."
    )


def check_choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    """Refuse ``value`` unless it is one of ``choices`` (of the same type).

    Raises:
        ConfigError: naming ``key`` and the choices.

    Example:
        >>> check_choice("data.oversize", "skip", ("error", "skip", "truncate"))
    """
    if isinstance(value, (str, bool)) or value is None:
        if value in choices and type(value) in {type(c) for c in choices}:
            return
    raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}.")


def check_bool(key: str, value: Any) -> None:
    """Refuse ``value`` unless it is true or false.

    Raises:
        ConfigError: naming ``key``.

    Example:
        >>> check_bool("test", False)
    """
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}.")


def check_path(key: str, value: Any, *, nullable: bool = True) -> None:
    """Refuse ``value`` unless it is a non-empty string (or null when ``nullable``).

    Raises:
        ConfigError: naming ``key``.

    Example:
        >>> check_path("data.cache_dir", None)
    """
    if (value is None and nullable) or (isinstance(value, str) and value.strip()):
        return
    raise ConfigError(
        f"{key} must be a path (a non-empty string){' or null' if nullable else ''}, got {value!r}."
    )


def passed_setting(data: DictConfig, error: BaseException) -> str | None:
    """A library error about a ``data`` key the example passes on under the same name, by
    its Hydra key: ``data.rank_shares=[1.0, 0.0]: <the library's message>``.

    ``None`` for the budgets (``data.max_tokens``/``data.val_max_tokens``: the caller names
    what they hold) and for settings that are no ``data`` key.

    Example:
        >>> from omegaconf import OmegaConf
        >>> from lightning_varbatch import SettingValueError
        >>> error = SettingValueError("rank_shares[1] ...", setting="rank_shares", value=0)
        >>> passed_setting(OmegaConf.create({"rank_shares": [1.0, 0.0]}), error)
        'data.rank_shares=[1.0, 0.0]: rank_shares[1] ...'
    """
    setting = getattr(error, "setting", None)
    if not isinstance(setting, str) or setting in ("max_tokens", "val_max_tokens"):
        return None
    if setting not in data:
        return None
    value = data.get(setting)
    return f"data.{setting}={'null' if value is None else value}: {error}"


def check_batching(data: DictConfig) -> None:
    """The batching settings of ``data`` both examples hand to the DataModule.

    ``data.max_tokens``, ``data.val_max_tokens``, ``data.bucket_width``,
    ``data.pad_to_multiple_of``, ``data.num_workers``, ``data.tail`` (the library's
    ``TAIL_POLICIES``), ``data.oversize`` (its ``OVERSIZE_POLICIES``) and ``data.pair_order``
    (its ``PAIR_ORDERS``).

    Raises:
        ConfigError: naming the ``data.*`` setting.

    Example:
        >>> from omegaconf import OmegaConf
        >>> data = OmegaConf.create(
        ...     {"max_tokens": 4096, "val_max_tokens": None, "bucket_width": 1,
        ...      "pad_to_multiple_of": 8, "num_workers": 0, "tail": "spread", "oversize": "error"}
        ... )
        >>> check_batching(data)
    """
    check_int("data.max_tokens", data.get("max_tokens"), 1, extra=" (the token budget)")
    check_int("data.val_max_tokens", data.get("val_max_tokens"), 1, nullable=True)
    check_int("data.bucket_width", data.get("bucket_width"), 1, extra=" (1: exact lengths)")
    check_int(
        "data.pad_to_multiple_of",
        data.get("pad_to_multiple_of"),
        1,
        extra=" (1: no rounding; e.g. 8 for tensor cores)",
    )
    check_int(
        "data.num_workers", data.get("num_workers"), 0, extra=" (0: load in the main process)"
    )
    check_choice("data.tail", data.get("tail"), TAIL_POLICIES)
    check_choice("data.oversize", data.get("oversize"), OVERSIZE_POLICIES)
    check_choice("data.pair_order", data.get("pair_order", "two_sided"), PAIR_ORDERS)


def _check_length(trainer: DictConfig) -> None:
    """``trainer.max_steps`` and ``trainer.max_epochs``: one of them ends the training."""
    max_steps = trainer.get("max_steps", -1)
    if not (is_int(max_steps) and (max_steps >= 1 or max_steps == -1)):
        raise ConfigError(
            f"trainer.max_steps must be a positive integer or -1 (no limit; then set "
            f"trainer.max_epochs), got {max_steps!r}."
        )
    max_epochs = trainer.get("max_epochs")
    if not (max_epochs is None or (is_int(max_epochs) and (max_epochs >= 1 or max_epochs == -1))):
        raise ConfigError(
            f"trainer.max_epochs must be a positive integer, -1 or null, got {max_epochs!r}."
        )
    if max_steps == -1 and max_epochs in (None, -1):
        raise ConfigError(
            "trainer.max_steps=-1 and trainer.max_epochs=-1/null would train forever: set one."
        )


def _check_loop(trainer: DictConfig) -> None:
    """The devices, accumulation, logging and validation intervals of ``trainer``."""
    devices = trainer.get("devices", 1)
    if not ((is_int(devices) and devices >= 1) or devices == "auto"):
        raise ConfigError(f"trainer.devices must be a positive integer or auto, got {devices!r}.")
    check_int("trainer.num_nodes", trainer.get("num_nodes", 1), 1)
    check_int("trainer.accumulate_grad_batches", trainer.get("accumulate_grad_batches", 1), 1)
    check_int("trainer.log_every_n_steps", trainer.get("log_every_n_steps", 50), 1)
    check_int("trainer.num_sanity_val_steps", trainer.get("num_sanity_val_steps", 0), -1)
    check_int(
        "trainer.check_val_every_n_epoch", trainer.get("check_val_every_n_epoch"), 1, nullable=True
    )
    interval = trainer.get("val_check_interval")
    if not (
        interval is None
        or (is_int(interval) and interval >= 1)
        or (isinstance(interval, float) and 0 < interval <= 1)
    ):
        raise ConfigError(
            "trainer.val_check_interval must be a positive integer (training micro-batches "
            f"between validations), a fraction of an epoch in (0, 1], or null; got {interval!r}."
        )


def check_trainer(trainer: DictConfig) -> None:
    """Refuse ``trainer.*`` settings that cannot work (before the Trainer is built).

    Raises:
        ConfigError: naming the ``trainer.*`` setting.

    Example:
        >>> from omegaconf import OmegaConf
        >>> check_trainer(OmegaConf.create({"max_steps": 100, "devices": 1}))
    """
    _check_length(trainer)
    _check_loop(trainer)
    check_number("trainer.gradient_clip_val", trainer.get("gradient_clip_val"), 0, nullable=True)
    for key in ("enable_progress_bar", "enable_model_summary"):
        if key in trainer:
            check_bool(f"trainer.{key}", trainer[key])
    deterministic = trainer.get("deterministic")
    if not (deterministic is None or isinstance(deterministic, bool) or deterministic == "warn"):
        raise ConfigError(
            f"trainer.deterministic must be true, false or warn, got {deterministic!r}."
        )
    accelerator = trainer.get("accelerator", "auto")
    if not isinstance(accelerator, str):
        raise ConfigError(
            f"trainer.accelerator must be a name (auto, cpu, gpu, ...), got {accelerator!r}."
        )


def _check_layout(cfg: DictConfig, top_level: frozenset[str]) -> None:
    """The groups are there and every top-level key is known."""
    for group in GROUPS:
        if group not in cfg or not isinstance(cfg[group], Mapping):
            raise ConfigError(
                f"The config has no {group!r} group (got {cfg.get(group)!r}); choose one of "
                f"conf/{group}/*.yaml ({group}=NAME)."
            )
    unknown = sorted(set(map(str, cfg)) - top_level)
    if unknown:
        raise ConfigError(
            f"Unknown top-level setting(s) {unknown} (a typo?); valid: "
            f"{', '.join(sorted(top_level))}."
        )


def _check_strategy(strategy: DictConfig) -> None:
    """A strategy to build, and DeepSpeed's own settings."""
    if not strategy.get("_target_"):
        raise ConfigError("strategy has no _target_; choose one of conf/strategy (strategy=NAME).")
    if "DeepSpeed" in str(strategy.get("_target_")):
        stage = strategy.get("stage", 2)
        if not (is_int(stage) and 0 <= stage <= 3):
            raise ConfigError(f"strategy.stage must be a ZeRO stage 0, 1, 2 or 3, got {stage!r}.")
        for key in ("offload_optimizer", "offload_parameters", "cpu_shm_comm"):
            if key in strategy:
                check_bool(f"strategy.{key}", strategy[key])


def check_run_settings(cfg: DictConfig, own: Iterable[str] = ()) -> None:
    """The settings both entry configs hold: groups, strategy, seed, paths, resume policy.

    Args:
        cfg: the composed config.
        own: the example's own top-level keys besides :data:`RUN_KEYS` (any other key is
            refused as a typo).

    Raises:
        ConfigError: for a missing group, an unknown key, a strategy without ``_target_`` or
            with a bad ZeRO stage, a bad ``seed``/``cpu_threads``/``output_dir``/
            ``ckpt_path``/``on_resume_mismatch``.

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"seed": 0, "output_dir": "out"})
        >>> try:
        ...     check_run_settings(cfg)
        ... except ConfigError as error:
        ...     print(str(error).split(";")[0])
        The config has no 'strategy' group (got None)
    """
    _check_layout(cfg, RUN_KEYS | set(own))
    _check_strategy(cfg.strategy)
    check_int("seed", cfg.get("seed"), 0)
    check_int("cpu_threads", cfg.get("cpu_threads"), 1, nullable=True)
    check_path("output_dir", cfg.get("output_dir"), nullable=False)
    check_path("ckpt_path", cfg.get("ckpt_path"))
    check_choice("on_resume_mismatch", cfg.get("on_resume_mismatch", "error"), ON_MISMATCH)
