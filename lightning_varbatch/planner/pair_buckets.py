"""How wide the planning lengths of pairs are grouped: the width that pads least.

Within one planning length the two-sided order (:mod:`~.pair_order`) puts pairs alike on both sides
together. Where few pairs share a length (small data, long tails), joining neighbouring lengths into
geometric buckets a few percent wide gives that order more pairs to arrange, for a budget priced at
the bucket's longest pair. The planner cuts the data at every width of :data:`WIDTHS` once, at
``max_tokens``, and keeps the one with the fewest padded slots of both tensors (ties: the narrower)
among those with at most 1 % more micro-batches than the exact lengths. The choice depends only on
the lengths and the settings: every rank, every epoch and every resume make the same.

Example:
    >>> from lightning_varbatch.planner.lengths import prepare_lengths
    >>> from lightning_varbatch.planner.synthetic import wmt_like_lengths
    >>> config = PlanConfig(max_tokens=1024)
    >>> pair_width(prepare_lengths(wmt_like_lengths(20_000), config), config) in WIDTHS
    True
"""

from __future__ import annotations

import numpy as np

from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.pair_order import with_pair_work
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups

__all__ = ["WIDTHS", "pair_width"]

#: The widths tried (0: the planning lengths themselves, or their ``bucket_width`` buckets).
WIDTHS: tuple[float, ...] = (0.0, 0.02, 0.05, 0.1)
#: A wider width is kept only with at most this factor of the exact lengths' micro-batches:
#: each micro-batch has a fixed cost (launches, an optimizer step's share) padding hides.
MORE_MICRO_BATCHES = 1.01
#: Above this many pairs each length holds enough to arrange: width 0 is kept, others untried
#: (4.5M WMT-like pairs at 16,384 tokens choose it when tried; trying costs ~0.1 s/million pairs).
MOST_PAIRS_TRIED = 1_000_000


def pair_width(prepared: PreparedLengths, config: PlanConfig) -> float:
    """The width of :data:`WIDTHS` whose cut at ``max_tokens`` pads both sides least.

    0 without pairs, under ``pair_order="max"``, a shape budget, or over :data:`MOST_PAIRS_TRIED`.
    """
    diff = prepared.diff
    if diff is None or config.pair_order != "two_sided" or config.max_shapes is not None:
        return 0.0
    planned = prepared.key.shape[0] if prepared.kept is None else prepared.kept.shape[0]
    if planned > MOST_PAIRS_TRIED:
        return 0.0
    best, chosen, most = np.inf, 0.0, np.inf
    for width in WIDTHS:
        groups = SortedGroups.build(
            prepared.key, prepared.kept, config.bucket_width, None, diff, width
        )
        cut = with_pair_work(SortedCut.build(groups, config), groups.ids, prepared, config)
        slots = cut.work
        if width == 0.0:
            most = MORE_MICRO_BATCHES * cut.num_micro_batches
        if slots.sum() < best and cut.num_micro_batches <= most:
            best, chosen = float(slots.sum()), width
    return chosen
