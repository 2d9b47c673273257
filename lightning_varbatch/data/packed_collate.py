"""Padding-free packing: a micro-batch's examples concatenated into one row, for varlen attention.

:class:`PackingCollate` lays a ``layout="packed"`` micro-batch end to end in one row ``(1, T)``
and returns what a variable-length attention kernel needs to keep attention inside each
example (FlashAttention's ``cu_seqlens``/``max_seqlen``, restarting ``position_ids``,
``seq_idx``). Its ``labels`` are *already shifted*: compute the loss with no further shift,
and do not pass them to a Hugging Face model's ``forward`` (which shifts labels itself).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lightning_varbatch import keys
from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.data.collate import PlanCollate
from lightning_varbatch.data.columnar import ColumnarItems
from lightning_varbatch.data.plan_items import attach_plan, count_entries, item_label
from lightning_varbatch.data.ragged import Ragged
from lightning_varbatch.data.token_fields import (
    HF_TOKENS_KEY,
    TOKENS_KEY,
    check_key,
    other_entries,
    ragged_field,
)
from lightning_varbatch.errors import SettingValueError

__all__ = ["PACKED_KEYS", "PackingCollate"]

PACKED_KEYS: tuple[str, ...] = (
    "input_ids",
    "position_ids",
    "cu_seqlens",
    "max_seqlen",
    "seq_idx",
    "labels",
)
"""The model-input entries of a packed batch (item entries may not use these names)."""

_COUNTS = (keys.NTOKENS, keys.NEXAMPLES, keys.PADDED_TOKENS, keys.INPUT_TOKENS)


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class PackingCollate(PlanCollate):
    """Pack a micro-batch of token sequences into one padding-free row (varlen attention).

    Items are mappings whose ``field`` (default ``"tokens"``) holds 1-D integer token ids (or a
    Hugging Face dataset's Arrow rows), concatenated in micro-batch order. The batch holds:

    * ``input_ids``: ``(1, T)`` long, the tokens, then ``pad_id`` up to ``T`` (count aligned);
    * ``position_ids``: ``(1, T)`` long, ``0 .. len - 1`` per example (``0`` on padding);
    * ``cu_seqlens``: ``(E + 1,)`` int32 cumulative lengths from 0; ``max_seqlen``, a Python int;
    * ``seq_idx``: ``(1, T)`` long, every token's example (``0 .. E - 1``; ``-1`` on padding);
    * ``labels``: ``(1, T)`` long, *shifted*: the next token of the same example, and
      ``ignore_index`` at every example's last token and on padding. Use
      ``cross_entropy(logits, labels, ignore_index=ignore_index)`` without shifting again;
    * the counts of :mod:`lightning_varbatch.keys`: ``NTOKENS`` (labels that are not
      ``ignore_index``: Σ ``len - 1``), ``NEXAMPLES`` (``E``), ``PADDED_TOKENS`` (``T``),
      ``INPUT_TOKENS`` (real tokens) and, from a ``TokenBudgetBatchSampler``, the plan's counts
      (``STEP_NTOKENS`` ...) for an exact :func:`~lightning_varbatch.loss.step_token_mean`;
    * the items' other entries: ints as an ``(E,)`` long tensor, anything else as a list.

    Plan with ``layout="packed"`` and ``loss_lengths = lengths - 1`` (one label fewer than tokens),
    and give the collate the sampler's ``pad_to_multiple_of``: no row then exceeds ``max_tokens``.
    Truncation cuts each example's *input*; the last kept token's label is still its next token:
    ``min(len - 1, truncate_to)`` labels, as planned. One row, by design: equal-length rows would
    add padding a packed plan does not budget (``(batch, length)`` input: ``PaddingCollate``).

    Args:
        field: the item key of the token ids.
        pad_id: the token id of the alignment padding.
        pad_to_multiple_of: round the row's length up to a multiple of this (alignment only).
        truncate_to: cut every example to this many input tokens (the sampler's ``truncate_to``).
        check_ntokens: on a sampler's micro-batches, compare ``NTOKENS`` with the plan's count.
        check_widths: on a sampler's micro-batches, check ``T`` ≤ the planned lengths' sum, aligned.
        ignore_index: the label of positions without a prediction (last tokens, padding).
        tokens_key: ``field``'s newer name; by default, items without it use ``"input_ids"``.

    Raises:
        ValueError: for bad settings, an empty micro-batch, non 1-D token fields, an item without
            ``field`` or with a packed field's name, or (checking) a micro-batch off the plan.
        TypeError: for a non-mapping item, non-integer token ids or bad setting types.

    Example:
        >>> batch = PackingCollate(pad_to_multiple_of=4)([{"tokens": [5, 6, 7], "id": 3},
        ...                                               {"tokens": [8, 9], "id": 1}])
        >>> batch["input_ids"].tolist(), batch["position_ids"].tolist()
        ([[5, 6, 7, 8, 9, 0, 0, 0]], [[0, 1, 2, 0, 1, 0, 0, 0]])
        >>> batch["labels"].tolist()
        [[6, 7, -100, 9, -100, -100, -100, -100]]
        >>> batch["seq_idx"].tolist(), batch["cu_seqlens"].tolist(), batch["max_seqlen"]
        ([[0, 0, 0, 1, 1, -1, -1, -1]], [0, 3, 5], 3)
        >>> [int(batch[k]) for k in ("ntokens", "nexamples", "padded_tokens", "input_tokens")]
        [3, 2, 8, 5]
        >>> batch["id"].tolist()
        [3, 1]
    """

    def __init__(
        self,
        field: str = "tokens",
        pad_id: int = 0,
        pad_to_multiple_of: int = 1,
        truncate_to: int | None = None,
        check_ntokens: bool = True,
        check_widths: bool = True,
        ignore_index: int = -100,
        tokens_key: str | None = None,
    ) -> None:
        check_key("field", field)
        if tokens_key is not None:
            check_key("tokens_key", tokens_key)
            if field not in (TOKENS_KEY, tokens_key):
                raise SettingValueError(
                    f"field={field!r} and tokens_key={tokens_key!r} name two token fields: "
                    "pass one of them (tokens_key; field is its older name).",
                    setting="tokens_key",
                    value=tokens_key,
                )
            field = tokens_key
        if field in PACKED_KEYS and field != HF_TOKENS_KEY:
            raise SettingValueError(
                f"tokens_key={field!r} is the name of a packed output; rename the dataset's "
                f"token column (the batch's entries are {list(PACKED_KEYS)}).",
                setting="tokens_key",
                value=field,
            )
        self.field = field
        self.pad_id = check_count(
            "pad_id", pad_id, minimum=-(2**63), what=" (the padding token id)"
        )
        self.pad_to_multiple_of = check_count("pad_to_multiple_of", pad_to_multiple_of)
        self.truncate_to = check_count("truncate_to", truncate_to, allow_none=True)
        self.check_ntokens = check_flag("check_ntokens", check_ntokens)
        self.check_widths = check_flag("check_widths", check_widths)
        self.ignore_index = check_count(
            "ignore_index", ignore_index, minimum=-(2**63), what=" (the label of no prediction)"
        )

    @property
    def tokens_key(self) -> str:
        """The item key of the token ids (``field``'s newer name, as in PaddingCollate)."""
        return self.field

    def _field_of(self, items: Sequence[Any]) -> str:
        """The token field of ``items``: ``field``, or ``"input_ids"`` found for the default."""
        if self.field != TOKENS_KEY or not len(items):
            return self.field
        names: Any = ()
        if isinstance(items, ColumnarItems):
            names = items.column_names
        elif isinstance(items[0], Mapping):
            names = items[0]
        if TOKENS_KEY not in names and HF_TOKENS_KEY in names:
            return HF_TOKENS_KEY
        return self.field

    def check_item(
        self,
        item: Any,
        index: int,
        planned_length: int | None = None,
        truncate_to: int | None = None,
    ) -> None:
        """Check one dataset item before training, as :meth:`PaddingCollate.check_item`.

        Example:
            >>> PackingCollate().check_item({"tokens": [1, 2]}, 0, 2)
            >>> PackingCollate().check_item({"text": "hi"}, 5)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            ValueError: PackingCollate expects a 'tokens' field but dataset item 5 has keys ...
        """
        items = attach_plan([item], [int(index)])
        field = self._field_of(items)
        self._check_items(items, field)
        ragged = ragged_field(items, field).truncate(self._limit(None, truncate_to))
        got = int(ragged.values.numel())
        if planned_length is not None and self.check_widths and got > planned_length:
            raise ValueError(self._width_message(item_label(items, 0), got, int(planned_length)))

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        """Pack one micro-batch (plan-carrying items, :class:`ColumnarItems` or a plain list)."""
        self._check_not_empty(items)
        field = self._field_of(items)
        self._check_items(items, field)
        info = getattr(items, "info", None)
        batch = self._pack(ragged_field(items, field), self._limit(info))
        lengths: list[int] = batch.pop("_lengths")
        planned = getattr(items, "planned_lengths", None) if self.check_widths else None
        if planned is not None and len(planned) == len(items):
            self._check_width(items, lengths, planned, int(batch[keys.PADDED_TOKENS]))
        others = other_entries(items, (field,))
        clash = sorted(set(others) & (set(PACKED_KEYS) | set(batch)))
        if clash:
            raise ValueError(
                f"The items have entries {clash}, which are names of the packed batch's own "
                "entries: remove or rename them in the dataset (e.g. "
                "ds.remove_columns([...]) for a Hugging Face dataset); PackingCollate builds "
                "the labels from the token field itself."
            )
        batch.update(others)
        if info is not None:
            self._check_plan(info, int(batch[keys.NTOKENS]), len(items))
        counts = {k: batch.pop(k) for k in _COUNTS}
        batch.update(count_entries(counts, info))
        return batch

    def _pack(self, ragged: Ragged, limit: int) -> dict[str, Any]:
        """The packed entries and counts of one field, vectorised over all tokens."""
        values, full = ragged.values, ragged.lengths
        count = len(ragged)
        example, position = ragged.positions()
        # A token's label is the next token of its example, from the full (uncut) example.
        has_next = position + 1 < full[example]
        following = torch.roll(values, -1) if values.numel() else values
        labels = torch.where(has_next, following, torch.tensor(self.ignore_index))
        lengths = full
        if limit and count and int(full.max()) > limit:
            keep = position < limit
            values, labels, example, position, has_next = (
                t[keep] for t in (values, labels, example, position, has_next)
            )
            lengths = full.clamp(max=limit)
        real = int(values.shape[0])
        width = _round_up(real, self.pad_to_multiple_of)

        def row(filled: torch.Tensor, pad: int) -> torch.Tensor:
            out = torch.full((1, width), pad, dtype=torch.long)
            out[0, :real] = filled
            return out

        cu_seqlens = torch.zeros(count + 1, dtype=torch.int32)
        cu_seqlens[1:] = torch.cumsum(lengths, 0)
        return {
            "input_ids": row(values, self.pad_id),
            "position_ids": row(position, 0),
            "cu_seqlens": cu_seqlens,
            "max_seqlen": int(lengths.max()) if count else 0,
            "seq_idx": row(example, -1),
            "labels": row(labels, self.ignore_index),
            keys.NTOKENS: int(has_next.sum()),
            keys.NEXAMPLES: count,
            keys.PADDED_TOKENS: width,
            keys.INPUT_TOKENS: real,
            "_lengths": lengths.tolist(),
        }

    def _check_items(self, items: Sequence[Any], field: str) -> None:
        """Every item a mapping with the token field (Arrow rows: the column exists)."""
        if isinstance(items, ColumnarItems):
            if field not in items.column_names:
                raise ValueError(
                    f"PackingCollate expects a {field!r} column but the dataset has "
                    f"columns {items.column_names}: set PackingCollate(tokens_key=...) to the "
                    "column of token ids."
                )
            return
        for position, item in enumerate(items):
            if not isinstance(item, Mapping):
                raise TypeError(
                    f"PackingCollate expects every item to be a mapping (dict) of fields, but "
                    f"{item_label(items, position)} is a {type(item).__name__}: return e.g. "
                    f"{{{field!r}: ids}} from the dataset, or pass your own collate."
                )
            if field not in item:
                raise ValueError(
                    f"PackingCollate expects a {field!r} field but "
                    f"{item_label(items, position)} has keys {sorted(map(str, item))}: set "
                    "PackingCollate(tokens_key=...) to the key of the token ids."
                )

    def _width_message(self, where: str, got: int, planned: int, extra: str = "") -> str:
        return (
            f"Field {self.field!r} of {where} has {got} tokens but the plan budgeted a length "
            f"of {planned} for this item{extra}: the sampler's `lengths` understate this "
            "field, so the packed row would exceed max_tokens. Pass each example's token "
            f"count ({self.field!r} length) as lengths, with layout='packed' and loss_lengths = "
            "lengths - 1 (PackingCollate(check_widths=False) turns this check off)."
        )

    def _check_width(
        self, items: Sequence[Any], lengths: list[int], planned: Sequence[int], width: int
    ) -> None:
        allowed = _round_up(int(sum(planned)), self.pad_to_multiple_of)
        if width <= allowed:
            return
        over = [i for i, (got, most) in enumerate(zip(lengths, planned, strict=True)) if got > most]
        position = over[0] if over else 0  # a row over the budget has an item over its own
        extra = (
            f"; the packed row would hold {width} token slots where the plan allowed "
            f"{allowed} (its planned lengths, {int(sum(planned))} tokens, rounded up to "
            f"pad_to_multiple_of={self.pad_to_multiple_of})"
        )
        raise ValueError(
            self._width_message(
                item_label(items, position), lengths[position], int(planned[position]), extra
            )
        )

    def _check_plan(self, info: Mapping[str, int | None], ntokens: int, nexamples: int) -> None:
        if not self.check_ntokens:
            return
        if info["ntokens"] != ntokens:
            where = f"epoch {info['epoch']}, step {info['step']}, micro-batch {info['micro']}"
            raise ValueError(
                f"The packed micro-batch at {where} has {ntokens} loss tokens (labels: each "
                f"example's {self.field!r} length minus 1, since its last token has no next "
                f"token to predict) but the plan counted {info['ntokens']}: build the sampler "
                f"with layout='packed' and loss_lengths = lengths - 1, where lengths are the "
                f"examples' {self.field!r} lengths (after any truncation the planner "
                "applies), or turn the check off with PackingCollate(check_ntokens=False) "
                "when the loss tokens deliberately differ (the width check stays on)."
            )
        self._check_step_examples(info, nexamples)
