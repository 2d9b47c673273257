"""The ``"sdpa"`` backend: ``scaled_dot_product_attention`` kept inside each example.

Two exact ways, chosen per call by :func:`~lightning_varbatch.attention.sdpa_cost.sdpa_batches`:

* the *loop* (:func:`sdpa_loop`): one call per example on that example's slice (``is_causal``
  for causal attention), results concatenated; work ``O(sum of len**2)`` per head, never
  ``O(T**2)``, but a fixed overhead per call;
* the *batch* (:func:`sdpa_padded`): the examples copied (one ``index_copy``) into a
  zero-padded ``(E, Lmax)`` batch, ONE call (``is_causal`` alone for causal attention, as the
  padding comes after every real query's keys; a ``(E, 1, 1, Lmax)`` key-padding mask for
  non-causal), the real rows gathered back (one ``index_select``).

Both equal each example alone (float64 outputs and gradients), have a backward on every supported
device, dtype and torch, read ``cu_seqlens`` on the host once, and zero the trailing padding.
"""

from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from lightning_varbatch.attention.packed_row import pad_rows
from lightning_varbatch.attention.sdpa_cost import sdpa_batches

__all__ = ["sdpa_attention", "sdpa_loop", "sdpa_padded"]


def sdpa_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: list[int],
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """SDPA per example, looped or batched (``sdpa_batches``), on document_attention's checked args.

    Example:
        >>> x = torch.randn(4, 1, 2)
        >>> torch.equal(sdpa_attention(x, x, x, [0], causal=True, scale=None), x * 0)
        True
    """
    total, heads = q.shape[0], q.shape[1]
    sizes = [b - a for a, b in itertools.pairwise(cu) if b > a]
    if not sizes:
        return v.new_zeros((total, heads, v.shape[2]))
    if sdpa_batches(sizes):
        return sdpa_padded(q, k, v, sizes, cu[-1], causal, scale)
    return sdpa_loop(q, k, v, sizes, cu[-1], causal, scale)


def sdpa_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sizes: list[int],
    real: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """One ``scaled_dot_product_attention`` per non-empty example (``sizes``), concatenated.

    ``real`` is the tokens of all examples (contiguous from token 0); the rest are padding.

    Example:
        >>> x = torch.randn(5, 1, 2)
        >>> sdpa_loop(x, x, x, [2, 2], 4, causal=False, scale=None)[4].abs().sum().item()
        0.0
    """
    total, heads = q.shape[0], q.shape[1]
    if k.shape[1] != heads:  # grouped-query attention (SDPA's enable_gqa needs torch >= 2.5)
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    # split, not slice: a split's backward is one concatenation, a slice's a full-size zero grad
    chunks = zip(*(x.split([*sizes, total - real]) for x in (q, k, v)), strict=True)
    outs = [
        F.scaled_dot_product_attention(
            qi.transpose(0, 1).unsqueeze(0),
            ki.transpose(0, 1).unsqueeze(0),
            vi.transpose(0, 1).unsqueeze(0),
            is_causal=causal,
            scale=scale,
        )[0].transpose(0, 1)
        for (qi, ki, vi), _ in zip(chunks, sizes, strict=False)
    ]
    outs.append(v.new_zeros((total - real, heads, v.shape[2])))  # the padding (maybe none)
    return torch.cat(outs)


def sdpa_padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sizes: list[int],
    real: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """One ``scaled_dot_product_attention`` on the examples as a zero-padded batch.

    The real tokens (non-empty examples ``sizes``, contiguous from token 0) are copied into a zero
    ``(E, Lmax)`` batch (right padding), one call runs, the real rows are gathered back. Causal:
    ``is_causal`` alone suffices, as a real query (position ``i < L_e``) only sees keys ``<= i``,
    all real. Non-causal: a key-padding mask, unless every example is ``Lmax`` long. No query row is
    fully masked (every example has a real first key) and the padded slots hold zeros (never the
    row's own padding tokens), so the discarded padded rows are finite and, receiving a zero
    gradient, send none back. The kernel does not materialise the ``E x Lmax x Lmax`` scores.

    Example:
        >>> x = torch.randn(5, 1, 2, dtype=torch.float64)
        >>> a = sdpa_padded(x, x, x, [3, 1], 4, causal=True, scale=None)
        >>> torch.allclose(a, sdpa_loop(x, x, x, [3, 1], 4, causal=True, scale=None))
        True
    """
    total, heads, kv_heads = q.shape[0], q.shape[1], k.shape[1]
    count, longest = len(sizes), max(sizes)
    device = q.device
    lengths = torch.tensor(sizes, device=device)
    slot: torch.Tensor | None = None  # slot of every real token in the flat (E * Lmax) batch
    if count * longest != real:  # (else every example is Lmax long: the batch is a view)
        starts = torch.cumsum(lengths, 0) - lengths
        doc = torch.repeat_interleave(torch.arange(count, device=device), lengths, output_size=real)
        slot = torch.arange(real, device=device) + doc * longest - starts[doc]

    def batch(x: torch.Tensor) -> torch.Tensor:
        """``(E, heads, Lmax, D)``: ``x``'s real tokens in their slots, zeros elsewhere."""
        if real != total:  # split, not slice: no full-size zero gradient in the backward
            x = x.split([real, total - real])[0]
        if slot is not None:
            x = x.new_zeros((count * longest, *x.shape[1:])).index_copy_(0, slot, x)
        return x.view(count, longest, *x.shape[1:]).transpose(1, 2)

    qb, kb, vb = batch(q), batch(k), batch(v)
    if kv_heads != heads:  # grouped-query attention (SDPA's enable_gqa needs torch >= 2.5)
        kb = kb.repeat_interleave(heads // kv_heads, dim=1)
        vb = vb.repeat_interleave(heads // kv_heads, dim=1)
    mask = None
    if not causal and min(sizes) < longest:
        keys = torch.arange(longest, device=device)
        mask = (keys < lengths[:, None])[:, None, None, :]  # (E, 1, 1, Lmax): real keys
    out = F.scaled_dot_product_attention(qb, kb, vb, attn_mask=mask, is_causal=causal, scale=scale)
    out = out.transpose(1, 2).reshape(count * longest, heads, v.shape[2])
    if slot is not None:
        out = out.index_select(0, slot)
    return pad_rows(out, total)
