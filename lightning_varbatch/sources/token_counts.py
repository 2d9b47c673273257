"""How a tokenizer's result becomes token counts, or an error naming the row and column.

:func:`token_counter`'s function reads the tokenizer's result on a batch of strings: token-id
lists, arrays or tensors are counted by their length, integer results taken as counts, and a
padded result (a ``BatchEncoding`` of ``tok(texts, padding=True)``, a ``Tokenizer`` with padding
on) by its attention mask, never its width. Results ``len()`` would miscount (strings, a padded
rectangle without a mask), floats, bools, ``None`` and nested sequences are refused.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingTypeError

__all__ = ["token_counter"]

#: What a tokenizer must return, for messages.
_WANTED = (
    "one token sequence (a list/array of token ids) or one integer count per string, or a "
    "BatchEncoding/dict with 'input_ids' (and 'attention_mask' when it pads)"
)


def _is_text(value: object) -> bool:
    return isinstance(value, (str, bytes))


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a numpy array when it is a numpy array or a tensor, else ``None``."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith(("torch", "tensorflow", "jax")) and hasattr(
        value, "shape"
    ):
        detach = getattr(value, "detach", None)
        value = detach().cpu() if callable(detach) else value
        return np.asarray(value)
    return None


class _Rows:
    """Turns one tokenizer result into counts, naming the dataset row and column when wrong."""

    def __init__(self, column: str, rows: Sequence[int], size: int) -> None:
        self.column, self.rows, self.size = column, rows, size

    def where(self, i: int) -> str:
        return f"row {self.rows[i]} of column {self.column!r}"

    def bad(self, i: int, got: str, fix: str) -> TypeError:
        return TypeError(
            f"tokenizer: for {self.where(i)} the tokenizer returned {got}; it must return "
            f"{_WANTED}. {fix}"
        )

    def count(self, i: int, row: Any) -> int:
        """The token count of one row of the result."""
        if row is None:
            return self._null(i)
        if isinstance(row, (bool, np.bool_, int, np.integer, float, np.floating, str, bytes)):
            return self._scalar(i, row)
        mask = getattr(row, "attention_mask", None)
        if mask is not None and hasattr(row, "ids"):  # a tokenizers.Encoding (maybe padded)
            return int(sum(mask))
        if isinstance(row, Mapping):
            return self._mapping_row(i, row)
        array = _as_array(row)
        if array is not None:
            return self._array_row(i, array)
        if isinstance(row, Sequence):
            return self._sequence_row(i, row)
        raise self.bad(i, f"a {type(row).__name__}", "")

    def _scalar(self, i: int, row: Any) -> int:
        """An integer count; a bool, float or string is refused."""
        if isinstance(row, (bool, np.bool_)):
            raise self.bad(i, f"a bool ({row!r})", "Return integer counts or token-id lists.")
        if isinstance(row, (int, np.integer)):
            return int(row)
        if isinstance(row, (float, np.floating)):
            raise self.bad(
                i,
                f"a float ({row!r})",
                "Counts must be integers: return int counts (or the token ids themselves).",
            )
        raise self.bad(
            i,
            f"a string ({str(row)[:40]!r})",
            "Counting its length would count characters, not tokens: return the token "
            "ids (e.g. tok.encode(text).ids or tok(texts)['input_ids']).",
        )

    def _array_row(self, i: int, array: np.ndarray) -> int:
        """A flat integer array (or tensor) of token ids, or a 0-d count."""
        if array.ndim == 0:
            return self.count(i, array.item())
        if array.ndim != 1:
            raise self.bad(
                i,
                f"an array of shape {array.shape}",
                "Each string's tokens must be one flat sequence (was "
                "return_overflowing_tokens or a nested list returned?).",
            )
        if array.dtype.kind not in "iu" and array.size:
            raise self.bad(
                i,
                f"an array of dtype {array.dtype}",
                "Token ids must be integers.",
            )
        return int(array.shape[0])

    def _sequence_row(self, i: int, row: Sequence[Any]) -> int:
        """A flat sequence of token ids; nested sequences, floats and nulls are refused."""
        if row and isinstance(row[0], (list, tuple, np.ndarray, Mapping)):
            raise self.bad(
                i,
                f"a nested sequence (its first element is a {type(row[0]).__name__})",
                "Each string's tokens must be one flat sequence of token ids (was "
                "return_overflowing_tokens on, or a pair of texts given?).",
            )
        if row and isinstance(row[0], (float, np.floating)):
            raise self.bad(
                i, f"a sequence of floats ({row[0]!r}, ...)", "Token ids must be integers."
            )
        if None in row:
            raise ValueError(
                f"tokenizer: for {self.where(i)} the tokenizer returned token ids with a "
                f"null at position {list(row).index(None)}; every token must be an "
                "integer id: fix the tokenizer (or its vocabulary) for that text."
            )
        return len(row)

    def _null(self, i: int) -> int:
        raise ValueError(
            f"tokenizer: for {self.where(i)} the tokenizer returned None instead of token ids "
            "or a count; it must return one result per string: check how it handles that "
            "text (or filter the row out)."
        )

    def _mapping_row(self, i: int, row: Mapping[str, Any]) -> int:
        if "attention_mask" in row:
            return int(np.asarray(row["attention_mask"]).sum())
        if "input_ids" in row:
            return self.count(i, row["input_ids"])
        raise self.bad(i, f"a dict with keys {sorted(map(str, row))}", "")

    def counts(self, out: Any) -> list[int]:
        """Counts of a whole batch result (one per string)."""
        if out is None:
            raise TypeError(
                f"tokenizer: the tokenizer returned None for a batch of {self.size} strings "
                f"(rows {self.rows[0]}..{self.rows[-1]} of column {self.column!r}); it must "
                f"return {_WANTED} (does it modify its input instead of returning?)."
            )
        if _is_text(out):
            raise TypeError(
                f"tokenizer: the tokenizer returned one string for a batch of {self.size} "
                f"strings (rows {self.rows[0]}..{self.rows[-1]} of column {self.column!r}); "
                f"it must return {_WANTED}."
            )
        if isinstance(out, Mapping):
            return self._mapping(out)
        array = _as_array(out)
        if array is not None:
            return self._array(array, "token ids")
        if not isinstance(out, Sequence):
            if not isinstance(out, Iterable):
                raise TypeError(
                    f"tokenizer: the tokenizer returned {type(out).__name__} for a batch of "
                    f"{self.size} strings (column {self.column!r}); it must return {_WANTED}."
                )
            out = list(out)
        self._check_rows(len(out))
        return [self.count(i, row) for i, row in enumerate(out)]

    def _check_rows(self, got: int) -> None:
        if got != self.size:
            raise ValueError(
                f"tokenizer: the tokenizer returned {got} results for a batch of {self.size} "
                f"strings (rows {self.rows[0]}..{self.rows[-1]} of column {self.column!r}); "
                "it must return one per string (is it tokenizing one string at a time? wrap "
                "it: lambda texts: [tok(t) for t in texts])."
            )

    def _array(self, array: np.ndarray, what: str) -> list[int]:
        if array.ndim == 1 and array.dtype.kind in "iu":  # one count per string
            self._check_rows(array.shape[0])
            return [self.count(i, int(x)) for i, x in enumerate(array.tolist())]
        if array.ndim == 1 and array.dtype == object:
            self._check_rows(array.shape[0])
            return [self.count(i, row) for i, row in enumerate(array)]
        if array.ndim == 1:
            raise self.bad(0, f"an array of dtype {array.dtype}", "Counts must be integers.")
        self._check_rows(array.shape[0])
        raise TypeError(
            f"tokenizer: the tokenizer returned {what} as one {array.shape} array for rows "
            f"{self.rows[0]}..{self.rows[-1]} of column {self.column!r}: a rectangular batch "
            "is padded, and its width is not each text's token count. Return the "
            "attention_mask with it (a BatchEncoding: tok(texts, padding=True)), or call the "
            "tokenizer without padding and return_tensors (tok(texts)['input_ids'])."
        )

    def _mapping(self, out: Mapping[str, Any]) -> list[int]:
        if "input_ids" not in out:
            raise TypeError(
                f"tokenizer: the tokenizer returned a {type(out).__name__} with keys "
                f"{sorted(map(str, out))} for column {self.column!r}; it must return "
                f"{_WANTED}."
            )
        mask = out.get("attention_mask")
        if mask is None:
            ids = out["input_ids"]
            array = _as_array(ids)
            return self._array(array, "input_ids") if array is not None else self.counts(ids)
        array = _as_array(mask)
        if array is not None and array.ndim == 2:  # padded to a rectangle: count the mask
            self._check_rows(array.shape[0])
            return array.astype(np.int64).sum(axis=1).tolist()
        rows = list(mask)
        self._check_rows(len(rows))
        counts = []
        for i, row in enumerate(rows):
            if row is None:
                self._null(i)
            counts.append(int(np.asarray(row, dtype=np.int64).sum()))
        return counts


def token_counter(tokenizer: Any) -> Callable[[list[Any], str, Sequence[int]], list[int]]:
    """A function from a batch of strings (column, dataset rows) to their token counts.

    Args:
        tokenizer: a ``tokenizers.Tokenizer`` (counted by its encodings' attention masks), a
            ``transformers`` tokenizer or any callable ``list[str] ->`` one result per string.

    Returns:
        ``count(texts, column, rows)``: one count per text; ``column`` and ``rows`` (the
        dataset rows of ``texts``) only name the culprit when a result is wrong.

    Raises:
        SettingTypeError: for a tokenizer that is not callable.

    Example:
        >>> count = token_counter(lambda texts: {"input_ids": [[5, 6, 0], [7, 0, 0]],
        ...                                      "attention_mask": [[1, 1, 0], [1, 0, 0]]})
        >>> count(["a b", "c"], "text", [0, 1])  # padded: counted by the mask, not the width
        [2, 1]
        >>> count = token_counter(lambda texts: [t.upper() for t in texts])
        >>> count(["a b"], "text", [4])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: tokenizer: for row 4 of column 'text' the tokenizer returned a string ...
    """
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if callable(encode_batch) and type(tokenizer).__module__.startswith("tokenizers"):
        # a padding Tokenizer pads ids to the batch width: count the attention mask
        return lambda texts, column, rows: [int(sum(e.attention_mask)) for e in encode_batch(texts)]
    if not callable(tokenizer):
        raise SettingTypeError(
            f"tokenizer must be a tokenizers.Tokenizer, a transformers tokenizer or a callable "
            f"list[str] -> token sequences, got {type(tokenizer).__name__}: pass one of those.",
            setting="tokenizer",
            value=tokenizer,
        )

    def count(texts: list[str], column: str, rows: Sequence[int]) -> list[int]:
        return _Rows(column, rows, len(texts)).counts(tokenizer(texts))

    return count
