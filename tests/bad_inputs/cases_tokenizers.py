"""Tokenizers handed to ``tokenized_lengths``: every shape they return, null texts, caches.

A tokenizer's result must be one token sequence or one count per string (or a
``BatchEncoding`` whose ``attention_mask`` says which ids are tokens). Results that ``len()``
would miscount (strings, padded rectangles without a mask), floats, ``None``, the wrong number
of rows and nested shapes are refused naming the row and column; null texts name theirs; a
cache that cannot be written or is damaged gives a ``LengthCacheWarning`` naming the file and
the setting, and the counts are right either way.

Example:
    >>> len(CASES) >= 20
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.sources import column_lengths, tokenized_lengths
from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning
from tests.bad_inputs.case import Case, accepted, error

AREA = "HF datasets"
TOKENIZED = "lightning_varbatch/sources/tokenized_lengths.py"

TEXTS = ["a b c", "d e", "f", "g h i j", "k l"] * 3  # 15 rows; batches of 4
WORDS = [len(t.split()) for t in TEXTS]


def _ds(texts: list[Any] | None = None) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": TEXTS if texts is None else texts})


def _count(tokenizer: Any, ds: datasets.Dataset | None = None, **kwargs: Any) -> np.ndarray:
    settings = {"cache_dir": None, "progress": False, "batch_size": 4, **kwargs}
    return tokenized_lengths(_ds() if ds is None else ds, tokenizer, "text", **settings)


def _ids(texts: list[str]) -> list[list[int]]:
    return [[7] * len(t.split()) for t in texts]


def _word_level() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "[PAD]": 1, **{w: i + 2 for i, w in enumerate("abcdefghijkl")}}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    return tok


def _transformers() -> Any:
    from transformers import PreTrainedTokenizerFast  # built offline: no download

    return PreTrainedTokenizerFast(tokenizer_object=_word_level(), pad_token="[PAD]")


def _bad(result: Any) -> Any:
    """A tokenizer returning ``result(texts)``."""
    return lambda tmp: _count(result)


def _ok_padded_transformers(tmp: Path) -> None:
    hf = _transformers()
    for kwargs in ({"padding": True}, {"padding": True, "return_tensors": "np"}):
        got = _count(lambda t, kw=kwargs: hf(t, **kw))
        assert got.tolist() == WORDS, (kwargs, got.tolist())
    assert _count(hf).tolist() == WORDS


def _ok_padded_tokenizers(tmp: Path) -> None:
    tok = _word_level()
    tok.enable_padding(pad_id=1, pad_token="[PAD]")
    assert _count(tok).tolist() == WORDS
    assert _count(tok.encode_batch).tolist() == WORDS


def _ok_tensors(tmp: Path) -> None:
    import torch

    assert _count(lambda t: [torch.tensor(r) for r in _ids(t)]).tolist() == WORDS
    assert _count(lambda t: torch.tensor([len(r) for r in _ids(t)])).tolist() == WORDS
    assert _count(lambda t: np.array([len(r) for r in _ids(t)])).tolist() == WORDS


def _null_text(tmp: Path) -> None:
    _count(_ids, _ds([None if i == 9 else t for i, t in enumerate(TEXTS)]))


def _null_after_select(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"ids": [[1, 2], None, [3], [4]]}).select([3, 0, 2, 1])
    column_lengths(ds, "ids")


def _ok_filtered_nulls(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"ids": [[1, 2], None, [3], None]})
    kept = ds.filter(lambda r: r["ids"] is not None)
    assert column_lengths(kept, "ids").tolist() == [2, 1]


def _unwritable(tmp: Path) -> None:
    (tmp / "blocker").write_text("a file where the cache folder should be")
    got = _count(_ids, cache_dir=tmp / "blocker" / "cache")
    assert got.tolist() == WORDS


def _damaged(tmp: Path) -> None:
    ds = _ds()
    want = _count(_ids, ds, cache_dir=tmp / "cache")
    (cache,) = (tmp / "cache").glob("*.npy")
    cache.write_bytes(cache.read_bytes()[:60])  # cut short
    assert _count(_ids, ds, cache_dir=tmp / "cache").tolist() == want.tolist()


CASES: list[Case] = [
    error(
        "hf-tokenizer-returns-str",
        AREA,
        "a tokenizer returning the texts (strings) instead of token ids",
        _bad(lambda t: [x.upper() for x in t]),
        "row 0",
        "'text'",
        "string",
        "characters",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-one-str",
        AREA,
        "a tokenizer returning one string for the batch",
        _bad(lambda t: " ".join(t)),
        "one string",
        "'text'",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-float-counts",
        AREA,
        "a tokenizer returning float counts (3.0)",
        _bad(lambda t: [float(len(x.split())) for x in t]),
        "row 0",
        "float",
        "integers",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-numpy-floats",
        AREA,
        "a tokenizer returning a float32 array of counts",
        _bad(lambda t: np.array([len(x.split()) for x in t], dtype=np.float32)),
        "float32",
        "integers",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-float-ids",
        AREA,
        "a tokenizer returning lists of floats",
        _bad(lambda t: [[0.5] * len(x.split()) for x in t]),
        "row 0",
        "floats",
        "integers",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-none",
        AREA,
        "a tokenizer returning None (works in place)",
        _bad(lambda t: None),
        "None",
        "rows 0..3",
        "'text'",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-none-row",
        AREA,
        "a tokenizer returning None for one text ('d e', row 1)",
        _bad(lambda t: [None if x == "d e" else [1] for x in t]),
        "row 1",  # the first "d e" of the data
        "'text'",
        "None",
        raises=ValueError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-null-token",
        AREA,
        "a tokenizer returning token ids with a null inside",
        _bad(lambda t: [[5, None] if x == "f" else [5] for x in t]),
        "row 2",
        "null at position 1",
        raises=ValueError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-too-few",
        AREA,
        "a tokenizer dropping a row of its batch",
        _bad(lambda t: _ids(t)[:-1]),
        "3 results",
        "4 strings",
        "rows 0..3",
        raises=ValueError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-nested",
        AREA,
        "a tokenizer returning a list of token lists per text (overflowing tokens)",
        _bad(lambda t: [[r] for r in _ids(t)]),
        "row 0",
        "nested",
        "flat",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-padded-array",
        AREA,
        "tok(texts, padding=True, return_tensors='np')['input_ids']: a padded rectangle",
        _bad(lambda t: _transformers()(t, padding=True, return_tensors="np")["input_ids"]),
        "padded",
        "attention_mask",
        "rows 0..3",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-dict-without-ids",
        AREA,
        "a tokenizer returning a dict without input_ids",
        _bad(lambda t: {"tokens": _ids(t)}),
        "input_ids",
        "'tokens'",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-returns-bools",
        AREA,
        "a tokenizer returning True per text",
        _bad(lambda t: [True] * len(t)),
        "row 0",
        "bool",
        raises=TypeError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-not-callable",
        AREA,
        "tokenizer='bert-base-uncased' (a name, not a tokenizer)",
        lambda tmp: _count("bert-base-uncased"),
        "tokenizer",
        "str",
        raises=SettingTypeError,
        setting="tokenizer",
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-columns-unknown",
        AREA,
        "tokenized_lengths(ds, tok, 'txt') (a typo)",
        lambda tmp: tokenized_lengths(_ds(), _ids, "txt", cache_dir=None),
        "'txt'",
        "'text'",
        raises=SettingValueError,
        setting="columns",
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-cache-dir-type",
        AREA,
        "cache_dir=3",
        lambda tmp: _count(_ids, cache_dir=3),
        "cache_dir",
        "3",
        raises=SettingTypeError,
        setting="cache_dir",
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-null-text",
        AREA,
        "a text column with a null at row 9",
        _null_text,
        "row 9",
        "'text'",
        "null",
        "filter",
        raises=ValueError,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-cache-unwritable",
        AREA,
        "cache_dir where a file blocks the folder (read-only home, full disk)",
        _unwritable,
        "could not write",
        "blocker",
        "cache_dir=",
        "LIGHTNING_VARBATCH_CACHE",
        raises=LengthCacheWarning,
        warn_ok=True,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-tokenizer-cache-damaged",
        AREA,
        "a cached counts file cut short (a job killed while copying the cache)",
        _damaged,
        "damaged",
        ".npy",
        "rebuilding",
        raises=LengthCacheWarning,
        warn_ok=True,
        fix_in=TOKENIZED,
    ),
    error(
        "hf-token-rows-null-after-select",
        AREA,
        "a null token row, the dataset reordered by select (row 3 of the dataset, 1 of the table)",
        _null_after_select,
        "row 3",
        "'ids'",
        "is null",
        raises=SettingValueError,
        setting="lengths",
        fix_in="lightning_varbatch/sources/arrow_lengths.py",
        not_blame=("row 1",),
    ),
    accepted(
        "hf-token-rows-ok-filtered-nulls",
        AREA,
        "null token rows removed with ds.filter (still in the Arrow table)",
        _ok_filtered_nulls,
        fix_in="lightning_varbatch/sources/arrow_lengths.py",
    ),
    accepted(
        "hf-tokenizer-ok-transformers-padded",
        AREA,
        "a transformers tokenizer called with padding=True (lists and numpy): the mask counts",
        _ok_padded_transformers,
        fix_in=TOKENIZED,
    ),
    accepted(
        "hf-tokenizer-ok-tokenizers-padding-on",
        AREA,
        "a tokenizers.Tokenizer with padding enabled, and its encode_batch",
        _ok_padded_tokenizers,
        fix_in=TOKENIZED,
    ),
    accepted(
        "hf-tokenizer-ok-tensors",
        AREA,
        "torch tensors per row, a tensor of counts, a numpy array of counts",
        _ok_tensors,
        fix_in=TOKENIZED,
    ),
]
