"""Independent references for planning (source, target) pairs, written from the definitions.

Nothing here imports the planner's code: the padding of a plan is recounted from its ids and
the raw lengths, the reference orders are cut by a plain greedy loop, and the exact optimum of
a small input is found by a dynamic program over all subsets.
:mod:`benchmarks.planning.pair_plan` and ``tests/test_pair_order.py`` compare the planner's
``pair_order`` against them.

* :func:`padded_slots`: the slots of both padded tensors, ``Σ n · (longest source + longest
  target)``, what the padding collate allocates (each side padded to its own longest).
* :func:`max_order` / :func:`bucket_order`: fairseq's order by ``max(source, target)``, and
  the key in narrow (geometric) buckets then ``source - target`` (NeMo's 2-D bucketing idea).
* :func:`lexicographic`: longest first by one list of keys, e.g. ``("max", "source",
  "target")`` (the exact lengths) or ``("source", "target")`` (fairseq's ``batch_by_size``
  with ``num_tokens_vec`` ordered by source, then target).
* :func:`greedy_cut`: cut an order left to right, a micro-batch growing while ``n · max(source,
  target) <= budget`` (a budget on each side: fairseq's ``max_tokens`` rule).
* :func:`optimum`: the least padded slots of any partition into at most ``m`` micro-batches
  within the budget on each side, exactly (``2^n`` subsets; inputs of up to ~12 pairs).

Example:
    >>> import numpy as np
    >>> pairs = np.array([[4, 9], [9, 2], [3, 9], [9, 3]])
    >>> cut = greedy_cut(max_order(pairs, seed=0), pairs, budget=18)
    >>> [len(b) for b in cut]
    [2, 2]
    >>> optimum(pairs, budget=18, most=2)  # {source-long pairs}, {target-long pairs}
    50
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "bucket_order",
    "greedy_cut",
    "lexicographic",
    "max_order",
    "optimum",
    "padded_slots",
]


def padded_slots(batches: list[np.ndarray], pairs: np.ndarray) -> int:
    """Both padded tensors' slots of ``batches`` (lists of example ids), summed."""
    total = 0
    for ids in batches:
        if len(ids):
            total += len(ids) * (int(pairs[ids, 0].max()) + int(pairs[ids, 1].max()))
    return total


def max_order(pairs: np.ndarray, seed: int) -> np.ndarray:
    """Ids by decreasing ``max(source, target)``, ties in a random order (fairseq's rule)."""
    perm = np.random.default_rng(seed).permutation(len(pairs))
    key = pairs.max(axis=1)
    return perm[np.argsort(-key[perm], kind="stable")]


def bucket_order(pairs: np.ndarray, width: float) -> np.ndarray:
    """Ids by decreasing key bucket (``width``: relative width, geometric), then source - target."""
    key = pairs.max(axis=1).astype(np.float64)
    bucket = np.floor(np.log(key) / np.log1p(width)).astype(np.int64)
    return np.lexsort((pairs[:, 0] - pairs[:, 1], -bucket))


def lexicographic(pairs: np.ndarray, keys: tuple[str, ...]) -> np.ndarray:
    """Ids longest first by ``keys`` in turn, each ``"max"``, ``"source"`` or ``"target"``.

    Example:
        >>> lexicographic(np.array([[3, 9], [9, 2], [9, 4]]), ("source", "target")).tolist()
        [2, 1, 0]
    """
    columns = {"max": pairs.max(axis=1), "source": pairs[:, 0], "target": pairs[:, 1]}
    return np.lexsort(tuple(-columns[k] for k in reversed(keys)))


def greedy_cut(order: np.ndarray, pairs: np.ndarray, budget: int) -> list[np.ndarray]:
    """``order`` cut left to right into the longest runs with ``n · max key <= budget``."""
    key = pairs.max(axis=1)
    batches: list[np.ndarray] = []
    start, longest = 0, 0
    for pos, i in enumerate(order.tolist()):
        grown = max(longest, int(key[i]))
        if (pos - start + 1) * grown > budget and pos > start:
            batches.append(order[start:pos])
            start, grown = pos, int(key[i])
        longest = grown
    batches.append(order[start:])
    return batches


def optimum(pairs: np.ndarray, budget: int, most: int) -> int:
    """Least padded slots of a partition into at most ``most`` micro-batches within budget.

    A dynamic program over subsets: ``best[k][S]`` is the least slots covering ``S`` with
    ``k`` micro-batches, each step taking a feasible micro-batch that holds the lowest
    example of ``S`` (so no partition is counted twice).

    Raises:
        ValueError: when no partition into ``most`` micro-batches fits the budget.
    """
    n = len(pairs)
    full = (1 << n) - 1
    masks = np.arange(1 << n)
    members = (masks[:, None] >> np.arange(n)) & 1
    count = members.sum(axis=1)
    longest_src = (members * pairs[:, 0]).max(axis=1)
    longest_tgt = (members * pairs[:, 1]).max(axis=1)
    fits = (count * np.maximum(longest_src, longest_tgt) <= budget) & (count > 0)
    slots = (count * (longest_src + longest_tgt)).tolist()
    feasible = fits.tolist()
    inf = float("inf")
    best = [0.0] + [inf] * full  # zero micro-batches: only the empty set
    answer = inf
    for _ in range(most):
        nxt = [inf] * (full + 1)
        for done in range(full):
            if best[done] == inf:
                continue
            rest = full & ~done
            low = rest & -rest
            sub = rest
            while sub:
                if sub & low and feasible[sub]:
                    value = best[done] + slots[sub]
                    if value < nxt[done | sub]:
                        nxt[done | sub] = value
                sub = (sub - 1) & rest
        best = nxt
        answer = min(answer, best[full])
    if answer == inf:
        raise ValueError(f"no partition into {most} micro-batches fits budget {budget}")
    return int(answer)
