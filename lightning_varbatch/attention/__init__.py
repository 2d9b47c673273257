"""Document-masked attention for padding-free packed rows (varlen attention).

A packed micro-batch (:class:`~lightning_varbatch.data.packed_collate.PackingCollate`) lays its
examples end to end in one row of ``T`` tokens and describes them with ``cu_seqlens`` (``(E +
1,)`` cumulative example lengths starting at 0, FlashAttention's varlen convention) and
``max_seqlen``. :func:`document_attention` computes attention on such a row with every token
attending only to tokens of its own example (and, when causal, only to itself and earlier
tokens of that example): the result equals running each example alone through ordinary
attention. Tokens after ``cu_seqlens[-1]`` (the collate's alignment padding) belong to no
example: they never influence a real token, their outputs are exactly zero and no gradient
flows into their ``q``, ``k`` or ``v``.

This package needs torch only (no Lightning). One module per idea:
:mod:`~lightning_varbatch.attention.document` (:func:`document_attention`, the entry point),
:mod:`~lightning_varbatch.attention.packed_row` (the checks of ``q``/``k``/``v`` and
``cu_seqlens``), :mod:`~lightning_varbatch.attention.choice` (:func:`select_backend`: which
backend ``"auto"`` runs, or why a named one cannot), the backends
:mod:`~lightning_varbatch.attention.flash`, :mod:`~lightning_varbatch.attention.flex` and
:mod:`~lightning_varbatch.attention.sdpa`, and :mod:`~lightning_varbatch.attention.sdpa_cost`
(whether ``"sdpa"`` loops over the examples or runs one padded batch). The measurements behind
the choices are in "Which backend runs, and what it costs on CPU" of ``docs/packing.md``.
"""

from __future__ import annotations

from lightning_varbatch.attention.choice import BACKENDS, Backend, select_backend
from lightning_varbatch.attention.document import document_attention
from lightning_varbatch.attention.packed_row import document_ids

__all__ = ["BACKENDS", "Backend", "document_attention", "document_ids", "select_backend"]
