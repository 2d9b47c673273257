"""Token counts of text columns: equal to a per-row encode, for every tokenizer kind, cached.

The reference is the plain loop users write (``len(tok.encode(text).ids)`` per row); the family
is a ``tokenizers.Tokenizer``, a ``transformers`` fast tokenizer wrapping it, a callable
returning token lists and one returning counts, each on one column and on a pair.
"""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pytest
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from lightning_varbatch.sources import tokenized_lengths

WORDS = "the a one two three zwei drei vier fünf sechs house haus cat katze dog hund".split()
RNG = np.random.default_rng(0)
EN = [" ".join(RNG.choice(WORDS, RNG.integers(1, 30))) for _ in range(300)]
DE = [" ".join(RNG.choice(WORDS, RNG.integers(1, 30))) for _ in range(300)]


@pytest.fixture(scope="module")
def bpe() -> Tokenizer:
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>", "</s>"])
    tok.train_from_iterator(EN + DE, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 1), ("</s>", 2)]
    )
    return tok


@pytest.fixture(scope="module")
def ds() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"en": EN, "de": DE, "id": list(range(len(EN)))})


def per_row(tok: Tokenizer, texts: list[str]) -> list[int]:
    return [len(tok.encode(t).ids) for t in texts]


def kinds(bpe: Tokenizer) -> dict[str, Any]:
    from transformers import PreTrainedTokenizerFast

    def as_lists(texts: list[str]) -> list[list[int]]:
        return [bpe.encode(t).ids for t in texts]

    def as_counts(texts: list[str]) -> list[int]:
        return [len(bpe.encode(t).ids) for t in texts]

    return {
        "tokenizers": bpe,
        "transformers": PreTrainedTokenizerFast(tokenizer_object=bpe),
        "callable_lists": as_lists,
        "callable_counts": as_counts,
    }


@pytest.mark.parametrize(
    "kind", ["tokenizers", "transformers", "callable_lists", "callable_counts"]
)
def test_every_tokenizer_kind_counts_like_a_per_row_loop(
    kind: str, bpe: Tokenizer, ds: datasets.Dataset
) -> None:
    tok = kinds(bpe)[kind]
    one = tokenized_lengths(ds, tok, "en", cache_dir=None, progress=False, batch_size=64)
    assert one.tolist() == per_row(bpe, EN)
    pair = tokenized_lengths(ds, tok, ("en", "de"), cache_dir=None, progress=False)
    assert pair.tolist() == np.array([per_row(bpe, EN), per_row(bpe, DE)]).T.tolist()


def test_parallel_processes_give_the_same_counts(bpe: Tokenizer, ds: datasets.Dataset) -> None:
    got = tokenized_lengths(ds, bpe, "de", num_proc=2, cache_dir=None, progress=False)
    assert got.tolist() == per_row(bpe, DE)


def test_remapped_dataset_counts_its_own_rows(bpe: Tokenizer, ds: datasets.Dataset) -> None:
    shuffled = ds.shuffle(seed=4).select(range(100))
    got = tokenized_lengths(shuffled, bpe, "en", cache_dir=None, progress=False)
    assert got.tolist() == per_row(bpe, shuffled["en"])


CALLS: list[int] = []


class CountingTokenizer:
    """Splits on spaces and records how many strings it tokenized (outside the object)."""

    def __init__(self, extra: int = 0) -> None:
        self.extra = extra

    def __call__(self, texts: list[str]) -> list[int]:
        CALLS.append(len(texts))
        return [len(t.split()) + self.extra for t in texts]


def test_the_cache_is_reused_and_keyed_by_data_and_tokenizer(
    tmp_path: Path, ds: datasets.Dataset
) -> None:
    CALLS.clear()
    first = tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=tmp_path, progress=False)
    assert sum(CALLS) == len(ds) and len(list(tmp_path.glob("*.npy"))) == 1
    again = tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=tmp_path, progress=False)
    assert sum(CALLS) == len(ds), "the second call must read the cache, not tokenize"
    assert again.tolist() == first.tolist() == [len(t.split()) for t in EN]
    other = tokenized_lengths(ds, CountingTokenizer(2), "en", cache_dir=tmp_path, progress=False)
    assert other.tolist() == [len(t.split()) + 2 for t in EN], "another tokenizer recounts"
    changed = ds.map(lambda r: {"en": r["en"] + " extra"})
    counts = tokenized_lengths(
        changed, CountingTokenizer(), "en", cache_dir=tmp_path, progress=False
    )
    assert counts.tolist() == [len(t.split()) + 1 for t in EN], "changed data recounts"
    assert len(list(tmp_path.glob("*.npy"))) == 3


def test_a_dataset_loaded_from_disk_reuses_the_cache_across_loads(
    tmp_path: Path, ds: datasets.Dataset
) -> None:
    ds.save_to_disk(str(tmp_path / "data"))
    CALLS.clear()
    for _ in range(2):  # two "runs": each loads the dataset afresh
        loaded = datasets.load_from_disk(str(tmp_path / "data"))
        tokenized_lengths(
            loaded, CountingTokenizer(), "de", cache_dir=tmp_path / "cache", progress=False
        )
    assert sum(CALLS) == len(ds)


def test_progress_is_reported(capfd: pytest.CaptureFixture[str], ds: datasets.Dataset) -> None:
    tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=None, progress=True)
    assert "Counting tokens" in capfd.readouterr().err


def test_the_default_cache_folder_follows_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ds: datasets.Dataset
) -> None:
    monkeypatch.setenv("LIGHTNING_VARBATCH_CACHE", str(tmp_path))
    tokenized_lengths(ds, CountingTokenizer(), "en", progress=False)
    assert len(list((tmp_path / "lengths").glob("*.npy"))) == 1


# ------------------------------------------------------------------ every shape (issue 22)


def shapes(bpe: Tokenizer) -> dict[str, Any]:
    """Every shape a tokenizer's batch result comes in, each counting like the per-row loop."""
    import torch
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=bpe, pad_token="<unk>")
    padded = Tokenizer.from_str(bpe.to_str())
    padded.enable_padding(pad_id=0, pad_token="<unk>")  # pads ids to the batch width
    ids = lambda texts: [bpe.encode(t).ids for t in texts]  # noqa: E731
    return {
        "tokenizers-padding-on": padded,
        "encode_batch-bound-method": padded.encode_batch,
        "transformers-padding-true": lambda t: hf(t, padding=True),
        "transformers-padding-max-length": lambda t: hf(t, padding="max_length", max_length=64),
        "transformers-pt-tensors": lambda t: hf(t, padding=True, return_tensors="pt"),
        "transformers-np-arrays": lambda t: hf(t, padding=True, return_tensors="np"),
        "transformers-input-ids": lambda t: hf(t)["input_ids"],
        "dict-of-lists": lambda t: {"input_ids": ids(t)},
        "numpy-rows": lambda t: [np.asarray(r, dtype=np.int32) for r in ids(t)],
        "tensor-rows": lambda t: [torch.tensor(r) for r in ids(t)],
        "numpy-counts": lambda t: np.array([len(r) for r in ids(t)], dtype=np.int64),
        "tensor-counts": lambda t: torch.tensor([len(r) for r in ids(t)]),
        "numpy-int-counts-list": lambda t: [np.int64(len(r)) for r in ids(t)],
        "token-strings": lambda t: [bpe.encode(x).tokens for x in t],
        "generator": lambda t: (len(r) for r in ids(t)),
        "tuples": lambda t: [tuple(r) for r in ids(t)],
        "row-dicts": lambda t: [{"input_ids": r, "attention_mask": [1] * len(r)} for r in ids(t)],
    }


SHAPES = [
    "tokenizers-padding-on",
    "encode_batch-bound-method",
    "transformers-padding-true",
    "transformers-padding-max-length",
    "transformers-pt-tensors",
    "transformers-np-arrays",
    "transformers-input-ids",
    "dict-of-lists",
    "numpy-rows",
    "tensor-rows",
    "numpy-counts",
    "tensor-counts",
    "numpy-int-counts-list",
    "token-strings",
    "generator",
    "tuples",
    "row-dicts",
]


@pytest.mark.parametrize("shape", SHAPES)
def test_every_result_shape_counts_tokens_not_padding(
    shape: str, bpe: Tokenizer, ds: datasets.Dataset
) -> None:
    """Padded batches count the attention mask, not the batch width (the reference: per row)."""
    tok = shapes(bpe)[shape]
    got = tokenized_lengths(ds, tok, "en", cache_dir=None, progress=False, batch_size=50)
    assert got.tolist() == per_row(bpe, EN)


def _rows_of(texts: list[str]) -> list[list[int]]:
    return [[1] * len(t.split()) for t in texts]


BAD_ROW = 57  # in the second batch of 50 (rows 50..99): its 8th row
BAD: dict[str, tuple[Any, type, str]] = {
    # shape -> (tokenizer, exact error type, what the message must say)
    "returns-str-per-row": (lambda t: list(t), TypeError, r"row 0 of column 'en'.*a string"),
    "returns-one-str": (lambda t: " ".join(t), TypeError, r"one string for a batch of"),
    "returns-float-counts": (
        lambda t: [float(len(x.split())) for x in t],
        TypeError,
        r"row 0 of column 'en'.*a float",
    ),
    "returns-numpy-floats": (
        lambda t: np.array([len(x.split()) for x in t], dtype=np.float32),
        TypeError,
        r"dtype float32",
    ),
    "returns-float-ids": (
        lambda t: [[0.5] * len(x.split()) for x in t],
        TypeError,
        r"sequence of floats",
    ),
    "returns-none": (lambda t: None, TypeError, r"returned None for a batch of 50"),
    "returns-none-row": (
        lambda t: [None if x == EN[BAD_ROW] else [1] for x in t],
        ValueError,
        rf"row {EN.index(EN[BAD_ROW])} of column 'en'.*None",  # the dataset's row, not "item 7"
    ),
    "returns-null-token": (
        lambda t: [[1, None] if x == EN[BAD_ROW] else [1] for x in t],
        ValueError,
        rf"row {EN.index(EN[BAD_ROW])} of column 'en'.*null at position 1",
    ),
    "returns-too-few": (lambda t: _rows_of(t)[:-1], ValueError, r"49 results for a batch of 50"),
    "returns-too-many": (lambda t: _rows_of(t) * 2, ValueError, r"100 results for a batch of 50"),
    "returns-nested": (
        lambda t: [[r] for r in _rows_of(t)],
        TypeError,
        r"nested sequence",
    ),
    "returns-2d-ids-without-mask": (
        lambda t: np.ones((len(t), 64), dtype=np.int64),
        TypeError,
        r"\(50, 64\) array .*padded.*attention_mask",
    ),
    "returns-dict-without-ids": (
        lambda t: {"tokens": _rows_of(t)},
        TypeError,
        r"keys \['tokens'\]",
    ),
    "returns-bools": (lambda t: [True] * len(t), TypeError, r"a bool"),
    "returns-object": (lambda t: object(), TypeError, r"returned object"),
}


@pytest.mark.parametrize("shape", sorted(BAD))
def test_every_wrong_result_is_refused_naming_row_column_and_fix(
    shape: str, ds: datasets.Dataset
) -> None:
    tok, error, named = BAD[shape]
    with pytest.raises(error) as caught:
        tokenized_lengths(ds, tok, "en", cache_dir=None, progress=False, batch_size=50)
    assert type(caught.value) is error
    text = str(caught.value)
    assert re.search(named, text), text
    assert "tokenizer" in text and re.search(r"\b(must|[Rr]eturn)\b", text)


@pytest.mark.parametrize("column", ["en", "de"])
def test_a_null_text_names_its_row_and_column(column: str) -> None:
    texts = {"en": EN[:120], "de": DE[:120]}
    texts[column] = [None if i == 103 else t for i, t in enumerate(texts[column])]
    null = datasets.Dataset.from_dict(texts)
    with pytest.raises(ValueError, match=rf"row 103 of column '{column}' is null.*filter") as e:
        tokenized_lengths(null, CountingTokenizer(), ("en", "de"), cache_dir=None, progress=False)
    assert type(e.value) is ValueError


def test_a_null_text_after_a_shuffle_names_the_datasets_own_row() -> None:
    texts = [None if i == 5 else t for i, t in enumerate(EN[:40])]
    shuffled = datasets.Dataset.from_dict({"en": texts}).shuffle(seed=2)
    row = shuffled["en"].index(None)
    with pytest.raises(ValueError, match=rf"row {row} of column 'en' is null"):
        tokenized_lengths(shuffled, CountingTokenizer(), "en", cache_dir=None, progress=False)


def test_bad_settings_are_setting_errors(ds: datasets.Dataset) -> None:
    from lightning_varbatch.errors import SettingTypeError, SettingValueError

    with pytest.raises(SettingTypeError) as caught:
        tokenized_lengths(ds, 42, "en", cache_dir=None)
    assert caught.value.setting == "tokenizer"
    with pytest.raises(SettingValueError) as missing:
        tokenized_lengths(ds, CountingTokenizer(), "text", cache_dir=None)
    assert missing.value.setting == "columns" and "'en'" in str(missing.value)
    with pytest.raises(SettingTypeError) as folder:
        tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=3)
    assert folder.value.setting == "cache_dir"


# ------------------------------------------------------------------ the cache when it breaks


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-rows", "floats", "empty"])
def test_a_damaged_cache_file_is_rebuilt_with_a_warning_naming_it(
    damage: str, tmp_path: Path, ds: datasets.Dataset
) -> None:
    from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning

    want = tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=tmp_path, progress=False)
    (cache,) = tmp_path.glob("*.npy")
    if damage == "truncated":
        cache.write_bytes(cache.read_bytes()[:100])
    elif damage == "garbage":
        cache.write_bytes(b"\x00garbage" * 50)
    elif damage == "other-rows":
        np.save(cache, want[:10])
    elif damage == "floats":
        np.save(cache, want.astype(np.float64))
    else:
        cache.write_bytes(b"")
    CALLS.clear()
    with pytest.warns(LengthCacheWarning, match=re.escape(str(cache)) + r".* damaged"):
        got = tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=tmp_path, progress=False)
    assert got.tolist() == want.tolist() and sum(CALLS) == len(ds)  # recounted
    CALLS.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # repaired: the next call reads it without a warning
        again = tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=tmp_path)
    assert again.tolist() == want.tolist() and sum(CALLS) == 0


@pytest.mark.parametrize("where", ["a-file-in-the-way", "read-only-folder"])
def test_an_unwritable_cache_warns_naming_path_and_setting_and_still_counts(
    where: str, tmp_path: Path, ds: datasets.Dataset
) -> None:
    import os

    from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning

    if where == "a-file-in-the-way":
        (tmp_path / "blocker").write_text("x")
        folder = tmp_path / "blocker" / "cache"
    else:
        folder = tmp_path / "ro"
        folder.mkdir()
        folder.chmod(0o500)
        if os.access(folder, os.W_OK):  # root ignores permissions: use a file in the way
            folder.chmod(0o700)
            (folder / "sub").write_text("x")
            folder = folder / "sub"
    with pytest.warns(LengthCacheWarning, match=r"could not write .*cache_dir=") as caught:
        got = tokenized_lengths(ds, CountingTokenizer(), "en", cache_dir=folder, progress=False)
    assert got.tolist() == [len(t.split()) for t in EN]
    assert str(folder) in str(caught[0].message)
    assert "LIGHTNING_VARBATCH_CACHE" in str(caught[0].message)
