"""Per-dataset breakdown of a mixture's epoch plan: shares, tokens, steps, repeats.

Example:
    >>> from lightning_varbatch import MixturePlanner, PlanConfig
    >>> planner = MixturePlanner([np.full(90, 8), np.full(4, 8)], PlanConfig(max_tokens=16),
    ...                          weights=[1, 1], steps_per_epoch=10)
    >>> rows = dataset_breakdown(planner, planner.plan(epoch=0))
    >>> [(r.name, r.steps, r.examples, r.unique_examples) for r in rows]
    [('0', 5, 10, 10), ('1', 5, 10, 4)]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_planner import EpochPlan
from lightning_varbatch.planner.micro_batch_figures import check_plan_of
from lightning_varbatch.planner.mixture import MixturePlanner

__all__ = ["DatasetShare", "dataset_breakdown", "format_breakdown"]


@dataclass(frozen=True)
class DatasetShare:
    """One dataset's part of an epoch plan; shares are 0-1.

    Attributes:
        name: the dataset's name.
        weight: its target share (``MixturePlanner.probabilities``).
        max_tokens: its budget of one micro-batch.
        micro_batches: its micro-batches this epoch, all ranks.
        batch_share: its share of the epoch's micro-batches.
        steps: optimizer steps made only of its micro-batches.
        loss_tokens: its loss tokens this epoch.
        token_share: its share of the epoch's loss tokens.
        examples: its examples run this epoch (repeats counted).
        unique_examples: its distinct examples run this epoch.
        repeats: ``examples - unique_examples`` (upsampling, tail padding).
        passes: ``examples / (its planned examples)``: how many passes over it the epoch holds.
        budget_fill: its mean micro-batch cost over its ``max_tokens``.
    """

    name: str
    weight: float
    max_tokens: int
    micro_batches: int
    batch_share: float
    steps: int
    loss_tokens: int
    token_share: float
    examples: int
    unique_examples: int
    repeats: int
    passes: float
    budget_fill: float

    def to_dict(self) -> dict[str, int | float | str]:
        """All fields as plain Python values."""
        return asdict(self)


def dataset_breakdown(planner: MixturePlanner, plan: EpochPlan) -> list[DatasetShare]:
    """Every dataset's share of ``plan`` (made by ``planner``).

    Args:
        planner: the mixture planner.
        plan: one of its plans.

    Returns:
        One :class:`DatasetShare` per dataset, in the planner's order.
    """
    if plan.micro_batch_dataset is None or (
        plan.micro_batch_dataset.size
        and int(plan.micro_batch_dataset.max()) >= planner.num_datasets
    ):
        raise SettingValueError(
            f"plan is not a plan of this mixture of {planner.num_datasets} datasets (it has "
            f"{'no' if plan.micro_batch_dataset is None else 'other'} dataset labels): pass a plan "
            "made by this MixturePlanner's plan(...).",
            setting="plan",
            value=plan,
        )
    check_plan_of(planner, plan)
    run = plan.assign.reshape(-1)
    dataset = plan.step_dataset.reshape(-1)
    homogeneous = (plan.step_dataset == plan.step_dataset[:, :1, :1]).all(axis=(1, 2))
    total_tokens = int(plan.micro_batch_tokens[run].sum())
    rows = []
    for d, name in enumerate(planner.names):
        micro_batches = run[dataset == d]
        ids = plan.ids_of_micro_batches(micro_batches).astype(np.int64)
        tokens = int(plan.micro_batch_tokens[micro_batches].sum())
        unique = int(np.unique(ids).size)
        budget = planner.budget(d)
        planned = planner.planners[d].num_planned
        rows.append(
            DatasetShare(
                name=name,
                weight=float(planner.probabilities[d]),
                max_tokens=budget,
                micro_batches=int(micro_batches.size),
                batch_share=micro_batches.size / run.size if run.size else 0.0,
                steps=int((homogeneous & (plan.step_dataset[:, 0, 0] == d)).sum()),
                loss_tokens=tokens,
                token_share=tokens / total_tokens if total_tokens else 0.0,
                examples=int(ids.size),
                unique_examples=unique,
                repeats=int(ids.size) - unique,
                passes=ids.size / planned if planned else 0.0,
                budget_fill=float(plan.micro_batch_cost[micro_batches].mean()) / budget
                if micro_batches.size
                else 0.0,
            )
        )
    return rows


#: The breakdown table's columns: each one's header and how a row shows its value.
_COLUMNS: tuple[tuple[str, Callable[[DatasetShare], str]], ...] = (
    ("dataset", lambda r: r.name),
    ("weight", lambda r: f"{r.weight:.3f}"),
    ("max_tokens", lambda r: f"{r.max_tokens:,}"),
    ("micro-batches", lambda r: f"{r.micro_batches:,}"),
    ("share", lambda r: f"{100 * r.batch_share:.1f}%"),
    ("steps", lambda r: f"{r.steps:,}"),
    ("tokens share", lambda r: f"{100 * r.token_share:.1f}%"),
    ("examples", lambda r: f"{r.examples:,}"),
    ("repeats", lambda r: f"{r.repeats:,}"),
    ("passes", lambda r: f"{r.passes:.2f}"),
    ("budget fill", lambda r: f"{100 * r.budget_fill:.1f}%"),
)


def format_breakdown(rows: list[DatasetShare]) -> str:
    """The breakdown as a text table.

    Example:
        >>> from lightning_varbatch import MixturePlanner, PlanConfig
        >>> planner = MixturePlanner([np.full(8, 4), np.full(4, 8)], PlanConfig(max_tokens=16))
        >>> print(format_breakdown(dataset_breakdown(planner, planner.plan(epoch=0))))
        ... # doctest: +NORMALIZE_WHITESPACE
        dataset  weight  max_tokens  micro-batches  share  steps  tokens share  examples
            repeats  passes  budget fill
        0        0.500   16          2              50.0%  2      50.0%         8
            0        1.00    100.0%
        1        0.500   16          2              50.0%  2      50.0%         4
            0        1.00    100.0%
    """
    table = [[head for head, _ in _COLUMNS]]
    table += [[show(r) for _, show in _COLUMNS] for r in rows]
    widths = [max(len(row[c]) for row in table) for c in range(len(table[0]))]
    lines = [
        "  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip() for row in table
    ]
    return "\n".join(lines)
