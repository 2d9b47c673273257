"""The length warm-up of a mixture: each dataset's caps, and the mixture's whole steps reordered.

Each dataset's cap grows along the common schedule to its own maximum (its longest example unless
bounds are set, per dataset on its :class:`~.mixture_datasets.DataSource` or in common); the
mixture's epoch 0 runs its whole steps in the order of the caps they fit (docs/length-warmup.md).

Example:
    >>> cfg = PlanConfig(64, length_warmup=4, length_warmup_min=8)
    >>> dataset_warmup_caps(cfg, [40, 200], [None, None], [None, None]).tolist()
    [[8, 16, 24, 32, 40], [8, 56, 104, 152, 200]]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.length_warmup import (
    LengthWarmupTrace,
    light_steps,
    scheduled_caps,
    warmup_order,
)
from lightning_varbatch.planner.mixture_datasets import DataSource
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.warmup_plan import check_warmup_acts, micro_batch_longest

__all__ = ["dataset_warmup_caps", "mixture_warmup_caps", "warm_mixture"]


def mixture_warmup_caps(
    config: PlanConfig,
    sources: Sequence[DataSource],
    planners: Sequence[EpochPlanner],
    names: Sequence[str],
) -> np.ndarray | None:
    """Check a mixture's warm-up settings (common and per dataset); its caps, or ``None``.

    Raises:
        SettingValueError: a ``DataSource`` ``length_warmup_min`` / ``length_warmup_max`` without a
            common ``length_warmup``, a dataset's minimum above its maximum, or its own minimum at
            or above its longest example; ``.setting`` names the setting, the message the dataset.
    """
    fields = ("length_warmup_min", "length_warmup_max")
    for source, name in zip(sources, names, strict=True):
        low, high = (getattr(source, f) for f in fields)
        if config.length_warmup is None:
            for field, value in zip(fields, (low, high), strict=True):
                if value is not None:
                    raise SettingValueError(
                        f"DataSource {name!r} has {field}={value}, which has no effect "
                        "without length_warmup: set length_warmup=<optimizer steps> in the "
                        f"common settings to warm up, or leave the DataSource's {field} unset.",
                        setting=field,
                        value=value,
                    )
            continue
        low = config.length_warmup_min if low is None else low
        high = config.length_warmup_max if high is None else high
        if high is not None and low > high:
            raise SettingValueError(
                f"Dataset {name!r}: length_warmup_min={low} is above length_warmup_max={high} "
                "(from its DataSource or the common settings): the cap grows from the "
                "minimum to the maximum. Lower its length_warmup_min or raise its "
                "length_warmup_max.",
                setting="length_warmup_min",
                value=low,
            )
    if config.length_warmup is None:
        return None
    longest = [int(p.prepared.planned_key.max(initial=0)) for p in planners]
    for source, name, top in zip(sources, names, longest, strict=True):
        own = source.length_warmup_min
        if own is not None and own >= top:  # set for this dataset, yet it caps none of it
            raise SettingValueError(
                f"DataSource {name!r} has length_warmup_min={own}, at or above its longest "
                f"example ({top}): its cap would hold every example from the first step, so "
                f"it would never warm up. Lower its length_warmup_min below {top} (e.g. to "
                f"{max(1, top // 4)}), or leave it unset to use the common one.",
                setting="length_warmup_min",
                value=own,
            )
    lows = [
        config.length_warmup_min if s.length_warmup_min is None else s.length_warmup_min
        for s in sources
    ]
    check_warmup_acts(config, longest, lows, names)
    return dataset_warmup_caps(
        config,
        longest,
        [s.length_warmup_min for s in sources],
        [s.length_warmup_max for s in sources],
    )


def dataset_warmup_caps(
    config: PlanConfig,
    longest: Sequence[int],
    lows: Sequence[int | None],
    highs: Sequence[int | None],
) -> np.ndarray | None:
    """Every dataset's cap at every step of a mixture's warm-up (``None``: no warm-up).

    Dataset ``d``'s cap grows along the common schedule from ``lows[d]`` to ``highs[d]``
    (``None``: the common ``length_warmup_min`` / ``length_warmup_max``, else ``longest[d]``).

    Returns:
        ``(datasets, length_warmup + 1)`` ``int64`` caps; column ``s`` is run step ``s``'s,
        the last column a dataset's longest example (no cap: after the warm-up).
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

    A step's *level* is the first run step whose caps (``caps[d, s]``) all its micro-batches
    fit; :func:`~.length_warmup.warmup_order` orders steps by level as a dataset's by length.

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
    step_level = level[plan.assign].reshape(steps, int(np.prod(plan.assign.shape[1:]))).max(axis=1)
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
        step_longest=longest[assign].reshape(steps, int(np.prod(assign.shape[1:]))).max(axis=1),
        levels=levels,
        dataset_scheduled=scheduled,
        dataset_realised=realised,
    )
    warmed = replace(plan, assign=assign)
    object.__setattr__(warmed, "length_warmup", trace)
    return warmed
