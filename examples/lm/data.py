"""Documents for the language-model example: an embedded, long-tailed English corpus.

Nothing is downloaded. The documents are the English side of the translation example's
generated corpus (:func:`examples.translation.data.build_corpus`, domain ``"mixed"``): bare
numbers, dates and money amounts (a few tokens), templated sentences, and paragraphs of
``1 + Geometric`` sentences (the long tail). Tokenized with the translation example's
byte-level BPE (:mod:`examples.translation.tokenizer`, trained on the training documents
only), each document becomes ``[BOS, ..., EOS]``; with the defaults its 99th-percentile
length is about 6x the median (:func:`length_stats`), the regime where packing whole
documents into one row instead of padding each to the longest pays off.

Example:
    >>> docs = build_documents(50, seed=0)
    >>> len(docs), all(isinstance(d, str) and d for d in docs)
    (50, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from examples.translation import data as corpus
from examples.translation import tokenizer as tok

__all__ = ["build_documents", "encode_documents", "length_stats", "split_documents"]


def build_documents(num_docs: int, seed: int = 0, cache_dir: str | Path | None = None) -> list[str]:
    """``num_docs`` distinct English documents, the same for the same ``(num_docs, seed)``.

    Args:
        num_docs: how many documents (at least 1).
        seed: the generator's seed.
        cache_dir: optional folder for the generated corpus (JSON, reloaded next time).

    Raises:
        ValueError: for ``num_docs < 1``.
    """
    if isinstance(num_docs, bool) or not isinstance(num_docs, int) or num_docs < 1:
        raise ValueError(f"data.num_docs must be an integer >= 1, got {num_docs!r}.")
    # English sides of distinct pairs can repeat (one English text, two German renderings):
    # keep the first of each, then top up from a larger draw so the count is exact.
    want, docs = num_docs, []
    while True:
        pairs = corpus.build_corpus(want, seed=seed, cache_dir=cache_dir, domain="mixed")
        docs = list(dict.fromkeys(en for en, _ in pairs))
        if len(docs) >= num_docs:
            return docs[:num_docs]
        want = int(want * 1.2) + 10


def split_documents(docs: Sequence[str], valid: int, seed: int = 0) -> dict[str, list[str]]:
    """A deterministic shuffled split into ``train`` and ``valid`` documents.

    Raises:
        ValueError: when ``valid`` is below 1 or leaves no training document.
    """
    if valid < 1 or valid >= len(docs):
        raise ValueError(
            f"data.valid={valid} must be >= 1 and leave training documents of the "
            f"{len(docs)} (data.num_docs): lower data.valid or raise data.num_docs."
        )
    rows = corpus.split_indices(len(docs), valid=valid, test=0, seed=seed)
    return {split: [docs[i] for i in rows[split]] for split in ("train", "valid")}


def encode_documents(
    tokenizer: Any, docs: Sequence[str], max_length: int | None = None
) -> tuple[list[dict[str, Any]], np.ndarray]:
    """Items ``{"tokens": [BOS, ..., EOS], "id": i}`` and their ``(n,)`` token counts.

    Args:
        tokenizer: a :class:`tokenizers.Tokenizer` with the specials of
            :mod:`examples.translation.tokenizer`.
        docs: the documents.
        max_length: cut each document to this many tokens (BOS and EOS included, EOS kept).

    Raises:
        ValueError: for ``max_length < 3`` (BOS, one token, EOS).
    """
    if max_length is not None and max_length < 3:
        raise ValueError(f"data.max_length must be >= 3 (BOS, a token, EOS), got {max_length}.")
    encoded = tokenizer.encode_batch(list(docs), add_special_tokens=False)
    keep = None if max_length is None else max_length - 2
    tokens = [[tok.BOS_ID, *e.ids[:keep], tok.EOS_ID] for e in encoded]
    lengths = np.array([len(t) for t in tokens], dtype=np.int64)
    return [{"tokens": t, "id": i} for i, t in enumerate(tokens)], lengths


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """Median, 99th percentile, maximum, mean and total of document lengths (tokens).

    Example:
        >>> length_stats(np.array([2, 4, 6]))["median"]
        4.0
    """
    lengths = np.asarray(lengths)
    return {
        "docs": float(lengths.size),
        "median": float(np.median(lengths)),
        "p99": float(np.percentile(lengths, 99)),
        "max": float(lengths.max()),
        "mean": float(lengths.mean()),
        "tokens": float(lengths.sum()),
    }
