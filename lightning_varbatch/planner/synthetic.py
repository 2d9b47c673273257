"""Built-in synthetic length distributions, for plan reports and benchmarks (no download).

Example:
    >>> lengths = wmt_like_lengths(1000, seed=0)
    >>> lengths.shape, lengths.dtype.name, int(lengths.min()) >= 1
    ((1000, 2), 'int16', True)
"""

from __future__ import annotations

import math

import numpy as np

from lightning_varbatch.checks import check_count

#: Source subword lengths of WMT14 en-de after BPE, roughly: median 24, 99th percentile 110.
WMT_MEDIAN = 24.0
WMT_P99 = 110.0
WMT_MAX = 256
_Z99 = 2.3263478740408408  # standard normal 99th percentile


def wmt_like_lengths(num_examples: int, seed: int = 0) -> np.ndarray:
    """WMT14 en-de–like (source, target) subword lengths.

    Sources lognormal (median 24, 99th percentile 110), targets ``1.1 × source`` plus noise
    (sd 2 + 10 %), both clipped to ``[1, 256]``.

    Args:
        num_examples: number of pairs.
        seed: random seed.

    Returns:
        ``(num_examples, 2)`` int16 array of (source, target) lengths.

    Raises:
        ValueError: when ``num_examples`` is not positive.

    Example:
        >>> float(abs(np.median(wmt_like_lengths(100_000)[:, 0]) - 24)) <= 1
        True
    """
    num_examples = check_count(
        "num_examples", num_examples, what=" (the number of (source, target) pairs to draw)"
    )
    rng = np.random.default_rng(seed)
    sigma = math.log(WMT_P99 / WMT_MEDIAN) / _Z99
    out = np.empty((num_examples, 2), dtype=np.int16)
    chunk = 1 << 22  # bounded float64 temporaries even for 100M pairs
    for lo in range(0, num_examples, chunk):
        hi = min(lo + chunk, num_examples)
        src = np.rint(rng.lognormal(math.log(WMT_MEDIAN), sigma, hi - lo))
        np.clip(src, 1, WMT_MAX, out=src)
        tgt = np.rint(1.1 * src + rng.normal(0.0, 1.0, hi - lo) * (2.0 + 0.1 * src))
        np.clip(tgt, 1, WMT_MAX, out=tgt)
        out[lo:hi, 0] = src
        out[lo:hi, 1] = tgt
    return out
