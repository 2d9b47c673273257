"""Padding collate for token-budgeted batches, carrying the plan's bookkeeping onto the batch.

:class:`PaddingCollate` pads the token fields of a micro-batch's items and puts the counts of
:mod:`lightning_varbatch.keys` on the batch, checking the real token count against the plan.
What the plan attaches to the items (counts, ids, planned lengths) is :mod:`~.plan_items`'s;
reading token fields, :mod:`~.token_fields`'s (both re-exported here under their old names).

Example:
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
from typing_extensions import Self

from lightning_varbatch import keys
from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.data.columnar import ColumnarItems
from lightning_varbatch.data.plan_items import (
    PlanItems,
    attach_plan,
    batch_info,
    check_map_style,
    count_entries,
    item_label,
    plan_entries,
    static_shape,
)
from lightning_varbatch.data.ragged import Ragged
from lightning_varbatch.data.token_fields import (
    HF_TOKENS_KEY,
    TOKENS_KEY,
    as_tokens,
    check_key,
    other_entries,
    ragged_field,
)
from lightning_varbatch.errors import SettingValueError

__all__ = [
    "HF_TOKENS_KEY",
    "TOKENS_KEY",
    "PaddingCollate",
    "PlanCollate",
    "attach_plan",
    "batch_info",
    "check_key",
    "check_map_style",
    "check_static_width",
    "count_entries",
    "item_label",
    "other_entries",
    "plan_entries",
    "ragged_field",
    "static_shape",
]


def check_static_width(
    ragged: Ragged, field: str, shape: tuple[int, int], items: Sequence[Any]
) -> None:
    """Refuse a field longer than the static shape's length (``max_shapes``): a ValueError."""
    if len(ragged) and int(ragged.lengths.max()) > shape[1]:
        position = int(torch.argmax(ragged.lengths))
        raise ValueError(
            f"Field {field!r} of {item_label(items, position)} has "
            f"{int(ragged.lengths[position])} tokens but its micro-batch's static shape is "
            f"{shape[0]} x {shape[1]}: the sampler's `lengths` understate this field. Pass "
            "lengths that cover every padded field (the longest field of each example)."
        )


class PlanCollate:
    """What both collates share: the plan's truncation and the checks of a micro-batch's size."""

    truncate_to: int | None

    def with_truncation(self, truncate_to: int | None) -> Self:
        """A copy cutting fields to ``truncate_to`` (unless this one already cuts).

        Example:
            >>> PaddingCollate().with_truncation(8).truncate_to
            8
        """
        other = copy.copy(self)
        if other.truncate_to is None:
            other.truncate_to = truncate_to
        return other

    def _limit(self, info: Mapping[str, int | None] | None, extra: int | None = None) -> int:
        """The truncation length in force (0: none): the smallest one set."""
        limits = [(info or {}).get("truncate_to") or 0, self.truncate_to or 0, extra or 0]
        return min((int(x) for x in limits if x), default=0)

    def _check_not_empty(self, items: Sequence[Any]) -> None:
        if len(items) == 0:
            raise ValueError(
                f"{type(self).__name__} got an empty micro-batch: a batch sampler must yield at "
                "least one index per micro-batch; use TokenBudgetBatchSampler, or check that "
                "your own batch sampler never yields an empty list."
            )

    @staticmethod
    def _check_step_examples(info: Mapping[str, int | None], nexamples: int) -> None:
        if (info["step_nexamples"] or 0) < nexamples:
            raise ValueError(
                f"The micro-batch has {nexamples} examples but its step only "
                f"{info['step_nexamples']}: the dataset does not match the sampler's `lengths`."
            )


class PaddingCollate(PlanCollate):
    """Pad token fields into ``(batch, length)`` tensors and add the bookkeeping counts.

    Items are mappings of 1-D LongTensors or lists of ints: ``source``/``target`` pairs (keys
    configurable) or a single ``"tokens"`` field. The batch holds, per field ``f``, the padded ``f``
    and a bool ``f_mask`` (True on real tokens), plus 0-dim long tensors named by
    :mod:`lightning_varbatch.keys`: ``NTOKENS`` (real loss tokens: target tokens, or a single
    field's, minus ``loss_offset`` per example), ``NEXAMPLES``, ``PADDED_TOKENS`` (slots of all
    padded fields), ``INPUT_TOKENS`` (real tokens of all fields) and, on micro-batches of a
    :class:`~lightning_varbatch.TokenBudgetBatchSampler`, the plan's counts of
    :data:`lightning_varbatch.keys.PLAN_COUNTS` (``STEP_NTOKENS``, ``STEP_NEXAMPLES``, ``DATASET``,
    ...). Other item entries are gathered: ints into a ``(batch,)`` long tensor, else a list.

    Args:
        pad_id: the padding token id (an integer).
        pad_to_multiple_of: pad lengths up to a multiple of this (use the sampler's).
        source_key: key of the source field of pairs.
        target_key: key of the target field of pairs.
        truncate_to: cut every field to this length (the sampler's), or to the plan's, if shorter.
        check_ntokens: on a sampler's micro-batches, compare the real loss tokens with the plan's
            (the exact normaliser; off only if loss tokens are not field length - ``loss_offset``).
        check_widths: on a sampler's micro-batches, check that no padded field of any item is
            longer (after truncation) than the plan budgeted, so none exceeds ``max_tokens``.
        loss_offset: loss tokens per example are its real loss-field tokens (after truncation)
            minus this, ≥ 0 (1 to predict ``target[1:]``); checked against the plan's loss lengths.
        tokens_key: the single token field's key (``"tokens"``, else an ``"input_ids"`` field).

    Raises:
        SettingTypeError, SettingValueError: for a bad setting.
        ValueError: non 1-D fields, items missing fields, or (checking) a micro-batch off the plan.
        TypeError: for a non-mapping item, or token ids that are not integers.

    Example:
        >>> collate = PaddingCollate(pad_to_multiple_of=4)
        >>> batch = collate([{"source": [1, 2], "target": [3]},
        ...                  {"source": [4, 5, 6, 7, 8], "target": [9, 9]}])
        >>> tuple(batch["source"].shape), tuple(batch["target"].shape)
        ((2, 8), (2, 4))
        >>> [int(batch[k]) for k in ("ntokens", "padded_tokens", "input_tokens")]
        [3, 24, 10]
        >>> int(PaddingCollate(loss_offset=1)([{"source": [1], "target": [3, 4, 5]}])["ntokens"])
        2
    """

    def __init__(
        self,
        pad_id: int = 0,
        pad_to_multiple_of: int = 1,
        source_key: str = "source",
        target_key: str = "target",
        truncate_to: int | None = None,
        check_ntokens: bool = True,
        check_widths: bool = True,
        loss_offset: int = 0,
        tokens_key: str = TOKENS_KEY,
    ) -> None:
        self.pad_id = check_count(
            "pad_id", pad_id, minimum=-(2**63), what=" (the tokenizer's padding token id)"
        )
        self.pad_to_multiple_of = check_count("pad_to_multiple_of", pad_to_multiple_of)
        self.truncate_to = check_count("truncate_to", truncate_to, allow_none=True)
        for name, key in (
            ("source_key", source_key),
            ("target_key", target_key),
            ("tokens_key", tokens_key),
        ):
            check_key(name, key)
        if source_key == target_key:
            raise SettingValueError(
                f"source_key and target_key must differ, both are {source_key!r}.",
                setting="target_key",
                value=target_key,
            )
        self.source_key = source_key
        self.target_key = target_key
        self.tokens_key = tokens_key
        self.check_ntokens = check_flag("check_ntokens", check_ntokens)
        self.check_widths = check_flag("check_widths", check_widths)
        self.loss_offset = check_count("loss_offset", loss_offset, minimum=0)

    def _fields(self, first: Any, where: str) -> tuple[tuple[str, ...], str]:
        if not isinstance(first, Mapping):
            raise TypeError(
                f"PaddingCollate expects every item to be a mapping (dict) of fields, but "
                f"{where} is a {type(first).__name__}: return e.g. {{{self.source_key!r}: "
                f"ids, {self.target_key!r}: ids}} or {{{self.tokens_key!r}: ids}} from the "
                "dataset, or pass your own collate."
            )
        if self.source_key in first and self.target_key in first:
            return (self.source_key, self.target_key), self.target_key
        if self.tokens_key in first:
            return (self.tokens_key,), self.tokens_key
        if self.tokens_key == TOKENS_KEY and HF_TOKENS_KEY in first:
            return (HF_TOKENS_KEY,), HF_TOKENS_KEY
        raise ValueError(
            f"PaddingCollate expects items with {self.source_key!r} and {self.target_key!r} "
            f"(pairs) or {self.tokens_key!r}; {where} has keys {sorted(map(str, first))}. Set "
            "source_key/target_key (pairs) or tokens_key (one field) to the dataset's field "
            "names."
        )

    def check_item(
        self,
        item: Any,
        index: int,
        planned_length: int | None = None,
        truncate_to: int | None = None,
    ) -> None:
        """Check one dataset item as this collate will see it (run before training).

        Args:
            item: the item (``dataset[index]``).
            index: its index in the dataset, for the message.
            planned_length: the plan's length for it; no padded field may be longer.
            truncate_to: the plan's truncation for this item, if any.

        Raises:
            TypeError: for a non-mapping item or non-integer token ids.
            ValueError: for missing fields, non 1-D fields, or a field over ``planned_length``.

        Example:
            >>> PaddingCollate().check_item({"source": [1, 2], "target": [3]}, 0, 2)
            >>> PaddingCollate().check_item({"source": [1, 2]}, 5)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: PaddingCollate expects items with ... dataset item 5 has keys ['source']...
        """
        items = PlanItems([item], ids=[int(index)])
        fields, _ = self._fields(item, item_label(items, 0))
        for field in fields:
            row = as_tokens(item[field], field, item_label(items, 0))
            width = min([len(row), *(t for t in (truncate_to, self.truncate_to) if t)])
            if planned_length is not None and self.check_widths and width > planned_length:
                raise ValueError(
                    self._width_message(field, item_label(items, 0), width, int(planned_length))
                )

    def _width_message(
        self, field: str, where: str, got: int, planned: int, extra: str = ""
    ) -> str:
        return (
            f"Field {field!r} of {where} has {got} tokens but the plan budgeted a length of "
            f"{planned} for this item{extra}: the sampler's `lengths` understate this field, so "
            "its micro-batch would pad to more slots than max_tokens allows. Pass lengths that "
            "cover every padded field: (n, 2) source/target lengths for pairs, or per example "
            "the longest of its fields; give loss-token counts separately through loss_lengths "
            "(PaddingCollate(check_widths=False) turns this check off)."
        )

    def __call__(self, items: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """Collate one micro-batch of items (a :class:`PlanItems` or a plain list)."""
        self._check_not_empty(items)
        columnar = isinstance(items, ColumnarItems)
        fields, loss_field = self._fields(items[0], item_label(items, 0))
        if not columnar:
            self._check_same_fields(items, fields)
        info = getattr(items, "info", None)
        planned = getattr(items, "planned_lengths", None) if self.check_widths else None
        if planned is not None and len(planned) != len(items):
            planned = None  # a user's dataset wrapper changed the items: nothing to compare
        truncate_to = self._limit(info)
        shape = static_shape(info, len(items))
        batch: dict[str, Any] = {}
        padded_slots = loss_tokens = real_tokens = 0
        for field in fields:
            ragged = ragged_field(items, field).truncate(truncate_to)
            if planned is not None:
                self._check_widths(items, field, ragged.lengths.tolist(), planned)
            if shape is not None:
                check_static_width(ragged, field, shape, items)
            padded, mask = ragged.pad(self.pad_id, self.pad_to_multiple_of, shape)
            batch[field], batch[f"{field}_mask"] = padded, mask
            real_tokens += int(ragged.values.numel())
            if field == loss_field:
                off = self.loss_offset
                lengths = ragged.lengths
                loss_tokens = int((lengths - off).clamp(min=0).sum() if off else lengths.sum())
            padded_slots += padded.numel()
        batch.update(other_entries(items, fields))
        ntokens = loss_tokens
        if info is not None:
            self._check(info, ntokens, len(items), loss_field)
        own = {
            keys.NTOKENS: ntokens,
            keys.NEXAMPLES: len(items),
            keys.PADDED_TOKENS: padded_slots,
            keys.INPUT_TOKENS: real_tokens,
        }
        batch.update(count_entries(own, info))
        return batch

    def _check_same_fields(self, items: Sequence[Any], fields: Sequence[str]) -> None:
        for position, item in enumerate(items):
            if not isinstance(item, Mapping):
                self._fields(item, item_label(items, position))  # raises a TypeError
            missing = [f for f in fields if f not in item]
            if missing:
                raise ValueError(
                    f"{item_label(items, position)} has no field {missing[0]!r} (its keys: "
                    f"{sorted(map(str, item))}) while the micro-batch's first item has "
                    f"{list(fields)}: every item needs the same token fields."
                )

    def _check_widths(
        self, items: Sequence[Any], field: str, lengths: list[int], planned: Sequence[int]
    ) -> None:
        for position, (got, budget) in enumerate(zip(lengths, planned, strict=True)):
            if got > budget:
                m = self.pad_to_multiple_of
                pad_width = -(-max(lengths) // m) * m
                plan_width = -(-max(planned) // m) * m
                extra = (
                    f"; the micro-batch would pad {field!r} to {len(items)} x {pad_width} = "
                    f"{len(items) * pad_width} slots where the plan allowed "
                    f"{len(items)} x {plan_width} = {len(items) * plan_width}"
                )
                raise ValueError(
                    self._width_message(field, item_label(items, position), got, int(budget), extra)
                )

    def _check(
        self, info: Mapping[str, int | None], ntokens: int, nexamples: int, field: str
    ) -> None:
        if not self.check_ntokens:
            return
        if info["ntokens"] != ntokens:
            where = f"epoch {info['epoch']}, step {info['step']}, micro-batch {info['micro']}"
            if self.loss_offset:
                raise ValueError(
                    f"The micro-batch at {where} has {ntokens} loss tokens (real {field!r} "
                    f"tokens minus loss_offset={self.loss_offset} per example) but the plan "
                    f"counted {info['ntokens']}: the sampler's loss_lengths do not match the "
                    f"dataset. Pass loss_lengths equal to each example's {field!r} length minus "
                    f"{self.loss_offset} (after any truncation), or change loss_offset."
                )
            raise ValueError(
                f"The micro-batch at {where} has {ntokens} real {field!r} tokens but the plan "
                f"counted {info['ntokens']}: the sampler's `lengths` do not match the dataset. "
                f"Pass one length per example equal to its {field!r} length ((n, 2) "
                "source/target lengths for pairs), or, when the loss tokens deliberately differ, "
                "give the sampler loss_lengths and PaddingCollate(check_ntokens=False) (the "
                "width check, check_widths, stays on)."
            )
        self._check_step_examples(info, nexamples)
