"""Early checks of the example's settings and of ``ckpt_path``, before anything is built.

Every check raises :class:`~examples.translation.corpora.ConfigError` with a message that names
the setting (``data.bucket_width``, ``model.nhead``, ``ckpt_path``, ...), the value received
and what is allowed; :func:`~examples.translation.train.main` turns it into exit status 2.
"""

from __future__ import annotations

import math
import pickle
import zipfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from examples.translation.compiling import check_compile
from examples.translation.corpora import ConfigError, mixture_settings, read_corpora
from examples.translation.streaming import check_stream

__all__ = [
    "MISMATCH_POLICIES",
    "check_checkpoint_file",
    "check_config",
    "sampler_state",
]

#: Values of ``on_resume_mismatch``: what a resume does when the data changed.
MISMATCH_POLICIES = ("error", "restart_epoch")
_MIN_VOCAB = 260
#: The keys conf/config.yaml may hold (its groups and its own settings).
TOP_LEVEL = frozenset(
    {
        "strategy",
        "data",
        "model",
        "trainer",
        "callbacks",
        "logger",
        "seed",
        "output_dir",
        "ckpt_path",
        "on_resume_mismatch",
        "test",
        "cpu_threads",
        "compile",
        "compile_backend",
    }
)  # the tokenizer's 4 specials + 256 bytes


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(float(value))
    )


def _int(key: str, value: Any, minimum: int, *, nullable: bool = False, extra: str = "") -> None:
    if (value is None and nullable) or (_is_int(value) and value >= minimum):
        return
    what = {0: "an integer >= 0", 1: "a positive integer"}.get(minimum, f"an integer >= {minimum}")
    raise ConfigError(
        f"{key} must be {what}{' or null' if nullable else ''}, got {value!r}{extra}."
    )


def _number(
    key: str,
    value: Any,
    low: float,
    high: float = math.inf,
    *,
    low_open: bool = False,
    high_open: bool = False,
    nullable: bool = False,
) -> None:
    if value is None and nullable:
        return
    if _is_number(value):
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


def _choice(key: str, value: Any, choices: Sequence[Any]) -> None:
    if isinstance(value, (str, bool)) or value is None:
        if value in choices and type(value) in {type(c) for c in choices}:
            return
    raise ConfigError(f"{key} must be one of {', '.join(map(str, choices))}; got {value!r}.")


def _bool(key: str, value: Any) -> None:
    if not isinstance(value, bool):
        raise ConfigError(f"{key} must be true or false, got {value!r}.")


def _path(key: str, value: Any, *, nullable: bool = True) -> None:
    if (value is None and nullable) or (isinstance(value, str) and value.strip()):
        return
    raise ConfigError(
        f"{key} must be a path (a non-empty string){' or null' if nullable else ''}, got {value!r}."
    )


def _check_data(data: DictConfig) -> None:
    _int("data.valid", data.get("valid"), 1)
    _int("data.test", data.get("test"), 0)
    _int("data.seed", data.get("seed"), 0)
    _int("data.num_pairs", data.get("num_pairs"), 1, nullable=bool(data.get("corpora")))
    _int("data.vocab_size", data.get("vocab_size"), _MIN_VOCAB, extra=" (4 specials + 256 bytes)")
    _int(
        "data.max_length",
        data.get("max_length"),
        2,
        nullable=True,
        extra=" (each side keeps BOS/EOS; null keeps whole sentences)",
    )
    _int("data.max_tokens", data.get("max_tokens"), 1, extra=" (the token budget)")
    _int("data.val_max_tokens", data.get("val_max_tokens"), 1, nullable=True)
    _int("data.bucket_width", data.get("bucket_width"), 1, extra=" (1: exact lengths)")
    _int(
        "data.pad_to_multiple_of",
        data.get("pad_to_multiple_of"),
        1,
        extra=" (1: no rounding; e.g. 8 for tensor cores)",
    )
    _int("data.num_workers", data.get("num_workers"), 0, extra=" (0: load in the main process)")
    _choice("data.tail", data.get("tail"), ("spread", "drop", "pad"))
    _choice("data.oversize", data.get("oversize"), ("error", "skip", "truncate"))
    for key in ("cache_dir", "src_path", "tgt_path", "tsv_path", "hf_path"):
        _path(f"data.{key}", data.get(key))


def _check_model(model: DictConfig, data: DictConfig) -> None:
    for key, minimum in (
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
    ):
        if key in model:
            _int(f"model.{key}", model[key], minimum)
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
    _choice("model.positions", model.get("positions"), ("sinusoidal", "learned"))
    _number("model.dropout", model.get("dropout"), 0, 1, high_open=True)
    _number("model.label_smoothing", model.get("label_smoothing"), 0, 1, high_open=True)
    _number("model.lr", model.get("lr"), 0, low_open=True)
    _number("model.weight_decay", model.get("weight_decay"), 0)
    betas = model.get("betas")
    if (
        not OmegaConf.is_list(betas)
        or len(betas) != 2
        or not all(_is_number(b) and 0 <= b < 1 for b in betas)
    ):
        raise ConfigError(
            f"model.betas must be two numbers in [0, 1), e.g. [0.9, 0.98]; got {betas!r}."
        )


def _check_trainer(trainer: DictConfig) -> None:
    max_steps = trainer.get("max_steps", -1)
    if not (_is_int(max_steps) and (max_steps >= 1 or max_steps == -1)):
        raise ConfigError(
            f"trainer.max_steps must be a positive integer or -1 (no limit; then set "
            f"trainer.max_epochs), got {max_steps!r}."
        )
    max_epochs = trainer.get("max_epochs")
    if not (max_epochs is None or (_is_int(max_epochs) and (max_epochs >= 1 or max_epochs == -1))):
        raise ConfigError(
            f"trainer.max_epochs must be a positive integer, -1 or null, got {max_epochs!r}."
        )
    if max_steps == -1 and max_epochs in (None, -1):
        raise ConfigError(
            "trainer.max_steps=-1 and trainer.max_epochs=-1/null would train forever: set one."
        )
    devices = trainer.get("devices", 1)
    if not ((_is_int(devices) and devices >= 1) or devices == "auto"):
        raise ConfigError(f"trainer.devices must be a positive integer or auto, got {devices!r}.")
    _int("trainer.num_nodes", trainer.get("num_nodes", 1), 1)
    _int("trainer.accumulate_grad_batches", trainer.get("accumulate_grad_batches", 1), 1)
    _int("trainer.log_every_n_steps", trainer.get("log_every_n_steps", 50), 1)
    _int("trainer.num_sanity_val_steps", trainer.get("num_sanity_val_steps", 0), -1)
    _int(
        "trainer.check_val_every_n_epoch", trainer.get("check_val_every_n_epoch"), 1, nullable=True
    )
    interval = trainer.get("val_check_interval")
    if not (
        interval is None
        or (_is_int(interval) and interval >= 1)
        or (isinstance(interval, float) and 0 < interval <= 1)
    ):
        raise ConfigError(
            "trainer.val_check_interval must be a positive integer (training micro-batches "
            f"between validations), a fraction of an epoch in (0, 1], or null; got {interval!r}."
        )
    _number("trainer.gradient_clip_val", trainer.get("gradient_clip_val"), 0, nullable=True)
    for key in ("enable_progress_bar", "enable_model_summary"):
        if key in trainer:
            _bool(f"trainer.{key}", trainer[key])
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


def check_config(cfg: DictConfig) -> None:
    """Reject settings that cannot work, before anything is built or written.

    Raises:
        ConfigError: naming the setting, the value received and what is allowed.
    """
    for group in ("strategy", "data", "model", "trainer", "callbacks"):
        if group not in cfg or not isinstance(cfg[group], Mapping):
            raise ConfigError(
                f"The config has no {group!r} group (got {cfg.get(group)!r}); choose one of "
                f"conf/{group}/*.yaml ({group}=NAME)."
            )
    unknown = sorted(set(map(str, cfg)) - TOP_LEVEL)
    if unknown:
        raise ConfigError(
            f"Unknown top-level setting(s) {unknown} (a typo?); valid: "
            f"{', '.join(sorted(TOP_LEVEL))}."
        )
    if not cfg.strategy.get("_target_"):
        raise ConfigError("strategy has no _target_; choose one of conf/strategy (strategy=NAME).")
    if "DeepSpeed" in str(cfg.strategy.get("_target_")):
        stage = cfg.strategy.get("stage", 2)
        if not (_is_int(stage) and 0 <= stage <= 3):
            raise ConfigError(f"strategy.stage must be a ZeRO stage 0, 1, 2 or 3, got {stage!r}.")
        for key in ("offload_optimizer", "offload_parameters", "cpu_shm_comm"):
            if key in cfg.strategy:
                _bool(f"strategy.{key}", cfg.strategy[key])
    _int("seed", cfg.get("seed"), 0)
    _bool("test", cfg.get("test", False))
    _int("cpu_threads", cfg.get("cpu_threads"), 1, nullable=True)
    _path("output_dir", cfg.get("output_dir"), nullable=False)
    _path("ckpt_path", cfg.get("ckpt_path"))
    _choice("on_resume_mismatch", cfg.get("on_resume_mismatch", "error"), MISMATCH_POLICIES)
    check_compile(cfg)
    _check_data(cfg.data)
    _check_model(cfg.model, cfg.data)
    _check_trainer(cfg.trainer)
    check_stream(cfg)
    corpora = read_corpora(cfg.data)
    mixture_settings(cfg.data, corpora)
    for c in corpora:
        if cfg.get("test") and not c.has_test:
            own = f" (or {c.setting}.hf_test_split)" if c.kind == "hf" else ""
            raise ConfigError(
                f"test=true needs a test split: set {c.setting}.test > 0{own} (got 0)."
            )


def check_checkpoint_file(path: str, deepspeed: bool = False) -> dict[str, Any] | None:
    """The checkpoint at ``ckpt_path``, loaded safely (``weights_only=True``), or refused.

    Returns:
        The loaded checkpoint, or ``None`` for a DeepSpeed checkpoint folder (read by DeepSpeed).

    Raises:
        ConfigError: for a missing path, a folder (outside DeepSpeed), or a file that is not
            a complete Lightning checkpoint of this example; the message names ``ckpt_path``.
    """
    import torch

    p = Path(path)
    hint = (
        "pass the .ckpt file a run wrote (e.g. <output_dir>/checkpoints/last.ckpt), or "
        "ckpt_path=null to start from scratch"
    )
    if not p.exists():
        raise ConfigError(f"ckpt_path={path} does not exist: {hint}.")
    if p.is_dir():
        if deepspeed and (p / "latest").is_file():
            return None
        raise ConfigError(
            f"ckpt_path={path} is a directory, not a checkpoint file"
            f"{' (nor a DeepSpeed checkpoint folder with a latest file)' if deepspeed else ''}: "
            f"{hint}."
        )
    if not zipfile.is_zipfile(p):
        raise ConfigError(
            f"ckpt_path={path} is not a torch checkpoint ({p.stat().st_size} bytes, not a "
            f"complete zip archive: a text file, another format, or a truncated copy): {hint}."
        )
    try:
        ckpt = torch.load(p, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as error:  # weights_only refuses what it holds
        raise ConfigError(
            f"ckpt_path={path} cannot be read as a checkpoint ({type(error).__name__}: it "
            "holds objects other than tensors and plain containers, which safe "
            f"loading refuses, or its pickle is damaged): {hint}."
        ) from None
    except Exception as error:
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        raise ConfigError(
            f"ckpt_path={path} cannot be read as a checkpoint ({type(error).__name__}: "
            f"{reason}): {hint}."
        ) from None
    if not isinstance(ckpt, dict) or "state_dict" not in ckpt or "loops" not in ckpt:
        keys = sorted(map(str, ckpt))[:8] if isinstance(ckpt, dict) else type(ckpt).__name__
        raise ConfigError(
            f"ckpt_path={path} is not a Lightning training checkpoint (no state_dict/loops; "
            f"found {keys}): {hint}."
        )
    return ckpt


def sampler_state(ckpt: Mapping[str, Any]) -> dict[str, Any] | None:
    """The training sampler's saved position in a Lightning checkpoint, if any."""
    for value in ckpt.values():
        if isinstance(value, Mapping) and isinstance(value.get("train_sampler"), Mapping):
            return dict(value["train_sampler"])
    return None
