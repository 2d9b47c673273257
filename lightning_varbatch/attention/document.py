"""The entry point: :func:`document_attention` checks a packed row and runs one backend."""

from __future__ import annotations

import itertools

import torch

from lightning_varbatch.attention.choice import Backend, select_backend
from lightning_varbatch.attention.flash import flash_attention
from lightning_varbatch.attention.flex import flex_attention
from lightning_varbatch.attention.packed_row import (
    check_cu_seqlens_tensor,
    check_cu_seqlens_values,
    check_qkv,
)
from lightning_varbatch.attention.sdpa import sdpa_attention
from lightning_varbatch.checks import check_count, check_flag, check_real
from lightning_varbatch.errors import SettingValueError

__all__ = ["document_attention"]


def document_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    max_seqlen: int | None = None,
    *,
    causal: bool = True,
    scale: float | None = None,
    backend: Backend | str = "auto",
    validate: bool = True,
) -> torch.Tensor:
    """Attention on a packed row, kept inside each example (block-diagonal, optionally causal).

    Equals ``scaled_dot_product_attention`` on every example ``q[cu_seqlens[i]:cu_seqlens[i + 1]]``
    alone (per head), concatenated. Tokens after ``cu_seqlens[-1]`` (alignment padding) are outside
    every example: they do not influence real tokens, their outputs are zeros and they receive zero
    gradients. Grouped-query attention is supported (``q`` heads a multiple of ``k``/``v`` heads;
    each key/value head serves consecutive query heads). No dropout.

    Args:
        q: queries, ``(T, H, D)`` (the varlen layout), or ``(1, T, H, D)``.
        k: keys, ``(T, Hkv, D)`` or ``(1, T, Hkv, D)``, ``H`` a multiple of ``Hkv``.
        v: values, the shape of ``k``.
        cu_seqlens: ``(E + 1,)`` int32 (or int64) cumulative example lengths, starting at 0,
            non-decreasing, last entry at most ``T``. Any device (moved as needed).
        max_seqlen: at least the longest example's length (``"flash"`` only; ``None``: computed).
        causal: each token attends only to itself and earlier tokens of its example.
        scale: the softmax scale; default ``1 / sqrt(D)``.
        backend: ``"auto"``, ``"flash"``, ``"flex"`` or ``"sdpa"`` (see :func:`select_backend`).
        validate: check ``cu_seqlens``'s values (start, order, end) and ``max_seqlen`` on the host
            (``"flex"`` need not: ``False`` once the input is trusted); shapes, dtypes: always.

    Returns:
        The attention output, ``(T, H, D)`` (``(1, T, H, D)`` for 4-D inputs), ``q``'s dtype
        and device, zeros on the trailing padding.

    Raises:
        TypeError: for non-tensors, mixed or non-float dtypes, or a non-integer ``cu_seqlens``.
        ValueError: for mismatched shapes, bad ``cu_seqlens`` values, a too small ``max_seqlen``,
            a bad ``scale`` or an unknown backend (a bad setting: a ``SettingError`` subclass).
        RuntimeError: when the requested backend cannot run here (the message says why).

    Example:
        >>> import torch.nn.functional as F
        >>> _ = torch.manual_seed(0)
        >>> q, k, v = (torch.randn(5, 2, 4, dtype=torch.float64) for _ in range(3))
        >>> cu = torch.tensor([0, 2, 5], dtype=torch.int32)
        >>> out = document_attention(q, k, v, cu, max_seqlen=3)
        >>> second = F.scaled_dot_product_attention(  # example 1 alone, heads first
        ...     q[2:].transpose(0, 1), k[2:].transpose(0, 1), v[2:].transpose(0, 1),
        ...     is_causal=True).transpose(0, 1)
        >>> out.shape, torch.allclose(out[2:], second)
        (torch.Size([5, 2, 4]), True)
    """
    q3, k3, v3, batched = check_qkv(q, k, v)
    check_cu_seqlens_tensor(cu_seqlens)
    causal = check_flag("causal", causal)
    if scale is not None:
        scale = check_real(
            "scale", scale, what=" (the softmax scale; pass None for 1/sqrt(head_dim))"
        )
    if max_seqlen is not None:
        max_seqlen = check_count("max_seqlen", max_seqlen, minimum=0)
    validate = check_flag("validate", validate)
    chosen = select_backend(q3, k3, v3, backend)

    total = q3.shape[0]
    host: list[int] | None = None
    if validate or chosen != "flex":
        host = [int(x) for x in cu_seqlens.tolist()]
    if validate:
        assert host is not None
        check_cu_seqlens_values(host, total)
        if max_seqlen is not None and len(host) > 1:
            longest = max(b - a for a, b in itertools.pairwise(host))
            if max_seqlen < longest:
                raise SettingValueError(
                    f"max_seqlen = {max_seqlen} is smaller than the longest example "
                    f"({longest} tokens).",
                    setting="max_seqlen",
                    value=max_seqlen,
                )

    if chosen == "flash":
        assert host is not None
        out = flash_attention(q3, k3, v3, cu_seqlens, host, max_seqlen, causal, scale)
    elif chosen == "flex":
        out = flex_attention(q3, k3, v3, cu_seqlens, causal, scale)
    else:
        assert host is not None
        out = sdpa_attention(q3, k3, v3, host, causal, scale)
    return out.unsqueeze(0) if batched else out
