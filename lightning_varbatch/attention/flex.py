"""The ``"flex"`` backend: FlexAttention with a document (and causal) block mask.

``torch.nn.attention.flex_attention`` (torch >= 2.5) with a
:func:`~torch.nn.attention.flex_attention.create_block_mask` whose ``mask_mod`` compares the
tokens' document ids (plus causality); no host sync. On CUDA (and other accelerators) it runs
through ``torch.compile`` (compiled once per process and shape family, then a fused
block-sparse kernel; the first call compiles for a while, and a row length ``T`` that changes
between batches costs one more compile before torch marks it dynamic). On CPU it runs
eagerly, forward only (CPU FlexAttention has no backward; see ``docs/packing.md``). Its kernel
computes the partially masked blocks, so a non-finite ``k``/``v`` in *another example* would
leak (``0 * nan``): padding rows are zeroed before the call.

Example:
    >>> q = k = v = torch.randn(6, 2, 4)
    >>> cu = torch.tensor([0, 3, 5])
    >>> out = q if flex_module()[0] is None else flex_attention(q, k, v, cu, True, None)
    >>> flex_module()[0] is None or out[5].abs().sum().item() == 0.0
    True
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

from lightning_varbatch.attention.choice import flex_module
from lightning_varbatch.attention.packed_row import token_documents

__all__ = ["compiled_flex", "flex_attention"]

_COMPILED_FLEX: Callable[..., torch.Tensor] | None = None


def compiled_flex() -> Callable[..., torch.Tensor]:
    """``torch.compile(flex_attention)``, created on first use and shared by every call."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        module, _ = flex_module()
        _COMPILED_FLEX = torch.compile(module.flex_attention)
    return _COMPILED_FLEX


def flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """FlexAttention inside each example, zero padding (``document_attention``'s args; no sync)."""
    module, _ = flex_module()
    total = q.shape[0]
    if total == 0 or cu_seqlens.numel() == 1:  # no token, or no example: nothing to attend
        return v.new_zeros((total, q.shape[1], v.shape[2]))
    docs = token_documents(cu_seqlens.to(q.device), total)

    def mask_mod(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        keep = (docs[q_idx] == docs[kv_idx]) & (docs[q_idx] >= 0)
        return keep & (q_idx >= kv_idx) if causal else keep

    block_mask = module.create_block_mask(mask_mod, None, None, total, total, device=q.device)
    real = (docs >= 0)[:, None, None]
    zero = q.new_zeros(())
    # Padding rows zeroed: the kernel multiplies whole blocks; a non-finite one leaks (0 * nan).
    args = tuple(torch.where(real, x, zero).transpose(0, 1)[None] for x in (q, k, v))
    kwargs: dict[str, Any] = {"block_mask": block_mask, "scale": scale}
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    if q.device.type == "cpu":  # eager on CPU (see the module docstring); silence its warning
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without")
            out = module.flex_attention(*args, **kwargs)
    else:
        out = compiled_flex()(*args, **kwargs)
    out = out[0].transpose(0, 1)
    # Padding queries see no key (a fully masked row): zero them explicitly, whatever the kernel.
    return torch.where(real, out, zero)
