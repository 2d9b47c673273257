"""What the plan attaches to a micro-batch's items: its counts, dataset ids, planned lengths.

torch's fetcher hands the sampler's :class:`~lightning_varbatch.MicroBatch` as it is to
``dataset.__getitems__``; the loader's dataset wrapper passes it with the fetched items to
:func:`attach_plan`: the items then carry the plan's counts (also across worker processes). The
collates put them on the batch (:func:`count_entries`) and name items with :func:`item_label`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import IterableDataset

from lightning_varbatch import keys
from lightning_varbatch.data.columnar import ColumnarItems
from lightning_varbatch.sources.arrow_lengths import is_arrow_table

__all__ = [
    "PlanItems",
    "attach_plan",
    "batch_info",
    "check_map_style",
    "count_entries",
    "item_label",
    "plan_entries",
    "static_shape",
]


class PlanItems(list[Any]):
    """The items of one micro-batch plus the plan's metadata for it (``info``).

    Attributes:
        info: plan counts (:func:`batch_info`; ``None`` if unknown), ``None`` for a plain list.
        ids: the dataset index of every item (``None``: unknown), for error messages.
        planned_lengths: each item's budgeted length (``MicroBatch.planned_lengths``), or ``None``.

    Example:
        >>> items = PlanItems([{"tokens": [1]}], info={"ntokens": 1})
        >>> len(items), items.info
        (1, {'ntokens': 1})
    """

    def __init__(
        self,
        items: Sequence[Any],
        info: Mapping[str, int | None] | None = None,
        ids: list[int] | None = None,
        planned_lengths: list[int] | None = None,
    ) -> None:
        super().__init__(items)
        self.info = info
        self.ids = ids
        self.planned_lengths = planned_lengths


def batch_info(indices: Sequence[int]) -> dict[str, int | None] | None:
    """A ``MicroBatch``'s plan counts (one per ``PLAN_COUNTS`` row, by attribute), else ``None``.

    Example:
        >>> from lightning_varbatch.data.micro_batch import MicroBatch
        >>> mb = MicroBatch([3], epoch=0, step=1, micro=0, rank=0, ntokens=4,
        ...                 step_ntokens=9, step_nexamples=2)
        >>> batch_info(mb)["step_ntokens"], batch_info(mb)["truncate_to"], batch_info([3])
        (9, None, None)
    """
    if not all(hasattr(indices, c.attribute) for c in keys.PLAN_COUNTS if c.required):
        return None
    info: dict[str, int | None] = {}
    for count in keys.PLAN_COUNTS:
        value = getattr(indices, count.attribute, None)
        info[count.attribute] = count.default if value is None else int(value)
    return info


def plan_entries(info: Mapping[str, int | None]) -> dict[str, int]:
    """The batch entries of the plan's counts: every keyed, known row of ``PLAN_COUNTS``.

    Example:
        >>> plan_entries({"ntokens": 4, "step_ntokens": 9, "dataset": None})
        {'step_ntokens': 9}
    """
    out = {}
    for count in keys.PLAN_COUNTS:
        value = info.get(count.attribute)
        if count.key is not None and value is not None:
            out[count.key] = int(value)
    return out


def count_entries(
    counts: Mapping[str, int], info: Mapping[str, int | None] | None
) -> dict[str, torch.Tensor]:
    """A batch's counts and the plan's (:func:`plan_entries`) as 0-dim long tensors.

    All of them are views of one tensor: a DataLoader worker then ships one shared-memory
    block per batch instead of one per count (about a millisecond each).

    Example:
        >>> entries = count_entries({"ntokens": 4}, {"step_ntokens": 9})
        >>> {k: int(v) for k, v in entries.items()}, entries["ntokens"].shape
        ({'ntokens': 4, 'step_ntokens': 9}, torch.Size([]))
    """
    merged = dict(counts)
    if info is not None:
        merged.update(plan_entries(info))
    values = torch.tensor(list(merged.values()), dtype=torch.long)
    return {key: values[i] for i, key in enumerate(merged)}


def attach_plan(items: Any, indices: Sequence[int]) -> Sequence[Any]:
    """The fetched ``items`` of ``indices`` as the collates read them: with the plan.

    ``items``: a list of items, or an Arrow table of the rows (then :class:`~.ColumnarItems`).

    Raises:
        RuntimeError: when there is not one item per index.

    Example:
        >>> from lightning_varbatch.data.micro_batch import MicroBatch
        >>> mb = MicroBatch([1, 0], epoch=0, step=0, micro=0, rank=0, ntokens=3,
        ...                 step_ntokens=3, step_nexamples=2)
        >>> items = attach_plan([{"tokens": [3]}, {"tokens": [1, 2]}], mb)
        >>> items.info["step_ntokens"], items.ids
        (3, [1, 0])
    """
    size = items.num_rows if is_arrow_table(items) else len(items)
    if size != len(indices):
        raise RuntimeError(
            f"the dataset returned {size} items for {len(indices)} indices; its "
            "__getitems__ must return one item per index, in order."
        )
    planned = getattr(indices, "planned_lengths", None)
    kind = ColumnarItems if is_arrow_table(items) else PlanItems
    return kind(
        items,
        batch_info(indices),
        ids=[int(i) for i in indices],
        planned_lengths=None if planned is None else list(planned),
    )


def static_shape(info: Mapping[str, int | None] | None, rows: int) -> tuple[int, int] | None:
    """The static ``(rows, length)`` a micro-batch is padded to (``max_shapes``), else ``None``.

    Raises:
        ValueError: when the micro-batch has more items than its shape has rows.

    Example:
        >>> static_shape({"pad_rows": 4, "pad_length": 16}, 3), static_shape(None, 3)
        ((4, 16), None)
    """
    if info is None or info.get("pad_rows") is None or info.get("pad_length") is None:
        return None
    shape = (int(info["pad_rows"] or 0), int(info["pad_length"] or 0))
    if rows > shape[0]:
        raise ValueError(
            f"The micro-batch has {rows} items but its static shape only {shape[0]} rows: the "
            "dataset returned more items than the plan's indices (a wrapper changed the items)."
        )
    return shape


def check_map_style(dataset: Any, name: str = "dataset") -> None:
    """Refuse an iterable-style dataset where a map-style one (items by index) is needed.

    Raises:
        TypeError: for an ``IterableDataset`` or an object without ``__getitem__``.

    Example:
        >>> check_map_style([{"tokens": [1]}])
        >>> class Stream(IterableDataset):
        ...     def __iter__(self):
        ...         yield {"tokens": [1]}
        >>> check_map_style(Stream())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: dataset is an iterable-style dataset (Stream), but ...map-style dataset...
    """
    if isinstance(dataset, IterableDataset) or not hasattr(dataset, "__getitem__"):
        kind = (
            "an iterable-style dataset"
            if isinstance(dataset, IterableDataset)
            else "not indexable (no __getitem__)"
        )
        raise TypeError(
            f"{name} is {kind} ({type(dataset).__name__}), but token budgeting needs a "
            "map-style dataset: the plan picks items by index (dataset[i]) from one length per "
            "item. Materialise the data as a list or a torch Dataset with __getitem__ and "
            "__len__ (for Hugging Face data: load it without streaming=True)."
        )


def item_label(items: Sequence[Any], position: int) -> str:
    """How an error message names the item at ``position`` of a micro-batch.

    Example:
        >>> item_label([{"tokens": [1]}], 0)
        'item 0 of the micro-batch'
    """
    ids = getattr(items, "ids", None)
    info = getattr(items, "info", None)
    text = (
        f"dataset item {ids[position]}"
        if ids is not None
        else f"item {position} of the micro-batch"
    )
    if info is not None:
        text += (
            f" (epoch {info['epoch']}, step {info['step']}, micro-batch {info['micro']}, "
            f"position {position})"
        )
    return text
