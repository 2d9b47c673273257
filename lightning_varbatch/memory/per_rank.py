"""Budgets of ranks with different memory: each rank's own budget, gathered for the plan.

On a mixed cluster, run :func:`~lightning_varbatch.memory.find_max_tokens` on every rank with its
own memory limit; :func:`gather_rank_max_tokens` then gives every rank all the budgets: the
``rank_max_tokens`` setting (``max_tokens``: their maximum), so every rank plans the same epoch,
each within its own budget (docs/mixed-clusters.md).

Example:
    >>> gather_rank_max_tokens(4096)  # one process: its own budget
    (4096,)
"""

from __future__ import annotations

import torch.distributed as dist

from lightning_varbatch.checks import check_count
from lightning_varbatch.memory.result import BudgetResult

__all__ = ["gather_rank_max_tokens"]


def gather_rank_max_tokens(result: BudgetResult | int) -> tuple[int, ...]:
    """Every rank's budget, rank 0 first (a collective: call it on every rank).

    Args:
        result: this rank's :class:`~lightning_varbatch.memory.BudgetResult` (or its budget).

    Returns:
        One budget per rank of the default process group (just this one without it).

    Raises:
        SettingValueError: for a budget below 1.
    """
    mine = result.max_tokens if isinstance(result, BudgetResult) else result
    budget = check_count("max_tokens", mine)
    if not (dist.is_available() and dist.is_initialized()):
        return (budget,)
    gathered: list[object] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, budget)
    return tuple(int(b) for b in gathered)  # type: ignore[call-overload]
