"""A tokenizer's result becomes token counts: padding counted by the mask, miscounts refused."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from lightning_varbatch.errors import SettingTypeError
from lightning_varbatch.sources.token_counts import token_counter


def _count(result: Any, texts: list[str] | None = None, rows: list[int] | None = None) -> list[int]:
    texts = texts if texts is not None else ["a b", "c"]
    rows = rows if rows is not None else list(range(10, 10 + len(texts)))
    return token_counter(lambda _: result)(texts, "text", rows)


def test_sequences_arrays_tensors_and_counts_are_counted() -> None:
    assert _count([[1, 2], [3]]) == [2, 1]
    assert _count([np.array([1, 2, 3]), torch.tensor([4])]) == [3, 1]
    assert _count(np.array([5, 1])) == [5, 1]  # one count per string
    assert _count({"input_ids": [[1, 2], [3]]}) == [2, 1]


def test_a_padded_batch_is_counted_by_its_attention_mask_not_its_width() -> None:
    padded = {
        "input_ids": torch.tensor([[5, 6, 0], [7, 0, 0]]),
        "attention_mask": torch.tensor([[1, 1, 0], [1, 0, 0]]),
    }
    assert _count(padded) == [2, 1]
    assert _count({"input_ids": [[5, 6], [7]], "attention_mask": [[1, 1], [1]]}) == [2, 1]


def test_a_tokenizers_tokenizer_is_counted_by_its_encodings_masks() -> None:
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace

    tok = tokenizers.Tokenizer(WordLevel({"a": 0, "b": 1, "[PAD]": 2}, unk_token="a"))
    tok.pre_tokenizer = Whitespace()
    tok.enable_padding(pad_id=2, pad_token="[PAD]")
    assert token_counter(tok)(["a b a", "b"], "text", [0, 1]) == [3, 1]


@pytest.mark.parametrize(
    ("result", "error", "match"),
    [
        (["x y", "z"], TypeError, r"for row 10 of column 'text' the tokenizer returned a string"),
        ([1.0, 2.0], TypeError, r"row 10 .* returned a float \(1.0\)"),
        ([[1], None], ValueError, r"row 11 .* returned None instead of token ids"),
        ([[1], [2, None]], ValueError, r"row 11 .* null at position 1"),
        ([[[1, 2]], [3]], TypeError, r"row 10 .* a nested sequence"),
        ([[1]], ValueError, r"returned 1 results for a batch of 2 strings \(rows 10..11"),
        (np.ones((2, 4), int), TypeError, r"one \(2, 4\) array .* a rectangular batch is padded"),
        ({"ids": [[1]]}, TypeError, r"returned a dict with keys \['ids'\]"),
        (None, TypeError, r"returned None for a batch of 2 strings"),
    ],
)
def test_results_that_would_miscount_are_refused_naming_the_row(
    result: Any, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        _count(result)


def test_a_tokenizer_that_cannot_be_called_names_the_setting() -> None:
    with pytest.raises(SettingTypeError, match="tokenizer must be") as info:
        token_counter(42)
    assert info.value.setting == "tokenizer"
