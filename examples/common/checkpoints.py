"""``ckpt_path``: loaded safely before anything is built, and checked against the current data.

A resume fails early, with a message naming ``ckpt_path`` and what to do, rather than in the
middle of ``Trainer.fit``: :func:`load_checkpoint` refuses a path that is not a complete
Lightning checkpoint, and :func:`check_sampler_resume` refuses a saved sampler position that
does not fit the data and settings of this run (unless ``on_resume_mismatch=restart_epoch``).

Example:
    >>> sampler_state({"TokenBudgetDataModule": {"train_sampler": {"epoch": 1}}})
    {'epoch': 1}
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from lightning_varbatch import TokenBudgetBatchSampler

__all__ = ["check_checkpoint_file", "check_sampler_resume", "load_checkpoint", "sampler_state"]

_HINT = (
    "pass the .ckpt file a run wrote (e.g. <output_dir>/checkpoints/last.ckpt), or "
    "ckpt_path=null to start from scratch"
)


def _check_path(path: str, deepspeed: bool) -> bool:
    """Whether ``path`` is a DeepSpeed checkpoint folder; refuse anything but a zip file."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"ckpt_path={path} does not exist: {_HINT}.")
    if p.is_dir():
        if deepspeed and (p / "latest").is_file():
            return True
        raise ConfigError(
            f"ckpt_path={path} is a directory, not a checkpoint file"
            f"{' (nor a DeepSpeed checkpoint folder with a latest file)' if deepspeed else ''}: "
            f"{_HINT}."
        )
    if not zipfile.is_zipfile(p):
        raise ConfigError(
            f"ckpt_path={path} is not a torch checkpoint ({p.stat().st_size} bytes, not a "
            f"complete zip archive: a text file, another format, or a truncated copy): {_HINT}."
        )
    return False


def check_checkpoint_file(path: str, deepspeed: bool = False) -> dict[str, Any] | None:
    """The checkpoint at ``ckpt_path``, loaded safely (``weights_only=True``), or refused.

    Returns:
        The loaded checkpoint, or ``None`` for a DeepSpeed checkpoint folder (read by DeepSpeed).

    Raises:
        ConfigError: for a missing path, a folder (outside DeepSpeed), or a file that is not
            a complete Lightning checkpoint of this example; the message names ``ckpt_path``.

    Example:
        >>> try:
        ...     check_checkpoint_file("no/such/last.ckpt")
        ... except ConfigError as error:
        ...     print(str(error).split(":")[0])
        ckpt_path=no/such/last.ckpt does not exist
    """
    import torch

    if _check_path(path, deepspeed):
        return None
    try:
        ckpt = torch.load(Path(path), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses what it holds
        raise ConfigError(
            f"ckpt_path={path} cannot be read as a checkpoint ({type(error).__name__}: it "
            "holds objects other than tensors and plain containers, which safe "
            f"loading refuses, or its pickle is damaged): {_HINT}."
        ) from None
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"ckpt_path={path} cannot be read as a checkpoint ({type(error).__name__}: "
            f"{reason}): {_HINT}."
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        keys = sorted(map(str, ckpt))[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConfigError(
            f"ckpt_path={path} is not a Lightning training checkpoint (no state_dict/loops; "
            f"found {keys}): {_HINT}."
        )
    return ckpt


def load_checkpoint(cfg: DictConfig) -> dict[str, Any] | None:
    """``cfg.ckpt_path`` loaded with :func:`check_checkpoint_file` (``None`` without one).

    A DeepSpeed checkpoint folder (with ``strategy=deepspeed``) also gives ``None``: DeepSpeed
    reads it in ``fit``.

    Example:
        >>> from omegaconf import OmegaConf
        >>> load_checkpoint(OmegaConf.create({"ckpt_path": None, "strategy": {}})) is None
        True
    """
    if cfg.get("ckpt_path") is None:
        return None
    deepspeed = "DeepSpeed" in str(cfg.strategy.get("_target_"))
    return check_checkpoint_file(str(cfg.ckpt_path), deepspeed=deepspeed)


def sampler_state(ckpt: Mapping[str, Any]) -> dict[str, Any] | None:
    """The training sampler's saved position in a Lightning checkpoint, if any.

    Example:
        >>> sampler_state({"state_dict": {}}) is None
        True
    """
    for value in ckpt.values():
        if isinstance(value, Mapping) and isinstance(value.get("train_sampler"), Mapping):
            return dict(value["train_sampler"])
    return None


def check_sampler_resume(cfg: DictConfig, dm: Any, ckpt: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose sampler position was saved for other data or settings.

    The position is loaded into a sampler of the DataModule's training planner (rank and
    world size from the environment, as the DataModule's own without a Trainer); the
    DataModule is left as is. With ``on_resume_mismatch=restart_epoch`` nothing is refused.

    Raises:
        ConfigError: naming ``ckpt_path`` and ``on_resume_mismatch=restart_epoch``.

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"ckpt_path": "last.ckpt"})
        >>> check_sampler_resume(cfg, None, {"state_dict": {}})  # no saved position to check
    """
    state = sampler_state(ckpt)
    if state is None or cfg.get("on_resume_mismatch", "error") != "error":
        return
    sampler = TokenBudgetBatchSampler.from_planner(dm.planner("train"))
    try:
        sampler.load_state_dict(state)
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} cannot resume on this data: {error} -- To keep the "
            "weights and optimizer and start the checkpoint's epoch afresh on the current data "
            "(every example of it trained once), add on_resume_mismatch=restart_epoch."
        ) from error
