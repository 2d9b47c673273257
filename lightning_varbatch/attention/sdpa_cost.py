"""The cost rule of the ``"sdpa"`` backend: loop over the examples, or one padded batch.

``"sdpa"`` runs a packed row one of two exact ways (:mod:`lightning_varbatch.attention.sdpa`):
a loop of one ``scaled_dot_product_attention`` call per example (work ``sum(L_i**2)`` but a
fixed overhead per call), or one call on the examples copied into a zero-padded ``(E, Lmax)``
batch (work ``E * Lmax**2`` plus the copies). :func:`sdpa_batches` chooses by a cost model in
units of one ``(query, key)`` pair of attention work, fitted to forward+backward timings on CPU
(8 heads x 64, float32; the timings and the fit are in "Which backend runs, and what it costs
on CPU" of ``docs/packing.md``). Batched when::

    E * Lmax * (Lmax + SLOT_COST) <= sum(L_i * (L_i + SLOT_COST)) + CALL_COST * E
    and E * Lmax <= MAX_PADDED * sum(L_i)

The batch wins for many short examples of similar lengths (per-call overhead dominates) and
loses once one long example pads many short ones (work grows as ``E * Lmax**2``). The second
condition bounds memory: padded q, k, v (and gradients) hold at most ``MAX_PADDED`` times the
row's real tokens. With equal lengths (no padding) the rule always batches.
"""

from __future__ import annotations

__all__ = ["CALL_COST", "MAX_PADDED", "SLOT_COST", "sdpa_batches"]

SLOT_COST = 128
"""The cost of one token slot of the padded batch (gather, zeros, scatter, the kernel's
per-row work and their backward), in units of one ``(query, key)`` pair of attention work."""
CALL_COST = 1536
"""The cost of one SDPA call of the per-example loop (forward and backward), same units."""
MAX_PADDED = 4
"""The padded batch holds at most this many times the row's real tokens."""

# How ``"sdpa"`` runs: ``"auto"`` (:func:`sdpa_batches`), ``"loop"``, ``"batched"`` (for tests).
_SDPA_STRATEGY = "auto"


def sdpa_batches(sizes: list[int]) -> bool:
    """Whether one SDPA call on a zero-padded ``(E, Lmax)`` batch beats the per-example loop.

    Args:
        sizes: the lengths ``L_i`` of the ``E`` non-empty examples (``Lmax`` the largest).

    Returns:
        ``True`` for the padded batch, ``False`` for the loop (always for one example, and
        when the padded batch would hold more than ``MAX_PADDED`` times the real tokens).

    Example:
        >>> sdpa_batches([6, 8, 7, 5, 8, 3, 8, 6] * 30)  # many short, similar examples
        True
        >>> sdpa_batches([700, 500, 400, 400])  # few long ones: the loop's overhead is small
        False
    """
    if _SDPA_STRATEGY != "auto":
        return _SDPA_STRATEGY == "batched"
    count, longest, real = len(sizes), max(sizes), sum(sizes)
    if count < 2 or count * longest > MAX_PADDED * real:
        return False
    batched = count * longest * (longest + SLOT_COST)
    return batched <= sum(n * (n + SLOT_COST) for n in sizes) + CALL_COST * count
