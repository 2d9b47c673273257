"""Early checks of the translation example's settings, before anything is built.

Every check raises :class:`~examples.common.config_checks.ConfigError` with a message that
names the setting (``data.bucket_width``, ``model.nhead``, ...), the value received and what
is allowed; :func:`~examples.common.cli.run_entry` turns it into exit status 2. The ``trainer``
group and the entry config's own settings are checked as in the LM example
(:mod:`examples.common.config_checks`), ``ckpt_path`` by :mod:`examples.common.checkpoints`.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from examples.common.batch_schedule import check_batch_schedule
from examples.common.config_checks import (
    ConfigError,
    check_batching,
    check_bool,
    check_choice,
    check_int,
    check_number,
    check_path,
    check_run_settings,
    check_trainer,
    is_number,
)
from examples.common.length_warmup import check_length_warmup
from examples.common.rank_shares import check_rank_settings
from examples.translation.compiling import check_compile
from examples.translation.corpora import mixture_settings, read_corpora
from examples.translation.streaming import check_stream
from examples.translation.tokenizer import MIN_VOCAB_SIZE

__all__ = ["OWN_KEYS", "check_config"]

#: The top-level keys of conf/config.yaml besides the run's (``RUN_KEYS``).
OWN_KEYS = ("test", "compile", "compile_backend")
#: The ``model.*`` integers and their least values.
MODEL_INTS = (
    ("d_model", 1),
    ("nhead", 1),
    ("num_encoder_layers", 1),
    ("num_decoder_layers", 1),
    ("dim_feedforward", 1),
    ("max_positions", 1),
    ("warmup_steps", 1),
    ("decode_batches", 0),
    ("max_decode_extra", 0),
    ("max_decode_length", 1),
    ("num_samples", 0),
    ("seed", 0),
)


def _warmup_refusals(data: DictConfig) -> dict[str, str]:
    """The settings on in ``data`` that rule out ``data.length_warmup`` (the planner's)."""
    out = {}
    if data.get("stream"):
        out["data.stream=true (the streamed windows are planned one at a time)"] = (
            "set data.stream=false"
        )
    return out


def _check_data(data: DictConfig) -> None:
    check_int("data.valid", data.get("valid"), 1)
    check_int("data.test", data.get("test"), 0)
    check_int("data.seed", data.get("seed"), 0)
    check_int("data.num_pairs", data.get("num_pairs"), 1, nullable=bool(data.get("corpora")))
    check_int(
        "data.vocab_size", data.get("vocab_size"), MIN_VOCAB_SIZE, extra=" (4 specials + 256 bytes)"
    )
    check_int(
        "data.max_length",
        data.get("max_length"),
        2,
        nullable=True,
        extra=" (each side keeps BOS/EOS; null keeps whole sentences)",
    )
    check_batching(data)
    check_length_warmup(data, refused_with=_warmup_refusals(data))
    for key in ("cache_dir", "src_path", "tgt_path", "tsv_path", "hf_path"):
        check_path(f"data.{key}", data.get(key))


def _check_model_shape(model: DictConfig, data: DictConfig) -> None:
    for key, minimum in MODEL_INTS:
        if key in model:
            check_int(f"model.{key}", model[key], minimum)
    if model.d_model % model.nhead:
        raise ConfigError(
            f"model.d_model={model.d_model} must be divisible by model.nhead={model.nhead}."
        )
    max_length = data.get("max_length")
    if max_length is not None and model.max_positions < max_length:
        raise ConfigError(
            f"model.max_positions={model.max_positions} is below data.max_length={max_length}: "
            "raise model.max_positions or lower data.max_length."
        )


def _check_model(model: DictConfig, data: DictConfig) -> None:
    _check_model_shape(model, data)
    check_choice("model.positions", model.get("positions"), ("sinusoidal", "learned"))
    check_number("model.dropout", model.get("dropout"), 0, 1, high_open=True)
    check_number("model.label_smoothing", model.get("label_smoothing"), 0, 1, high_open=True)
    check_number("model.lr", model.get("lr"), 0, low_open=True)
    check_number("model.weight_decay", model.get("weight_decay"), 0)
    betas = model.get("betas")
    if (
        not OmegaConf.is_list(betas)
        or len(betas) != 2
        or not all(is_number(b) and 0 <= b < 1 for b in betas)
    ):
        raise ConfigError(
            f"model.betas must be two numbers in [0, 1), e.g. [0.9, 0.98]; got {betas!r}."
        )


def check_config(cfg: DictConfig) -> None:
    """Reject settings that cannot work, before anything is built or written.

    Raises:
        ConfigError: naming the setting, the value received and what is allowed.

    Example:
        >>> from hydra import compose, initialize_config_dir
        >>> from examples.translation.train import CONF_DIR
        >>> with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        ...     cfg = compose("config", overrides=["data.tail=spill"])
        >>> try:
        ...     check_config(cfg)
        ... except ConfigError as error:
        ...     print(error)
        data.tail must be one of spread, drop, pad; got 'spill'.
    """
    check_run_settings(cfg, OWN_KEYS)
    check_bool("test", cfg.get("test", False))
    check_compile(cfg)
    _check_data(cfg.data)
    check_batch_schedule(cfg)
    _check_model(cfg.model, cfg.data)
    check_trainer(cfg.trainer)
    check_rank_settings(cfg.data, cfg.trainer)
    check_stream(cfg)
    corpora = read_corpora(cfg.data)
    mixture_settings(cfg.data, corpora)
    for c in corpora:
        if cfg.get("test") and not c.has_test:
            own = f" (or {c.setting}.hf_test_split)" if c.kind == "hf" else ""
            raise ConfigError(
                f"test=true needs a test split: set {c.setting}.test > 0{own} (got 0)."
            )
