"""Shared English/German byte-level BPE tokenizer (Hugging Face ``tokenizers``).

Special tokens have fixed ids: ``<pad>`` = 0, ``<s>`` = 1, ``</s>`` = 2, ``<unk>`` = 3.

Caching: :func:`train_or_load_tokenizer` saves the trained tokenizer to ``cache_path``
and writes a sidecar ``<cache_path>.meta.json`` holding a fingerprint (sha256 over
``vocab_size`` and every training text). On the next call the cached tokenizer is
loaded when the fingerprint matches, and retrained (overwriting it) when it does
not. A ``cache_path`` without a sidecar (e.g. a tokenizer you provide yourself) is
loaded as is.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

__all__ = [
    "BOS",
    "BOS_ID",
    "EOS",
    "EOS_ID",
    "MIN_VOCAB_SIZE",
    "PAD",
    "PAD_ID",
    "SPECIAL_TOKENS",
    "UNK",
    "UNK_ID",
    "decode",
    "encode_dataset",
    "encode_pairs",
    "encode_texts",
    "train_or_load_tokenizer",
]

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
PAD_ID, BOS_ID, EOS_ID, UNK_ID = 0, 1, 2, 3
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, EOS, UNK)
_SPECIAL_IDS = frozenset((PAD_ID, BOS_ID, EOS_ID, UNK_ID))
#: The smallest vocabulary the byte-level BPE can have: the 4 specials and the 256 bytes.
MIN_VOCAB_SIZE = len(SPECIAL_TOKENS) + 256


def _fingerprint(texts: Sequence[str], vocab_size: int) -> str:
    h = hashlib.sha256(f"bytelevel-bpe-v1|{vocab_size}|".encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def _meta_path(cache_path: Path) -> Path:
    return cache_path.with_name(cache_path.name + ".meta.json")


def _check_specials(tok: Tokenizer) -> None:
    for token, expected in zip(SPECIAL_TOKENS, (PAD_ID, BOS_ID, EOS_ID, UNK_ID), strict=True):
        got = tok.token_to_id(token)
        if got != expected:
            raise ValueError(f"tokenizer maps {token!r} to id {got}, expected {expected}")


def _train(texts: Sequence[str], vocab_size: int) -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer, length=len(texts))
    return tok


def train_or_load_tokenizer(
    texts: Iterable[str], vocab_size: int = 4000, cache_path: str | Path | None = None
) -> Tokenizer:
    """Train a byte-level BPE tokenizer shared by both languages, or load it from cache.

    Args:
        texts: Training texts (pass sources and targets together for a shared vocab).
        vocab_size: Target vocabulary size, specials included (at least 260 so the
            256 byte symbols fit).
        cache_path: Optional ``tokenizer.json`` path; see the module docstring for
            how the cache is keyed.

    Returns:
        A :class:`tokenizers.Tokenizer` with ``<pad>``/``<s>``/``</s>``/``<unk>`` at 0..3.
    """
    if vocab_size < len(SPECIAL_TOKENS) + 256:
        raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + 256}, got {vocab_size}")
    text_list = list(texts)
    path = Path(cache_path) if cache_path is not None else None
    fp = _fingerprint(text_list, vocab_size)
    if path is not None and path.exists():
        meta = _meta_path(path)
        stored = json.loads(meta.read_text())["fingerprint"] if meta.exists() else None
        if stored is None or stored == fp:
            tok = Tokenizer.from_file(str(path))
            _check_specials(tok)
            return tok
    if not text_list:
        raise ValueError("cannot train a tokenizer on an empty text collection")
    tok = _train(text_list, vocab_size)
    _check_specials(tok)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tok.save(str(path))
        _meta_path(path).write_text(
            json.dumps({"fingerprint": fp, "vocab_size": vocab_size, "num_texts": len(text_list)})
        )
    return tok


def encode_texts(
    tokenizer: Tokenizer,
    sources: Sequence[str],
    targets: Sequence[str],
    max_length: int | None = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids of aligned sources (``[..., EOS]``) and targets (``[BOS, ..., EOS]``).

    With ``max_length`` both sides are truncated so that each list (specials included) has at
    most ``max_length`` ids; the final ``EOS`` is kept.
    """
    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be >= 2 (room for BOS/EOS), got {max_length}")
    src_enc = tokenizer.encode_batch(list(sources), add_special_tokens=False)
    tgt_enc = tokenizer.encode_batch(list(targets), add_special_tokens=False)
    out_src: list[list[int]] = []
    out_tgt: list[list[int]] = []
    for se, te in zip(src_enc, tgt_enc, strict=True):
        s_ids, t_ids = se.ids, te.ids
        if max_length is not None:
            s_ids, t_ids = s_ids[: max_length - 1], t_ids[: max_length - 2]
        out_src.append([*s_ids, EOS_ID])
        out_tgt.append([BOS_ID, *t_ids, EOS_ID])
    return out_src, out_tgt


def encode_pairs(
    tokenizer: Tokenizer,
    pairs: Sequence[tuple[str, str]],
    max_length: int | None = None,
) -> tuple[list[dict[str, list[int]]], np.ndarray]:
    """Encode ``(source, target)`` pairs.

    Items are ``{"source": [..., EOS], "target": [BOS, ..., EOS]}``. With
    ``max_length`` both sides are truncated so that each list (specials included)
    has at most ``max_length`` ids; the final ``EOS`` is kept.

    Returns:
        The items and an ``(n, 2)`` int64 array of ``(len(source), len(target))``.
    """
    sources, targets = encode_texts(
        tokenizer, [s for s, _ in pairs], [t for _, t in pairs], max_length
    )
    items = [{"source": s, "target": t} for s, t in zip(sources, targets, strict=True)]
    lengths = np.array([[len(s), len(t)] for s, t in zip(sources, targets, strict=True)])
    return items, lengths.reshape(len(items), 2).astype(np.int64)


def encode_dataset(
    tokenizer: Tokenizer,
    dataset: Any,
    source_column: str,
    target_column: str,
    max_length: int | None = None,
    cache_dir: str | Path | None = None,
) -> Any:
    """A ``datasets.Dataset`` of token ids: ``source`` and ``target`` list columns (int32).

    The same ids as :func:`encode_pairs`, computed with ``Dataset.map(batched=True)``; the text
    columns (and every other column) are dropped. The result stays an Arrow-backed dataset, so
    its lengths can be read from the columns (``column_lengths(ds, ("source", "target"))``) and
    its micro-batches read as Arrow. It is kept in memory, or with ``cache_dir`` written there
    (named after the dataset's fingerprint, the tokenizer and ``max_length``: the next run with
    the same data and tokenizer reloads it instead of tokenizing again); nothing is written next
    to the dataset itself.
    """
    import datasets  # type: ignore[import-not-found]

    if max_length is not None and max_length < 2:
        raise ValueError(f"max_length must be >= 2 (room for BOS/EOS), got {max_length}")
    key = hashlib.sha256(
        f"{dataset._fingerprint}|{source_column}|{target_column}|{max_length}|".encode()
        + tokenizer.to_str().encode()
    ).hexdigest()[:20]
    ids = getattr(datasets, "List", datasets.Sequence)(datasets.Value("int32"))
    features = datasets.Features({"source": ids, "target": ids})
    if len(dataset) == 0:  # map() would keep the input's (removed) columns: none at all
        return datasets.Dataset.from_dict({"source": [], "target": []}, features=features)

    def encode(batch: dict[str, list[Any]]) -> dict[str, list[list[int]]]:
        sources, targets = encode_texts(
            tokenizer, batch[source_column], batch[target_column], max_length
        )
        return {"source": sources, "target": targets}

    cache_file = None
    if cache_dir is not None:
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache_file = str(Path(cache_dir) / f"tokens-{key}.arrow")
    return dataset.map(
        encode,
        batched=True,
        batch_size=1000,
        remove_columns=dataset.column_names,
        features=features,
        keep_in_memory=cache_file is None,
        cache_file_name=cache_file,
        new_fingerprint=key,
        desc="Tokenizing",
    )


def decode(tokenizer: Tokenizer, ids: Sequence[int]) -> str:
    """Decode ids to text, dropping special tokens (and stopping at the first EOS)."""
    out: list[int] = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in _SPECIAL_IDS:
            out.append(i)
    return str(tokenizer.decode(out, skip_special_tokens=True))
