"""Composing a mixture's epoch: the datasets' units interleaved evenly into one plan.

:class:`~lightning_varbatch.planner.mixture.MixturePlanner` plans each dataset on its own
(:class:`Part`: a pass over the dataset, a window of its stream of passes, or a re-planned
remainder) and :func:`compose_parts` joins them into one
:class:`~lightning_varbatch.planner.epoch_plan.EpochPlan`: the parts' micro-batches (tiles)
are renumbered globally and their *units* (whole optimizer steps under ``mixing="per_step"``,
single micro-batches under ``"per_batch"``) are spread along the epoch by
:func:`interleave`, a stratified random interleaving: every dataset's share holds along the
whole epoch, not only at its end. Under ``"per_batch"`` the interleaved micro-batches are then
dealt to ranks step by step (:func:`~lightning_varbatch.planner.dealing.deal_steps`).

Example:
    >>> import numpy as np
    >>> order = interleave(np.array([0, 0, 0, 0, 1, 1]), np.random.default_rng(0))
    >>> np.array([0, 0, 0, 0, 1, 1])[order].tolist()  # the two 1s spread out, not bunched
    [0, 0, 1, 0, 0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_varbatch.planner.dealing import deal_steps
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.sources import MixingPolicy

__all__ = ["MIX_TAG", "Part", "compose_parts", "interleave"]

#: Separates the interleaving's random stream from the datasets' own.
MIX_TAG = 0x6D6978


@dataclass(frozen=True)
class Part:
    """One dataset plan (a pass, or a re-planned remainder) and the units taken from it.

    Attributes:
        dataset: the dataset's index.
        plan: the dataset's plan (its example ids are the dataset's own).
        ids: maps the plan's example ids to global ids: an offset, or an id array.
        units: the plan's steps (``(u, world, acc)`` tile ids) under per-step mixing, or its
            tiles (``(u,)``) under per-batch mixing, in run order.
    """

    dataset: int
    plan: EpochPlan
    ids: np.ndarray | int
    units: np.ndarray


def interleave(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An order of ``labels``' positions spreading every label evenly.

    Each label keeps its own order: the ``j``-th of its ``c`` units sits at ``(j + u) / c``,
    ``u ~ U(0, 1)`` (stratified random interleaving).
    """
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    counts = np.bincount(labels)
    first = np.concatenate(([0], np.cumsum(counts)))[labels]
    by_label = np.argsort(labels, kind="stable")
    rank_in_label = np.empty(labels.size, dtype=np.int64)
    rank_in_label[by_label] = np.arange(labels.size) - first[by_label]
    position = (rank_in_label + rng.random(labels.size)) / counts[labels]
    return np.argsort(position, kind="stable")


def compose_parts(
    parts: list[Part],
    *,
    epoch: int,
    world: int,
    acc: int,
    mixing: MixingPolicy,
    rng: np.random.Generator,
    num_examples: int,
    num_skipped: int,
    num_truncated: int,
    dropped: int | None = None,
) -> EpochPlan:
    """One plan from the parts: global tiles, units interleaved evenly by dataset.

    Args:
        parts: the datasets' parts, in any order.
        epoch: the epoch.
        world: number of ranks.
        acc: micro-batches per rank per optimizer step.
        mixing: ``"per_step"`` (units are whole steps) or ``"per_batch"`` (micro-batches,
            dealt to ranks after interleaving).
        rng: the interleaving's random stream.
        num_examples: examples of all datasets (the id dtype: int32 below ``2**31``).
        num_skipped: examples left out by ``oversize="skip"``, all datasets.
        num_truncated: examples cut by ``oversize="truncate"``, all datasets.
        dropped: examples dropped by the tail policy; ``None``: the parts' sum.
    """
    orders, starts, tile_ds, units, unit_ds = [], [], [], [], []
    order_base = tile_base = 0
    for part in parts:
        p = part.plan
        ids = p.order.astype(np.int64)
        orders.append(ids + part.ids if isinstance(part.ids, int) else part.ids[ids])
        starts.append(p.tile_start + order_base)
        tile_ds.append(np.full(p.tile_start.size, part.dataset, dtype=np.int64))
        units.append(part.units + tile_base)
        unit_ds.append(np.full(part.units.shape[0], part.dataset, dtype=np.int64))
        order_base += p.order.size
        tile_base += p.tile_start.size
    cat = np.concatenate
    plans = [part.plan for part in parts]
    cost = cat([p.tile_cost for p in plans]) if plans else np.zeros(0)
    load = cat([p.tile_load for p in plans]) if plans else np.zeros(0)
    packed = any(p.tile_work is not None for p in plans)
    shaped = [p.tile_shape for p in plans if p.tile_shape is not None]
    all_units = cat(units) if units else np.zeros((0, world, acc), dtype=np.int64)
    picked = all_units[interleave(cat(unit_ds) if unit_ds else np.zeros(0, int), rng)]
    if mixing == "per_step":
        assign = picked.reshape(-1, world, acc)
    else:
        assign = deal_steps(picked.reshape(-1, world * acc), load, world, acc)
    order = cat(orders) if orders else np.zeros(0, dtype=np.int64)
    return EpochPlan(
        epoch=epoch,
        world_size=world,
        accumulate_grad_batches=acc,
        order=order.astype(np.int32) if num_examples < 2**31 else order,
        tile_start=cat(starts) if starts else np.zeros(0, dtype=np.int64),
        tile_size=cat([p.tile_size for p in plans]) if plans else np.zeros(0, np.int64),
        tile_cost=cost,
        assign=assign,
        num_dropped=sum(p.num_dropped for p in plans) if dropped is None else dropped,
        num_duplicated=sum(p.num_duplicated for p in plans),
        num_skipped=num_skipped,
        num_truncated=num_truncated,
        tile_dataset=cat(tile_ds) if tile_ds else np.zeros(0, dtype=np.int64),
        tile_work=load if packed else None,
        tile_shape=cat(shaped) if shaped and len(shaped) == len(plans) else None,
        _exact_tokens=cat([p.tile_tokens for p in plans]) if plans else np.zeros(0, int),
    )
