"""Document-masked attention for padding-free packed rows (varlen attention).

A packed micro-batch (:class:`~lightning_varbatch.PackingCollate`) lays its examples end to end
in one row of ``T`` tokens, described by ``cu_seqlens`` (``(E + 1,)`` cumulative example lengths
from 0, FlashAttention's varlen convention) and ``max_seqlen``. :func:`document_attention` lets
every token attend only to its own example (when causal, to itself and earlier tokens of it):
the result equals running each example alone through ordinary attention. Tokens after
``cu_seqlens[-1]`` (alignment padding) belong to no example: they never influence a real token,
their outputs are exactly zero and no gradient flows into their ``q``, ``k`` or ``v``.

Needs torch only (no Lightning). Modules: ``document`` (:func:`document_attention`, the entry
point), ``packed_row`` (checks of ``q``/``k``/``v`` and ``cu_seqlens``), ``choice``
(:func:`select_backend`: which backend ``"auto"`` runs, or why a named one cannot), the backends
``flash``, ``flex`` and ``sdpa``, and ``sdpa_cost`` (whether ``"sdpa"`` loops over the examples
or runs one padded batch). Measurements behind the choices: "Which backend runs, and what it
costs on CPU" in ``docs/packing.md``.
"""

from __future__ import annotations

from lightning_varbatch.attention.choice import BACKENDS, Backend, select_backend
from lightning_varbatch.attention.document import document_attention
from lightning_varbatch.attention.packed_row import document_ids

__all__ = ["BACKENDS", "Backend", "document_attention", "document_ids", "select_backend"]
