"""The ranks' budgets a plan is cut to, and the checks that every budget can hold the data.

Ranks of their own budgets plan in lanes (:mod:`~.rank_lanes`), all at ``max_tokens`` as one
(:func:`uniform`); each must hold the longest example (:func:`check_budgets_hold` names the rank).

Example:
    >>> lane_budgets(PlanConfig(max_tokens=64), 2, (64, 32), lambda: 10)
    (64, 32)
    >>> lane_budgets(PlanConfig(max_tokens=64), 2, None, lambda: 10) is None
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["check_budgets_hold", "lane_budgets", "single_example_cost", "uniform"]


def uniform(budgets: Sequence[int] | None, max_tokens: int) -> bool:
    """Whether ``budgets`` plan as one budget of ``max_tokens`` (no lanes needed).

    Example:
        >>> uniform(None, 64), uniform((64, 64), 64), uniform((64, 32), 64)
        (True, True, False)
    """
    return budgets is None or all(int(b) == int(max_tokens) for b in budgets)


def single_example_cost(prepared: PreparedLengths, config: PlanConfig) -> int:
    """The cost of a micro-batch holding only the longest planned example.

    Example:
        >>> from lightning_varbatch.planner.lengths import prepare_lengths
        >>> config = PlanConfig(max_tokens=64, pad_to_multiple_of=8)
        >>> single_example_cost(prepare_lengths([3, 13, 5], config), config)
        16
    """
    key = prepared.planned_key
    if key.size == 0:
        return 0
    longest = np.array([int(key.max())], dtype=np.int64)
    p = config.pad_to_multiple_of
    cost = checked_cost(config.cost_fn, np.ones(1, dtype=np.int64), -(-longest // p) * p, longest)
    return math.ceil(float(cost[0]))


def lane_budgets(
    config: PlanConfig,
    world: int,
    given: Sequence[int] | None,
    longest_cost: Callable[[], int],
) -> tuple[int, ...] | None:
    """The ranks' budgets a plan is cut to, ``None`` when they are ``max_tokens`` on every rank.

    Args:
        config: the planner settings.
        world: the number of ranks.
        given: the budgets asked for (``None``: the config's, ``PlanConfig.rank_budgets``).
        longest_cost: the cost of the longest example alone (called only when needed).

    Raises:
        SettingValueError: not one budget per rank, outside [1, max_tokens], or under the longest.
    """
    budgets = config.rank_budgets(world) if given is None else tuple(int(b) for b in given)
    if budgets is not None and len(budgets) != world:
        raise SettingValueError(
            f"rank_budgets has {len(budgets)} entries but world_size={world}: give one "
            "budget per rank.",
            setting="rank_budgets",
            value=budgets,
        )
    if uniform(budgets, config.max_tokens):
        return None
    assert budgets is not None
    if max(budgets) > config.max_tokens or min(budgets) < 1:
        raise SettingValueError(
            f"rank_budgets={budgets} must each be in [1, max_tokens={config.max_tokens}].",
            setting="rank_budgets",
            value=budgets,
        )
    check_budgets_hold(budgets, longest_cost(), config)
    return budgets


def check_budgets_hold(budgets: Sequence[int], longest_cost: int, config: PlanConfig) -> None:
    """Refuse budgets of which one cannot hold the longest example, naming the rank.

    Raises:
        SettingValueError: (``.setting``: ``"rank_shares"`` when shares are set, else
            ``"rank_max_tokens"``) for the first rank whose budget is too small.
    """
    for rank, budget in enumerate(budgets):
        if budget >= longest_cost:
            continue
        setting = "rank_shares" if config.rank_shares is not None else "rank_max_tokens"
        fix = f"raise rank {rank}'s entry of {setting}"
        memory = config.rank_max_tokens
        if memory is not None and len(memory) == len(budgets):
            speed = np.asarray(config.rank_shares or [1.0] * len(memory), dtype=np.float64)
            limit = int(np.argmin(np.asarray(memory) / (speed / speed.max())))
            if memory[limit] < longest_cost or config.rank_shares is None:
                # every budget is scaled to fit this rank's memory: another rank's entry is moot
                setting = "rank_max_tokens"
                fix = (
                    f"raise rank_max_tokens[{limit}]={memory[limit]} (rank {limit}'s memory "
                    "sets every rank's budget)"
                )
                if config.rank_shares is not None:
                    fix += f" or rank {rank}'s entry of rank_shares"
        raise SettingValueError(
            f"Rank {rank}'s micro-batch budget is {budget} tokens (from rank_shares="
            f"{config.rank_shares}, rank_max_tokens={config.rank_max_tokens}, max_tokens="
            f"{config.max_tokens}), which cannot hold the longest example (cost "
            f"{longest_cost}): {fix}, or shorten the longest examples (oversize='truncate' or "
            "'skip' with a lower max_tokens).",
            setting=setting,
            value=getattr(config, setting),
        )
