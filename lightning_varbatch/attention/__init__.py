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

This package needs torch only (no Lightning; from this package only the settings checks of
:mod:`lightning_varbatch.checks`, which need numpy). One module per idea:

* :mod:`~lightning_varbatch.attention.document`: :func:`document_attention`, the entry point;
* :mod:`~lightning_varbatch.attention.packed_row`: the checks of ``q``/``k``/``v`` and
  ``cu_seqlens``, :func:`document_ids`;
* :mod:`~lightning_varbatch.attention.choice`: :func:`select_backend` (``"auto"`` resolved,
  or why a named backend cannot run);
* the backends: :mod:`~lightning_varbatch.attention.flash` (``flash_attn_varlen_func``; CUDA,
  fp16/bf16), :mod:`~lightning_varbatch.attention.flex` (FlexAttention with a document block
  mask; compiled on CUDA, eager and forward-only on CPU) and
  :mod:`~lightning_varbatch.attention.sdpa` (``scaled_dot_product_attention``, everywhere,
  with backward);
* :mod:`~lightning_varbatch.attention.sdpa_cost`: the CPU cost rule that runs ``"sdpa"`` as a
  loop over the examples or as one zero-padded batch.

``"auto"`` picks ``"flash"`` when it is usable (flash-attn importable, CUDA, fp16/bf16), else
``"flex"`` on CUDA when torch has it, else ``"sdpa"``; on CPU it therefore always picks
``"sdpa"``. The measurements behind these choices (CPU FlexAttention's missing backward and
speed, the loop against a block-diagonal mask, the fit of the loop-or-batch rule) are in
"Which backend runs, and what it costs on CPU" of ``docs/packing.md``.

Example:
    >>> import torch
    >>> _ = torch.manual_seed(0)
    >>> cu_seqlens = torch.tensor([0, 3, 5], dtype=torch.int32)  # two examples: 3 + 2 tokens
    >>> q, k, v = (torch.randn(6, 2, 4) for _ in range(3))  # T = 6: one padding token
    >>> out = document_attention(q, k, v, cu_seqlens, max_seqlen=3)
    >>> alone = document_attention(q[3:5], k[3:5], v[3:5], torch.tensor([0, 2]))
    >>> torch.allclose(out[3:5], alone), out[5].abs().sum().item()
    (True, 0.0)
"""

from __future__ import annotations

from lightning_varbatch.attention.choice import BACKENDS, Backend, select_backend
from lightning_varbatch.attention.document import document_attention
from lightning_varbatch.attention.packed_row import document_ids

__all__ = ["BACKENDS", "Backend", "document_attention", "document_ids", "select_backend"]
