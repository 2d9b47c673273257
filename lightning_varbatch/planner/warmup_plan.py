"""The length warm-up where it meets the planner: its settings, caps, steps and resume position.

:mod:`~lightning_varbatch.planner.length_warmup` holds the schedule and the step order; this
module checks the ``length_warmup*`` settings of a ``PlanConfig``, computes the caps of one
plan from them, the longest example of every step, and where a resumed remainder continues.

Example:
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> config = PlanConfig(64, length_warmup=4, length_warmup_min=2)
    >>> config.length_warmup, check_warmup_acts(config, [12], [2], ["0"])
    (4, None)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from lightning_varbatch.checks import check_count
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.length_warmup import (
    LengthWarmupTrace,
    light_steps,
    scheduled_caps,
    warmup_order,
)

if TYPE_CHECKING:
    from lightning_varbatch.planner.epoch_plan import EpochPlan
    from lightning_varbatch.planner.lengths import PreparedLengths
    from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "check_warmup_acts",
    "dataset_warmup_caps",
    "micro_batch_longest",
    "step_longest",
    "warm_mixture",
    "warmup_caps",
    "warmup_position",
]


def check_warmup_acts(
    config: PlanConfig, longest: Sequence[int], lows: Sequence[int], names: Sequence[str]
) -> None:
    """Refuse a length warm-up that caps nothing: its first cap holds every example already.

    ``longest``: the longest planned example of each dataset (one for a single dataset);
    ``lows``: each one's first cap (``length_warmup_min``, a mixture's own per dataset);
    ``names``: how messages name them.

    Raises:
        SettingValueError: (``.setting``: ``"length_warmup_min"``) when no dataset has an
            example longer than its first cap.

    Example:
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> check_warmup_acts(PlanConfig(64, length_warmup=4), [12], [8], ["0"])
    """
    if config.length_warmup is None or any(
        int(top) > int(low) for top, low in zip(longest, lows, strict=True)
    ):
        return
    shown = ", ".join(
        f"{n}: {int(t)} (minimum {int(low)})"
        for n, t, low in zip(names, longest, lows, strict=True)
    )
    raise SettingValueError(
        f"length_warmup_min={config.length_warmup_min} holds every example already (the "
        f"longest: {shown}), so the length warm-up over {config.length_warmup} steps would "
        "change nothing: lower length_warmup_min below the longest example (e.g. to a quarter "
        "of it), or unset length_warmup.",
        setting="length_warmup_min",
        value=config.length_warmup_min,
    )


def warmup_caps(
    config: PlanConfig, prepared: PreparedLengths, epoch: int, first_step: int
) -> np.ndarray | None:
    """The scheduled caps of the warm-up steps a plan holds (``None``: no warm-up).

    Example:
        >>> from lightning_varbatch.planner.lengths import prepare_lengths
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> cfg = PlanConfig(64, length_warmup=4, length_warmup_min=2)
        >>> warmup_caps(cfg, prepare_lengths(np.array([2, 9, 10]), cfg, None), 0, 1).tolist()
        [4, 6, 8]
    """
    first_step = check_count("first_step", first_step, minimum=0)
    if config.length_warmup is None or epoch != 0 or first_step >= config.length_warmup:
        return None
    key, kept = prepared.key, prepared.kept
    longest = int(key.max(initial=0) if kept is None else key[kept].max(initial=0))
    high = longest if config.length_warmup_max is None else config.length_warmup_max
    return scheduled_caps(
        config.length_warmup_schedule,
        config.length_warmup,
        config.length_warmup_min,
        high,
        first=first_step,
    )


def step_longest(
    key: np.ndarray, starts: np.ndarray, sizes: np.ndarray, order: np.ndarray, assign: np.ndarray
) -> np.ndarray:
    """The longest example (planning key) of every step of ``assign``.

    Example:
        >>> step_longest(np.array([5, 3, 9]), np.array([0, 2]), np.array([2, 1]),
        ...              np.array([0, 1, 2]), np.array([[[1]], [[0]]])).tolist()
        [9, 5]
    """
    longest = micro_batch_longest(key, starts, sizes, order)
    if longest.size == 0:
        return np.zeros(assign.shape[0], dtype=np.int64)
    return np.asarray(longest[assign].reshape(assign.shape[0], -1).max(axis=1, initial=0))


def micro_batch_longest(
    key: np.ndarray, starts: np.ndarray, sizes: np.ndarray, order: np.ndarray
) -> np.ndarray:
    """The longest example (planning key) of every micro-batch (``0`` for an empty one).

    Example:
        >>> micro_batch_longest(np.array([5, 3, 9]), np.array([0, 2]), np.array([2, 1]),
        ...                     np.array([0, 1, 2])).tolist()
        [5, 9]
    """
    ordered = key[order].astype(np.int64)
    if starts.size == 0 or ordered.size == 0:
        return np.zeros(starts.size, dtype=np.int64)
    longest = np.maximum.reduceat(ordered, np.minimum(starts, ordered.size - 1))
    longest[sizes == 0] = 0
    return np.asarray(longest)


def warmup_position(plan: EpochPlan, consumed: int, first: int, floor: int) -> tuple[int, int]:
    """The run's step and the warm-up's cap after ``consumed`` micro-batches per rank of ``plan``.

    A started step counts as taken: its examples ran under its cap. A mixture's plan
    (``trace.levels`` set) counts the cap in the run's steps of the schedule
    (:func:`warm_mixture`), a single dataset's in tokens.

    Example:
        >>> from lightning_varbatch.planner.epoch_planner import plan_epoch
        >>> plan = plan_epoch(np.arange(1, 200), 400, world_size=2, length_warmup=5)
        >>> step, cap = warmup_position(plan, 3, 0, 0)
        >>> step, cap == int(plan.length_warmup.realised[:3].max())
        (3, True)
    """
    steps = -(-consumed // plan.accumulate_grad_batches)
    trace = plan.length_warmup
    if trace is not None and steps > 0:
        reached = trace.realised if trace.levels is None else trace.levels
        floor = max(floor, int(reached[:steps].max(initial=0)))
    return first + steps, floor


def dataset_warmup_caps(
    config: PlanConfig,
    longest: Sequence[int],
    lows: Sequence[int | None],
    highs: Sequence[int | None],
) -> np.ndarray | None:
    """Every dataset's cap at every step of a mixture's warm-up (``None``: no warm-up).

    Dataset ``d``'s cap grows along the common schedule from ``lows[d]`` (``None``: the
    common ``length_warmup_min``) to ``highs[d]`` (``None``: the common ``length_warmup_max``,
    and when that is unset too, the dataset's own ``longest[d]``): with the common settings
    every dataset runs its short examples first and its share holds along the warm-up. A
    common ``length_warmup_max`` gives every dataset the same caps: one cap for the mixture.

    Returns:
        ``(datasets, length_warmup + 1)`` ``int64`` caps; column ``s`` is run step ``s``'s,
        the last column a dataset's longest example (no cap: after the warm-up).

    Example:
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> cfg = PlanConfig(64, length_warmup=4, length_warmup_min=8)
        >>> dataset_warmup_caps(cfg, [40, 200], [None, None], [None, None]).tolist()
        [[8, 16, 24, 32, 40], [8, 56, 104, 152, 200]]
    """
    if config.length_warmup is None:
        return None
    rows = []
    for top, low, high in zip(longest, lows, highs, strict=True):
        low = config.length_warmup_min if low is None else low
        high = config.length_warmup_max if high is None else high
        caps = scheduled_caps(
            config.length_warmup_schedule,
            config.length_warmup,
            low,
            int(top) if high is None else high,
            first=0,
        )
        rows.append(np.append(caps, max(int(top), int(caps[-1]))))
    return np.asarray(rows, dtype=np.int64).reshape(len(rows), config.length_warmup + 1)


def warm_mixture(
    plan: EpochPlan,
    key: np.ndarray,
    budgets: np.ndarray,
    caps: np.ndarray,
    first: int,
    floor: int,
) -> EpochPlan:
    """A mixture's plan with its whole steps reordered by the length warm-up.

    The schedule is counted in *levels*: a micro-batch of dataset ``d`` fits at run step ``s``
    when its longest example is within ``caps[d, s]``; a step's level is the first step all its
    micro-batches fit at (``length_warmup`` when only after the warm-up).
    :func:`~lightning_varbatch.planner.length_warmup.warmup_order` then orders the steps by
    level exactly as it orders a single dataset's by length, so the guarantees are the same:
    only the order of whole steps changes, the realised level never decreases, and where no
    step left fits the schedule advances to the lowest level left.

    Args:
        plan: the mixture's composed plan (``micro_batch_dataset`` set; global example ids).
        key: the planning key of every example, in global id order.
        budgets: every dataset's ``max_tokens`` (light steps are judged against them).
        caps: :func:`dataset_warmup_caps`.
        first: the run's step the plan's first step is.
        floor: the level already reached before ``first`` (a resumed remainder).

    Returns:
        ``plan`` when it holds no warm-up step, else a plan with the same micro-batches and
        steps, reordered, and its :class:`LengthWarmupTrace` in ``plan.length_warmup``.
    """
    warmup = caps.shape[1] - 1
    if plan.num_steps == 0 or first >= warmup or plan.micro_batch_dataset is None:
        return plan
    dataset = plan.micro_batch_dataset
    longest = micro_batch_longest(key, plan.micro_batch_start, plan.micro_batch_size, plan.order)
    level = np.zeros(longest.shape[0], dtype=np.int64)
    for d in np.unique(dataset).tolist():
        mine = dataset == d
        level[mine] = np.searchsorted(caps[d], longest[mine], side="left")
    steps = plan.assign.shape[0]
    step_level = level[plan.assign].reshape(steps, -1).max(axis=1)
    fill = plan.micro_batch_cost / np.asarray(budgets, dtype=np.float64)[dataset]
    light = light_steps(fill, plan.assign)
    perm, levels = warmup_order(step_level, np.arange(first, warmup), floor, light)
    assign = plan.assign[perm]
    scheduled = caps[:, first : first + levels.shape[0]]
    realised = caps[:, levels]
    trace = LengthWarmupTrace(
        first_step=first,
        scheduled=scheduled.max(axis=0),
        realised=realised.max(axis=0),
        step_longest=longest[assign].reshape(steps, -1).max(axis=1),
        levels=levels,
        dataset_scheduled=scheduled,
        dataset_realised=realised,
    )
    warmed = replace(plan, assign=assign)
    object.__setattr__(warmed, "length_warmup", trace)
    return warmed
