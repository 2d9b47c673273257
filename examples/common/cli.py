"""The Hydra entry around an example's ``train(cfg)``: exit statuses and output folders.

- :func:`check_overrides` exits with status 2 (not Hydra's 1) for overrides that do not
  compose (an unknown key or option), before Hydra creates anything;
- :func:`run_entry` runs ``train(cfg)`` in this job's own folder (:func:`use_job_dir`: job
  ``n`` of a multirun writes to ``<sweep dir>/<n>``) and turns a
  :class:`~examples.common.config_checks.ConfigError` into a one-line message and exit status
  2, removing the run folder Hydra made for nothing (:func:`drop_empty_run_dir`).

Example:
    >>> from examples.common.cli import run_entry
    >>> def train(cfg):
    ...     return {"global_step": 1}
    >>> run_entry(train, {})  # doctest: +SKIP
    {'global_step': 1}
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from examples.common.config_checks import ConfigError

__all__ = ["check_overrides", "drop_empty_run_dir", "run_entry", "use_job_dir"]


def use_job_dir(cfg: DictConfig) -> None:
    """In a multirun (``-m``), point ``output_dir`` at this job's folder.

    Hydra puts job ``n`` of a sweep in ``<hydra.sweep.dir>/<n>`` (``hydra.sweep.dir`` defaults
    to ``output_dir``); without this every job would write its logs, checkpoints and
    ``metrics.json`` into the same ``output_dir``.

    Example:
        >>> use_job_dir(cfg)  # doctest: +SKIP
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        cfg.output_dir = hydra_cfg.runtime.output_dir


def drop_empty_run_dir() -> None:
    """Remove Hydra's fresh run folder when it holds nothing but its own config and log.

    Example:
        >>> drop_empty_run_dir()  # outside Hydra: nothing to remove
    """
    try:
        from hydra.core.hydra_config import HydraConfig

        run_dir = Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return
    if run_dir.is_dir() and all(
        p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()
    ):
        shutil.rmtree(run_dir, ignore_errors=True)


def run_entry(train: Callable[[DictConfig], dict[str, Any]], cfg: DictConfig) -> dict[str, Any]:
    """``train(cfg)`` in this job's folder; a bad setting exits with status 2.

    Returns:
        What ``train`` returned.

    Raises:
        SystemExit: with status 2 for a :class:`ConfigError`, after printing
            ``Configuration error: <message>`` to stderr.

    Example:
        >>> run_entry(train, cfg)  # doctest: +SKIP
    """
    use_job_dir(cfg)
    try:
        return train(cfg)
    except ConfigError as error:
        drop_empty_run_dir()
        print(f"Configuration error: {error}", file=sys.stderr)
        sys.exit(2)


def check_overrides(argv: list[str], conf_dir: Path) -> None:
    """Exit 2 (not Hydra's 1) for overrides that do not compose: an unknown key or option.

    Only for a plain run (no ``-m``/``--flags`` and no ``hydra.*`` overrides); Hydra reports
    everything else itself.

    Args:
        argv: ``sys.argv`` (the script, then the overrides).
        conf_dir: the entry config's folder.

    Raises:
        SystemExit: with status 2, after printing ``Configuration error: ...`` to stderr.

    Example:
        >>> from examples.translation.train import CONF_DIR
        >>> check_overrides(["train.py", "data.max_tokens=2048"], CONF_DIR)
    """
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    overrides = argv[1:]
    if any(a.startswith("-") or a.lstrip("+~").startswith("hydra") for a in overrides):
        return
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            compose("config", overrides=overrides)
    except Exception as error:  # Hydra's and OmegaConf's composition errors
        print(f"Configuration error: {error} (overrides: {' '.join(overrides)})", file=sys.stderr)
        sys.exit(2)
    finally:
        GlobalHydra.instance().clear()
