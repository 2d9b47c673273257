"""Padding collate for token-budgeted batches, carrying the plan's bookkeeping onto the batch.

The batch sampler yields :class:`~lightning_varbatch.sampler.MicroBatch` lists that know their
token counts and the whole optimizer step's token count. torch's fetcher hands that list, as it
is, to ``dataset.__getitems__``; :class:`BatchInfoDataset` reads the metadata there and returns
a :class:`CollatedItems` list carrying it (also across DataLoader worker processes, since both
pickle with their attributes). :class:`PaddingCollate` pads the fields and puts the counts of
:mod:`lightning_varbatch.keys` on the batch, checking the real token count against the plan.

Example:
    >>> import torch
    >>> from lightning_varbatch import keys
    >>> batch = PaddingCollate()([{"tokens": [5, 6, 7]}, {"tokens": [8]}])
    >>> batch["tokens"].tolist(), batch["tokens_mask"].sum().item(), int(batch[keys.NTOKENS])
    ([[5, 6, 7], [8, 0, 0]], 4, 4)
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.utils.data import Dataset

from lightning_varbatch import keys

__all__ = ["BatchInfoDataset", "CollatedItems", "PaddingCollate"]

TOKENS_KEY = "tokens"
_INFO_FIELDS = ("epoch", "step", "micro", "ntokens", "step_ntokens", "step_nexamples")


class CollatedItems(list[Any]):
    """The items of one micro-batch plus the plan's metadata for it (``info``).

    Attributes:
        info: ``epoch``, ``step``, ``micro``, ``ntokens``, ``step_ntokens``,
            ``step_nexamples``, ``dataset`` and ``truncate_to`` (0: none) of the micro-batch,
            or ``None`` when the indices were a plain list.

    Example:
        >>> items = CollatedItems([{"tokens": [1]}], info={"ntokens": 1})
        >>> len(items), items.info
        (1, {'ntokens': 1})
    """

    def __init__(self, items: Sequence[Any], info: dict[str, int] | None = None) -> None:
        super().__init__(items)
        self.info = info


def batch_info(indices: Sequence[int]) -> dict[str, int] | None:
    """The plan metadata of a :class:`~lightning_varbatch.sampler.MicroBatch`, else ``None``.

    Example:
        >>> from lightning_varbatch.sampler import MicroBatch
        >>> mb = MicroBatch([3], epoch=0, step=1, micro=0, rank=0, ntokens=4,
        ...                 step_ntokens=9, step_nexamples=2)
        >>> batch_info(mb)["step_ntokens"], batch_info([3])
        (9, None)
    """
    if not all(hasattr(indices, name) for name in _INFO_FIELDS):
        return None
    info = {name: int(getattr(indices, name)) for name in _INFO_FIELDS}
    info["dataset"] = int(getattr(indices, "dataset", 0))
    info["truncate_to"] = int(getattr(indices, "truncate_to", None) or 0)  # 0: no truncation
    for name in ("world_size", "accumulate_grad_batches"):  # the plan's topology; 0: unknown
        info[name] = int(getattr(indices, name, None) or 0)
    return info


class BatchInfoDataset(Dataset[Any]):
    """Wrap a map-style dataset so that each fetched micro-batch keeps the plan's metadata.

    ``__getitems__`` receives the sampler's :class:`~lightning_varbatch.sampler.MicroBatch`
    (torch's fetcher passes the batch sampler's list through unchanged) and returns a
    :class:`CollatedItems` whose ``info`` :class:`PaddingCollate` turns into batch entries.

    Args:
        dataset: any map-style dataset (``__getitem__``; its ``__getitems__`` is used when it
            has one).

    Example:
        >>> from lightning_varbatch.sampler import MicroBatch
        >>> data = BatchInfoDataset([{"tokens": [1, 2]}, {"tokens": [3]}])
        >>> mb = MicroBatch([1, 0], epoch=0, step=0, micro=0, rank=0, ntokens=3,
        ...                 step_ntokens=3, step_nexamples=2)
        >>> items = data.__getitems__(mb)
        >>> items, items.info["step_ntokens"]
        ([{'tokens': [3]}, {'tokens': [1, 2]}], 3)
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: Sequence[int]) -> CollatedItems:
        """The items at ``indices`` with the micro-batch's metadata."""
        inner = getattr(self.dataset, "__getitems__", None)
        items = inner(indices) if callable(inner) else [self.dataset[i] for i in indices]
        return CollatedItems(items, batch_info(indices))


def _as_tokens(value: Any, field: str) -> torch.Tensor:
    tensor = torch.as_tensor(value, dtype=torch.long)
    if tensor.dim() != 1:
        raise ValueError(
            f"Field {field!r} must be a 1-D sequence of token ids, got shape {tuple(tensor.shape)}."
        )
    return tensor


class PaddingCollate:
    """Pad token fields into ``(batch, length)`` tensors and add the bookkeeping counts.

    Items are mappings holding 1-D LongTensors or lists of ints: ``source``/``target`` pairs
    (keys configurable) or a single ``"tokens"`` field. The batch holds, per field ``f``, the
    padded ``f`` and a bool ``f_mask`` (True on real tokens), plus 0-dim long tensors under the
    names of :mod:`lightning_varbatch.keys`: ``NTOKENS`` (real target tokens; real tokens for a
    single field), ``NEXAMPLES``, ``PADDED_TOKENS`` (slots of all padded fields),
    ``INPUT_TOKENS`` (real tokens of all fields) and, when the items come through
    :class:`BatchInfoDataset` from a :class:`~lightning_varbatch.TokenBudgetBatchSampler`,
    ``STEP_NTOKENS``, ``STEP_NEXAMPLES`` and ``DATASET``. Other item entries are gathered:
    ints into a ``(batch,)`` long tensor, anything else into a list.

    Args:
        pad_id: the padding token id.
        pad_to_multiple_of: pad lengths up to a multiple of this (use the sampler's).
        source_key: key of the source field of pairs.
        target_key: key of the target field of pairs.
        truncate_to: cut every field to this length (the sampler's ``truncate_to`` under
            ``oversize="truncate"``; :class:`TokenBudgetDataModule` sets it). A micro-batch
            whose plan cuts shorter (a dataset of a mixture with its own budget) is cut to
            the plan's length.
        check_ntokens: compare the real token count with the plan's; turn off when the sampler
            was given ``loss_lengths`` that differ from the target lengths.

    Raises:
        ValueError: for bad settings, non 1-D fields, or (when checking) a batch whose token
            count differs from the plan's: the sampler's ``lengths`` do not match the dataset.

    Example:
        >>> collate = PaddingCollate(pad_to_multiple_of=4)
        >>> batch = collate([{"source": [1, 2], "target": [3]},
        ...                  {"source": [4, 5, 6, 7, 8], "target": [9, 9]}])
        >>> tuple(batch["source"].shape), tuple(batch["target"].shape)
        ((2, 8), (2, 4))
        >>> [int(batch[k]) for k in ("ntokens", "padded_tokens", "input_tokens")]
        [3, 24, 10]
    """

    def __init__(
        self,
        pad_id: int = 0,
        pad_to_multiple_of: int = 1,
        source_key: str = "source",
        target_key: str = "target",
        truncate_to: int | None = None,
        check_ntokens: bool = True,
    ) -> None:
        if isinstance(pad_to_multiple_of, bool) or not isinstance(pad_to_multiple_of, int):
            raise ValueError(f"pad_to_multiple_of must be an integer, got {pad_to_multiple_of!r}.")
        if pad_to_multiple_of < 1:
            raise ValueError(f"pad_to_multiple_of must be >= 1, got {pad_to_multiple_of}.")
        if truncate_to is not None and (
            isinstance(truncate_to, bool) or not isinstance(truncate_to, int) or truncate_to < 1
        ):
            raise ValueError(
                f"truncate_to must be a positive integer or None, got {truncate_to!r}."
            )
        if source_key == target_key:
            raise ValueError(f"source_key and target_key must differ, both are {source_key!r}.")
        self.pad_id = pad_id
        self.pad_to_multiple_of = pad_to_multiple_of
        self.source_key = source_key
        self.target_key = target_key
        self.truncate_to = truncate_to
        self.check_ntokens = check_ntokens

    def with_truncation(self, truncate_to: int | None) -> PaddingCollate:
        """A copy cutting fields to ``truncate_to`` (unless this one already cuts).

        Example:
            >>> PaddingCollate().with_truncation(8).truncate_to
            8
        """
        other = copy.copy(self)
        if other.truncate_to is None:
            other.truncate_to = truncate_to
        return other

    def _fields(self, first: Mapping[str, Any]) -> tuple[tuple[str, ...], str]:
        if self.source_key in first and self.target_key in first:
            return (self.source_key, self.target_key), self.target_key
        if TOKENS_KEY in first:
            return (TOKENS_KEY,), TOKENS_KEY
        raise ValueError(
            f"PaddingCollate expects items with {self.source_key!r} and {self.target_key!r} "
            f"(pairs) or {TOKENS_KEY!r}; got keys {sorted(first)}. Set source_key/target_key."
        )

    def _pad(self, rows: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        lengths = torch.tensor([len(r) for r in rows], dtype=torch.long)
        width = int(lengths.max()) if rows else 0
        m = self.pad_to_multiple_of
        width = -(-width // m) * m
        padded = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        for i, row in enumerate(rows):
            padded[i, : len(row)] = row
        mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
        return padded, mask

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate one micro-batch of items (a :class:`CollatedItems` or a plain list)."""
        if len(items) == 0:
            raise ValueError("PaddingCollate got an empty micro-batch.")
        fields, loss_field = self._fields(items[0])
        info = getattr(items, "info", None)
        limits = [(info or {}).get("truncate_to") or 0, self.truncate_to or 0]
        truncate_to = min((x for x in limits if x), default=0)
        batch: dict[str, Any] = {}
        real: dict[str, int] = {}
        padded_slots = 0
        for field in fields:
            rows = [_as_tokens(item[field], field) for item in items]
            if truncate_to:
                rows = [r[:truncate_to] for r in rows]
            padded, mask = self._pad(rows)
            batch[field], batch[f"{field}_mask"] = padded, mask
            real[field] = sum(len(r) for r in rows)
            padded_slots += padded.numel()
        for name in items[0]:
            if name in fields:
                continue
            values = [item[name] for item in items]
            if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
                batch[name] = torch.tensor(values, dtype=torch.long)
            else:
                batch[name] = values
        ntokens = real[loss_field]
        batch[keys.NTOKENS] = torch.tensor(ntokens)
        batch[keys.NEXAMPLES] = torch.tensor(len(items))
        batch[keys.PADDED_TOKENS] = torch.tensor(padded_slots)
        batch[keys.INPUT_TOKENS] = torch.tensor(sum(real.values()))
        if info is not None:
            self._check(info, ntokens, len(items), loss_field)
            batch[keys.STEP_NTOKENS] = torch.tensor(info["step_ntokens"])
            batch[keys.STEP_NEXAMPLES] = torch.tensor(info["step_nexamples"])
            batch[keys.DATASET] = torch.tensor(info.get("dataset", 0))
            if info.get("world_size"):
                batch[keys.PLAN_WORLD_SIZE] = torch.tensor(info["world_size"])
                batch[keys.PLAN_ACCUMULATE] = torch.tensor(info["accumulate_grad_batches"])
        return batch

    def _check(self, info: Mapping[str, int], ntokens: int, nexamples: int, field: str) -> None:
        if not self.check_ntokens:
            return
        if info["ntokens"] != ntokens:
            where = f"epoch {info['epoch']}, step {info['step']}, micro-batch {info['micro']}"
            raise ValueError(
                f"The micro-batch at {where} has {ntokens} real {field!r} tokens but the plan "
                f"counted {info['ntokens']}: the sampler's `lengths` do not match the dataset. "
                f"Pass one length per example equal to its {field!r} length ((n, 2) "
                "source/target lengths for pairs), or, when the loss tokens deliberately differ, "
                "give the sampler loss_lengths and PaddingCollate(check_ntokens=False)."
            )
        if info["step_nexamples"] < nexamples:
            raise ValueError(
                f"The micro-batch has {nexamples} examples but its step only "
                f"{info['step_nexamples']}: the dataset does not match the sampler's `lengths`."
            )
