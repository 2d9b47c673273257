"""Token counts of text columns: equal to a per-row encode, for every tokenizer kind, cached.

The reference is the plain loop users write (``len(tok.encode(text).ids)`` per row); the family
is a ``tokenizers.Tokenizer``, a ``transformers`` fast tokenizer wrapping it, a callable
returning token lists and one returning counts, each on one column and on a pair.
"""

from __future__ import annotations

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
