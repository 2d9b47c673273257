"""The inputs of a re-plan: ``plan_resumed``'s topology history and ``plan``'s exclude mask.

Both planners check a resume's history (``plan_resumed``) and ``plan(exclude=...)`` here, alike.

Example:
    >>> check_history([(2, 1, 5), (4, 2, 0)])
    [(2, 1, 5), (4, 2, 0)]
    >>> check_exclude(np.zeros(3, dtype=bool), 3).tolist()
    [False, False, False]
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = ["check_exclude", "check_history"]


def check_exclude(exclude: object, num_examples: int) -> np.ndarray:
    """Validate ``plan``'s ``exclude``: a boolean mask over all ``num_examples`` examples.

    Raises:
        SettingTypeError: for a mask that is not boolean (a list of ids, say).
        SettingValueError: for a mask of another length.
    """
    mask = np.asarray(exclude)
    if mask.dtype != np.bool_:
        raise SettingTypeError(
            f"exclude must be a boolean mask over the {num_examples} examples, "
            f"got dtype {mask.dtype}; build it with np.zeros(n, dtype=bool) and set "
            "the excluded ids to True (a list of ids is not a mask).",
            setting="exclude",
            value=mask,
        )
    if mask.shape != (num_examples,):
        raise SettingValueError(
            f"exclude must be a boolean mask of {num_examples} examples, got shape {mask.shape}.",
            setting="exclude",
            value=mask,
        )
    return mask


def check_history(history: object) -> list[tuple[Any, ...]]:
    """Validate ``plan_resumed``'s history: ``(world_size, accumulation, consumed)`` triples.

    A fourth item, its plan's rank budgets, may follow: returned as ints (``None`` if absent).

    Raises:
        ValueError: naming the bad entry and what it should be.
    """
    if isinstance(history, (str, bytes)) or not isinstance(history, (Sequence, np.ndarray)):
        raise SettingTypeError(
            f"history must be a sequence of (world_size, accumulate_grad_batches, consumed "
            f"micro-batches per rank) triples, got {type(history).__name__} {history!r:.60}.",
            setting="history",
            value=history,
        )
    out: list[tuple[Any, ...]] = []
    for i, entry in enumerate(history):
        if (
            isinstance(entry, (str, bytes))
            or not isinstance(entry, (Sequence, np.ndarray))
            or len(entry) not in (3, 4)
        ):
            raise SettingValueError(
                f"history[{i}] is {entry!r}: each entry must be a (world_size, "
                "accumulate_grad_batches, consumed micro-batches per rank) triple.",
                setting="history",
                value=history,
            )
        world, acc, consumed = entry[:3]
        checked = (
            check_count(f"history[{i}] world_size", world),
            check_count(f"history[{i}] accumulate_grad_batches", acc),
            check_count(f"history[{i}] consumed micro-batches", consumed, minimum=0),
        )
        budgets = entry[3] if len(entry) == 4 else None
        if budgets is None:
            out.append(checked)
            continue
        if isinstance(budgets, (str, bytes)) or not isinstance(budgets, (Sequence, np.ndarray)):
            raise SettingValueError(
                f"history[{i}]'s rank budgets are {budgets!r}: a list of one budget per rank "
                "(or None) was expected.",
                setting="history",
                value=history,
            )
        out.append((*checked, tuple(check_count(f"history[{i}] rank budget", b) for b in budgets)))
    return out
