"""Each corpus split into train/valid/test, and each split tokenized with its lengths.

A corpus is a list of (source, target) pairs, or a Hugging Face dataset that stays one
throughout (:meth:`~examples.translation.corpora.Corpus.load`): its splits are row selections,
tokenized into ``source``/``target`` token-id columns whose lengths are read with Arrow.

Example:
    >>> c = Corpus(name=None, setting="data", kind="tsv", source={}, valid=5, test=5)
    >>> pairs = [(f"s{i}", f"t{i}") for i in range(50)]
    >>> {k: len(v) for k, v in split_pairs(c, pairs, seed=0).items()}
    {'train': 40, 'valid': 5, 'test': 5}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.common.summary import world_size
from examples.translation import data as corpus
from examples.translation import tokenizer as tok
from examples.translation.corpora import Corpus
from lightning_varbatch import column_lengths

__all__ = ["TOKEN_COLUMNS", "encode_split", "split_pairs", "split_texts"]

#: The token-id columns of a Hugging Face corpus after tokenizing: what the collate pads and
#: the DataModule reads the planning lengths from.
TOKEN_COLUMNS = ("source", "target")


def _check_sizes(c: Corpus, size: int, valid: int, test: int, own: dict[str, Any]) -> None:
    """Refuse split sizes that leave no training pairs."""
    if valid + test >= size or (valid < 1 and "valid" not in own) or test < 0:
        larger = "give a larger corpus"
        if c.kind == "synthetic":
            larger = f"raise {c.setting}.num_pairs (or {larger})"
        raise ConfigError(
            f"{c.setting}.valid={c.valid} and {c.setting}.test={c.test} must leave training "
            f"pairs ({c.setting}.valid >= 1, {c.setting}.test >= 0) of the {size} pairs "
            f"of the corpus: lower them, or {larger}."
        )


def split_pairs(
    c: Corpus, pairs: list[tuple[str, str]] | dict[str, Any], seed: int
) -> dict[str, Any]:
    """``c``'s pairs split into train/valid/test by its own ``valid`` and ``test`` sizes.

    A Hugging Face corpus (``pairs`` is ``{"train": ds, ...}``, see :meth:`Corpus.load`) is
    split the same way, by rows (``ds.select``: the same pairs as the list of them would give),
    except for a ``valid``/``test`` split of its own (``data.hf_valid_split`` /
    ``data.hf_test_split``), which is used whole and nothing is held out for it.

    Raises:
        ConfigError: when ``valid`` and ``test`` leave no training pairs.
    """
    own: dict[str, Any] = {}
    whole: Any = pairs  # a list of pairs, or the training split's datasets.Dataset
    if isinstance(pairs, dict):
        own = {k: v for k, v in pairs.items() if k != "train"}
        whole = pairs["train"]
    valid = 0 if "valid" in own else c.valid
    test = 0 if "test" in own else c.test
    _check_sizes(c, len(whole), valid, test, own)
    if isinstance(whole, list):
        return corpus.split_corpus(whole, valid=valid, test=test, seed=seed)
    rows = corpus.split_indices(len(whole), valid=valid, test=test, seed=seed)
    return {split: own[split] if split in own else whole.select(rows[split]) for split in rows}


def split_texts(split: Any, c: Corpus) -> tuple[list[str], list[str]]:
    """The sources and the targets of one split (pairs or a Hugging Face dataset).

    Example:
        >>> split_texts([("a", "b"), ("c", "d")], None)
        (['a', 'c'], ['b', 'd'])
    """
    if isinstance(split, list):
        return [s for s, _ in split], [t for _, t in split]
    # a select()ed split's rows through its indices, as Python strings for the BPE trainer
    return list(split[c.source["source_column"]]), list(split[c.source["target_column"]])


def encode_split(split: Any, c: Corpus, tokenizer: Any, data: DictConfig) -> tuple[Any, Any]:
    """One split's items and ``(n, 2)`` (source, target) lengths.

    Pairs become a list of ``{"source", "target"}`` items; a Hugging Face split stays a
    ``datasets.Dataset`` with ``source``/``target`` token-id columns
    (:func:`~examples.translation.tokenizer.encode_dataset`), its lengths read from them with
    Arrow (:func:`~lightning_varbatch.sources.column_lengths`), not a loop over rows.
    """
    if isinstance(split, list):
        return tok.encode_pairs(tokenizer, split, max_length=data.max_length)
    cache = None if data.cache_dir is None or world_size() > 1 else Path(data.cache_dir) / "hf"
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
