"""Train an en->de Transformer on token-budgeted batches, configured with Hydra.

From the repository root (or from this folder as ``python train.py ...``)::

    python examples/translation/train.py                                  # tiny model, CPU
    python examples/translation/train.py strategy=deepspeed data.max_tokens=16384
    python examples/translation/train.py strategy=fsdp trainer.devices=2 model=base
    python examples/translation/train.py ckpt_path=outputs/.../checkpoints/last.ckpt
    python examples/translation/train.py -m data.max_tokens=2048,4096   # output_dir/0, output_dir/1
    python examples/translation/train.py data=mixture data.corpora.sentences.weight=3

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
from examples.translation.corpora import (  # noqa: E402
    ConfigError,
    Corpus,
    mixture_settings,
    read_corpora,
)
from lightning_varbatch import (  # noqa: E402
    DataSource,
    PaddingCollate,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    VarBatchDeepSpeedStrategy,
)

CONF_DIR = ROOT / "conf"
STRATEGIES = sorted(p.stem for p in (CONF_DIR / "strategy").glob("*.yaml"))

__all__ = ["CONF_DIR", "ConfigError", "main", "train"]


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
    corpora = read_corpora(cfg.data)
    mixture_settings(cfg.data, corpora)
    for c in corpora:
        if cfg.get("test") and not c.test:
            raise ConfigError(f"test=true needs a test split: set {c.setting}.test > 0 (got 0).")
    threads = cfg.get("cpu_threads")
    if threads is not None and (
        isinstance(threads, bool) or not isinstance(threads, int) or threads < 1
    ):
        raise ConfigError(f"cpu_threads must be a positive integer or null, got {threads!r}.")
    accumulate = cfg.trainer.get("accumulate_grad_batches", 1)
    if not isinstance(accumulate, int) or accumulate < 1:
        raise ConfigError(f"trainer.accumulate_grad_batches must be >= 1, got {accumulate!r}.")


def _loss_lengths(lengths: np.ndarray) -> np.ndarray:
    # The loss predicts target[1:] (everything after BOS): plan with that count as the target
    # length so that the batch's step_ntokens is exactly the step's number of loss tokens.
    out = lengths.copy()
    out[:, 1] -= 1
    return out


def _split(c: Corpus, pairs: list[tuple[str, str]], seed: int) -> dict[str, list[Any]]:
    """``c``'s pairs split into train/valid/test by its own ``valid`` and ``test`` sizes."""
    if c.valid < 1 or c.test < 0 or c.valid + c.test >= len(pairs):
        raise ConfigError(
            f"{c.setting}.valid={c.valid} and {c.setting}.test={c.test} must leave training "
            f"pairs ({c.setting}.valid >= 1, {c.setting}.test >= 0) of the {len(pairs)} pairs "
            f"of the corpus: lower them, or raise {c.setting}.num_pairs (or give a larger corpus)."
        )
    return corpus.split_corpus(pairs, valid=c.valid, test=c.test, seed=seed)


def build_datamodule(
    cfg: DictConfig, output_dir: Path
) -> tuple[TokenBudgetDataModule, Any, dict[str, Any]]:
    """The tokenizer and the token-budgeted DataModule over train/valid/test splits.

    Each corpus is split on its own and one BPE tokenizer is trained on every training split.
    With ``data.corpora`` each split is a list of :class:`~lightning_varbatch.DataSource`, one
    per corpus (named, with its own ``max_tokens``/``max_examples``), mixed by ``data.mixing``,
    ``data.corpora.<name>.weight``, ``data.temperature`` and ``data.steps_per_epoch``;
    validation and test cover every example of every corpus once.

    Returns:
        The DataModule, the tokenizer and the split sizes (``train``/``valid``/``test``, plus
        ``corpora``: the sizes per corpus, for a mixture).

    Raises:
        ConfigError: for a corpus that cannot be read or split, or a budget that cannot hold
            the data under the oversize policy.
    """
    data = cfg.data
    corpora = read_corpora(data)
    mixture = mixture_settings(data, corpora)
    splits = [_split(c, c.load(data.cache_dir), data.seed) for c in corpora]
    train_pairs = [pair for sp in splits for pair in sp["train"]]
    texts = [s for s, _ in train_pairs] + [t for _, t in train_pairs]
    cache = None
    if data.cache_dir is not None and _world() == 1:
        cache = Path(data.cache_dir) / f"tokenizer-{data.vocab_size}.json"
    # Several ranks train the same (deterministic) tokenizer in memory: no shared-file race.
    tokenizer = tok.train_or_load_tokenizer(texts, vocab_size=data.vocab_size, cache_path=cache)
    encoded: list[dict[str, tuple[list[dict[str, list[int]]], np.ndarray]]] = []
    for sp in splits:
        encoded.append({})
        for split in ("train", "valid", "test"):
            items, lengths = tok.encode_pairs(tokenizer, sp[split], max_length=data.max_length)
            encoded[-1][split] = (items, _loss_lengths(lengths))

    def stage(split: str) -> tuple[Any, Any]:  # (dataset, lengths) of one split
        if not mixture:
            return encoded[0][split]
        own = [{"max_tokens": c.max_tokens, "max_examples": c.max_examples} for c in corpora]
        return [
            DataSource(e[split][1], dataset=e[split][0], name=c.name, **kw)
            for c, e, kw in zip(corpora, encoded, own, strict=True)
        ], None

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
        one: dict[str, Any] = {"rank": 0, "world_size": 1, **planner_kwargs}
        try:  # plan once here so that a bad budget fails before the Trainer writes anything
            if mixture:
                mixing = mixture if split == "train" else {"mixing": "per_batch"}
                sampler = TokenBudgetBatchSampler.from_sources(
                    stage(split)[0], budget, **mixing, **one
                )
            else:
                sampler = TokenBudgetBatchSampler(stage(split)[1], budget, **one)
            _ = sampler.plan
        except ValueError as error:
            longest = max(int(e[split][1].max()) for e in encoded)
            own = " (or data.corpora.<name>.max_tokens)" if mixture else ""
            budgets = [f"data.max_tokens={budget}"] + [
                f"{c.setting}.max_tokens={c.max_tokens}" for c in corpora if c.max_tokens
            ]
            raise ConfigError(
                f"{' / '.join(budgets)} cannot batch the {split} split (longest example "
                f"{longest} tokens per side, padded source+target cost): {error} Raise "
                f"data.max_tokens{own}, lower data.max_length, or set data.oversize=skip|truncate."
            ) from error
    collate = PaddingCollate(
        pad_id=tok.PAD_ID, pad_to_multiple_of=data.pad_to_multiple_of, check_ntokens=False
    )
    train_data, train_lengths = stage("train")
    test = stage("test") if all(c.test for c in corpora) else (None, None)
    dm = TokenBudgetDataModule(
        train_data,
        train_lengths,
        data.max_tokens,
        val_dataset=stage("valid")[0],
        val_lengths=stage("valid")[1],
        test_dataset=test[0],
        test_lengths=test[1],
        val_max_tokens=data.val_max_tokens,
        collate=collate,
        num_workers=data.num_workers,
        **mixture,
        **planner_kwargs,
    )
    sizes: dict[str, Any] = {
        split: sum(len(e[split][0]) for e in encoded) for split in ("train", "valid", "test")
    }
    if mixture:
        sizes["corpora"] = {
            c.name: {split: len(items) for split, (items, _) in e.items()}
            for c, e in zip(corpora, encoded, strict=True)
        }
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
        dataset_names=list(sizes.get("corpora", [])) or None,  # per-corpus loss keys
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
