"""Which backend :func:`~lightning_varbatch.attention.document_attention` runs, and why not another.

The backends need different things: ``"flash"`` the ``flash-attn`` package and CUDA tensors in
float16/bfloat16, ``"flex"`` a torch with ``torch.nn.attention.flex_attention`` (and, on CPU,
no gradient: FlexAttention has no CPU backward), ``"sdpa"`` nothing. :func:`select_backend`
resolves ``"auto"`` to the fastest one that can run and, for a backend asked for by name,
raises an error that lists every missing piece. The optional packages are imported on first
use and the answer is cached (:func:`flash_varlen`, :func:`flex_module`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Literal

import torch

from lightning_varbatch.checks import check_choice

__all__ = [
    "BACKENDS",
    "FLASH_DTYPES",
    "Backend",
    "flash_problem",
    "flash_varlen",
    "flex_module",
    "flex_problem",
    "select_backend",
]

Backend = Literal["auto", "flash", "flex", "sdpa"]
BACKENDS: tuple[str, ...] = ("auto", "flash", "flex", "sdpa")
"""The accepted values of ``backend``."""

FLASH_DTYPES = (torch.float16, torch.bfloat16)
"""The dtypes FlashAttention's kernels take."""

_FLASH_NEEDS = "backend='flash' needs the flash_attn package and CUDA tensors in fp16/bf16"


@functools.lru_cache(maxsize=1)
def flash_varlen() -> tuple[Callable[..., torch.Tensor] | None, str]:
    """``flash_attn.flash_attn_varlen_func``, or ``None`` and why it cannot be imported.

    Example:
        >>> function, why = flash_varlen()
        >>> (function is None) == bool(why)
        True
    """
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception as exc:  # ImportError, or a broken build (undefined CUDA symbols ...)
        return None, f"flash_attn cannot be imported ({type(exc).__name__}: {exc})"
    return flash_attn_varlen_func, ""


@functools.lru_cache(maxsize=1)
def flex_module() -> tuple[Any, str]:
    """``torch.nn.attention.flex_attention`` (the module), or ``None`` and why not.

    Example:
        >>> module, why = flex_module()
        >>> (module is None) == bool(why)
        True
    """
    try:
        from torch.nn.attention import flex_attention as module
    except Exception as exc:
        return None, (
            f"torch {torch.__version__} has no torch.nn.attention.flex_attention "
            f"(torch >= 2.5 needed; {type(exc).__name__}: {exc})"
        )
    return module, ""


def _needs_grad(*tensors: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def flash_problem(q: torch.Tensor) -> str:
    """Why ``"flash"`` cannot run on ``q`` (empty string when it can): every missing piece.

    Example:
        >>> flash_problem(torch.zeros(2, 1, 4)).split("; ")[-1]
        'the tensors are torch.float32, not float16/bfloat16'
    """
    function, reason = flash_varlen()
    problems = [] if function is not None else [reason]
    if q.device.type != "cuda":
        problems.append(f"the tensors are on {q.device.type}, not CUDA")
    if q.dtype not in FLASH_DTYPES:
        problems.append(f"the tensors are {q.dtype}, not float16/bfloat16")
    return "; ".join(problems)


def flex_problem(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> str:
    """Why ``"flex"`` cannot run on these tensors (empty string when it can).

    Example:
        >>> x = torch.zeros(2, 1, 4, requires_grad=True)
        >>> "no backward on cpu" in flex_problem(x, x, x) or "no torch.nn" in flex_problem(x, x, x)
        True
    """
    module, reason = flex_module()
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
    ``"sdpa"`` (always on CPU, where FlexAttention has no backward and is slower: docs/packing.md).

    Args:
        q: the queries (only their device, dtype and ``requires_grad`` matter).
        k: the keys (their ``requires_grad`` matters for ``"flex"`` on CPU); default ``q``.
        v: the values (likewise); default ``q``.
        backend: ``"auto"``, ``"flash"``, ``"flex"`` or ``"sdpa"``.

    Returns:
        ``"flash"``, ``"flex"`` or ``"sdpa"``.

    Raises:
        SettingValueError: for an unknown backend name (a ``ValueError``).
        RuntimeError: when the requested backend cannot run here, saying why.

    Example:
        >>> select_backend(torch.zeros(4, 2, 8))
        'sdpa'
    """
    k = q if k is None else k
    v = q if v is None else v
    check_choice("backend", backend, BACKENDS)
    if backend == "auto":
        if q.device.type == "cuda" and q.dtype in FLASH_DTYPES and not flash_problem(q):
            return "flash"  # (flash_attn is only imported for CUDA fp16/bf16 tensors)
        if q.device.type == "cuda" and not flex_problem(q, k, v):
            return "flex"
        return "sdpa"
    if backend == "flash":
        problem = flash_problem(q)
        if problem:
            raise RuntimeError(f"{_FLASH_NEEDS}: {problem}.")
    elif backend == "flex":
        problem = flex_problem(q, k, v)
        if problem:
            raise RuntimeError(f"backend='flex' is unavailable: {problem}.")
    return backend
