"""Running the probes of :func:`~lightning_varbatch.memory.find_max_tokens`.

A probe is one call ``run_batch(examples, length)``: a forward and backward pass on a
synthetic batch of that shape, returning its peak memory in bytes (e.g. the second value of
:func:`~lightning_varbatch.peak_memory.measure_peak`). :func:`run_probe` runs one and checks
what it returned (an out-of-memory error, one of :data:`OUT_OF_MEMORY`, is a result too);
:func:`probe_shapes` picks the shapes of the first probes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from lightning_varbatch.memory.model import Probe

__all__ = ["OUT_OF_MEMORY", "RunBatch", "probe_shapes", "run_probe"]

RunBatch = Callable[[int, int], int | float]
"""``run_batch(examples, length)`` -> peak bytes of a forward and backward pass of that shape."""

#: What a probe may raise for "out of memory": ``torch.OutOfMemoryError`` (CUDA and any device whose
#: allocator raises it) and ``MemoryError``, by type only: torch's CPU allocator raises a plain
#: ``RuntimeError`` ("can't allocate memory"), which propagates like any error (a CPU ``run_batch``
#: can catch it and raise ``MemoryError``).
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


def run_probe(run_batch: RunBatch, examples: int, length: int) -> Probe:
    """Run one probe; ``peak_bytes`` is ``None`` when it raised one of :data:`OUT_OF_MEMORY`.

    Raises:
        TypeError: when ``run_batch`` returns something other than a real number.
        ValueError: when it returns zero, a negative number, NaN or infinity.

    Example:
        >>> def too_big(examples: int, length: int) -> int:
        ...     raise MemoryError
        >>> run_probe(too_big, 64, 512).peak_bytes is None
        True
    """
    try:
        peak = run_batch(examples, length)
    except OUT_OF_MEMORY:
        return Probe(examples, length, None)
    call = f"the probe run_batch(examples={examples}, length={length})"
    if isinstance(peak, (bool, np.bool_)) or not isinstance(peak, (int, float, np.number)):
        raise TypeError(
            f"{call} returned {peak!r} ({type(peak).__name__}): run_batch must return the "
            "peak memory in bytes of a forward and backward pass of that shape, a number > 0 "
            "(e.g. the second value of measure_peak(step, device))."
        )
    value = float(peak)
    if not math.isfinite(value) or value <= 0:
        what = "no memory at all" if value == 0 else "no byte count"
        raise ValueError(
            f"{call} measured {peak!r} bytes, which is {what}: run_batch must return the "
            "peak memory in bytes (a finite number > 0) of a forward and backward pass of "
            "that shape. Check that it measures the device the model computes on, after "
            "the backward (e.g. measure_peak(step, device)[1])."
        )
    return Probe(examples, length, value)


def probe_shapes(longest: int, tokens: Sequence[int], count: int) -> list[tuple[int, int]]:
    """``count`` shapes alternating the longest length and a third of it, growing in tokens.

    Tokens (examples x length) grow geometrically, ``min(tokens)`` to ``max(tokens)``; all distinct.

    Example:
        >>> probe_shapes(60, [60, 600], 3)
        [(1, 60), (9, 20), (10, 60)]
    """
    short = max(1, longest // 3)
    lo, hi = min(tokens), max(tokens)
    shapes: list[tuple[int, int]] = []
    for i in range(count):
        t = lo * (hi / lo) ** (i / max(1, count - 1))
        length = longest if i % 2 == 0 else short
        shape = (max(1, int(t // length)), length)
        if shape in shapes:  # keep shapes distinct: one more example
            shape = (shape[0] + 1, length)
        shapes.append(shape)
    return shapes
