"""Train an en->de Transformer on token-budgeted batches, configured with Hydra.

From the repository root (or from this folder as ``python train.py ...``)::

    python examples/translation/train.py                                  # tiny model, CPU
    python examples/translation/train.py strategy=deepspeed data.max_tokens=16384
    python examples/translation/train.py strategy=fsdp trainer.devices=2 model=base
    python examples/translation/train.py ckpt_path=outputs/.../checkpoints/last.ckpt
    python examples/translation/train.py -m data.max_tokens=2048,4096   # output_dir/0, output_dir/1

:func:`train` does the work (tests call it with a composed config); :func:`main` is the
command-line entry. A bad setting (non-positive ``data.max_tokens``, a budget below the
longest example with ``data.oversize=error``, ...) stops before anything is written, with a
message naming the setting, and exit status 2; Hydra itself rejects unknown group options
(``strategy=foo``) listing the valid ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback, Trainer, seed_everything  # noqa: E402
from lightning.pytorch.callbacks import LearningRateMonitor  # noqa: E402
from lightning.pytorch.loggers import Logger  # noqa: E402
from lightning.pytorch.strategies import DDPStrategy, Strategy  # noqa: E402
from lightning.pytorch.utilities import rank_zero_info  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from examples.translation import data as corpus  # noqa: E402
from examples.translation import tokenizer as tok  # noqa: E402
from lightning_varbatch import (  # noqa: E402
    PaddingCollate,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    VarBatchDeepSpeedStrategy,
)

CONF_DIR = ROOT / "conf"
STRATEGIES = sorted(p.stem for p in (CONF_DIR / "strategy").glob("*.yaml"))

__all__ = ["CONF_DIR", "ConfigError", "main", "train"]


class ConfigError(ValueError):
    """A configuration value that cannot work; the message names the setting to change."""


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_config(cfg: DictConfig) -> None:
    """Reject settings that cannot work, before anything is built or written.

    Raises:
        ConfigError: naming the setting and what was expected.
    """
    for group in ("strategy", "data", "model", "trainer", "callbacks"):
        if group not in cfg or cfg[group] is None:
            raise ConfigError(f"The config has no {group!r} group; see {CONF_DIR}.")
    target = cfg.strategy.get("_target_")
    if not target:
        raise ConfigError(
            f"strategy has no _target_; choose one of {', '.join(STRATEGIES)} (strategy=NAME)."
        )
    max_tokens = cfg.data.max_tokens
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise ConfigError(
            f"data.max_tokens must be a positive integer token budget, got {max_tokens!r}."
        )
    val_max = cfg.data.get("val_max_tokens")
    if val_max is not None and (not isinstance(val_max, int) or val_max < 1):
        raise ConfigError(
            f"data.val_max_tokens must be a positive integer or null, got {val_max!r}."
        )
    if cfg.data.oversize not in ("error", "skip", "truncate"):
        raise ConfigError(
            f"data.oversize must be one of error, skip, truncate; got {cfg.data.oversize!r}."
        )
    if cfg.data.tail not in ("spread", "drop", "pad"):
        raise ConfigError(f"data.tail must be one of spread, drop, pad; got {cfg.data.tail!r}.")
    if (cfg.data.src_path is None) != (cfg.data.tgt_path is None):
        raise ConfigError("data.src_path and data.tgt_path must be given together.")
    if cfg.data.get("tsv_path") and cfg.data.src_path is not None:
        raise ConfigError(
            "Give either data.tsv_path or data.src_path/data.tgt_path, not both; got "
            f"data.tsv_path={cfg.data.tsv_path} and data.src_path={cfg.data.src_path}."
        )
    if cfg.get("test") and not cfg.data.test:
        raise ConfigError(f"test=true needs a test split: set data.test > 0 (got {cfg.data.test}).")
    threads = cfg.get("cpu_threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError(f"cpu_threads must be a positive integer or null, got {threads!r}.")
    accumulate = cfg.trainer.get("accumulate_grad_batches", 1)
    if not isinstance(accumulate, int) or accumulate < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches must be >= 1, got {accumulate!r}.")


def load_pairs(cfg: DictConfig) -> list[tuple[str, str]]:
    """The parallel corpus: the configured files, else the synthetic en->de corpus.

    Raises:
        ConfigError: for a missing or unreadable file, a TSV line without exactly one tab,
            parallel files of different lengths or non-UTF-8 text; the message names the
            setting, the file and the line.
    """
    data = cfg.data
    if data.get("tsv_path"):
        setting, read = f"data.tsv_path={data.tsv_path}", partial(corpus.load_tsv, data.tsv_path)
    elif data.src_path is not None:
        setting = f"data.src_path={data.src_path} / data.tgt_path={data.tgt_path}"
        read = partial(corpus.load_parallel_text, data.src_path, data.tgt_path)
    else:
        return corpus.build_corpus(
            num_pairs=data.num_pairs, seed=data.seed, cache_dir=data.cache_dir
        )
    try:
        return read()
    except (OSError, ValueError) as error:
        raise ConfigError(f"Cannot read the corpus of {setting}: {error}") from error


def _loss_lengths(lengths: np.ndarray) -> np.ndarray:
    # The loss predicts target[1:] (everything after BOS): plan with that count as the target
    # length so that the batch's step_ntokens is exactly the step's number of loss tokens.
    out = lengths.copy()
    out[:, 1] -= 1
    return out


def build_datamodule(
    cfg: DictConfig, output_dir: Path
) -> tuple[TokenBudgetDataModule, Any, dict[str, int]]:
    """The tokenizer and the token-budgeted DataModule over train/valid/test splits.

    Raises:
        ConfigError: when the budget cannot hold the data under the oversize policy.
    """
    data = cfg.data
    pairs = load_pairs(cfg)
    if data.valid < 1 or data.test < 0 or data.valid + data.test >= len(pairs):
        raise ConfigError(
            f"data.valid={data.valid} and data.test={data.test} must leave training pairs "
            f"(data.valid >= 1, data.test >= 0) of the {len(pairs)} pairs of the corpus: lower "
            "them, or raise data.num_pairs (or give a larger corpus)."
        )
    splits = corpus.split_corpus(pairs, valid=data.valid, test=data.test, seed=data.seed)
    train_pairs = splits["train"]
    texts = [s for s, _ in train_pairs] + [t for _, t in train_pairs]
    cache = None
    if data.cache_dir is not None and _world() == 1:
        cache = Path(data.cache_dir) / f"tokenizer-{data.vocab_size}.json"
    # Several ranks train the same (deterministic) tokenizer in memory: no shared-file race.
    tokenizer = tok.train_or_load_tokenizer(texts, vocab_size=data.vocab_size, cache_path=cache)
    encoded = {}
    for split in ("train", "valid", "test"):
        items, lengths = tok.encode_pairs(tokenizer, splits[split], max_length=data.max_length)
        encoded[split] = (items, _loss_lengths(lengths))
    planner_kwargs: dict[str, Any] = {
        "bucket_width": data.bucket_width,
        "tail": data.tail,
        "oversize": data.oversize,
        "pad_to_multiple_of": data.pad_to_multiple_of,
        "seed": data.seed,
    }
    for split, budget in (
        ("train", data.max_tokens),
        ("valid", data.val_max_tokens or data.max_tokens),
    ):
        lengths = encoded[split][1]
        if len(lengths) == 0:
            raise ConfigError(f"The {split} split is empty: raise data.num_pairs or data.{split}.")
        try:  # plan once here so that a bad budget fails before the Trainer writes anything
            _ = TokenBudgetBatchSampler(
                lengths, budget, rank=0, world_size=1, **planner_kwargs
            ).plan
        except ValueError as error:
            longest = int(lengths.max(1).max())
            raise ConfigError(
                f"data.max_tokens={budget} cannot batch the {split} split (longest example "
                f"{longest} tokens per side, padded source+target cost): {error} Raise "
                "data.max_tokens, lower data.max_length, or set data.oversize=skip|truncate."
            ) from error
    collate = PaddingCollate(
        pad_id=tok.PAD_ID, pad_to_multiple_of=data.pad_to_multiple_of, check_ntokens=False
    )
    dm = TokenBudgetDataModule(
        encoded["train"][0],
        encoded["train"][1],
        data.max_tokens,
        val_dataset=encoded["valid"][0],
        val_lengths=encoded["valid"][1],
        test_dataset=encoded["test"][0] if encoded["test"][0] else None,
        test_lengths=encoded["test"][1] if encoded["test"][0] else None,
        val_max_tokens=data.val_max_tokens,
        collate=collate,
        num_workers=data.num_workers,
        **planner_kwargs,
    )
    sizes = {split: len(encoded[split][0]) for split in encoded}
    return dm, tokenizer, sizes


def build_strategy(cfg: DictConfig) -> Strategy | str:
    """The configured strategy object (``"auto"`` for DDP on a single device)."""
    strategy = hydra.utils.instantiate(cfg.strategy)
    devices = cfg.trainer.get("devices", 1)
    single = devices in (1, "1") and cfg.trainer.get("num_nodes", 1) == 1
    if isinstance(strategy, DDPStrategy) and type(strategy) is DDPStrategy and single:
        return "auto"  # no process group for one process
    if isinstance(strategy, VarBatchDeepSpeedStrategy) and cfg.strategy.get("offload_optimizer"):
        # ZeRO-Offload otherwise insists on DeepSpeedCPUAdam (a JIT-compiled op).
        assert strategy.config is not None
        strategy.config["zero_force_ds_cpu_optimizer"] = False
    return strategy


def build_callbacks(cfg: DictConfig) -> list[Callback]:
    """The enabled callbacks of ``cfg.callbacks`` (each entry has an ``enabled`` switch).

    The learning-rate monitor is left out when there is no logger (``~logger``): Lightning
    refuses it then.
    """
    callbacks: list[Callback] = []
    for name, spec in (cfg.callbacks or {}).items():
        if spec is None:
            continue
        spec = OmegaConf.to_container(spec, resolve=True)
        assert isinstance(spec, dict)
        if not spec.pop("enabled", True):
            continue
        if "_target_" not in spec:
            raise ConfigError(f"callbacks.{name} has no _target_.")
        callback = hydra.utils.instantiate(spec)
        if isinstance(callback, LearningRateMonitor) and cfg.get("logger") is None:
            rank_zero_info(f"callbacks.{name} (LearningRateMonitor) is off: there is no logger.")
            continue
        callbacks.append(callback)
    return callbacks


def build_logger(cfg: DictConfig) -> Logger | bool:
    """The configured logger, or ``False`` for ``logger=null``."""
    if cfg.get("logger") is None:
        return False
    return hydra.utils.instantiate(cfg.logger)


def _scalar_metrics(trainer: Trainer) -> dict[str, Any]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, tokenizer, model, strategy, callbacks and logger; fit; return the metrics.

    Returns:
        The final logged metrics as floats (``val/bleu``, ``val/chrf``, ``val/loss``, ...; with
        ``test=true`` also ``test/bleu``, ``test/chrf``, ``test/loss``, ``test/nll``) plus
        ``bleu`` (None without a validation), ``global_step``, ``log_dir``, ``ckpt_dir``,
        ``output_dir``, ``seconds`` and the split sizes.

    Raises:
        ConfigError: for a setting that cannot work (nothing has been written then).
    """
    start = time.perf_counter()
    check_config(cfg)
    seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("cpu_threads"):
        torch.set_num_threads(cfg.cpu_threads)
        # Processes Lightning launches inherit it, and Lightning's DDP keeps it.
        os.environ["OMP_NUM_THREADS"] = str(cfg.cpu_threads)
    output_dir = Path(cfg.output_dir).resolve()
    dm, tokenizer, sizes = build_datamodule(cfg, output_dir)
    model = hydra.utils.instantiate(  # plain containers: checkpoints load with weights_only
        cfg.model,
        vocab_size=tokenizer.get_vocab_size(),
        decode_fn=partial(tok.decode, tokenizer),
        _convert_="all",
    )
    strategy = build_strategy(cfg)
    callbacks = build_callbacks(cfg)
    logger = build_logger(cfg)
    trainer: Trainer = hydra.utils.instantiate(
        cfg.trainer,
        strategy=strategy,
        callbacks=callbacks,
        logger=logger,
        enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks),
    )
    if trainer.global_rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(output_dir / "tokenizer.json"))
    trainer.fit(model, dm, ckpt_path=cfg.get("ckpt_path"))
    metrics = _scalar_metrics(trainer)
    if cfg.get("test"):
        trainer.test(model, dm)
        metrics.update(_scalar_metrics(trainer))  # test() replaced the callback metrics
    checkpoint = trainer.checkpoint_callback
    metrics.update(
        bleu=metrics.get("val/bleu"),
        global_step=int(trainer.global_step),
        log_dir=trainer.log_dir if trainer.loggers else None,
        ckpt_dir=getattr(checkpoint, "dirpath", None),
        output_dir=str(output_dir),
        seconds=time.perf_counter() - start,
        sizes=sizes,
        world_size=int(trainer.world_size),
        tokenizer_sha=hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
    )
    if trainer.global_rank == 0:
        bleu = "n/a (no validation ran)" if metrics["bleu"] is None else f"{metrics['bleu']:.2f}"
        if "test/bleu" in metrics:
            bleu += f", test BLEU {metrics['test/bleu']:.2f}"
        print(
            f"Done: {metrics['global_step']} steps in {metrics['seconds']:.0f}s on "
            f"{trainer.world_size} process(es); final BLEU {bleu}\n"
            f"  logs:        {metrics['log_dir']}\n  checkpoints: {metrics['ckpt_dir']}\n"
            f"  tokenizer:   {output_dir / 'tokenizer.json'}"
        )
    return metrics


def _use_job_dir(cfg: DictConfig) -> None:
    """In a multirun (``-m``), point ``output_dir`` at this job's folder.

    Hydra puts job ``n`` of a sweep in ``<hydra.sweep.dir>/<n>`` (``hydra.sweep.dir`` defaults
    to ``output_dir``); without this every job would write its logs, checkpoints and
    ``metrics.json`` into the same ``output_dir``.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        cfg.output_dir = hydra_cfg.runtime.output_dir


def _drop_empty_run_dir() -> None:
    """Remove Hydra's fresh run folder when it holds nothing but its own config and log."""
    try:
        from hydra.core.hydra_config import HydraConfig

        run_dir = Path(HydraConfig.get().runtime.output_dir)
    except (ImportError, ValueError):
        return
    if run_dir.is_dir() and all(
        p.name == ".hydra" or p.suffix == ".log" for p in run_dir.iterdir()
    ):
        shutil.rmtree(run_dir, ignore_errors=True)


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Command-line entry: ``python examples/translation/train.py [overrides]``."""
    _use_job_dir(cfg)
    try:
        metrics = train(cfg)
    except ConfigError as error:
        _drop_empty_run_dir()
        print(f"Configuration error: {error}", file=sys.stderr)
        sys.exit(2)
    if _rank() == 0 and metrics["output_dir"]:
        summary = {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, dict))}
        (Path(metrics["output_dir"]) / "metrics.json").write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
