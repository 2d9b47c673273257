"""The translation example's token-budgeted DataModule, built from the ``data`` config.

:func:`build_datamodule` reads the corpora (:mod:`examples.translation.corpora`), splits each
one and trains one BPE tokenizer on every training split (:mod:`examples.translation.splits`),
and builds a :class:`~lightning_varbatch.TokenBudgetDataModule` (or, with ``data.stream=true``,
a :class:`~lightning_varbatch.StreamingDataModule` over shards,
:mod:`examples.translation.streaming`). Every split is planned and checked here, as rank 0 of
1 without a Trainer, so that a budget or setting that cannot work fails before the Trainer
writes anything. :func:`check_resume` checks a checkpoint's saved position against it.

Example:
    >>> from hydra import compose, initialize_config_dir
    >>> from pathlib import Path
    >>> from examples.translation.train import CONF_DIR
    >>> overrides = ["data.num_pairs=400", "data.vocab_size=300", "data.cache_dir=null"]
    >>> with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
    ...     cfg = compose("config", overrides=overrides)
    >>> dm, tokenizer, sizes = build_datamodule(cfg, Path("unused"))  # doctest: +SKIP
    >>> sizes  # doctest: +SKIP
    {'train': 300, 'valid': 50, 'test': 50}
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from examples.common.batch_schedule import batch_schedule_settings
from examples.common.checkpoints import check_sampler_resume
from examples.common.config_checks import ConfigError, passed_setting
from examples.common.length_warmup import length_warmup_settings
from examples.common.oversize import describe_oversize, fitting_length, oversize_counts
from examples.common.rank_shares import planned_ranks, rank_settings
from examples.common.summary import rank, world_size
from examples.translation import streaming
from examples.translation import tokenizer as tok
from examples.translation.corpora import Corpus, mixture_settings, read_corpora
from examples.translation.splits import TOKEN_COLUMNS, encode_split, split_pairs, split_texts
from lightning_varbatch import (
    DataSource,
    PaddingCollate,
    SettingError,
    StreamingDataModule,
    TokenBudgetDataModule,
)
from lightning_varbatch.planner import MAX_OVERSIZE_FRACTION

__all__ = ["build_datamodule", "check_resume"]

#: A split (as the corpus names it) and the DataModule's stage of the same split.
STAGES = {"train": "train", "valid": "val", "test": "test"}


def _budgets(cfg: DictConfig, split: str, corpora: list[Corpus]) -> tuple[str, list[int]]:
    """The setting that holds ``split``'s budget and each corpus's budget for it."""
    data = cfg.data
    if split == "train":
        setting, budget = "data.max_tokens", data.max_tokens
    else:
        setting, budget = "data.val_max_tokens", data.val_max_tokens or data.max_tokens
    return setting, [c.max_tokens or budget for c in corpora]


def _sources(
    cfg: DictConfig, split: str, corpora: list[Corpus], encoded: list[dict[str, Any]]
) -> list[DataSource]:
    """One :class:`DataSource` per corpus of ``split``: items and padded lengths (the loss
    counts are the DataModule's ``loss_offset=1``)."""
    out = []
    for c, e in zip(corpora, encoded, strict=True):
        items, lengths = e[split]
        out.append(
            DataSource(
                lengths,  # what the collate pads: source and whole target (BOS ... EOS)
                dataset=items,
                name=c.name,
                max_tokens=c.max_tokens,
                max_examples=c.max_examples,
            )
        )
    return out


def _split_arguments(
    cfg: DictConfig, corpora: list[Corpus], encoded: list[dict[str, Any]], with_test: bool
) -> dict[str, Any]:
    """The DataModule's split arguments: one plain dataset per split for a single corpus, a
    list of :class:`DataSource` for several (the loss counts: ``loss_offset=1``)."""
    stages = {stage: split for split, stage in STAGES.items() if with_test or split != "test"}
    if corpora[0].name:  # data.corpora: one DataSource per corpus
        out: dict[str, Any] = {
            f"{s}_dataset": _sources(cfg, sp, corpora, encoded) for s, sp in stages.items()
        }
        return {**out, "train_lengths": None}
    out = {}
    for stage, split in stages.items():
        items, lengths = encoded[0][split]
        out[f"{stage}_dataset"] = items
        # what the collate pads: source and whole target; a Hugging Face dataset's are named
        # by column, so that the DataModule reads them from Arrow itself
        out[f"{stage}_lengths"] = TOKEN_COLUMNS if corpora[0].kind == "hf" else lengths
    return out


def _plan_error(cfg: DictConfig, split: str, corpora: list[Corpus], error: Exception) -> str:
    """Why ``split`` cannot be planned, naming the ``data`` setting at fault (its Hydra key),
    else the budget settings it was planned with."""
    named = passed_setting(cfg.data, error)  # data.rank_shares, data.length_warmup_max, ...
    if named is not None:
        return named
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


def _collate(data: DictConfig) -> PaddingCollate:
    # the loss predicts target[1:]: one loss token fewer than target tokens per pair
    return PaddingCollate(
        pad_id=tok.PAD_ID, pad_to_multiple_of=data.pad_to_multiple_of, loss_offset=1
    )


def _datamodule(
    cfg: DictConfig,
    corpora: list[Corpus],
    encoded: list[dict[str, Any]],
    mixture: dict[str, Any],
    with_test: bool,
) -> TokenBudgetDataModule:
    """The map-style DataModule; a split that cannot be planned names its budget settings."""
    data = cfg.data
    try:
        return TokenBudgetDataModule(
            max_tokens=data.max_tokens,
            val_max_tokens=data.val_max_tokens,
            collate=_collate(data),
            num_workers=data.num_workers,
            on_resume_mismatch=cfg.get("on_resume_mismatch", "error"),
            bucket_width=data.bucket_width,
            max_shapes=data.get("max_shapes"),  # the shape budget (compile=true)
            tail=data.tail,
            pair_order=data.get("pair_order", "two_sided"),
            oversize=data.oversize,
            pad_to_multiple_of=data.pad_to_multiple_of,
            seed=data.seed,
            # the loss predicts target[1:]: the planner counts each pair's target tokens minus
            # one, after any data.oversize=truncate cut (the collate checks the same count)
            loss_offset=1,
            **length_warmup_settings(data),
            **batch_schedule_settings(data),
            **rank_settings(data),  # a mixed cluster: plain tuples, one entry per rank
            **_split_arguments(cfg, corpora, encoded, with_test),
            **mixture,
        )
    except ValueError as error:  # the DataModule may plan its splits when it is built
        # the split whose planning failed: the SettingError's stage (train when it has none)
        stage = error.stage if isinstance(error, SettingError) and error.stage else "train"
        split = {"val": "valid"}.get(stage, stage)
        raise ConfigError(_plan_error(cfg, split, corpora, error)) from error


def _warn_oversize(data: DictConfig, split: str, counts: dict[str, int]) -> None:
    if counts["skipped"] + counts["truncated"] and rank() == 0:
        print(
            f"WARNING: data.oversize={data.oversize}: {describe_oversize(split, counts)}.",
            file=sys.stderr,
        )


def _mostly_lost(counts: dict[str, int]) -> bool:
    """Whether ``data.oversize`` leaves out or cuts more of a split than is allowed."""
    return counts["skipped"] + counts["truncated"] > MAX_OVERSIZE_FRACTION * counts["examples"]


def _check_oversize(
    cfg: DictConfig, dm: TokenBudgetDataModule, corpora: list[Corpus], splits: list[str]
) -> dict[str, dict[str, int]]:
    """Plan ``splits`` as the Trainer will (rank 0 of 1, or of one rank per ``data.rank_*``
    entry); count, warn, refuse most lost."""
    data, oversize = cfg.data, {}
    for split in splits:
        stage = STAGES[split]
        try:
            plan = dm.check(planned_ranks(data), stages=(stage,))[stage]
        except ValueError as error:
            raise ConfigError(_plan_error(cfg, split, corpora, error)) from error
        counts = oversize[split] = oversize_counts(dm.planner(stage), plan)
        if _mostly_lost(counts):
            setting, _ = _budgets(cfg, split, corpora)
            raise ConfigError(
                f"data.oversize={data.oversize} with {setting}="
                f"{data.get(setting.split('.')[1])} would leave out or cut most of the data: "
                f"{describe_oversize(split + ' split', counts)}. Raise {setting}, lower "
                "data.max_length, or set data.oversize=error to see the longest example."
            )
        _warn_oversize(data, split, counts)
    return oversize


def _tokenizer(data: DictConfig, train_texts: list[tuple[list[str], list[str]]]) -> Any:
    """One BPE tokenizer trained on every corpus's training split (cached when it may be)."""
    # every source, then every target (the order the tokenizer's cache fingerprint hashes)
    texts = [s for sources, _ in train_texts for s in sources]
    texts += [t for _, targets in train_texts for t in targets]
    cache = None
    if data.cache_dir is not None and world_size() == 1:
        cache = Path(data.cache_dir) / f"tokenizer-{data.vocab_size}.json"
    # Several ranks train the same (deterministic) tokenizer in memory: no shared-file race.
    return tok.train_or_load_tokenizer(texts, vocab_size=data.vocab_size, cache_path=cache)


def _sizes(
    encoded: list[dict[str, Any]], corpora: list[Corpus], mixture: dict[str, Any]
) -> dict[str, Any]:
    """The split sizes, and with a mixture each corpus's (``corpora``)."""
    sizes: dict[str, Any] = {
        split: sum(len(e[split][0]) for e in encoded) for split in ("train", "valid", "test")
    }
    if mixture:
        sizes["corpora"] = {
            c.name: {split: len(items) for split, (items, _) in e.items()}
            for c, e in zip(corpora, encoded, strict=True)
        }
    return sizes


def build_datamodule(
    cfg: DictConfig, output_dir: Path
) -> tuple[TokenBudgetDataModule | StreamingDataModule, Any, dict[str, Any]]:
    """The tokenizer and the token-budgeted DataModule over train/valid/test splits.

    Each corpus is split on its own and one BPE tokenizer is trained on every training split.
    A Hugging Face corpus (``data.hf_path``) stays a ``datasets.Dataset`` throughout: its
    splits are tokenized into ``source``/``target`` token-id columns and handed to the
    DataModule with those column names as their lengths (read from Arrow), so that every
    micro-batch is read as one Arrow table.
    Every split is planned on the padded (source, target) lengths with ``loss_offset=1`` (the
    planner counts each pair's target minus BOS, after any cut): one corpus is one plain
    dataset per split; with
    ``data.corpora`` every split is a list of :class:`~lightning_varbatch.DataSource`, one per
    corpus (named, with its own ``max_tokens``/``max_examples``), mixed by ``data.mixing``,
    ``data.corpora.<name>.weight``, ``data.temperature`` and ``data.steps_per_epoch``;
    validation and test cover every example of every corpus once.

    With ``data.stream=true`` the training split is streamed from parquet shards instead
    (:mod:`examples.translation.streaming`: written once to ``data.shard_dir``, by default
    ``<output_dir>/shards``, then reused) and validation/test stay map-style.

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
    splits = [split_pairs(c, c.load(data.cache_dir), data.seed) for c in corpora]
    train_texts = [split_texts(sp["train"], c) for c, sp in zip(corpora, splits, strict=True)]
    tokenizer = _tokenizer(data, train_texts)
    if data.get("stream"):
        return _streaming_datamodule(cfg, output_dir, corpora, splits[0], tokenizer, train_texts[0])
    encoded = [
        {split: encode_split(sp[split], c, tokenizer, data) for split in sp}
        for c, sp in zip(corpora, splits, strict=True)
    ]
    with_test = all(c.has_test for c in corpora)
    dm = _datamodule(cfg, corpora, encoded, mixture, with_test)
    checked = ["train", "valid"] + (["test"] if with_test and cfg.get("test") else [])
    dm.oversize = _check_oversize(cfg, dm, corpora, checked)  # type: ignore[attr-defined]
    return dm, tokenizer, _sizes(encoded, corpora, mixture)


def _stream_oversize(
    data: DictConfig, dm: StreamingDataModule, plan: Any, shards: dict[str, Any], rows: int
) -> dict[str, dict[str, int]]:
    """What the shards cut (training) and the plan leaves out or cuts (validation)."""
    cut = fitting_length(data.max_tokens, data.pad_to_multiple_of)
    oversize = {
        "train": {
            "examples": rows,
            "skipped": 0,
            "truncated": int(shards["truncated"]),
            "truncate_to": cut if data.oversize == "truncate" else 0,
        },
        "valid": oversize_counts(dm.planner("val"), plan),
    }
    if _mostly_lost(oversize["valid"]):
        raise ConfigError(
            f"data.oversize={data.oversize} with data.val_max_tokens={data.val_max_tokens} "
            "would leave out or cut most of the data: "
            f"{describe_oversize('valid split', oversize['valid'])}. Raise "
            "data.val_max_tokens, lower data.max_length, or set data.oversize=error."
        )
    for name, lost in oversize.items():
        _warn_oversize(data, name, lost)
    return oversize


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
    encode = partial(encode_split, split["train"], c, tokenizer, data)
    shards = streaming.prepare_shards(data, folder, tokenizer, texts, encode, world_size())
    source = streaming.open_shards(shards, data.cache_dir)
    val = encode_split(split["valid"], c, tokenizer, data)
    test = encode_split(split["test"], c, tokenizer, data) if cfg.get("test") else None
    try:
        dm = streaming.build(data, source, shards, val, test)
        # planned as the Trainer will (the first training window; one rank per data.rank_*)
        plan = dm.check(planned_ranks(data), stages=("train", "val"))["val"]
    except ConfigError:
        raise
    except ValueError as error:
        train = isinstance(error, SettingError) and error.stage == "train"
        raise ConfigError(
            _plan_error(cfg, "train" if train else "valid", corpora, error)
        ) from error
    rows = source.num_rows
    dm.oversize = _stream_oversize(data, dm, plan, shards, rows)  # type: ignore[attr-defined]
    dm.shards = shards  # type: ignore[attr-defined]
    streaming.announce(shards, folder, rows)
    return dm, tokenizer, {"train": rows, "valid": len(val[0]), "test": len(split["test"])}


def check_resume(cfg: DictConfig, dm: Any, ckpt: dict[str, Any]) -> None:
    """Refuse a checkpoint whose saved position was saved for other data or settings.

    A streamed run's position is checked by :func:`examples.translation.streaming.check_resume`;
    a map-style run's by :func:`examples.common.checkpoints.check_sampler_resume`.

    Raises:
        ConfigError: naming ``ckpt_path`` and ``on_resume_mismatch=restart_epoch``, or for a
            checkpoint of a streamed run resumed map-style.
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
    check_sampler_resume(cfg, dm, ckpt)
