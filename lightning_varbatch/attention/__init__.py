"""Document-masked attention for padding-free packed rows (varlen attention).

A packed micro-batch (:class:`~lightning_varbatch.PackingCollate`) lays its examples end to end in
one row of ``T`` tokens, described by ``cu_seqlens`` (``(E + 1,)`` cumulative example lengths from
0, FlashAttention's varlen convention) and ``max_seqlen``. :func:`document_attention` keeps each
token's attention inside its own example (optionally causal), as if each example ran alone; the
alignment padding after ``cu_seqlens[-1]`` affects no real token, outputs zeros, gets no gradient.

Needs torch only (no Lightning). :func:`select_backend` says which backend ``"auto"`` runs, or why
a named one cannot; the modules' roles: ``docs/architecture.md``; measurements: ``docs/packing.md``.
"""

from __future__ import annotations

from lightning_varbatch.attention.choice import BACKENDS, Backend, select_backend
from lightning_varbatch.attention.document import document_attention
from lightning_varbatch.attention.packed_row import document_ids

__all__ = ["BACKENDS", "Backend", "document_attention", "document_ids", "select_backend"]
