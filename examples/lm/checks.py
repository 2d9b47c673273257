"""Early checks of the LM example's settings, before anything is built.

Every check raises :class:`~examples.common.config_checks.ConfigError` naming the setting;
the ``trainer`` group and the entry config's own settings are checked as in the translation
example (:mod:`examples.common.config_checks`).
"""

from __future__ import annotations

from omegaconf import DictConfig

from examples.common.batch_schedule import check_batch_schedule
from examples.common.config_checks import (
    ConfigError,
    check_batching,
    check_choice,
    check_int,
    check_path,
    check_run_settings,
    check_trainer,
    is_number,
)
from examples.common.length_warmup import check_length_warmup
from examples.common.rank_shares import check_rank_settings
from examples.translation.tokenizer import MIN_VOCAB_SIZE
from lightning_varbatch.planner import LAYOUTS

__all__ = ["LAYOUTS", "OWN_KEYS", "check_config"]

#: The top-level key of examples/lm/conf/config.yaml besides the run's (``RUN_KEYS``).
OWN_KEYS = ("layout",)


def _check_data(data: DictConfig) -> None:
    check_int("data.num_docs", data.get("num_docs"), 2)
    check_int("data.valid", data.get("valid"), 1)
    check_int("data.vocab_size", data.get("vocab_size"), MIN_VOCAB_SIZE)
    check_int("data.max_length", data.get("max_length"), 3, nullable=True)
    check_batching(data)
    check_length_warmup(data)
    flops = data.get("flop_attention")
    if flops is not None and not (is_number(flops) and flops >= 0):
        raise ConfigError(
            f"data.flop_attention must be a finite number >= 0 or null (derived from the "
            f"model's shape), got {flops!r}."
        )
    check_path("data.cache_dir", data.get("cache_dir"))


def check_config(cfg: DictConfig) -> None:
    """Refuse a ``layout``, ``data.*``, ``trainer.*`` or run setting that cannot work.

    Nothing has been built or written yet when it raises.

    Raises:
        ConfigError: naming the setting, the value received and what is allowed.

    Example:
        >>> from hydra import compose, initialize_config_dir
        >>> from examples.lm.train import CONF_DIR
        >>> with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        ...     cfg = compose("config", overrides=["layout=padded"])
        >>> check_config(cfg)  # nothing to refuse
    """
    check_run_settings(cfg, OWN_KEYS)
    check_choice("layout", cfg.get("layout"), LAYOUTS)
    _check_data(cfg.data)
    check_batch_schedule(cfg)
    check_trainer(cfg.trainer)
    check_rank_settings(cfg.data, cfg.trainer)
