"""One token field of a micro-batch as flat values plus row lengths, padded in one scatter.

Both ways a micro-batch arrives end here: a list of items (one tensor per row, concatenated) and
Arrow columns read in one batched call from a Hugging Face dataset (flattened values and list
lengths, no Python object per token). Truncation and padding are vectorised over the whole field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from lightning_varbatch.sources.arrow_lengths import is_list_type, null_rows

__all__ = ["Ragged"]


@dataclass(frozen=True)
class Ragged:
    """A batch of variable-length token rows: ``values`` (flat, long) and ``lengths``.

    Attributes:
        values: every row's tokens, concatenated (1-D long tensor).
        lengths: tokens per row (1-D long tensor); they sum to ``len(values)``.
    """

    values: torch.Tensor
    lengths: torch.Tensor

    @classmethod
    def from_rows(cls, rows: Sequence[torch.Tensor]) -> Ragged:
        """Rows of 1-D long tensors.

        Example:
            >>> Ragged.from_rows([torch.tensor([1, 2]), torch.tensor([3])]).lengths.tolist()
            [2, 1]
        """
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        values = torch.cat(list(rows)) if rows else torch.zeros(0, dtype=torch.long)
        return cls(values, lengths)

    @classmethod
    def from_arrow(cls, column: Any) -> Ragged:
        """An Arrow list column of integers (a ``ChunkedArray`` or an array), no copy per token.

        The caller checks the type and nulls first (:func:`arrow_list_problem`).

        Example:
            >>> import pyarrow as pa
            >>> Ragged.from_arrow(pa.chunked_array([[[1, 2], [3]], [[4]]])).values.tolist()
            [1, 2, 3, 4]
        """
        import pyarrow.compute as pc

        lengths = np.array(pc.list_value_length(column).to_numpy(), dtype=np.int64)
        values = np.array(pc.list_flatten(column).to_numpy(), dtype=np.int64)  # writable copy
        return cls(torch.from_numpy(values), torch.from_numpy(lengths))

    def __len__(self) -> int:
        return int(self.lengths.shape[0])

    def positions(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The row and the position in its row of every value.

        Example:
            >>> rows, at = Ragged.from_rows([torch.tensor([7, 8]), torch.tensor([9])]).positions()
            >>> rows.tolist(), at.tolist()
            ([0, 0, 1], [0, 1, 0])
        """
        rows = torch.repeat_interleave(torch.arange(len(self)), self.lengths)
        starts = torch.cumsum(self.lengths, 0) - self.lengths
        return rows, torch.arange(self.values.shape[0]) - starts[rows]

    def truncate(self, limit: int | None) -> Ragged:
        """Every row cut to at most ``limit`` tokens (``None`` or 0: unchanged).

        Example:
            >>> Ragged.from_rows([torch.tensor([1, 2, 3])]).truncate(2).values.tolist()
            [1, 2]
        """
        if not limit or len(self) == 0 or int(self.lengths.max()) <= limit:
            return self
        _, position = self.positions()
        return Ragged(self.values[position < limit], self.lengths.clamp(max=limit))

    def pad(
        self, pad_id: int, multiple: int = 1, shape: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(rows, width)`` padded tokens and the bool mask of real ones.

        The width: the longest row rounded up to ``multiple``, or ``shape``'s (a static ``(rows,
        width)`` at least as large; the extra rows all padding, mask ``False``).

        Example:
            >>> ragged = Ragged.from_rows([torch.tensor([4]), torch.tensor([5, 6])])
            >>> ragged.pad(9)[0].tolist()
            [[4, 9], [5, 6]]
            >>> ragged.pad(0, shape=(3, 3))[1].tolist()
            [[True, False, False], [True, True, False], [False, False, False]]
        """
        longest = int(self.lengths.max()) if len(self) else 0
        width = -(-longest // multiple) * multiple
        nrows = len(self)
        if shape is not None:
            assert shape[0] >= nrows and shape[1] >= longest, "the static shape is too small"
            nrows, width = shape
        padded = torch.full((nrows, width), pad_id, dtype=torch.long)
        if self.values.numel():
            rows, position = self.positions()
            padded[rows, position] = self.values
        lengths = self.lengths
        if nrows > len(self):
            lengths = torch.cat([lengths, lengths.new_zeros(nrows - len(self))])
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        return padded, mask


def arrow_list_problem(column: Any) -> tuple[int, str, type[Exception]] | None:
    """Why an Arrow column cannot be a token field: ``(row, what is wrong, error type)``.

    ``None`` when it can; ``row`` is the first row at fault (0 for the column's type).

    Example:
        >>> import pyarrow as pa
        >>> arrow_list_problem(pa.chunked_array([["a b"]]))[1]
        'is text (string), not token ids: tokenize the text in the dataset'
        >>> arrow_list_problem(pa.chunked_array([[[1], [2, None]]]))[0]
        1
    """
    import pyarrow as pa

    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        return 0, f"is text ({kind}), not token ids: tokenize the text in the dataset", TypeError
    if not is_list_type(kind):
        return 0, f"has type {kind}, not a list of integer token ids", TypeError
    if not pa.types.is_integer(kind.value_type):
        what = (
            f"holds {kind.value_type} values (type {kind}); expected integer token ids (a "
            "float or bool would be silently cut to an id). Store the ids as ints"
        )
        return 0, what, TypeError
    bad = null_rows(column)
    if bad is None:
        return None
    row = int(np.flatnonzero(bad)[0])
    value = column[row]
    got = f"holds a null token id ({value.as_py()})" if value.is_valid else "is null"
    what = (
        f"{got}: every item needs a list of integer token ids; fill or drop the rows with "
        "nulls in the dataset (ds.filter) before training"
    )
    return row, what, TypeError if value.is_valid else ValueError
