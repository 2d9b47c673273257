"""Composing a mixture's epoch: the datasets' units interleaved evenly into one plan.

:func:`compose_parts` renumbers the datasets' plans (:class:`Part`) globally and spreads their
*units* (steps, or micro-batches under ``mixing="per_batch"``, then dealt to ranks) along the
epoch (:func:`interleave`): every dataset's share holds along the epoch, not only at its end.

Example:
    >>> order = interleave(np.array([0, 0, 0, 0, 1, 1]), np.random.default_rng(0))
    >>> np.array([0, 0, 0, 0, 1, 1])[order].tolist()  # the two 1s spread out, not bunched
    [0, 0, 1, 0, 0, 1]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_varbatch.planner.dealing import deal_steps
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.mixture_datasets import MixingPolicy

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
        units: the plan's steps ``(u, world, acc)`` or micro-batches ``(u,)`` (per-batch), in order.
    """

    dataset: int
    plan: EpochPlan
    ids: np.ndarray | int
    units: np.ndarray


def interleave(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An order of ``labels``' positions spreading every label evenly (stratified, random).

    Each label keeps its order: its ``j``-th of ``c`` units is at ``(j + u) / c``, ``u ~ U(0, 1)``.
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
    rank_budget: np.ndarray | None = None,
) -> EpochPlan:
    """One plan from the parts: global micro-batches, units interleaved evenly by dataset.

    ``num_examples``, ``num_skipped``, ``num_truncated``: of all datasets (the first sets the
    id dtype); ``dropped``: by the tail policy (``None``: the parts' sum); ``rank_budget``: the
    ranks' budgets the parts were planned with (``None``: equal).
    """
    orders, starts, micro_ds, units, unit_ds = [], [], [], [], []
    order_base = micro_base = 0
    for part in parts:
        p = part.plan
        ids = p.order.astype(np.int64)
        orders.append(ids + part.ids if isinstance(part.ids, int) else part.ids[ids])
        starts.append(p.micro_batch_start + order_base)
        micro_ds.append(np.full(p.micro_batch_start.size, part.dataset, dtype=np.int64))
        units.append(part.units + micro_base)
        unit_ds.append(np.full(part.units.shape[0], part.dataset, dtype=np.int64))
        order_base += p.order.size
        micro_base += p.micro_batch_start.size
    cat = np.concatenate
    plans = [part.plan for part in parts]
    cost = cat([p.micro_batch_cost for p in plans]) if plans else np.zeros(0)
    load = cat([p.micro_batch_load for p in plans]) if plans else np.zeros(0)
    packed = any(p.micro_batch_work is not None for p in plans)
    shaped = [p.micro_batch_shape for p in plans if p.micro_batch_shape is not None]
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
        micro_batch_start=cat(starts) if starts else np.zeros(0, dtype=np.int64),
        micro_batch_size=cat([p.micro_batch_size for p in plans])
        if plans
        else np.zeros(0, np.int64),
        micro_batch_cost=cost,
        assign=assign,
        num_dropped=sum(p.num_dropped for p in plans) if dropped is None else dropped,
        num_duplicated=sum(p.num_duplicated for p in plans),
        num_skipped=num_skipped,
        num_truncated=num_truncated,
        micro_batch_dataset=cat(micro_ds) if micro_ds else np.zeros(0, dtype=np.int64),
        micro_batch_work=load if packed else None,
        micro_batch_shape=cat(shaped) if shaped and len(shaped) == len(plans) else None,
        rank_budget=rank_budget,
        _exact_tokens=cat([p.micro_batch_tokens for p in plans]) if plans else np.zeros(0, int),
    )
