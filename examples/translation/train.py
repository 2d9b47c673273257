"""Train an en->de Transformer on token-budgeted batches, configured with Hydra.

From the repository root (or from this folder as ``python train.py ...``)::

    python examples/translation/train.py                                  # tiny model, CPU
    python examples/translation/train.py strategy=deepspeed data.max_tokens=16384
    python examples/translation/train.py strategy=fsdp trainer.devices=2 model=base
    python examples/translation/train.py ckpt_path=outputs/.../checkpoints/last.ckpt
    python examples/translation/train.py -m data.max_tokens=2048,4096   # output_dir/0, output_dir/1
    python examples/translation/train.py data=mixture data.corpora.sentences.weight=3
    python examples/translation/train.py data.hf_path=ds data.source_column=en data.target_column=de
    python examples/translation/train.py data.stream=true      # train split streamed from shards

:func:`train` does the work (tests call it with a composed config); :func:`main` is the
command-line entry. A bad setting (any ``data.*``/``model.*``/``trainer.*`` value that cannot
work, a budget below the longest example with ``data.oversize=error``, a ``ckpt_path`` that
is not a checkpoint or was saved for other data, an unknown key or group option, ...) stops
before anything is written, with a message naming the setting, and exit status 2. SIGTERM and
SIGINT save ``<output_dir>/checkpoints/last.ckpt`` at the next optimizer step (during a
validation: after its micro-batch in progress) and exit with 143 and 130 (see
:mod:`examples.translation.preemption`); once training has finished, ``metrics.json`` names
its complete ``last.ckpt`` as ``checkpoint`` (a signal during the test then points there).
Budget semantics and the loss counts: :mod:`examples.translation.batching`; the early checks:
:mod:`examples.translation.checks`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
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
from lightning.pytorch.utilities.exceptions import SIGTERMException  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402

from examples.translation import data as corpus  # noqa: E402
from examples.translation import streaming  # noqa: E402
from examples.translation import tokenizer as tok  # noqa: E402
from examples.translation.batching import (  # noqa: E402
    describe_oversize,
    fitting_length,
    loss_lengths,
    oversize_counts,
)
from examples.translation.checks import (  # noqa: E402
    check_checkpoint_file,
    check_config,
    sampler_state,
)
from examples.translation.compiling import CompileStats  # noqa: E402
from examples.translation.corpora import (  # noqa: E402
    ConfigError,
    Corpus,
    mixture_settings,
    read_corpora,
)
from examples.translation.preemption import Interrupted, PreemptionCheckpoint  # noqa: E402
from lightning_varbatch import (  # noqa: E402
    DataSource,
    PaddingCollate,
    ResumeMismatchError,
    SettingError,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    VarBatchDeepSpeedStrategy,
)
from lightning_varbatch.sources import column_lengths  # noqa: E402

#: The token-id columns of a Hugging Face corpus after tokenizing: what the collate pads and
#: the DataModule reads the planning lengths from.
TOKEN_COLUMNS = ("source", "target")
CONF_DIR = ROOT / "conf"
STRATEGIES = sorted(p.stem for p in (CONF_DIR / "strategy").glob("*.yaml"))

__all__ = [
    "CONF_DIR",
    "ConfigError",
    "check_config",
    "check_overrides",
    "main",
    "record_trained",
    "train",
]


def _rank() -> int:
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def _world() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def _split(c: Corpus, pairs: list[tuple[str, str]] | dict[str, Any], seed: int) -> dict[str, Any]:
    """``c``'s pairs split into train/valid/test by its own ``valid`` and ``test`` sizes.

    A Hugging Face corpus (``pairs`` is ``{"train": ds, ...}``, see :meth:`Corpus.load`) is
    split the same way, by rows (``ds.select``: the same pairs as the list of them would give),
    except for a ``valid``/``test`` split of its own (``data.hf_valid_split`` /
    ``data.hf_test_split``), which is used whole and nothing is held out for it.
    """
    own: dict[str, Any] = {}
    whole: Any = pairs  # a list of pairs, or the training split's datasets.Dataset
    if isinstance(pairs, dict):
        own = {k: v for k, v in pairs.items() if k != "train"}
        whole = pairs["train"]
    valid = 0 if "valid" in own else c.valid
    test = 0 if "test" in own else c.test
    if valid + test >= len(whole) or (valid < 1 and "valid" not in own) or test < 0:
        larger = "give a larger corpus"
        if c.kind == "synthetic":
            larger = f"raise {c.setting}.num_pairs (or {larger})"
        raise ConfigError(
            f"{c.setting}.valid={c.valid} and {c.setting}.test={c.test} must leave training "
            f"pairs ({c.setting}.valid >= 1, {c.setting}.test >= 0) of the {len(whole)} pairs "
            f"of the corpus: lower them, or {larger}."
        )
    if isinstance(whole, list):
        return corpus.split_corpus(whole, valid=valid, test=test, seed=seed)
    rows = corpus.split_indices(len(whole), valid=valid, test=test, seed=seed)
    return {split: own[split] if split in own else whole.select(rows[split]) for split in rows}


def _texts(split: Any, c: Corpus) -> tuple[list[str], list[str]]:
    """The sources and the targets of one split (pairs or a Hugging Face dataset)."""
    if isinstance(split, list):
        return [s for s, _ in split], [t for _, t in split]
    # a select()ed split's rows through its indices, as Python strings for the BPE trainer
    return list(split[c.source["source_column"]]), list(split[c.source["target_column"]])


def _encode(split: Any, c: Corpus, tokenizer: Any, data: DictConfig) -> tuple[Any, Any]:
    """One split's items and ``(n, 2)`` (source, target) lengths.

    Pairs become a list of ``{"source", "target"}`` items; a Hugging Face split stays a
    ``datasets.Dataset`` with ``source``/``target`` token-id columns
    (:func:`~examples.translation.tokenizer.encode_dataset`), its lengths read from them with
    Arrow (:func:`~lightning_varbatch.sources.column_lengths`), not a loop over rows.
    """
    if isinstance(split, list):
        return tok.encode_pairs(tokenizer, split, max_length=data.max_length)
    cache = None if data.cache_dir is None or _world() > 1 else Path(data.cache_dir) / "hf"
    ids = tok.encode_dataset(
        tokenizer,
        split,
        c.source["source_column"],
        c.source["target_column"],
        max_length=data.max_length,
        cache_dir=cache,
    )
    if len(ids) == 0:  # an empty split (data.test=0): nothing to read
        return ids, np.zeros((0, 2), dtype=np.int64)
    return ids, column_lengths(ids, TOKEN_COLUMNS, f"{c.setting}.hf_path")


#: Above this share of a split's examples skipped or truncated, the run is refused.
MAX_OVERSIZE_SHARE = 0.5


def _budgets(cfg: DictConfig, split: str, corpora: list[Corpus]) -> tuple[str, list[int]]:
    """The setting that holds ``split``'s budget and each corpus's budget for it."""
    data = cfg.data
    if split == "train":
        setting, budget = "data.max_tokens", data.max_tokens
    else:
        setting, budget = "data.val_max_tokens", data.val_max_tokens or data.max_tokens
    return setting, [c.max_tokens or budget for c in corpora]


def _loss_lengths(cfg: DictConfig, lengths: Any, budget: int) -> Any:
    """Loss tokens per pair (target minus BOS), after the cut of ``data.oversize=truncate``."""
    data = cfg.data
    cut = fitting_length(budget, data.pad_to_multiple_of)
    return loss_lengths(lengths, cut if data.oversize == "truncate" else None)


def _sources(
    cfg: DictConfig, split: str, corpora: list[Corpus], encoded: list[dict[str, Any]]
) -> list[DataSource]:
    """One :class:`DataSource` per corpus of ``split``: items, padded lengths, loss counts."""
    _, budgets = _budgets(cfg, split, corpora)
    out = []
    for c, e, budget in zip(corpora, encoded, budgets, strict=True):
        items, lengths = e[split]
        out.append(
            DataSource(
                lengths,  # what the collate pads: source and whole target (BOS ... EOS)
                dataset=items,
                name=c.name,
                max_tokens=c.max_tokens,
                max_examples=c.max_examples,
                loss_lengths=_loss_lengths(cfg, lengths, budget),
            )
        )
    return out


def _splits(
    cfg: DictConfig, corpora: list[Corpus], encoded: list[dict[str, Any]], with_test: bool
) -> dict[str, Any]:
    """The DataModule's split arguments: one plain dataset per split for a single corpus
    (with its per-split loss lengths), a list of :class:`DataSource` for several."""
    stages = {"train": "train", "val": "valid", "test": "test"}
    if not with_test:
        del stages["test"]
    if corpora[0].name:  # data.corpora: one DataSource per corpus
        out: dict[str, Any] = {
            f"{s}_dataset": _sources(cfg, sp, corpora, encoded) for s, sp in stages.items()
        }
        return {**out, "train_lengths": None}
    out = {}
    for stage, split in stages.items():
        items, lengths = encoded[0][split]
        _, (budget,) = _budgets(cfg, split, corpora)
        out[f"{stage}_dataset"] = items
        # what the collate pads: source and whole target; a Hugging Face dataset's are named
        # by column, so that the DataModule reads them from Arrow itself
        out[f"{stage}_lengths"] = TOKEN_COLUMNS if corpora[0].kind == "hf" else lengths
        out[f"{stage}_loss_lengths"] = _loss_lengths(cfg, lengths, budget)
    return out


def _plan_error(cfg: DictConfig, split: str, corpora: list[Corpus], error: Exception) -> str:
    """Why ``split`` cannot be planned, naming the budget settings it was planned with."""
    setting, _ = _budgets(cfg, split, corpora)
    value = cfg.data.get(setting.split(".")[1])
    default = " (null: data.max_tokens)" if split != "train" and value is None else ""
    budgets = [f"{setting}={value}{default}"] + [
        f"{c.setting}.max_tokens={c.max_tokens}" for c in corpora if c.max_tokens
    ]
    own = " (or data.corpora.<name>.max_tokens)" if corpora[0].name else ""
    fixes = f"Raise {setting}{own} or lower data.max_length"
    if cfg.data.oversize == "error":
        fixes += ", or set data.oversize=skip|truncate to leave out or cut the longest examples"
    return (
        f"{' / '.join(budgets)} cannot batch the {split} split (a micro-batch's budget counts "
        f"n x the widest padded field, source or target): {error} {fixes}."
    )


def _datamodule(
    cfg: DictConfig,
    corpora: list[Corpus],
    encoded: list[dict[str, Any]],
    mixture: dict[str, Any],
    with_test: bool,
) -> TokenBudgetDataModule:
    data = cfg.data
    return TokenBudgetDataModule(
        max_tokens=data.max_tokens,
        val_max_tokens=data.val_max_tokens,
        # the loss predicts target[1:]: one loss token fewer than target tokens per pair
        collate=PaddingCollate(
            pad_id=tok.PAD_ID, pad_to_multiple_of=data.pad_to_multiple_of, loss_offset=1
        ),
        num_workers=data.num_workers,
        on_resume_mismatch=cfg.get("on_resume_mismatch", "error"),
        bucket_width=data.bucket_width,
        max_shapes=data.get("max_shapes"),  # the shape budget (compile=true)
        tail=data.tail,
        oversize=data.oversize,
        pad_to_multiple_of=data.pad_to_multiple_of,
        seed=data.seed,
        **_splits(cfg, corpora, encoded, with_test),
        **mixture,
    )


def build_datamodule(
    cfg: DictConfig, output_dir: Path
) -> tuple[TokenBudgetDataModule | StreamingDataModule, Any, dict[str, Any]]:
    """The tokenizer and the token-budgeted DataModule over train/valid/test splits.

    Each corpus is split on its own and one BPE tokenizer is trained on every training split.
    A Hugging Face corpus (``data.hf_path``) stays a ``datasets.Dataset`` throughout: its
    splits are tokenized into ``source``/``target`` token-id columns and handed to the
    DataModule with those column names as their lengths (read from Arrow), so that every
    micro-batch is read as one Arrow table.
    Every split is planned on the padded (source, target) lengths with the loss counts
    (target minus BOS) as its loss lengths (:mod:`examples.translation.batching`): one corpus
    is one plain dataset per split (``train_loss_lengths``, ...); with ``data.corpora`` every
    split is a list of :class:`~lightning_varbatch.DataSource`, one per corpus (named, with
    its own ``max_tokens``/``max_examples`` and ``loss_lengths``), mixed by ``data.mixing``,
    ``data.corpora.<name>.weight``, ``data.temperature`` and ``data.steps_per_epoch``;
    validation and test cover every example of every corpus once.

    With ``data.stream=true`` the training split is streamed from parquet shards instead
    (:mod:`examples.translation.streaming`: written once to ``data.shard_dir``, then reused)
    and validation/test stay map-style.

    Every split is planned and checked here with :meth:`TokenBudgetDataModule.check` (as rank
    0 of 1, without a Trainer), so that a budget or setting that cannot work fails before the
    Trainer writes anything, and the examples skipped or truncated by ``data.oversize`` are
    reported (more than half of a split is refused).

    Returns:
        The DataModule, the tokenizer and the split sizes (``train``/``valid``/``test``, plus
        ``corpora``: the sizes per corpus, for a mixture). The DataModule's ``oversize``
        attribute holds the skipped and truncated counts per split.

    Raises:
        ConfigError: for a corpus that cannot be read or split, or a budget that cannot hold
            the data under the oversize policy.
    """
    data = cfg.data
    corpora = read_corpora(data)
    mixture = mixture_settings(data, corpora)
    splits = [_split(c, c.load(data.cache_dir), data.seed) for c in corpora]
    train_texts = [_texts(sp["train"], c) for c, sp in zip(corpora, splits, strict=True)]
    # every source, then every target (the order the tokenizer's cache fingerprint hashes)
    texts = [s for sources, _ in train_texts for s in sources]
    texts += [t for _, targets in train_texts for t in targets]
    cache = None
    if data.cache_dir is not None and _world() == 1:
        cache = Path(data.cache_dir) / f"tokenizer-{data.vocab_size}.json"
    # Several ranks train the same (deterministic) tokenizer in memory: no shared-file race.
    tokenizer = tok.train_or_load_tokenizer(texts, vocab_size=data.vocab_size, cache_path=cache)
    if data.get("stream"):
        return _streaming_datamodule(cfg, output_dir, corpora, splits[0], tokenizer, train_texts[0])
    encoded: list[dict[str, Any]] = []
    for c, sp in zip(corpora, splits, strict=True):
        encoded.append({split: _encode(sp[split], c, tokenizer, data) for split in sp})
    with_test = all(c.has_test for c in corpora)
    try:
        dm = _datamodule(cfg, corpora, encoded, mixture, with_test)
    except ValueError as error:  # the DataModule may plan its splits when it is built
        # the split whose planning failed: the SettingError's stage (train when it has none)
        stage = error.stage if isinstance(error, SettingError) and error.stage else "train"
        split = {"val": "valid"}.get(stage, stage)
        raise ConfigError(_plan_error(cfg, split, corpora, error)) from error
    oversize: dict[str, dict[str, int]] = {}
    stages = {"train": "train", "valid": "val"}
    if with_test and cfg.get("test"):
        stages["test"] = "test"
    for split, stage in stages.items():
        try:  # planned and checked as the Trainer will, here as rank 0 of 1
            plan = dm.check(stages=(stage,))[stage]
        except ValueError as error:
            raise ConfigError(_plan_error(cfg, split, corpora, error)) from error
        counts = oversize_counts(dm.planner(stage), plan)
        oversize[split] = counts
        lost = counts["skipped"] + counts["truncated"]
        if lost > MAX_OVERSIZE_SHARE * counts["examples"]:
            setting, _ = _budgets(cfg, split, corpora)
            raise ConfigError(
                f"data.oversize={data.oversize} with {setting}="
                f"{data.get(setting.split('.')[1])} would leave out or cut most of the data: "
                f"{describe_oversize(split + ' split', counts)}. Raise {setting}, lower "
                "data.max_length, or set data.oversize=error to see the longest example."
            )
        if lost and _rank() == 0:
            print(
                f"WARNING: data.oversize={data.oversize}: {describe_oversize(split, counts)}.",
                file=sys.stderr,
            )
    dm.oversize = oversize  # type: ignore[attr-defined]  # for train()'s metrics
    sizes: dict[str, Any] = {
        split: sum(len(e[split][0]) for e in encoded) for split in ("train", "valid", "test")
    }
    if mixture:
        sizes["corpora"] = {
            c.name: {split: len(items) for split, (items, _) in e.items()}
            for c, e in zip(corpora, encoded, strict=True)
        }
    return dm, tokenizer, sizes


def _streaming_datamodule(
    cfg: DictConfig,
    output_dir: Path,
    corpora: list[Corpus],
    split: dict[str, Any],
    tokenizer: Any,
    texts: tuple[list[str], list[str]],
) -> tuple[StreamingDataModule, Any, dict[str, Any]]:
    """``data.stream=true``: the training split from shards, validation/test map-style.

    See :mod:`examples.translation.streaming`; returns what :func:`build_datamodule` does, the
    DataModule's ``shards`` attribute describing the shard folder.
    """
    data, (c,) = cfg.data, corpora
    shard_dir = data.get("shard_dir")
    folder = Path(shard_dir).expanduser().resolve() if shard_dir else output_dir / "shards"
    shards = streaming.prepare_shards(
        data,
        folder,
        tokenizer,
        texts,
        partial(_encode, split["train"], c, tokenizer, data),
        _world(),
    )
    source = streaming.open_shards(shards, data.cache_dir)
    val = _encode(split["valid"], c, tokenizer, data)
    test = _encode(split["test"], c, tokenizer, data) if cfg.get("test") else None
    try:
        dm = streaming.build(data, source, shards, val, test)
        plan = dm.check(stages=("val",))["val"]  # planned as the Trainer will, as 1 rank
    except ConfigError:
        raise
    except ValueError as error:
        raise ConfigError(_plan_error(cfg, "valid", corpora, error)) from error
    cut = fitting_length(data.max_tokens, data.pad_to_multiple_of)
    rows = source.num_rows
    oversize = {
        "train": {
            "examples": rows,
            "skipped": 0,
            "truncated": int(shards["truncated"]),
            "truncate_to": cut if data.oversize == "truncate" else 0,
        },
        "valid": oversize_counts(dm.planner("val"), plan),
    }
    counts = oversize["valid"]
    if counts["skipped"] + counts["truncated"] > MAX_OVERSIZE_SHARE * counts["examples"]:
        raise ConfigError(
            f"data.oversize={data.oversize} with data.val_max_tokens={data.val_max_tokens} "
            f"would leave out or cut most of the data: {describe_oversize('valid split', counts)}"
            ". Raise data.val_max_tokens, lower data.max_length, or set data.oversize=error."
        )
    for name, lost in oversize.items():
        if lost["skipped"] + lost["truncated"] and _rank() == 0:
            print(
                f"WARNING: data.oversize={data.oversize}: {describe_oversize(name, lost)}.",
                file=sys.stderr,
            )
    dm.oversize = oversize  # type: ignore[attr-defined]  # for train()'s metrics
    dm.shards = shards  # type: ignore[attr-defined]
    if _rank() == 0:
        what = "your own shards" if shards["own"] else "shards"
        print(
            f"data.stream=true: training on {rows:,} pairs streamed from {shards['files']} "
            f"{what} in {folder}"
            + ("" if shards["written"] or shards["own"] else " (reused: same manifest hash)"),
            file=sys.stderr,
        )
    sizes = {"train": rows, "valid": len(val[0]), "test": len(split["test"])}
    return dm, tokenizer, sizes


def check_resume(cfg: DictConfig, dm: Any, ckpt: dict[str, Any]) -> None:
    """Refuse a checkpoint whose sampler position was saved for other data or settings.

    Raises:
        ConfigError: naming ``ckpt_path`` and ``on_resume_mismatch=restart_epoch``.
    """
    if isinstance(dm, StreamingDataModule):
        streaming.check_resume(str(cfg.ckpt_path), dm, ckpt)
        return
    if StreamingDataModule.__qualname__ in ckpt or streaming.LEGACY_STATE_KEY in ckpt:
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} was saved by a streamed run (data.stream=true): its "
            "position is in the shard stream, not in this map-style epoch. Resume it with "
            "data.stream=true and the same data.shard_dir."
        )
    state = sampler_state(ckpt)
    if state is None or cfg.get("on_resume_mismatch", "error") != "error":
        return
    # a sampler of the DataModule's training planner (rank and world size from the
    # environment, as the DataModule's own without a Trainer); the DataModule is left as is
    sampler = TokenBudgetBatchSampler.from_planner(dm.planner("train"))
    try:
        sampler.load_state_dict(state)
    except (ValueError, TypeError) as error:
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} cannot resume on this data: {error} -- To keep the "
            "weights and optimizer and start the checkpoint's epoch afresh on the current data "
            "(every example of it trained once), add on_resume_mismatch=restart_epoch."
        ) from error


def _instantiate(setting: str, spec: Any, **kwargs: Any) -> Any:
    """``hydra.utils.instantiate`` with a bad argument reported as a :class:`ConfigError`."""
    try:
        return hydra.utils.instantiate(spec, **kwargs)
    except Exception as error:
        cause = error.__cause__ or error
        text = str(cause).splitlines()[0] if str(cause) else type(cause).__name__
        raise ConfigError(f"{setting} cannot be built: {type(cause).__name__}: {text}") from error


def build_strategy(cfg: DictConfig) -> Strategy | str:
    """The configured strategy object (``"auto"`` for DDP on a single device)."""
    strategy = _instantiate("strategy", cfg.strategy)
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
        if not isinstance(spec, dict):
            raise ConfigError(f"callbacks.{name} must be a mapping with _target_, got {spec!r}.")
        enabled = spec.pop("enabled", True)
        if not isinstance(enabled, bool):
            raise ConfigError(f"callbacks.{name}.enabled must be true or false, got {enabled!r}.")
        if not enabled:
            continue
        if "_target_" not in spec:
            raise ConfigError(f"callbacks.{name} has no _target_.")
        callback = _instantiate(f"callbacks.{name}", spec)
        if isinstance(callback, LearningRateMonitor) and cfg.get("logger") is None:
            rank_zero_info(f"callbacks.{name} (LearningRateMonitor) is off: there is no logger.")
            continue
        callbacks.append(callback)
    return callbacks


def build_logger(cfg: DictConfig) -> Logger | bool:
    """The configured logger, or ``False`` for ``logger=null``."""
    if cfg.get("logger") is None:
        return False
    return _instantiate("logger", cfg.logger)


def _scalar_metrics(trainer: Trainer) -> dict[str, Any]:
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def _summary(metrics: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, dict))}


def write_summary(metrics: dict[str, Any]) -> None:
    """``<output_dir>/metrics.json`` (rank 0): the final metrics, or how the run stopped."""
    if _rank() == 0 and metrics.get("output_dir"):
        path = Path(metrics["output_dir"]) / "metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(_summary(metrics), indent=2))


def record_trained(trainer: Trainer, metrics: dict[str, Any], callbacks: list[Callback]) -> None:
    """Training has finished: name its complete checkpoint in ``metrics.json`` at once.

    ``callbacks.preemption`` saved the final state to ``last.ckpt`` when training ended
    (:attr:`PreemptionCheckpoint.final`); ``metrics.json`` names it as ``checkpoint`` before a
    test begins, so a requeue script that resumes from it does not train again, whatever
    stops the job later. Without that callback ``checkpoint`` is null.
    """
    finals = [c.final for c in callbacks if isinstance(c, PreemptionCheckpoint)]
    metrics.update(
        checkpoint=next((f for f in finals if f is not None), None),
        global_step=int(trainer.global_step),
        trained=True,
    )
    write_summary(metrics)


def _stopped(trainer: Trainer, metrics: dict[str, Any], signum: int, ckpt: str | None) -> None:
    """Write what the interrupted run has, say how to resume, exit with ``128 + signum``."""
    name = signal.Signals(signum).name
    metrics.update(_scalar_metrics(trainer))
    metrics.update(
        interrupted=name,
        checkpoint=ckpt,
        global_step=int(trainer.global_step),
        exit_code=128 + signum,
    )
    write_summary(metrics)
    if trainer.global_rank == 0:
        if ckpt and metrics.get("trained"):
            resume = (
                f"training had finished; resume with the same overrides plus ckpt_path={ckpt} "
                "to run what followed it"
            )
        elif ckpt:
            resume = f"resume with the same overrides plus ckpt_path={ckpt}"
        else:
            resume = "no checkpoint was written (the signal came before training started)"
        print(
            f"Interrupted by {name} after {metrics['global_step']} optimizer steps: {resume}. "
            f"Summary: {Path(metrics['output_dir']) / 'metrics.json'}; exit status "
            f"{128 + signum}.",
            file=sys.stderr,
        )
    raise SystemExit(128 + signum)


def _compile(cfg: DictConfig, model: Any, dm: Any) -> CompileStats | None:
    """With ``compile=true``: compile the model's training forward; say what was set.

    The shape budget itself (``data.max_shapes``, ``data.bucket_width``) is set by the config
    (``conf/data/default.yaml``) and checked by :func:`check_config`; see
    :mod:`examples.translation.compiling`.
    """
    if not cfg.get("compile"):
        return None
    backend = str(cfg.get("compile_backend", "inductor"))
    # A fresh dynamo cache: the jobs of a multirun (-m) share one process and one
    # TranslationModel.forward code object, whose compiled versions would pile up past
    # the recompile limit.
    torch._dynamo.reset()
    model.compile_forward(backend)
    shapes = getattr(dm.planner("train"), "shapes", None)
    stats = CompileStats(cfg.data.max_shapes, backend, None if shapes is None else shapes.tolist())
    if _rank() == 0:
        listed = "" if shapes is None else ": " + ", ".join(f"{r}x{n}" for r, n in shapes.tolist())
        count = "" if shapes is None else f"{len(shapes)} "
        print(
            f"compile=true: the training forward runs under torch.compile(dynamic=False, "
            f"backend={backend!r}); data.max_shapes={cfg.data.max_shapes}, "
            f"data.bucket_width={cfg.data.bucket_width}; the training split has "
            f"{count}shapes (rows x length){listed}; dynamo recompile limit "
            f"{stats.recompile_limit}. Validation and decoding run eager."
        )
    return stats


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, tokenizer, model, strategy, callbacks and logger; fit; return the metrics.

    Returns:
        The final logged metrics as floats (``val/bleu``, ``val/chrf``, ``val/loss``, ...; with
        ``test=true`` also ``test/bleu``, ``test/chrf``, ``test/loss``, ``test/nll``) plus
        ``bleu`` (None without a validation), ``global_step``, ``log_dir``, ``ckpt_dir``,
        ``output_dir``, ``seconds``, the split sizes, ``trained`` (true) and ``checkpoint``
        (the complete ``last.ckpt`` of the finished training); with ``compile=true`` also
        ``compile`` (:meth:`~examples.translation.compiling.CompileStats.summary`: ``graphs``
        compiled during training, distinct training ``shapes``, ``max_shapes``, ...).

    Raises:
        ConfigError: for a setting that cannot work (nothing has been written then).
        SystemExit: with status 143 (SIGTERM) or 130 (SIGINT) when training was interrupted,
            after saving ``<output_dir>/checkpoints/last.ckpt`` (callbacks.preemption) and
            writing ``metrics.json`` with ``interrupted`` and ``checkpoint``.
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
        # Processes Lightning launches inherit it, and Lightning's DDP keeps it.
        os.environ["OMP_NUM_THREADS"] = str(cfg.cpu_threads)
    output_dir = Path(cfg.output_dir).resolve()
    strategy = build_strategy(cfg)
    callbacks = build_callbacks(cfg)
    logger = build_logger(cfg)
    dm, tokenizer, sizes = build_datamodule(cfg, output_dir)
    if ckpt is not None:
        check_resume(cfg, dm, ckpt)
        del ckpt
    model = _instantiate(  # plain containers: checkpoints load with weights_only
        "model",
        cfg.model,
        vocab_size=tokenizer.get_vocab_size(),
        decode_fn=partial(tok.decode, tokenizer),
        dataset_names=list(sizes.get("corpora", [])) or None,  # per-corpus loss keys
        _convert_="all",
    )
    stats = _compile(cfg, model, dm)
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
    oversize = getattr(dm, "oversize", {})
    metrics: dict[str, Any] = {"output_dir": str(output_dir), "sizes": sizes, "oversize": oversize}
    if hasattr(dm, "shards"):
        metrics["shards"] = dm.shards
    try:
        trainer.fit(model, dm, ckpt_path=cfg.get("ckpt_path"))
        metrics.update(_scalar_metrics(trainer))
        record_trained(trainer, metrics, callbacks)
        if cfg.get("test"):
            trainer.test(model, dm)
            metrics.update(_scalar_metrics(trainer))  # test() replaced the callback metrics
    except Interrupted as stop:
        _stopped(trainer, metrics, stop.signum, stop.checkpoint)
    except SIGTERMException:  # Lightning's own, outside our hooks: the finished training's
        _stopped(trainer, metrics, int(signal.SIGTERM), metrics.get("checkpoint"))
    except ResumeMismatchError as error:  # a DeepSpeed checkpoint folder is only read by fit()
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} cannot resume on this data: {error} -- add "
            "on_resume_mismatch=restart_epoch to start the checkpoint's epoch afresh."
        ) from error
    if stats is not None:
        metrics["compile"] = stats.summary(model.compiled_shapes)
    checkpoint = trainer.checkpoint_callback
    metrics.update(
        bleu=metrics.get("val/bleu"),
        global_step=int(trainer.global_step),
        log_dir=trainer.log_dir if trainer.loggers else None,
        ckpt_dir=getattr(checkpoint, "dirpath", None),
        output_dir=str(output_dir),
        seconds=time.perf_counter() - start,
        sizes=sizes,
        oversize=oversize,
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
            + (f"\n  compile:     {stats.describe(metrics['compile'])}" if stats else "")
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
    write_summary(metrics)


def check_overrides(argv: list[str], conf_dir: Path = CONF_DIR) -> None:
    """Exit 2 (not Hydra's 1) for overrides that do not compose: an unknown key or option.

    Only for a plain run (no ``-m``/``--flags`` and no ``hydra.*`` overrides); Hydra reports
    everything else itself. ``conf_dir`` is the entry config's folder (the LM example's too).
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


if __name__ == "__main__":
    check_overrides(sys.argv)
    main()
