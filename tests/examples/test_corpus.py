from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from examples.translation.data import (
    DatasetSettingError,
    build_corpus,
    corpus_stats,
    load_hf_dataset,
    load_parallel_text,
    load_tsv,
    split_corpus,
)
from examples.translation.tokenizer import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    decode,
    encode_pairs,
    train_or_load_tokenizer,
)


@pytest.fixture(scope="module")
def corpus() -> list[tuple[str, str]]:
    return build_corpus()


@pytest.fixture(scope="module")
def small() -> list[tuple[str, str]]:
    return build_corpus(5000, seed=3)


@pytest.mark.slow
def test_default_size_unique_and_fast(corpus: list[tuple[str, str]]) -> None:
    assert len(corpus) >= 100_000
    assert len(set(corpus)) == len(corpus)
    assert all(s and t for s, t in corpus)
    start = time.perf_counter()
    build_corpus(20_000, seed=11)
    assert time.perf_counter() - start < 10


def test_long_tail(corpus: list[tuple[str, str]]) -> None:
    stats = corpus_stats(corpus)
    assert stats["src_tokens_p99"] >= 4 * stats["src_tokens_median"]
    assert stats["src_chars_p99"] >= 4 * stats["src_chars_median"]


def test_deterministic(corpus: list[tuple[str, str]]) -> None:
    assert build_corpus(3000, seed=0) == corpus[:3000]
    assert build_corpus(3000, seed=0) == build_corpus(3000, seed=0)
    assert build_corpus(3000, seed=1) != build_corpus(3000, seed=0)


def test_cache_dir(tmp_path: Path) -> None:
    first = build_corpus(500, seed=5, cache_dir=tmp_path)
    assert list(tmp_path.glob("*.json"))
    assert build_corpus(500, seed=5, cache_dir=tmp_path) == first


def test_languages_look_right(corpus: list[tuple[str, str]]) -> None:
    sample = corpus[:5000]
    src = " ".join(s for s, _ in sample)
    tgt = " ".join(t for _, t in sample)
    assert any(ch in tgt for ch in "äöüß")
    for word in ("zwanzig", "hundert", "Euro", "Januar", "Uhr"):
        assert word in tgt
    for word in ("twenty", "hundred", "euros", "January"):
        assert word in src
    assert not any(ch in src for ch in "äöüß")
    assert any(s.startswith("On the ") and t.startswith("Am ") for s, t in sample)


def test_split_disjoint(corpus: list[tuple[str, str]]) -> None:
    splits = split_corpus(corpus, valid=2000, test=2000, seed=0)
    assert set(splits) == {"train", "valid", "test"}
    assert len(splits["valid"]) == 2000 and len(splits["test"]) == 2000
    assert sum(len(v) for v in splits.values()) == len(corpus)
    tr, va, te = (set(splits[k]) for k in ("train", "valid", "test"))
    assert not (tr & va) and not (tr & te) and not (va & te)
    assert split_corpus(corpus[:100], 10, 10, seed=2) == split_corpus(corpus[:100], 10, 10, seed=2)
    with pytest.raises(ValueError, match="exceeds"):
        split_corpus(corpus[:10], valid=6, test=6)


def test_parallel_text_roundtrip(tmp_path: Path, small: list[tuple[str, str]]) -> None:
    src, tgt = tmp_path / "train.src", tmp_path / "train.tgt"
    src.write_text("".join(s + "\n" for s, _ in small[:200]), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in small[:200]), encoding="utf-8")
    assert load_parallel_text(src, tgt) == small[:200]
    tgt.write_text("".join(t + "\n" for _, t in small[:199]), encoding="utf-8")
    with pytest.raises(ValueError) as info:
        load_parallel_text(src, tgt)
    msg = str(info.value)
    assert str(src) in msg and str(tgt) in msg and "200" in msg and "199" in msg


def test_tsv_roundtrip(tmp_path: Path, small: list[tuple[str, str]]) -> None:
    path = tmp_path / "data.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in small[:100]), encoding="utf-8")
    assert load_tsv(path) == small[:100]
    path.write_text("a\tb\nc\td\nno tab here\ne\tf\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"data\.tsv:3"):
        load_tsv(path)


def test_hf_loader_never_downloads(tmp_path: Path) -> None:
    # A hub name is not a local dataset: the loader says how to save it once, offline after.
    with pytest.raises(DatasetSettingError, match="save_to_disk"):
        load_hf_dataset("wmt14", "train", "en", "de")


def test_tokenizer_roundtrip_and_cache(tmp_path: Path, small: list[tuple[str, str]]) -> None:
    texts = [s for s, _ in small] + [t for _, t in small]
    cache = tmp_path / "tok" / "tokenizer.json"
    tok = train_or_load_tokenizer(texts, vocab_size=1000, cache_path=cache)
    assert cache.exists()
    assert tok.get_vocab_size() <= 1000
    for token, idx in (("<pad>", PAD_ID), ("<s>", BOS_ID), ("</s>", EOS_ID), ("<unk>", UNK_ID)):
        assert tok.token_to_id(token) == idx

    items, lengths = encode_pairs(tok, small[:300])
    assert lengths.shape == (300, 2) and np.issubdtype(lengths.dtype, np.integer)
    for (s, t), item, (ls, lt) in zip(small[:300], items, lengths, strict=True):
        assert item["source"][-1] == EOS_ID and EOS_ID not in item["source"][:-1]
        assert item["target"][0] == BOS_ID and item["target"][-1] == EOS_ID
        assert len(item["source"]) == ls and len(item["target"]) == lt
        assert decode(tok, item["source"]) == s
        assert decode(tok, item["target"]) == t
    assert decode(tok, [PAD_ID, BOS_ID, *items[0]["target"][1:], PAD_ID]) == small[0][1]

    clipped, clipped_len = encode_pairs(tok, small[:300], max_length=8)
    assert clipped_len.max() <= 8
    assert all(i["source"][-1] == EOS_ID and i["target"][-1] == EOS_ID for i in clipped)

    again = train_or_load_tokenizer(texts, vocab_size=1000, cache_path=cache)
    assert again.get_vocab() == tok.get_vocab()
    # a different vocab size invalidates the cache
    other = train_or_load_tokenizer(texts, vocab_size=600, cache_path=cache)
    assert other.get_vocab_size() <= 600


def test_only_newline_ends_a_line(tmp_path: Path) -> None:
    """U+0085 / U+2028 / form feed inside a sentence must not split it (and misalign pairs)."""
    src, tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    src.write_bytes("one\u2028two\r\nthree\x85four\n\x0cfive\n".encode())
    tgt.write_bytes(b"eins\r\ndrei\nfuenf")  # no final line end
    assert load_parallel_text(src, tgt) == [
        ("one\u2028two", "eins"),
        ("three\x85four", "drei"),
        ("\x0cfive", "fuenf"),
    ]


def test_unmatched_and_non_utf8_lines_are_named(tmp_path: Path) -> None:
    src, tgt = tmp_path / "a.src", tmp_path / "a.tgt"
    src.write_text("a\nb\nc\n", encoding="utf-8")
    tgt.write_text("x\ny\n", encoding="utf-8")
    with pytest.raises(ValueError, match=rf"{src}:3 is the first line without a counterpart"):
        load_parallel_text(src, tgt)
    tgt.write_bytes(b"x\ny\n\xe4\n")  # latin-1 'ä'
    with pytest.raises(ValueError, match=rf"{tgt}:3: not UTF-8"):
        load_parallel_text(src, tgt)
