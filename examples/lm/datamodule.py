"""The LM example's DataModule: embedded documents on packed or padded token budgets.

:func:`build_datamodule` splits the embedded documents (:mod:`examples.lm.data`), trains a
byte-level BPE on the training split, and builds the
:class:`~lightning_varbatch.TokenBudgetDataModule` of ``cfg.layout``:

* ``packed``: every micro-batch is one padding-free row of whole documents
  (:class:`~lightning_varbatch.PackingCollate`) whose real tokens fit ``data.max_tokens``,
  attended with :func:`~lightning_varbatch.attention.document_attention`; ranks are dealt
  micro-batches by their FLOPs (``data.flop_attention``, by default :func:`flop_model`'s, from
  the model's shape with :func:`~lightning_varbatch.planner.flops.transformer_flops`);
* ``padded``: ``(documents x longest)`` batches (:class:`~lightning_varbatch.PaddingCollate`)
  whose slots fit ``data.max_tokens``, attended with causal SDPA.

Example:
    >>> from omegaconf import OmegaConf
    >>> cfg = OmegaConf.create({"d_model": 64, "num_layers": 2, "dim_feedforward": 256})
    >>> round(1 / flop_model(cfg, 1000).flop_attention)
    1268
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from examples.common.batch_schedule import batch_schedule_settings
from examples.common.config_checks import ConfigError, passed_setting
from examples.common.length_warmup import length_warmup_settings
from examples.common.rank_shares import planned_ranks, rank_settings
from examples.common.summary import world_size
from examples.lm.data import build_documents, encode_documents, length_stats, split_documents
from examples.translation import tokenizer as tok
from lightning_varbatch import (
    PackingCollate,
    PaddingCollate,
    TokenBudgetDataModule,
    transformer_flops,
)
from lightning_varbatch.planner import FlopModel

__all__ = ["build_datamodule", "flop_model"]


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


def _documents(data: DictConfig) -> dict[str, list[str]]:
    """The embedded documents, split train/valid."""
    try:
        docs = build_documents(int(data.num_docs), int(data.seed), data.cache_dir)
        return split_documents(docs, int(data.valid), int(data.seed))
    except ValueError as error:
        raise ConfigError(str(error)) from error


def _tokenizer(data: DictConfig, documents: list[str]) -> Any:
    """A byte-level BPE trained on the training documents (cached when it may be)."""
    cache = None
    if data.cache_dir is not None and world_size() == 1:
        cache = Path(data.cache_dir) / f"lm-tokenizer-{data.vocab_size}.json"
    return tok.train_or_load_tokenizer(documents, vocab_size=int(data.vocab_size), cache_path=cache)


def _layout(cfg: DictConfig, vocab_size: int) -> tuple[dict[str, Any], Any]:
    """The planner's layout settings and the collate of ``cfg.layout``."""
    data, multiple = cfg.data, int(cfg.data.pad_to_multiple_of)
    if cfg.layout != "packed":
        return {"layout": cfg.layout}, PaddingCollate(
            pad_id=tok.PAD_ID, pad_to_multiple_of=multiple, loss_offset=1
        )
    flops = data.flop_attention
    if flops is None:
        flops = flop_model(cfg.model, vocab_size).flop_attention
    layout = {"layout": cfg.layout, "flop_attention": float(flops)}
    return layout, PackingCollate(pad_id=tok.PAD_ID, pad_to_multiple_of=multiple)


def _datamodule(
    cfg: DictConfig, splits: dict[str, Any], layout: dict[str, Any], collate: Any
) -> TokenBudgetDataModule:
    """The DataModule, both splits planned and checked (as rank 0 of 1, or of one rank per
    ``data.rank_*`` entry)."""
    data = cfg.data
    (train_items, train_lengths), (val_items, val_lengths) = splits["train"], splits["valid"]
    try:
        dm = TokenBudgetDataModule(
            train_items,
            train_lengths,
            int(data.max_tokens),
            val_dataset=val_items,
            val_lengths=val_lengths,
            val_max_tokens=data.val_max_tokens,
            # L - 1 next-token predictions per document, after any truncate cut
            loss_offset=1,
            **length_warmup_settings(data),
            **batch_schedule_settings(data),
            **rank_settings(data),  # a mixed cluster: plain tuples, one entry per rank
            collate=collate,
            num_workers=int(data.num_workers),
            on_resume_mismatch=cfg.get("on_resume_mismatch", "error"),
            bucket_width=int(data.bucket_width),
            tail=data.tail,
            oversize=data.oversize,
            pad_to_multiple_of=int(data.pad_to_multiple_of),
            seed=int(data.seed),
            **layout,
        )
        dm.check(planned_ranks(data), stages=("train", "val"))
    except ValueError as error:
        named = passed_setting(data, error)  # data.rank_shares, data.length_warmup_max, ...
        if named is not None:
            raise ConfigError(named) from error
        setting = f"data.max_tokens={data.max_tokens}"
        if data.val_max_tokens is not None:
            setting += f" / data.val_max_tokens={data.val_max_tokens}"
        raise ConfigError(
            f"{setting} cannot batch the documents with layout={cfg.layout}: {error} Raise "
            "the budget, lower data.max_length, or set data.oversize=skip|truncate."
        ) from error
    return dm


def build_datamodule(cfg: DictConfig) -> tuple[TokenBudgetDataModule, Any, dict[str, Any]]:
    """The tokenizer and the token-budgeted DataModule of ``cfg.layout`` over train/valid.

    The documents (:func:`~examples.lm.data.build_documents`) are split, a byte-level BPE is
    trained on the training documents, and each document becomes ``[BOS, ..., EOS]``. Both
    splits are planned with ``loss_offset=1`` (a document of ``L`` tokens has ``L - 1``
    next-token predictions; the planner counts them after any ``data.oversize=truncate``
    cut), so ``step_ntokens`` is the exact loss-token count of the optimizer step in either
    layout:

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

    Example:
        >>> dm, tokenizer, info = build_datamodule(cfg)  # doctest: +SKIP
        >>> info["layout"], dm.planner("train").config.layout  # doctest: +SKIP
        ('packed', 'packed')
    """
    data = cfg.data
    documents = _documents(data)
    tokenizer = _tokenizer(data, documents["train"])
    splits = {
        split: encode_documents(tokenizer, documents[split], data.max_length)
        for split in ("train", "valid")
    }
    layout, collate = _layout(cfg, tokenizer.get_vocab_size())
    dm = _datamodule(cfg, splits, layout, collate)
    info = {
        "layout": cfg.layout,
        "train_docs": len(splits["train"][0]),
        "valid_docs": len(splits["valid"][0]),
        "train_lengths": length_stats(splits["train"][1]),
        "flop_attention": layout.get("flop_attention"),
    }
    return dm, tokenizer, info
