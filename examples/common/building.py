"""The run's parts from the config: process settings, strategy, callbacks, logger, Trainer.

Every part is built with ``hydra.utils.instantiate`` through :func:`instantiate`, which turns a
bad argument into a :class:`~examples.common.config_checks.ConfigError` naming the group
(``strategy``, ``callbacks.<name>``, ``logger``, ``model``, ``trainer``): exit status 2 rather
than a traceback.

Example:
    >>> from omegaconf import OmegaConf
    >>> build_logger(OmegaConf.create({"logger": None}))
    False
"""

from __future__ import annotations

import os
from typing import Any

import hydra
import torch
from lightning.pytorch import Callback, Trainer, seed_everything
from lightning.pytorch.callbacks import LearningRateMonitor
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy, Strategy
from lightning.pytorch.utilities import rank_zero_info
from omegaconf import DictConfig, OmegaConf

from examples.common.config_checks import ConfigError
from lightning_varbatch import VarBatchDeepSpeedStrategy

__all__ = [
    "build_callbacks",
    "build_logger",
    "build_parts",
    "build_strategy",
    "build_trainer",
    "instantiate",
    "set_up_process",
]


def instantiate(setting: str, spec: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` with a bad argument reported as a :class:`ConfigError`.

    Args:
        setting: the config group or key ``spec`` comes from, for the message.
        spec: the config node (with ``_target_``).
        **kwargs: passed on to ``hydra.utils.instantiate``.

    Raises:
        ConfigError: ``"<setting> cannot be built: <error type>: <first line>"``.

    Example:
        >>> instantiate("model", {"_target_": "builtins.dict", "a": 1})
        {'a': 1}
    """
    try:
        return hydra.utils.instantiate(spec, **kwargs)
    except Exception as error:
        cause = error.__cause__ or error
        text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise ConfigError(f"{setting} cannot be built: {type(cause).__name__}: {text}") from error


def set_up_process(cfg: DictConfig) -> None:
    """Seed every generator (``cfg.seed``) and set the CPU threads (``cfg.cpu_threads``).

    The processes Lightning launches inherit ``OMP_NUM_THREADS``, and Lightning's DDP keeps it.

    Example:
        >>> from omegaconf import OmegaConf
        >>> set_up_process(OmegaConf.create({"seed": 0, "cpu_threads": None}))
    """
    seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("cpu_threads"):
        torch.set_num_threads(cfg.cpu_threads)
        os.environ["OMP_NUM_THREADS"] = str(cfg.cpu_threads)


def build_strategy(cfg: DictConfig) -> Strategy | str:
    """The configured strategy object (``"auto"`` for DDP on a single device).

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create(
        ...     {"strategy": {"_target_": "lightning.pytorch.strategies.DDPStrategy"},
        ...      "trainer": {"devices": 1}}
        ... )
        >>> build_strategy(cfg)
        'auto'
    """
    strategy = instantiate("strategy", cfg.strategy)
    devices = cfg.trainer.get("devices", 1)
    single = devices in (1, "1") and cfg.trainer.get("num_nodes", 1) == 1
    if isinstance(strategy, DDPStrategy) and type(strategy) is DDPStrategy and single:
        return "auto"  # no process group for one process
    if isinstance(strategy, VarBatchDeepSpeedStrategy) and cfg.strategy.get("offload_optimizer"):
        # ZeRO-Offload otherwise insists on DeepSpeedCPUAdam (a JIT-compiled op).
        assert strategy.config is not None
        strategy.config["zero_force_ds_cpu_optimizer"] = False
    return strategy


def _callback_spec(name: str, spec: Any) -> dict[str, Any] | None:
    """``callbacks.<name>`` as arguments, or ``None`` when it is switched off."""
    spec = OmegaConf.to_container(spec, resolve=True)
    if not isinstance(spec, dict):
        raise ConfigError(f"callbacks.{name} must be a mapping with _target_, got {spec!r}.")
    enabled = spec.pop("enabled", True)
    if not isinstance(enabled, bool):
        raise ConfigError(f"callbacks.{name}.enabled must be true or false, got {enabled!r}.")
    if not enabled:
        return None
    if "_target_" not in spec:
        raise ConfigError(f"callbacks.{name} has no _target_.")
    return spec


def build_callbacks(cfg: DictConfig) -> list[Callback]:
    """The enabled callbacks of ``cfg.callbacks`` (each entry has an ``enabled`` switch).

    The learning-rate monitor is left out when there is no logger (``~logger``): Lightning
    refuses it then.

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"callbacks": {"lr": None}, "logger": None})
        >>> build_callbacks(cfg)
        []
    """
    callbacks: list[Callback] = []
    for name, node in (cfg.callbacks or {}).items():
        spec = None if node is None else _callback_spec(str(name), node)
        if spec is None:
            continue
        callback = instantiate(f"callbacks.{name}", spec)
        if isinstance(callback, LearningRateMonitor) and cfg.get("logger") is None:
            rank_zero_info(f"callbacks.{name} (LearningRateMonitor) is off: there is no logger.")
            continue
        callbacks.append(callback)
    return callbacks


def build_logger(cfg: DictConfig) -> Logger | bool:
    """The configured logger, or ``False`` for ``logger=null``.

    Example:
        >>> from omegaconf import OmegaConf
        >>> build_logger(OmegaConf.create({"logger": None}))
        False
    """
    if cfg.get("logger") is None:
        return False
    logger: Logger = instantiate("logger", cfg.logger)
    return logger


def build_parts(cfg: DictConfig) -> tuple[Strategy | str, list[Callback], Logger | bool]:
    """Set up the process (:func:`set_up_process`), then build the strategy, callbacks and logger.

    Example:
        >>> strategy, callbacks, logger = build_parts(cfg)  # doctest: +SKIP
    """
    set_up_process(cfg)
    return build_strategy(cfg), build_callbacks(cfg), build_logger(cfg)


def build_trainer(
    cfg: DictConfig, strategy: Strategy | str, callbacks: list[Callback], logger: Logger | bool
) -> Trainer:
    """The Trainer of ``cfg.trainer`` with the built parts.

    Checkpointing is on when one of the callbacks is a ``ModelCheckpoint``.

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create(
        ...     {"trainer": {"_target_": "lightning.pytorch.Trainer", "max_steps": 1,
        ...                  "accelerator": "cpu", "enable_progress_bar": False,
        ...                  "enable_model_summary": False}}
        ... )
        >>> build_trainer(cfg, "auto", [], False).max_steps
        1
    """
    trainer: Trainer = instantiate(
        "trainer",
        cfg.trainer,
        strategy=strategy,
        callbacks=callbacks,
        logger=logger,
        enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks),
    )
    return trainer
