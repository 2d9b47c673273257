"""The memory model of a micro-batch: ``peak ≈ a + b·B·L + c·B·L²``, fitted to probes.

``B`` examples padded to length ``L``: ``a`` is fixed memory (weights, optimizer state, the
runtime), ``b·B·L`` the activations, ``c·B·L²`` the attention scores. :class:`Probe` is one
measured shape; :func:`fit_memory_model` fits the three coefficients (none negative) and
:func:`check_growth` refuses a fit in which memory does not grow with the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Coefficients", "Probe", "check_growth", "fit_memory_model"]

Coefficients = tuple[float, float, float]
"""``(a, b, c)`` of ``peak ≈ a + b·B·L + c·B·L²``."""


@dataclass(frozen=True)
class Probe:
    """One shape: ``examples`` sequences padded to ``length`` needed ``peak_bytes`` (None: OOM).

    Example:
        >>> Probe(examples=4, length=128, peak_bytes=None).peak_bytes is None
        True
    """

    examples: int
    length: int
    peak_bytes: float | None


def fit_memory_model(probes: Iterable[Probe]) -> Coefficients:
    """Least-squares ``(a, b, c)`` of ``peak ≈ a + b·B·L + c·B·L²``, every coefficient >= 0.

    A coefficient the free fit makes negative (noise) is set to 0 and the others refitted.

    Raises:
        ValueError: with fewer than 3 good probes, or shapes that cannot separate the three terms.

    Example:
        >>> fit_memory_model([Probe(1, 8, 100 + 2 * 8 + 64), Probe(4, 8, 100 + 64 + 256),
        ...                   Probe(2, 16, 100 + 64 + 512)])
        (100.0, 2.0, 1.0)
    """
    done = [p for p in probes if p.peak_bytes is not None]
    if len(done) < 3:
        raise ValueError(
            f"fitting a + b·B·L + c·B·L² needs at least 3 successful probes, got {len(done)}: "
            "raise probes= or the memory limit, or pass smaller bounds/candidates."
        )
    bl = np.array([p.examples * p.length for p in done], dtype=np.float64)
    bll = bl * np.array([p.length for p in done], dtype=np.float64)
    x = np.stack([np.ones_like(bl), bl, bll], axis=1)
    y = np.array([float(p.peak_bytes or 0) for p in done])
    scale = np.abs(x).max(axis=0)
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        sub = x[:, active] / scale[active]
        if np.linalg.matrix_rank(sub) < len(active):
            raise ValueError(
                "the probes' shapes cannot separate a, b and c (they need different lengths "
                f"and sizes): {[(p.examples, p.length) for p in done]}."
            )
        solution = np.linalg.lstsq(sub, y, rcond=None)[0] / scale[active]
        negative = [a for a, s in zip(active, solution, strict=True) if s < 0]
        if not negative:
            coef[:] = 0.0
            coef[active] = solution
            break
        active = [a for a in active if a not in negative]
    a, b, c = (float(np.round(v, 9)) for v in coef)
    return a, b, c


def check_growth(coef: Coefficients, probes: Sequence[Probe]) -> None:
    """Refuse a fit in which memory does not grow with the batch (flat or decreasing).

    Raises:
        ValueError: when ``b`` and ``c`` are both 0 (the message lists each probe's measurement).

    Example:
        >>> check_growth((100.0, 2.0, 0.0), [])  # grows: nothing to say
    """
    if coef[1] > 0 or coef[2] > 0:
        return
    measured = ", ".join(
        f"{p.examples} x {p.length} tokens: {p.peak_bytes:.0f} bytes"
        for p in sorted(probes, key=lambda p: p.examples * p.length)
        if p.peak_bytes is not None
    )
    raise ValueError(
        "find_max_tokens: the probes' memory does not grow with the batch (flat or "
        f"decreasing as the batch grows: {measured}), so every budget would be predicted to "
        "fit. run_batch must return the peak memory of a forward and backward pass of the "
        "shape it is given, on the device that computes it: check that it runs the batch it "
        "is asked for and measures after the backward (e.g. measure_peak(step, device)[1]); "
        "on CPU, a model too small for the resident set to show it needs larger bounds or "
        "candidates."
    )
