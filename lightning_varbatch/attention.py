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

This module needs torch only (no Lightning, nothing else from this package). Three backends:

``"flash"``
    ``flash_attn.flash_attn_varlen_func`` (the ``flash-attn`` package): CUDA tensors in
    float16 or bfloat16 only. Fastest on GPUs; never materialises a ``T x T`` matrix. The
    padding rows are cut off before the call (flash leaves rows outside ``cu_seqlens``
    uninitialised) and zeros appended; this costs one host sync to read ``cu_seqlens[-1]``.
``"flex"``
    ``torch.nn.attention.flex_attention`` (torch >= 2.5) with a
    :func:`~torch.nn.attention.flex_attention.create_block_mask` whose ``mask_mod`` compares
    the tokens' document ids (plus causality). On CUDA (and other accelerators) it runs
    through ``torch.compile`` (compiled once per process and shape family, then a fused
    block-sparse kernel; the first call compiles for a while, and a row length ``T`` that
    changes between batches costs one more compile before torch marks it dynamic). On CPU it
    runs eagerly, forward only. Its kernel computes the partially masked blocks, so a
    non-finite ``k``/``v`` in *another example* would leak (``0 * nan``); padding rows are
    zeroed before the call, and ``"sdpa"`` and ``"flash"`` never read other examples.
``"sdpa"``
    :func:`torch.nn.functional.scaled_dot_product_attention`, one of two ways chosen per call
    by a cost rule (``_sdpa_batches``, below). The *loop*: one call per example on that
    example's slice (``is_causal`` for causal attention), results concatenated; work
    ``O(sum of len**2)`` per head, never ``O(T**2)``, but a fixed overhead per call
    (about 0.15 ms forward+backward on CPU at 8 heads x 64). The *batch*: the examples copied (one
    ``index_copy`` from index tensors built from ``cu_seqlens``) into a zero-padded ``(E,
    Lmax)`` batch, ONE call (``is_causal`` alone for causal attention, as the padding comes
    after every real query's keys; a ``(E, 1, 1, Lmax)`` key-padding mask for non-causal),
    the real rows gathered back (one ``index_select``). Both are exact (float64 equal to
    every example alone, outputs and gradients). Works on every device, dtype and torch
    version this package supports, with backward. Either way one host sync (to read
    ``cu_seqlens``).

``"auto"`` picks ``"flash"`` when it is usable (flash-attn importable, CUDA, fp16/bf16), else
``"flex"`` on CUDA when torch has it, else ``"sdpa"``. On CPU it therefore always picks
``"sdpa"``. Measured with torch 2.13.0+cpu on a 2-core machine (1 thread, 8 heads, head
dimension 64, float32):

* FlexAttention has **no backward on CPU**: with any input that requires grad it raises
  ``NotImplementedError("FlexAttention does not support backward on CPU")``, eagerly and
  under ``torch.compile`` alike, so it cannot train on CPU.
* Eager flex (what ``flex_attention`` does outside ``torch.compile``: an unfused path that
  materialises the scores, with a performance warning) is slow: forward of a ``T = 2048``
  row of 8 examples took about 2.7 s, against about 0.05-0.15 s for ``"sdpa"`` (per-example
  loop) and about 0.4 s for a single SDPA call with a ``T x T`` block-diagonal boolean mask.
  Its first call also traces the mask (about 1-3 s once per process).
* Compiled flex on CPU (``torch.compile(flex_attention)``, inductor C++ code) took about 25 s
  to compile (for ``T = 40`` as for ``T = 2048``), then about 0.1 s per ``T = 2048``
  forward, on par with ``"sdpa"``; it rejects float64 (``float32``, ``float16`` and
  ``bfloat16`` only). Forward only, so the compile is not worth it here: ``"flex"`` on CPU
  runs eagerly (for inference or cross-checks).
* The per-example ``"sdpa"`` loop beat the block-diagonal-mask variant at every measured mix
  (``T = 2048``, fwd+bwd: 4 examples 0.54 s vs 1.41 s; 64 examples 0.10 s vs 1.44 s; 512
  examples 0.40 s vs 1.76 s), because it skips the masked-out blocks and CPU SDPA (a
  flash-style kernel, float64 included) turns a boolean mask into a dense ``T x T`` float
  bias. So the mask variant is not offered.

Loop or batch in ``"sdpa"`` (the rule of ``_sdpa_batches``): batched when ``E * Lmax * (Lmax
+ 128) <= sum(L_i * (L_i + 128)) + 1536 * E`` and ``E * Lmax <= 4 * sum(L_i)``, i.e. when the
attention work of the padded batch, plus a per-slot cost of the copies, is below the loop's
work plus its per-call overhead, with the padded batch at most four times the real tokens.
The constants come from a least-squares fit of fwd+bwd timings (8 heads x 64, float32,
1 thread): about 0.15 ms per call of the loop, about 15 us per padded token slot (memory
traffic: zeros, copies and their backward), about 80-95 ns per ``(query, key)`` pair, on a
busy shared 2-core machine (timings varied by 20-50% between repeats). Per layer forward +
backward, ``T = 2048``, one lognormal row (``numpy`` lognormal, sigma 0.5 or 1, scaled to
the row), old loop / forced batch / rule:

* sigma 0.5, causal: 4 examples (longest 876) 165 / 342 / 161 ms; 64 examples (longest 112)
  37 / 179 / 39 ms; 512 examples (longest 16) 87 / 120 / 79 ms (the rule keeps the loop).
* sigma 1, causal: 4 examples (longest 1251) 131 / 406 / 130 ms; 64 (longest 297) 36 / 703 /
  34 ms; 512 (longest 53) 56 / 469 / 52 ms (loop). Non-causal alike (batch 1.4-13x slower).
* Similar lengths, causal: 128 examples of 16 tokens 49 / 13 / 15 ms; 256 examples of 3-8
  tokens 44 / 30 / 27 ms; 512 of 4 tokens 83 / 16 / 15 ms (the rule batches).

So with skewed (lognormal) lengths one long example makes the padded batch cost ``E *
Lmax**2`` and the loop stays; the batch pays off for many short examples of similar
lengths, where the loop's per-call overhead dominates (3-5x faster there).

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

import functools
import itertools
import math
import warnings
from collections.abc import Callable
from typing import Any, Literal

import torch
import torch.nn.functional as F

__all__ = ["BACKENDS", "document_attention", "document_ids", "select_backend"]

Backend = Literal["auto", "flash", "flex", "sdpa"]
BACKENDS: tuple[str, ...] = ("auto", "flash", "flex", "sdpa")
"""The accepted values of ``backend``."""

_FLASH_DTYPES = (torch.float16, torch.bfloat16)
_FLASH_NEEDS = "backend='flash' needs the flash_attn package and CUDA tensors in fp16/bf16"


# --------------------------------------------------------------------------- availability


@functools.lru_cache(maxsize=1)
def _flash_varlen() -> tuple[Callable[..., torch.Tensor] | None, str]:
    """``flash_attn.flash_attn_varlen_func``, or ``None`` and why it cannot be imported."""
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception as exc:  # ImportError, or a broken build (undefined CUDA symbols ...)
        return None, f"flash_attn cannot be imported ({type(exc).__name__}: {exc})"
    return flash_attn_varlen_func, ""


@functools.lru_cache(maxsize=1)
def _flex_module() -> tuple[Any, str]:
    """``torch.nn.attention.flex_attention`` (the module), or ``None`` and why not."""
    try:
        from torch.nn.attention import flex_attention as module
    except Exception as exc:
        return None, (
            f"torch {torch.__version__} has no torch.nn.attention.flex_attention "
            f"(torch >= 2.5 needed; {type(exc).__name__}: {exc})"
        )
    return module, ""


_COMPILED_FLEX: Callable[..., torch.Tensor] | None = None


def _compiled_flex() -> Callable[..., torch.Tensor]:
    """``torch.compile(flex_attention)``, created on first use and shared by every call."""
    global _COMPILED_FLEX
    if _COMPILED_FLEX is None:
        module, _ = _flex_module()
        _COMPILED_FLEX = torch.compile(module.flex_attention)
    return _COMPILED_FLEX


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _flash_problem(q: torch.Tensor) -> str:
    """Why ``"flash"`` cannot run on ``q`` (empty string when it can)."""
    function, reason = _flash_varlen()
    problems = [] if function is not None else [reason]
    if q.device.type != "cuda":
        problems.append(f"the tensors are on {q.device.type}, not CUDA")
    if q.dtype not in _FLASH_DTYPES:
        problems.append(f"the tensors are {q.dtype}, not float16/bfloat16")
    return "; ".join(problems)


def _flex_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """Why ``"flex"`` cannot run on these tensors (empty string when it can)."""
    module, reason = _flex_module()
    if module is None:
        return reason
    if q.device.type in ("cpu", "mps") and _needs_grad(q, k, v):
        return (
            f"FlexAttention has no backward on {q.device.type} in torch {torch.__version__}: "
            "run it under torch.no_grad() (inference only) or use backend='sdpa'"
        )
    return ""


def select_backend(
    q: torch.Tensor,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    backend: str = "auto",
) -> str:
    """The backend :func:`document_attention` runs for these tensors (``"auto"`` resolved).

    ``"auto"`` is ``"flash"`` when flash-attn is importable and ``q`` is a CUDA tensor in
    float16/bfloat16, else ``"flex"`` when ``q`` is on CUDA and torch has FlexAttention, else
    ``"sdpa"`` (always ``"sdpa"`` on CPU: CPU FlexAttention has no backward and is slower, see
    the module docstring).

    Args:
        q: the queries (only their device, dtype and ``requires_grad`` matter).
        k: the keys (their ``requires_grad`` matters for ``"flex"`` on CPU); default ``q``.
        v: the values (likewise); default ``q``.
        backend: ``"auto"``, ``"flash"``, ``"flex"`` or ``"sdpa"``.

    Returns:
        ``"flash"``, ``"flex"`` or ``"sdpa"``.

    Raises:
        ValueError: for an unknown backend name.
        RuntimeError: when the requested backend cannot run here, saying why.

    Example:
        >>> import torch
        >>> select_backend(torch.zeros(4, 2, 8))
        'sdpa'
    """
    k = q if k is None else k
    v = q if v is None else v
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}.")
    if backend == "auto":
        if q.device.type == "cuda" and q.dtype in _FLASH_DTYPES and not _flash_problem(q):
            return "flash"  # (flash_attn is only imported for CUDA fp16/bf16 tensors)
        if q.device.type == "cuda" and not _flex_problem(q, k, v):
            return "flex"
        return "sdpa"
    if backend == "flash":
        problem = _flash_problem(q)
        if problem:
            raise RuntimeError(f"{_FLASH_NEEDS}: {problem}.")
    elif backend == "flex":
        problem = _flex_problem(q, k, v)
        if problem:
            raise RuntimeError(f"backend='flex' is unavailable: {problem}.")
    return backend


# --------------------------------------------------------------------------- validation


def _check_cu_seqlens_tensor(cu_seqlens: Any) -> None:
    if not isinstance(cu_seqlens, torch.Tensor):
        raise TypeError(f"cu_seqlens must be a 1-D int32 tensor, got {type(cu_seqlens).__name__}.")
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(
            "cu_seqlens must be a 1-D tensor of E + 1 cumulative example lengths starting "
            f"at 0, got shape {tuple(cu_seqlens.shape)}."
        )
    if cu_seqlens.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"cu_seqlens must be int32 (or int64), got {cu_seqlens.dtype}.")


def _check_cu_seqlens_values(cu: list[int], total_tokens: int) -> None:
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


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}.")
    return value


def _check_qkv(q: Any, k: Any, v: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, bool]:
    """The ``(T, H, D)`` views of q, k, v and whether they had a leading batch dim of 1."""
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


# --------------------------------------------------------------------------- public API


def _document_ids(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """:func:`document_ids` without checks and without a host sync."""
    positions = torch.arange(total_tokens, device=cu_seqlens.device, dtype=cu_seqlens.dtype)
    ids = torch.searchsorted(cu_seqlens[1:].contiguous(), positions, right=True)
    return torch.where(ids >= cu_seqlens.numel() - 1, -1, ids)


def document_ids(cu_seqlens: torch.Tensor, total_tokens: int) -> torch.Tensor:
    """The example index of every token of a packed row; ``-1`` on trailing padding.

    Token ``t`` belongs to example ``i`` when ``cu_seqlens[i] <= t < cu_seqlens[i + 1]``;
    tokens at or after ``cu_seqlens[-1]`` get ``-1``. Empty examples (repeated entries) own no
    token. This is the packed collate's ``seq_idx`` row.

    Args:
        cu_seqlens: ``(E + 1,)`` int32/int64 cumulative example lengths starting at 0.
        total_tokens: the row's length ``T`` (at least ``cu_seqlens[-1]``).

    Returns:
        A ``(T,)`` int64 tensor on ``cu_seqlens``'s device.

    Raises:
        TypeError: for a non-tensor or non-integer ``cu_seqlens``.
        ValueError: for a bad shape, a ``cu_seqlens`` that does not start at 0, decreases or
            ends after ``total_tokens``, or a negative ``total_tokens``.

    Example:
        >>> import torch
        >>> document_ids(torch.tensor([0, 3, 4, 6], dtype=torch.int32), 8).tolist()
        [0, 0, 0, 1, 2, 2, -1, -1]
    """
    _check_cu_seqlens_tensor(cu_seqlens)
    total_tokens = _check_int("total_tokens", total_tokens, 0)
    _check_cu_seqlens_values(cu_seqlens.tolist(), total_tokens)
    return _document_ids(cu_seqlens, total_tokens)


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

    Equals running ``scaled_dot_product_attention`` on every example
    ``q[cu_seqlens[i]:cu_seqlens[i + 1]]`` alone (per head) and concatenating the results.
    Tokens after ``cu_seqlens[-1]`` (alignment padding) are outside every example: they do
    not influence real tokens, their outputs are zeros and they receive zero gradients.
    Grouped-query attention is supported (``q`` heads a multiple of ``k``/``v`` heads; each
    key/value head serves consecutive query heads). No dropout.

    Args:
        q: queries, ``(T, H, D)`` (the varlen layout), or ``(1, T, H, D)``.
        k: keys, ``(T, Hkv, D)`` or ``(1, T, Hkv, D)``, ``H`` a multiple of ``Hkv``.
        v: values, the shape of ``k``.
        cu_seqlens: ``(E + 1,)`` int32 (or int64) cumulative example lengths, starting at 0,
            non-decreasing, last entry at most ``T``. Any device (moved as needed).
        max_seqlen: the longest example's length (only ``"flash"`` uses it; computed from
            ``cu_seqlens`` when ``None``). Must not be smaller than the longest example.
        causal: each token attends only to itself and earlier tokens of its example.
        scale: the softmax scale; default ``1 / sqrt(D)``.
        backend: ``"auto"``, ``"flash"``, ``"flex"`` or ``"sdpa"`` (see the module
            docstring and :func:`select_backend`).
        validate: check ``cu_seqlens``'s values (start, order, end) and ``max_seqlen``.
            That reads ``cu_seqlens`` on the host; ``"sdpa"`` and ``"flash"`` read it
            anyway, ``"flex"`` otherwise runs without a host sync, so pass ``False`` there
            once the input pipeline is trusted (shapes and dtypes are always checked).

    Returns:
        The attention output, ``(T, H, D)`` (``(1, T, H, D)`` for 4-D inputs), ``q``'s dtype
        and device, zeros on the trailing padding.

    Raises:
        TypeError: for non-tensor inputs, mixed or non-floating dtypes, or a non-integer
            ``cu_seqlens``.
        ValueError: for mismatched shapes, bad ``cu_seqlens`` values, a too small
            ``max_seqlen``, a bad ``scale`` or an unknown backend.
        RuntimeError: when the requested backend cannot run here (the message says why).

    Example:
        >>> import torch
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
    q3, k3, v3, batched = _check_qkv(q, k, v)
    _check_cu_seqlens_tensor(cu_seqlens)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {causal!r}.")
    if scale is not None and (
        isinstance(scale, bool)
        or not isinstance(scale, (int, float))
        or not math.isfinite(scale)
        or scale <= 0
    ):
        raise ValueError(f"scale must be a positive finite number or None, got {scale!r}.")
    if max_seqlen is not None:
        _check_int("max_seqlen", max_seqlen, 0)
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {validate!r}.")
    chosen = select_backend(q3, k3, v3, backend)

    total = q3.shape[0]
    host: list[int] | None = None
    if validate or chosen != "flex":
        host = [int(x) for x in cu_seqlens.tolist()]
    if validate:
        assert host is not None
        _check_cu_seqlens_values(host, total)
        if max_seqlen is not None and len(host) > 1:
            longest = max(b - a for a, b in itertools.pairwise(host))
            if max_seqlen < longest:
                raise ValueError(
                    f"max_seqlen = {max_seqlen} is smaller than the longest example "
                    f"({longest} tokens)."
                )

    if chosen == "flash":
        assert host is not None
        out = _flash(q3, k3, v3, cu_seqlens, host, max_seqlen, causal, scale)
    elif chosen == "flex":
        out = _flex(q3, k3, v3, cu_seqlens, causal, scale)
    else:
        assert host is not None
        out = _sdpa(q3, k3, v3, host, causal, scale)
    return out.unsqueeze(0) if batched else out


# --------------------------------------------------------------------------- backends


def _pad_rows(out: torch.Tensor, total: int) -> torch.Tensor:
    """``out`` (real tokens) followed by zero rows up to ``total`` tokens."""
    if out.shape[0] == total:
        return out
    return torch.cat([out, out.new_zeros((total - out.shape[0], *out.shape[1:]))])


# How ``"sdpa"`` runs the examples: ``"auto"`` (the cost rule of :func:`_sdpa_batches`),
# ``"loop"`` (one call per example) or ``"batched"`` (one call on a zero-padded batch). Private:
# the tests set it to exercise both strategies on the same inputs.
_SDPA_STRATEGY = "auto"
_SLOT_COST = 128
"""The cost of one token slot of the padded batch (gather, zeros, scatter, the kernel's
per-row work and their backward), in units of one ``(query, key)`` pair of attention work."""
_CALL_COST = 1536
"""The cost of one SDPA call of the per-example loop (forward and backward), same units."""
_MAX_PADDED = 4
"""The padded batch holds at most this many times the row's real tokens."""


def _sdpa_batches(sizes: list[int]) -> bool:
    """Whether one SDPA call on a zero-padded ``(E, Lmax)`` batch beats the per-example loop.

    ``sizes`` are the lengths ``L_i`` of the ``E`` non-empty examples, ``Lmax`` the largest.
    Cost model, in units of one ``(query, key)`` pair of attention work (fitted to fwd+bwd
    timings at 8 heads x 64 on CPU, see the module docstring): the loop costs
    ``sum(L_i**2) + _CALL_COST * E`` (one call per example, about 0.15 ms each, as much as a
    ~40-token example's attention), the batch ``E * Lmax**2`` plus ``_SLOT_COST`` per token
    slot, padded or not (memory traffic dominates: copying into zeros and back, in both
    directions), minus the same per-token cost that the loop pays for the real tokens.
    Batched when::

        E * Lmax * (Lmax + 128) <= sum(L_i * (L_i + 128)) + 1536 * E
        and E * Lmax <= 4 * sum(L_i)

    So the batch wins for many short examples of similar lengths (where the loop's per-call
    overhead dominates) and loses as soon as one long example pads many short ones (the work
    grows as ``E * Lmax**2``). The second condition bounds the memory: the padded q, k, v
    (and their gradients) hold at most four times the row's real tokens. The ``E x Lmax x
    Lmax`` scores are not materialised (measured: a forced batch of one 1000-token and 64
    16-token examples grew the peak memory by about 1 GB, causal and non-causal alike: its
    padded q, k, v, output and gradients, not the 2 GB of scores). With equal lengths (no
    padding) the rule always batches.
    """
    if _SDPA_STRATEGY != "auto":
        return _SDPA_STRATEGY == "batched"
    count, longest, real = len(sizes), max(sizes), sum(sizes)
    if count < 2 or count * longest > _MAX_PADDED * real:
        return False
    batched = count * longest * (longest + _SLOT_COST)
    return batched <= sum(n * (n + _SLOT_COST) for n in sizes) + _CALL_COST * count


def _sdpa(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu: list[int],
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """``scaled_dot_product_attention`` per example, looped or batched (see _sdpa_batches)."""
    total, heads = q.shape[0], q.shape[1]
    sizes = [b - a for a, b in itertools.pairwise(cu) if b > a]
    if not sizes:
        return v.new_zeros((total, heads, v.shape[2]))
    if _sdpa_batches(sizes):
        return _sdpa_padded(q, k, v, sizes, cu[-1], causal, scale)
    return _sdpa_loop(q, k, v, sizes, cu[-1], causal, scale)


def _sdpa_loop(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sizes: list[int],
    real: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """One ``scaled_dot_product_attention`` per non-empty example (``sizes``), concatenated."""
    total, heads = q.shape[0], q.shape[1]
    if k.shape[1] != heads:  # grouped-query attention (SDPA's enable_gqa needs torch >= 2.5)
        k = k.repeat_interleave(heads // k.shape[1], dim=1)
        v = v.repeat_interleave(heads // v.shape[1], dim=1)
    # split, not slice: the backward of a split is one concatenation, while every slice's
    # backward writes a full-size zero gradient.
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


def _sdpa_padded(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    sizes: list[int],
    real: int,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """One ``scaled_dot_product_attention`` on the examples as a zero-padded batch.

    The real tokens (the non-empty examples, ``sizes``, are contiguous from token 0) are copied
    into an ``(E, Lmax)`` batch of zeros (right padding), one call runs, the real rows are
    gathered back. Causal: ``is_causal`` alone suffices, as a real query (position ``i <
    L_e``) only sees keys ``<= i``, all real. Non-causal: a key-padding mask, unless every
    example is ``Lmax`` long. No query row is fully masked (every example has a real first
    key) and the padded slots hold zeros (never the row's own padding tokens), so the
    discarded padded rows are finite and, receiving a zero gradient, send none back.
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
    return _pad_rows(out, total)


def _flex(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """FlexAttention with a document (and causal) block mask; no host sync."""
    module, _ = _flex_module()
    total = q.shape[0]
    if total == 0 or cu_seqlens.numel() == 1:  # no token, or no example: nothing to attend
        return v.new_zeros((total, q.shape[1], v.shape[2]))
    docs = _document_ids(cu_seqlens.to(q.device), total)

    def mask_mod(b: Any, h: Any, q_idx: torch.Tensor, kv_idx: torch.Tensor) -> torch.Tensor:
        keep = (docs[q_idx] == docs[kv_idx]) & (docs[q_idx] >= 0)
        return keep & (q_idx >= kv_idx) if causal else keep

    block_mask = module.create_block_mask(mask_mod, None, None, total, total, device=q.device)
    real = (docs >= 0)[:, None, None]
    zero = q.new_zeros(())
    # The kernel multiplies masked-out probabilities (exact zeros) with the values of whole
    # blocks, so a non-finite padding value would leak (0 * nan); the padding rows are zeroed.
    args = tuple(torch.where(real, x, zero).transpose(0, 1)[None] for x in (q, k, v))
    kwargs: dict[str, Any] = {"block_mask": block_mask, "scale": scale}
    if k.shape[1] != q.shape[1]:
        kwargs["enable_gqa"] = True
    if q.device.type == "cpu":  # eager on CPU (see the module docstring); silence its warning
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*flex_attention called without")
            out = module.flex_attention(*args, **kwargs)
    else:
        out = _compiled_flex()(*args, **kwargs)
    out = out[0].transpose(0, 1)
    # Padding queries see no key (a fully masked row): zero them explicitly, whatever the kernel.
    return torch.where(real, out, zero)


def _flash(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens: torch.Tensor,
    cu: list[int],
    max_seqlen: int | None,
    causal: bool,
    scale: float | None,
) -> torch.Tensor:
    """``flash_attn_varlen_func`` on the real tokens, zero rows for the padding."""
    function, _ = _flash_varlen()
    assert function is not None
    total, real = q.shape[0], cu[-1]
    if real == 0:
        return v.new_zeros((total, q.shape[1], v.shape[2]))
    if max_seqlen is None:
        max_seqlen = max(b - a for a, b in itertools.pairwise(cu))
    cu32 = cu_seqlens.to(device=q.device, dtype=torch.int32)
    # Only the real tokens go in: flash leaves rows outside cu_seqlens (and their gradients)
    # uninitialised.
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
    return _pad_rows(out, total)
