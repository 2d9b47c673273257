"""How the example budgets its batches: planning lengths, loss counts, the collate's checks.

The collate pads every item's ``source`` and its whole ``target`` (``BOS ... EOS``), so the
planner gets those two lengths (after ``data.max_length``): with the default cost model
(``"padded"``, :mod:`lightning_varbatch.planner.costs`) a micro-batch of ``n`` pairs costs
``n x max(padded source width, padded target width)``, i.e. *each* padded field holds at most
``data.max_tokens`` slots (source and target together at most twice that).

The loss predicts ``target[1:]`` (teacher forcing), one token fewer than the target: the
DataModule is built with ``loss_offset=1``, so the planner derives every pair's loss tokens
(target minus one, after a ``data.oversize=truncate`` cut) and ``step_ntokens`` is the exact
number of loss tokens of the optimizer step, in every split and every corpus. The collate is
the library's ``PaddingCollate(loss_offset=1)``: its width check (every field against the plan)
stays on, and its loss-count check compares the plan's count with the real target tokens
minus one per example. :func:`loss_lengths` computes the same counts explicitly for the
streamed run's validation/test splits (:mod:`examples.translation.streaming`), whose
``loss_offset`` would count them before the cut. What ``data.oversize`` leaves out or cuts,
and the length it cuts to: :mod:`examples.common.oversize`.
"""

from __future__ import annotations

import numpy as np

__all__ = ["loss_lengths"]


def loss_lengths(lengths: np.ndarray, truncate_to: int | None = None) -> np.ndarray:
    """Loss tokens per pair: the target length minus BOS, after an ``oversize`` cut.

    Args:
        lengths: ``(n, 2)`` padded (source, target) lengths, specials included.
        truncate_to: the length ``oversize="truncate"`` cuts every field to (``None``: none).

    Example:
        >>> loss_lengths(np.array([[4, 6], [3, 2]])).tolist()
        [5, 1]
        >>> loss_lengths(np.array([[4, 6], [3, 2]]), truncate_to=4).tolist()
        [3, 1]
    """
    target = lengths[:, 1] if truncate_to is None else np.minimum(lengths[:, 1], truncate_to)
    return np.asarray(target - 1, dtype=np.int64)
