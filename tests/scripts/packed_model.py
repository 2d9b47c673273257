"""The packed layout of the strategy scripts: ``--layout padded|packed``, model and collate.

``--layout packed`` plans the epoch with ``layout="packed"`` and ``loss_lengths = lengths - 1``
and collates each micro-batch with :class:`~lightning_varbatch.PackingCollate` into one
padding-free row of whole documents. :class:`PackedModel` reads such a row: token and position
embeddings (``position_ids`` restart at every document), one causal self-attention layer through
:func:`~lightning_varbatch.document_attention` (attention stays inside each document), a
residual and the output projection; :func:`packed_loss_sum` sums the next-token losses of the
row's already shifted ``labels`` (``ignore_index=-100`` at every document's end). Run on one
document alone, the model is ordinary causal attention, so the float64 reference in
``tests/strategies/_reference.py`` can compute every document separately.

Like ``hf_source.py`` this module imports nothing from its siblings, so the scripts
(``from packed_model import ...``) and the tests (``tests.scripts.packed_model``) share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from lightning_varbatch import PackingCollate, document_attention

LAYOUTS = ("padded", "packed")
HEADS = 2
IGNORE_INDEX = -100


def pop_layout(argv: list[str]) -> str:
    """Remove ``--layout VALUE`` from ``argv`` (in place) and return VALUE (default ``padded``)."""
    if "--layout" not in argv:
        return "padded"
    at = argv.index("--layout")
    if at + 1 >= len(argv) or argv[at + 1] not in LAYOUTS:
        raise SystemExit(f"--layout needs a value out of {LAYOUTS}")
    layout = argv[at + 1]
    del argv[at : at + 2]
    return layout


class PackedModel(nn.Module):
    """A one-layer causal attention LM on a packed row ``(1, T)``; logits ``(T, vocab)``."""

    def __init__(self, vocab: int, dim: int, positions: int, heads: int = HEADS) -> None:
        super().__init__()
        self.heads = heads
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(positions, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, vocab)

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        cu_seqlens: torch.Tensor,
        max_seqlen: int,
    ) -> torch.Tensor:
        h = self.embed(input_ids[0]) + self.position(position_ids[0])  # (T, dim)
        total, dim = h.shape
        q, k, v = self.qkv(h).view(total, 3, self.heads, dim // self.heads).unbind(1)
        mixed = document_attention(q, k, v, cu_seqlens, max_seqlen, causal=True)
        return self.out(h + torch.tanh(mixed.reshape(total, dim)))


def make_packed_model(vocab: int, dim: int, positions: int, seed: int) -> PackedModel:
    torch.manual_seed(seed)
    return PackedModel(vocab, dim, positions)


def packed_loss_sum(model: nn.Module, batch: dict[str, Any]) -> torch.Tensor:
    """Sum of the next-token cross entropies of one packed row (labels already shifted)."""
    logits = model(
        batch["input_ids"], batch["position_ids"], batch["cu_seqlens"], batch["max_seqlen"]
    )
    return nn.functional.cross_entropy(
        logits, batch["labels"][0], ignore_index=IGNORE_INDEX, reduction="sum"
    )


class RecordingPackingCollate(PackingCollate):
    """The library's packing collate, plus what the scripts record of every micro-batch.

    ``ids`` (the ``id`` entry as a list, in row order), the plan's ``step`` and ``micro`` and
    ``collated_from`` (the type of the items: ``ColumnarItems`` for an Arrow read).
    """

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        batch = super().__call__(items)
        info = getattr(items, "info", None) or {}
        batch["ids"] = batch.pop("id").tolist()
        batch["step"] = info.get("step")
        batch["micro"] = info.get("micro")
        batch["collated_from"] = type(items).__name__
        return batch


def row_record(batch: dict[str, Any]) -> dict[str, Any]:
    """What a packed micro-batch looked like: its shape and document boundaries."""
    return {
        "row_shape": list(batch["input_ids"].shape),
        "cu_seqlens": batch["cu_seqlens"].tolist(),
        "max_seqlen": int(batch["max_seqlen"]),
        "labelled": int((batch["labels"] != IGNORE_INDEX).sum()),
    }
