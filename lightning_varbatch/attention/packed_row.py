"""A packed row's description: checks of ``q``/``k``/``v`` and ``cu_seqlens``, document ids.

A packed row lays ``E`` examples end to end in ``T`` tokens; ``cu_seqlens`` (``(E + 1,)`` cumulative
example lengths from 0, FlashAttention's varlen convention) says where each starts. Tokens after
``cu_seqlens[-1]`` (the collate's alignment padding) belong to no example. Every backend of
:func:`~lightning_varbatch.attention.document_attention` reads the row through these helpers.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_varbatch.checks import check_count

__all__ = [
    "check_cu_seqlens_tensor",
    "check_cu_seqlens_values",
    "check_qkv",
    "document_ids",
    "pad_rows",
    "token_documents",
]


def check_cu_seqlens_tensor(cu_seqlens: Any) -> None:
    """Raise unless ``cu_seqlens`` is a 1-D int32/int64 tensor with at least one entry.

    Example:
        >>> check_cu_seqlens_tensor([0, 3])
        Traceback (most recent call last):
        TypeError: cu_seqlens must be a 1-D int32 tensor, got list.
    """
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a 1-D int32 tensor, got {type(cu_seqlens).__name__}.")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(
            "cu_seqlens must be a 1-D tensor of E + 1 cumulative example lengths starting "
            f"at 0, got shape {tuple(cu_seqlens.shape)}."
        )
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be int32 (or int64), got {cu_seqlens.dtype}.")


def check_cu_seqlens_values(cu: list[int], total_tokens: int) -> None:
    """Raise unless ``cu`` starts at 0, never decreases and ends at most at ``total_tokens``.

    Example:
        >>> check_cu_seqlens_values([0, 4, 3], 6)
        Traceback (most recent call last):
        ValueError: cu_seqlens must be non-decreasing (cumulative example lengths), got cu_seqlens[1] = 4 > cu_seqlens[2] = 3.
    """  # noqa: E501
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0] = {cu[0]}.")
    for i in range(1, len(cu)):
        if cu[i] < cu[i - 1]:
            raise ValueError(
                "cu_seqlens must be non-decreasing (cumulative example lengths), got "
                f"cu_seqlens[{i - 1}] = {cu[i - 1]} > cu_seqlens[{i}] = {cu[i]}."
            )
    if cu[-1] > total_tokens:
        raise ValueError(
            f"cu_seqlens[-1] = {cu[-1]} exceeds the number of tokens T = {total_tokens}."
        )


def check_qkv(q: Any, k: Any, v: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """The ``(T, H, D)`` views of q, k, v and whether they had a leading batch dim of 1.

    Example:
        >>> x = torch.zeros(1, 5, 2, 4)
        >>> *_, batched = check_qkv(x, x, x)
        >>> batched
        True
    """
    for name, x in (("q", q), ("k", k), ("v", v)):
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"{name} must be a tensor, got {type(x).__name__}.")
    dims = {q.dim(), k.dim(), v.dim()}
    if len(dims) != 1 or dims.pop() not in (3, 4):
        raise ValueError(
            "q, k and v must all be (total_tokens, heads, head_dim) or all (1, total_tokens, "
            f"heads, head_dim), got shapes {tuple(q.shape)}, {tuple(k.shape)}, "
            f"{tuple(v.shape)}."
        )
    batched = q.dim() == 4
    if batched:
        if q.shape[0] != 1 or k.shape[0] != 1 or v.shape[0] != 1:
            raise ValueError(
                "a packed row has batch size 1; got q, k, v of shapes "
                f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)} (flatten the rows "
                "into one: total_tokens = sum of the rows' tokens, with cu_seqlens over all)."
            )
        q, k, v = q[0], k[0], v[0]
    if k.shape != v.shape:
        raise ValueError(
            f"k and v must have the same shape, got {tuple(k.shape)} and {tuple(v.shape)}."
        )
    if q.shape[0] != k.shape[0]:
        raise ValueError(
            f"q has {q.shape[0]} tokens but k and v have {k.shape[0]} (self-attention on one "
            "packed row: the same total_tokens)."
        )
    if q.shape[2] != k.shape[2]:
        raise ValueError(f"q and k head_dim differ: {q.shape[2]} vs {k.shape[2]}.")
    if k.shape[1] < 1 or q.shape[1] % k.shape[1]:
        raise ValueError(
            f"q's heads ({q.shape[1]}) must be a multiple of k/v's heads ({k.shape[1]}) "
            "(equal, or grouped-query attention)."
        )
    if not q.is_floating_point() or q.dtype != k.dtype or q.dtype != v.dtype:
        raise TypeError(
            f"q, k and v must share one floating dtype, got {q.dtype}, {k.dtype}, {v.dtype}."
        )
    if q.device != k.device or q.device != v.device:
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}."
        )
    return q, k, v, batched


def token_documents(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """:func:`document_ids` without checks and without a host sync.

    Example:
        >>> token_documents(torch.tensor([0, 2, 3]), 4).tolist()
        [0, 0, 1, -1]
    """
    positions = torch.arange(total_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    ids = torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)
    return torch.where(ids >= cu_seqlens.numel() - 1, -1, ids)


def document_ids(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """The example index of every token of a packed row; ``-1`` on trailing padding.

    Token ``t`` belongs to example ``i`` when ``cu_seqlens[i] <= t < cu_seqlens[i + 1]``; empty
    examples (repeated entries) own no token. This is the packed collate's ``seq_idx`` row.

    Args:
        cu_seqlens: ``(E + 1,)`` int32/int64 cumulative example lengths starting at 0.
        total_tokens: the row's length ``T`` (at least ``cu_seqlens[-1]``).

    Returns:
        A ``(T,)`` int64 tensor on ``cu_seqlens``'s device.

    Raises:
        TypeError: for a non-tensor or non-integer ``cu_seqlens``.
        ValueError: a bad shape, ``cu_seqlens`` not from 0, decreasing or past ``total_tokens``.

    Example:
        >>> document_ids(torch.tensor([0, 3, 4, 6], dtype=torch.int32), 8).tolist()
        [0, 0, 0, 1, 2, 2, -1, -1]
    """
    check_cu_seqlens_tensor(cu_seqlens)
    total_tokens = check_count("total_tokens", total_tokens, minimum=0)
    check_cu_seqlens_values(cu_seqlens.tolist(), total_tokens)
    return token_documents(cu_seqlens, total_tokens)


def pad_rows(out: torch.Tensor, total: int) -> torch.Tensor:
    """``out`` (real tokens) followed by zero rows up to ``total`` tokens.

    Example:
        >>> pad_rows(torch.ones(2, 1, 1), 2).shape
        torch.Size([2, 1, 1])
    """
    if out.shape[0] == total:
        return out
    return torch.cat([out, out.new_zeros((total - out.shape[0], *out.shape[1:]))])
