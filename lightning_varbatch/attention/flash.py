"""The ``"flash"`` backend: ``flash_attn_varlen_func`` on the real tokens of a packed row.

FlashAttention's varlen kernel (the ``flash-attn`` package) takes CUDA tensors in float16 or
bfloat16 only; it never materialises a ``T x T`` matrix. It leaves rows outside ``cu_seqlens``
(and their gradients) uninitialised, so the padding rows are cut off before the call and zero
rows appended: this costs one host sync to read ``cu_seqlens[-1]``.

Example:
    >>> from lightning_varbatch.attention.choice import flash_problem
    >>> flash_problem(torch.zeros(2, 1, 8)) != ""  # no CUDA here: "flash" cannot run
    True
"""

from __future__ import annotations

import itertools

import torch

from lightning_varbatch.attention.choice import flash_varlen
from lightning_varbatch.attention.packed_row import pad_rows

__all__ = ["flash_attention"]


def flash_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu: list[int],
    max_seqlen: int | None,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """``flash_attn_varlen_func`` on the real tokens, zero rows for the padding (checked args)."""
    function, _ = flash_varlen()
    assert function is not None
    total, real = q.shape[0], cu[-1]
    if real == 0:
        return v.new_zeros((total, q.shape[1], v.shape[2]))
    if max_seqlen is None:
        max_seqlen = max(b - a for a, b in itertools.pairwise(cu))
    cu32 = cu_seqlens.to(device=q.device, dtype=torch.int32)
    # Only the real tokens go in (flash leaves the other rows and their gradients uninitialised).
    out = function(
        q[:real],
        k[:real],
        v[:real],
        cu32,
        cu32,
        max_seqlen,
        max_seqlen,
        dropout_p=0.0,
        softmax_scale=scale,
        causal=causal,
    )
    return pad_rows(out, total)
