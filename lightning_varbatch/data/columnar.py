"""Micro-batches read from a Hugging Face dataset in one batched call, as Arrow columns.

For a Hugging Face ``datasets.Dataset`` (and a library collate) each micro-batch is one ``take`` of
its rows from the memory-mapped table, handed over as :class:`ColumnarItems` (no Python object per
row or token); a ``ConcatDataset`` of them is routed part by part (a micro-batch is one dataset's).

Example:
    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"tokens": [[1, 2], [3], [4, 5, 6]]})
    >>> items = ColumnarItems(fetch_rows(ds, [2, 0], columnar=True))
    >>> len(items), items[0]
    (2, {'tokens': [4, 5, 6]})
"""

from __future__ import annotations

import bisect
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from torch.utils.data import ConcatDataset

__all__ = ["ColumnarItems", "arrow_view", "fetch_rows"]


_VIEWS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def arrow_view(dataset: Any) -> Any | None:
    """``dataset`` formatted to return Arrow tables, if it is a ``datasets.Dataset``.

    ``None`` for anything else, and for a dataset with a transform (``set_transform`` /
    ``with_transform``): its items are what the transform returns, so they are read through
    the dataset itself. The view keeps the dataset's column selection and is built once per
    dataset and process (``with_format`` copies the dataset object: too slow per batch).

    Example:
        >>> arrow_view([1, 2]) is None
        True
    """
    kind = type(dataset)
    if kind.__name__ != "Dataset" or not kind.__module__.startswith("datasets"):
        return None
    view = _VIEWS.get(dataset)
    if view is None:
        fmt = dataset.format
        if fmt.get("type") == "custom":
            return None
        view = dataset.with_format(
            "arrow",
            columns=fmt.get("columns"),
            output_all_columns=bool(fmt.get("output_all_columns", False)),
        )
        _VIEWS[dataset] = view
    return view


def _part_of(dataset: ConcatDataset[Any], indices: Sequence[int]) -> tuple[int, int] | None:
    """The part of a ConcatDataset holding every index, and its offset (``None``: several)."""
    ends = dataset.cumulative_sizes
    part = bisect.bisect_right(ends, min(indices))
    if part != bisect.bisect_right(ends, max(indices)) or part == len(ends):
        return None
    return part, ends[part - 1] if part else 0


def fetch_rows(dataset: Any, indices: Sequence[int], columnar: bool) -> Any:
    """The rows at ``indices``, read in one call where the dataset allows it.

    Returns an Arrow table for a Hugging Face dataset when ``columnar``; otherwise the items of the
    dataset's ``__getitems__`` (Hugging Face's reads a batch at once) or of ``dataset[i]`` per
    index. A ``ConcatDataset`` whose indices all fall in one part reads from that part the same way.

    Example:
        >>> fetch_rows([{"tokens": [1]}, {"tokens": [2]}], [1], columnar=True)
        [{'tokens': [2]}]
    """
    if isinstance(dataset, ConcatDataset) and len(indices):
        part = _part_of(dataset, indices)
        if part is not None:
            which, offset = part
            local = [int(i) - offset for i in indices]
            return fetch_rows(dataset.datasets[which], local, columnar)
    if columnar:
        view = arrow_view(dataset)
        if view is not None:
            # A gather leaves a chunk per row; one per column makes later steps single vector calls
            return view[[int(i) for i in indices]].combine_chunks()
    inner = getattr(dataset, "__getitems__", None)
    if callable(inner):
        return inner(list(indices) if not isinstance(indices, list) else indices)
    return [dataset[i] for i in indices]


class ColumnarItems(Sequence[Mapping[str, Any]]):
    """The rows of one micro-batch as an Arrow table, plus the plan's metadata.

    Indexing gives a row as a dict (for checks and messages); the collate reads the columns.

    Attributes:
        table: the micro-batch's rows (``pyarrow.Table``).
        info: the plan's counts (see :func:`~lightning_varbatch.data.collate.batch_info`).
        ids: dataset index of every row.
        planned_lengths: the length the plan budgeted for every row.
    """

    def __init__(
        self,
        table: Any,
        info: Mapping[str, int | None] | None = None,
        ids: list[int] | None = None,
        planned_lengths: list[int] | None = None,
    ) -> None:
        self.table = table
        self.info = info
        self.ids = ids
        self.planned_lengths = planned_lengths

    @property
    def column_names(self) -> list[str]:
        """The table's columns."""
        return list(self.table.column_names)

    def __len__(self) -> int:
        return int(self.table.num_rows)

    def __getitem__(self, index: Any) -> Any:
        position = int(index)
        if not -len(self) <= position < len(self):
            raise IndexError(f"row {index} of a micro-batch of {len(self)} rows")
        return self.table.slice(position % len(self), 1).to_pylist()[0]
