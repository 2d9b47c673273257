"""Train a tiny decoder-only language model on packed or padded token budgets, with Hydra.

From the repository root (or from this folder as ``python train.py ...``)::

    python examples/lm/train.py                                   # layout=packed, CPU, 2-4 min
    python examples/lm/train.py layout=padded                     # the same, padded batches
    python examples/lm/train.py layout=packed data.max_tokens=4096 strategy=deepspeed
    python examples/lm/train.py strategy=fsdp trainer.devices=2
    python examples/lm/train.py -m layout=packed,padded           # output_dir/0, output_dir/1

The corpus is embedded (:mod:`examples.lm.data`, no download) and long-tailed. With
``layout=packed`` every micro-batch is one padding-free row of whole documents
(:class:`~lightning_varbatch.PackingCollate`) whose real tokens fit ``data.max_tokens``,
attended with :func:`~lightning_varbatch.attention.document_attention`, and ranks are dealt
micro-batches by their FLOPs (``data.flop_attention``, by default derived from the model's
shape with :func:`~lightning_varbatch.planner.flops.transformer_flops`). With
``layout=padded`` micro-batches are padded ``(documents x longest)`` batches
(:class:`~lightning_varbatch.PaddingCollate`) whose slots fit ``data.max_tokens``, attended
with causal SDPA. Either way the loss is the exact token mean of the optimizer step
(:func:`~lightning_varbatch.loss.step_token_mean`).

The configuration is ``examples/lm/conf/config.yaml``; its ``strategy``, ``trainer``,
``callbacks`` and ``logger`` groups are the repository's ``conf/`` ones (found through
``hydra.searchpath``, the folder named by ``$LIGHTNING_VARBATCH_CONF``, which this module sets
to the repository's ``conf/`` unless it is set already). A setting that cannot work stops
before anything is written, with a message naming it, and exit status 2; SIGTERM/SIGINT save
``<output_dir>/checkpoints/last.ckpt`` at the next optimizer step (or validation micro-batch)
and exit with 143/130, as in the translation example
(:mod:`examples.translation.preemption`). ``<output_dir>/metrics.json`` holds the final
metrics and, once training has finished, its complete checkpoint as ``checkpoint``.
"""

from __future__ import annotations

import hashlib
import math
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
#: The environment variable naming the repository's shared config groups (conf/).
CONF_ENV = "LIGHTNING_VARBATCH_CONF"
os.environ.setdefault(CONF_ENV, str(ROOT / "conf"))

import hydra  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything  # noqa: E402
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402
from omegaconf import DictConfig  # noqa: E402
from typing_extensions import override  # noqa: E402

from examples.lm.data import (  # noqa: E402
    build_documents,
    encode_documents,
    length_stats,
    split_documents,
)
from examples.translation import tokenizer as tok  # noqa: E402
from examples.translation.batching import fitting_length  # noqa: E402
from examples.translation.checks import (  # noqa: E402
    _bool,
    _check_trainer,
    _choice,
    _path,
    check_checkpoint_file,
)
from examples.translation.corpora import ConfigError  # noqa: E402
from examples.translation.preemption import Interrupted  # noqa: E402
from examples.translation.train import (  # noqa: E402
    _drop_empty_run_dir,
    _instantiate,
    _scalar_metrics,
    _stopped,
    _use_job_dir,
    build_callbacks,
    build_logger,
    build_strategy,
    check_overrides,
    check_resume,
    record_trained,
    write_summary,
)
from lightning_varbatch import (  # noqa: E402
    PackingCollate,
    PaddingCollate,
    ResumeMismatchError,
    TokenBudgetDataModule,
    keys,
)
from lightning_varbatch.planner.flops import FlopModel, transformer_flops  # noqa: E402

CONF_DIR = Path(__file__).resolve().parent / "conf"
#: The values of the ``layout`` setting.
LAYOUTS = ("packed", "padded")
_TOP_LEVEL = frozenset(
    {
        "layout",
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
        "cpu_threads",
    }
)

__all__ = [
    "CONF_DIR",
    "LAYOUTS",
    "ConfigError",
    "RunTotals",
    "build_datamodule",
    "check_config",
    "flop_model",
    "main",
    "train",
]


def _int(key: str, value: Any, minimum: int, *, nullable: bool = False) -> None:
    if value is None and nullable:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        extra = " or null" if nullable else ""
        raise ConfigError(f"{key} must be an integer >= {minimum}{extra}, got {value!r}.")


def check_config(cfg: DictConfig) -> None:
    """Reject settings that cannot work, before anything is built or written.

    Raises:
        ConfigError: naming the setting, the value received and what is allowed.
    """
    for group in ("strategy", "data", "model", "trainer", "callbacks"):
        if group not in cfg or not isinstance(cfg[group], DictConfig):
            raise ConfigError(f"The config has no {group!r} group (got {cfg.get(group)!r}).")
    unknown = sorted(set(map(str, cfg)) - _TOP_LEVEL)
    if unknown:
        raise ConfigError(
            f"Unknown top-level setting(s) {unknown} (a typo?); valid: "
            f"{', '.join(sorted(_TOP_LEVEL))}."
        )
    _choice("layout", cfg.get("layout"), LAYOUTS)
    if not cfg.strategy.get("_target_"):
        raise ConfigError("strategy has no _target_; choose strategy=ddp|fsdp|deepspeed.")
    _int("seed", cfg.get("seed"), 0)
    _int("cpu_threads", cfg.get("cpu_threads"), 1, nullable=True)
    _path("output_dir", cfg.get("output_dir"), nullable=False)
    _path("ckpt_path", cfg.get("ckpt_path"))
    mismatch = cfg.get("on_resume_mismatch", "error")
    _choice("on_resume_mismatch", mismatch, ("error", "restart_epoch"))
    data = cfg.data
    _int("data.num_docs", data.get("num_docs"), 2)
    _int("data.valid", data.get("valid"), 1)
    _int("data.vocab_size", data.get("vocab_size"), 260)  # 4 specials + 256 bytes
    _int("data.max_length", data.get("max_length"), 3, nullable=True)
    _int("data.max_tokens", data.get("max_tokens"), 1)
    _int("data.val_max_tokens", data.get("val_max_tokens"), 1, nullable=True)
    _int("data.pad_to_multiple_of", data.get("pad_to_multiple_of"), 1)
    _int("data.bucket_width", data.get("bucket_width"), 1)
    _int("data.num_workers", data.get("num_workers"), 0)
    _choice("data.tail", data.get("tail"), ("spread", "drop", "pad"))
    _choice("data.oversize", data.get("oversize"), ("error", "skip", "truncate"))
    flops = data.get("flop_attention")
    if flops is not None and (
        isinstance(flops, bool)
        or not isinstance(flops, (int, float))
        or not math.isfinite(flops)
        or flops < 0
    ):
        raise ConfigError(
            f"data.flop_attention must be a finite number >= 0 or null (derived from the "
            f"model's shape), got {flops!r}."
        )
    _path("data.cache_dir", data.get("cache_dir"))
    _check_trainer(cfg.trainer)
    if "enable_progress_bar" in cfg.trainer:
        _bool("trainer.enable_progress_bar", cfg.trainer.enable_progress_bar)


def flop_model(model: DictConfig, vocab_size: int) -> FlopModel:
    """The model's forward FLOPs per token and per attention pair (the output layer counted).

    Example:
        >>> from omegaconf import OmegaConf
        >>> cfg = OmegaConf.create({"d_model": 64, "num_layers": 2, "dim_feedforward": 256})
        >>> round(1 / flop_model(cfg, 1000).flop_attention)
        1268
    """
    stack = transformer_flops(
        int(model.d_model), int(model.num_layers), ffn_dim=int(model.dim_feedforward)
    )
    head = 2.0 * int(model.d_model) * vocab_size  # the tied output projection
    return FlopModel(per_token=stack.per_token + head, per_pair=stack.per_pair)


def build_datamodule(cfg: DictConfig) -> tuple[TokenBudgetDataModule, Any, dict[str, Any]]:
    """The tokenizer and the token-budgeted DataModule of ``cfg.layout`` over train/valid.

    The documents (:func:`~examples.lm.data.build_documents`) are split, a byte-level BPE is
    trained on the training documents, and each document becomes ``[BOS, ..., EOS]``. Both
    splits are planned with ``loss_lengths = lengths - 1`` (a document of ``L`` tokens has
    ``L - 1`` next-token predictions), so ``step_ntokens`` is the exact loss-token count of
    the optimizer step in either layout:

    * ``packed``: ``layout="packed"`` with ``flop_attention`` (``data.flop_attention``, or
      :func:`flop_model`'s when null) and :class:`~lightning_varbatch.PackingCollate`;
    * ``padded``: the padded cost with ``PaddingCollate(loss_offset=1)``.

    Both splits are planned and checked here (:meth:`TokenBudgetDataModule.check`, as rank 0
    of 1), so a budget that cannot hold the data fails before the Trainer writes anything.

    Returns:
        The DataModule, the tokenizer and a summary (document counts, training-length
        statistics, the ``flop_attention`` used).

    Raises:
        ConfigError: for a split or budget that cannot work.
    """
    data = cfg.data
    try:
        docs = build_documents(int(data.num_docs), int(data.seed), data.cache_dir)
        splits = split_documents(docs, int(data.valid), int(data.seed))
    except ValueError as error:
        raise ConfigError(str(error)) from error
    cache = None
    if data.cache_dir is not None and int(os.environ.get("WORLD_SIZE", "1")) == 1:
        cache = Path(data.cache_dir) / f"lm-tokenizer-{data.vocab_size}.json"
    tokenizer = tok.train_or_load_tokenizer(
        splits["train"], vocab_size=int(data.vocab_size), cache_path=cache
    )
    train_items, train_lengths = encode_documents(tokenizer, splits["train"], data.max_length)
    val_items, val_lengths = encode_documents(tokenizer, splits["valid"], data.max_length)
    multiple = int(data.pad_to_multiple_of)
    train_loss, val_loss = train_lengths - 1, val_lengths - 1
    if cfg.layout == "padded" and data.oversize == "truncate":
        # A document cut to c tokens has c - 1 predictions in a padded row (the planner, which
        # counts min(L - 1, c), assumes the packed rule: the last kept token keeps its label).
        budgets = (data.max_tokens, data.val_max_tokens or data.max_tokens)
        train_cut, val_cut = (fitting_length(int(b), multiple) for b in budgets)
        train_loss = np.minimum(train_lengths, train_cut) - 1
        val_loss = np.minimum(val_lengths, val_cut) - 1
    layout: dict[str, Any] = {"layout": cfg.layout}
    if cfg.layout == "packed":
        flops = data.flop_attention
        if flops is None:
            flops = flop_model(cfg.model, tokenizer.get_vocab_size()).flop_attention
        layout["flop_attention"] = float(flops)
        collate: Any = PackingCollate(pad_id=tok.PAD_ID, pad_to_multiple_of=multiple)
    else:
        collate = PaddingCollate(pad_id=tok.PAD_ID, pad_to_multiple_of=multiple, loss_offset=1)
    try:
        dm = TokenBudgetDataModule(
            train_items,
            train_lengths,
            int(data.max_tokens),
            val_dataset=val_items,
            val_lengths=val_lengths,
            val_max_tokens=data.val_max_tokens,
            train_loss_lengths=train_loss,
            val_loss_lengths=val_loss,
            collate=collate,
            num_workers=int(data.num_workers),
            on_resume_mismatch=cfg.get("on_resume_mismatch", "error"),
            bucket_width=int(data.bucket_width),
            tail=data.tail,
            oversize=data.oversize,
            pad_to_multiple_of=multiple,
            seed=int(data.seed),
            **layout,
        )
        dm.check(stages=("train", "val"))
    except ValueError as error:
        setting = f"data.max_tokens={data.max_tokens}"
        if data.val_max_tokens is not None:
            setting += f" / data.val_max_tokens={data.val_max_tokens}"
        raise ConfigError(
            f"{setting} cannot batch the documents with layout={cfg.layout}: {error} Raise "
            "the budget, lower data.max_length, or set data.oversize=skip|truncate."
        ) from error
    info = {
        "layout": cfg.layout,
        "train_docs": len(train_items),
        "valid_docs": len(val_items),
        "train_lengths": length_stats(train_lengths),
        "flop_attention": layout.get("flop_attention"),
    }
    return dm, tokenizer, info


class RunTotals(Callback):
    """Count the tokens trained (all ranks) and the training time, for ``metrics.json``.

    Per micro-batch it adds the batch's real input tokens, padded slots and loss tokens
    (:mod:`lightning_varbatch.keys`); at the end of training the counts are summed over ranks
    (a collective on every rank) and the wall time from the first to the last training
    batch is taken from rank 0's clock (validation included).

    Attributes:
        totals: after training, ``input_tokens``, ``padded_tokens``, ``loss_tokens`` (all
            ranks), ``train_seconds``, ``tokens_per_sec`` (real input tokens per second over
            all ranks) and ``padding_efficiency`` (real tokens / slots).
    """

    def __init__(self) -> None:
        self._counts = torch.zeros(3, dtype=torch.float64)
        self._start: float | None = None
        self.totals: dict[str, float] = {}

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        if self._start is None:
            self._start = time.perf_counter()

    @override
    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        for i, key in enumerate((keys.INPUT_TOKENS, keys.PADDED_TOKENS, keys.NTOKENS)):
            self._counts[i] += float(batch[key])

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        seconds = time.perf_counter() - (self._start or time.perf_counter())
        counts = self._counts.to(pl_module.device, torch.float32)  # float64: not on every device
        total = trainer.strategy.reduce(counts, reduce_op="sum").double().cpu().tolist()
        real, padded, loss = total
        self.totals = {
            "input_tokens": real,
            "padded_tokens": padded,
            "loss_tokens": loss,
            "train_seconds": seconds,
            "tokens_per_sec": real / seconds if seconds > 0 else float("nan"),
            "padding_efficiency": real / padded if padded else float("nan"),
        }


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, tokenizer, model, strategy, callbacks and logger; fit; return the metrics.

    Returns:
        The final logged metrics as floats (``train/loss``, ``train/ppl``, ``val/loss``,
        ``val/ppl``, ...) plus ``layout``, ``global_step``, ``seconds`` (the whole run),
        ``train_seconds``, ``tokens_per_sec``, ``input_tokens``, ``padded_tokens``,
        ``padding_efficiency``, ``log_dir``, ``ckpt_dir``, ``output_dir`` and the data
        summary (``data``).

    Raises:
        ConfigError: for a setting that cannot work (nothing has been written then).
        SystemExit: with status 143 (SIGTERM) or 130 (SIGINT) when training was interrupted,
            after saving ``<output_dir>/checkpoints/last.ckpt`` and writing ``metrics.json``.

    The metrics are also written to ``<output_dir>/metrics.json`` (rank 0).
    """
    start = time.perf_counter()
    check_config(cfg)
    ckpt = None
    if cfg.get("ckpt_path") is not None:
        deepspeed = "DeepSpeed" in str(cfg.strategy.get("_target_"))
        ckpt = check_checkpoint_file(str(cfg.ckpt_path), deepspeed=deepspeed)
    seed_everything(cfg.seed, workers=True, verbose=False)
    if cfg.get("cpu_threads"):
        torch.set_num_threads(cfg.cpu_threads)
        os.environ["OMP_NUM_THREADS"] = str(cfg.cpu_threads)  # for launched processes
    output_dir = Path(cfg.output_dir).resolve()
    strategy = build_strategy(cfg)
    totals = RunTotals()
    callbacks = [*build_callbacks(cfg), totals]
    logger = build_logger(cfg)
    dm, tokenizer, info = build_datamodule(cfg)
    if ckpt is not None:
        check_resume(cfg, dm, ckpt)
        del ckpt
    model = _instantiate("model", cfg.model, vocab_size=tokenizer.get_vocab_size(), _convert_="all")
    trainer: Trainer = _instantiate(
        "trainer",
        cfg.trainer,
        strategy=strategy,
        callbacks=callbacks,
        logger=logger,
        enable_checkpointing=any(type(c).__name__ == "ModelCheckpoint" for c in callbacks),
    )
    if trainer.global_rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(output_dir / "tokenizer.json"))
    metrics: dict[str, Any] = {"output_dir": str(output_dir), "layout": cfg.layout, "data": info}
    try:
        trainer.fit(model, dm, ckpt_path=cfg.get("ckpt_path"))
        metrics.update(_scalar_metrics(trainer))
        record_trained(trainer, metrics, callbacks)  # metrics.json names the complete last.ckpt
    except Interrupted as stop:
        _stopped(trainer, metrics, stop.signum, stop.checkpoint)
    except SIGTERMException:  # Lightning's own, outside our hooks
        _stopped(trainer, metrics, int(signal.SIGTERM), metrics.get("checkpoint"))
    except ResumeMismatchError as error:  # a DeepSpeed checkpoint folder is only read by fit()
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} cannot resume on this data: {error} -- add "
            "on_resume_mismatch=restart_epoch to start the checkpoint's epoch afresh."
        ) from error
    checkpoint = trainer.checkpoint_callback
    metrics.update(totals.totals)
    metrics.update(
        global_step=int(trainer.global_step),
        log_dir=trainer.log_dir if trainer.loggers else None,
        ckpt_dir=getattr(checkpoint, "dirpath", None),
        seconds=time.perf_counter() - start,
        world_size=int(trainer.world_size),
        tokenizer_sha=hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
    )
    if trainer.global_rank == 0:
        val = metrics.get("val/loss")
        result = (
            "no validation ran"
            if val is None
            else f"val loss {val:.3f}, perplexity {metrics['val/ppl']:.2f}"
        )
        print(
            f"Done ({cfg.layout}): {metrics['global_step']} steps in {metrics['seconds']:.0f}s "
            f"on {trainer.world_size} process(es); {result}; "
            f"{metrics.get('tokens_per_sec', float('nan')):.0f} tokens/s, padding efficiency "
            f"{metrics.get('padding_efficiency', float('nan')):.3f}\n"
            f"  logs:        {metrics['log_dir']}\n  checkpoints: {metrics['ckpt_dir']}\n"
            f"  metrics:     {output_dir / 'metrics.json'}"
        )
    write_summary(metrics)
    return metrics


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Command-line entry: ``python examples/lm/train.py [overrides]``."""
    _use_job_dir(cfg)
    try:
        train(cfg)  # writes <output_dir>/metrics.json
    except ConfigError as error:
        _drop_empty_run_dir()
        print(f"Configuration error: {error}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    check_overrides(sys.argv, CONF_DIR)
    main()
