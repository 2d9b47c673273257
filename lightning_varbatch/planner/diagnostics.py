"""Plan diagnostics: what an epoch plan will cost, before any GPU hour is spent.

:func:`diagnose` sums an epoch plan up as a JSON-friendly :class:`PlanDiagnostics`: padding
efficiency, budget fill, examples per batch, rank imbalance, examples dropped/repeated/skipped/cut.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.micro_batch_figures import (
    LoadModel,
    MicroBatchFigures,
    micro_batch_figures,
    micro_batch_load,
)
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.protocol import Planner

__all__ = [
    "LoadModel",
    "MicroBatchFigures",
    "PlanDiagnostics",
    "diagnose",
    "micro_batch_figures",
    "rank_loads",
]


@dataclass(frozen=True)
class PlanDiagnostics:
    """Summary figures of one epoch plan; ratios are 0-1.

    Attributes:
        num_examples: examples in the dataset (skipped ones included).
        num_planned: examples that take part in the plan (all but the skipped ones).
        num_micro_batches: micro-batches run this epoch, all ranks together.
        micro_batches_per_rank: micro-batches every rank runs.
        num_steps: optimizer steps.
        world_size: number of ranks.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        max_tokens: the budget of one micro-batch.
        cost: the planner's cost model (name, or the callable's qualified name).
        real_tokens: summed planning lengths of every run example (``max(src, tgt)`` for pairs).
        padded_tokens: slots after padding, Σ examples × longest padded length (packed: aligned).
        padding_efficiency: ``real_tokens / padded_tokens``.
        budget_fill: mean micro-batch cost / its budget (its dataset's and rank's).
        examples_per_batch_min: fewest examples in a micro-batch.
        examples_per_batch_mean: mean examples per micro-batch.
        examples_per_batch_p50: median examples per micro-batch.
        examples_per_batch_p95: 95th percentile of examples per micro-batch.
        examples_per_batch_max: most examples in a micro-batch.
        imbalance_linear_mean: mean over steps of the busiest rank's load (Σ examples × longest
            padded length; over its budget share, if any) / the mean rank load (1 = even).
        imbalance_linear_max: the same, worst step.
        imbalance_quadratic_mean: as linear, load Σ n·L + c·n·L² (c: ``quadratic_coef``, 1/64).
        imbalance_quadratic_max: the same, worst step.
        imbalance_flops_mean: as linear, load slots + ``flop_attention`` × Σ L² (:mod:`~.flops`).
        imbalance_flops_max: the same, worst step.
        num_dropped: examples left out by ``tail="drop"``.
        num_duplicated: examples repeated by ``tail="pad"`` (or a ``"spread"`` short of them).
        num_skipped: examples left out by ``oversize="skip"``.
        num_truncated: examples cut by ``oversize="truncate"``.
        coverage: distinct examples run / ``num_planned``.
        equal_counts: every rank runs the same number of non-empty micro-batches.
        num_shapes: distinct ``(rows, padded length)`` shapes run (``torch.compile`` graphs).
        shapes: under a shape budget (``max_shapes``), per shape ``[rows, length,
            micro-batches, real tokens, padded slots]`` by length; empty for free shapes.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner(np.full(8, 4), PlanConfig(max_tokens=8))
        >>> diag = diagnose(planner, planner.plan(epoch=0, world_size=2))
        >>> diag.padding_efficiency, diag.budget_fill, diag.imbalance_linear_max
        (1.0, 1.0, 1.0)
    """

    num_examples: int
    num_planned: int
    num_micro_batches: int
    micro_batches_per_rank: int
    num_steps: int
    world_size: int
    accumulate_grad_batches: int
    max_tokens: int
    cost: str
    real_tokens: int
    padded_tokens: int
    padding_efficiency: float
    budget_fill: float
    examples_per_batch_min: int
    examples_per_batch_mean: float
    examples_per_batch_p50: float
    examples_per_batch_p95: float
    examples_per_batch_max: int
    imbalance_linear_mean: float
    imbalance_linear_max: float
    imbalance_quadratic_mean: float
    imbalance_quadratic_max: float
    imbalance_flops_mean: float
    imbalance_flops_max: float
    num_dropped: int
    num_duplicated: int
    num_skipped: int
    num_truncated: int
    coverage: float
    equal_counts: bool
    num_shapes: int = 0
    shapes: tuple[tuple[int, int, int, int, int], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """All fields as plain Python values (ready for ``json.dumps`` or a logger)."""
        out = asdict(self)
        out["shapes"] = [list(row) for row in self.shapes]  # as JSON gives it back
        return out

    def format(self) -> str:
        """A human-readable, multi-line report.

        Example:
            >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
            >>> planner = EpochPlanner(np.full(8, 4), PlanConfig(max_tokens=8))
            >>> print(diagnose(planner, planner.plan(epoch=0, world_size=2)).format())
            ... # doctest: +NORMALIZE_WHITESPACE
            plan: 8 examples (8 planned)
              settings            world_size=2 accumulate_grad_batches=1 max_tokens=8 cost=padded
              steps               2 optimizer steps x 2 ranks x 1 micro-batches = 4 micro-batches
              padding efficiency  100.0 %  (32 real / 32 padded tokens)
              budget fill         100.0 %  (mean micro-batch cost / max_tokens)
              examples per batch  min 2  p50 2  mean 2.0  p95 2  max 2
              rank imbalance      linear mean 1.000 max 1.000 | quadratic mean 1.000 max 1.000
                                  flops mean 1.000 max 1.000
              coverage            100.0 % of planned examples
              dropped/duplicated  0 dropped, 0 duplicated, 0 skipped, 0 truncated
              equal counts        yes: every rank runs 2 micro-batches
              shapes              1 distinct (rows, length) (free shapes)
        """
        return "\n".join(
            [
                f"plan: {self.num_examples:,} examples ({self.num_planned:,} planned)",
                f"  settings            world_size={self.world_size} "
                f"accumulate_grad_batches={self.accumulate_grad_batches} "
                f"max_tokens={self.max_tokens:,} cost={self.cost}",
                f"  steps               {self.num_steps:,} optimizer steps x {self.world_size} "
                f"ranks x {self.accumulate_grad_batches} micro-batches = "
                f"{self.num_micro_batches:,} micro-batches",
                f"  padding efficiency  {100 * self.padding_efficiency:.1f} %  "
                f"({self.real_tokens:,} real / {self.padded_tokens:,} padded tokens)",
                f"  budget fill         {100 * self.budget_fill:.1f} %  "
                "(mean micro-batch cost / max_tokens)",
                f"  examples per batch  min {self.examples_per_batch_min:,}  "
                f"p50 {self.examples_per_batch_p50:,.0f}  "
                f"mean {self.examples_per_batch_mean:,.1f}  "
                f"p95 {self.examples_per_batch_p95:,.0f}  max {self.examples_per_batch_max:,}",
                f"  rank imbalance      linear mean {self.imbalance_linear_mean:.3f} "
                f"max {self.imbalance_linear_max:.3f} | quadratic mean "
                f"{self.imbalance_quadratic_mean:.3f} max {self.imbalance_quadratic_max:.3f}",
                f"                      flops mean {self.imbalance_flops_mean:.3f} "
                f"max {self.imbalance_flops_max:.3f}",
                f"  coverage            {100 * self.coverage:.1f} % of planned examples",
                f"  dropped/duplicated  {self.num_dropped:,} dropped, "
                f"{self.num_duplicated:,} duplicated, {self.num_skipped:,} skipped, "
                f"{self.num_truncated:,} truncated",
                f"  equal counts        {'yes' if self.equal_counts else 'NO'}: every rank runs "
                f"{self.micro_batches_per_rank:,} micro-batches",
                f"  shapes              {self.num_shapes:,} distinct (rows, length)"
                + ("" if self.shapes else " (free shapes)"),
                *(
                    f"    {rows:>6,} x {length:<6,} {count:>8,} micro-batches  "
                    f"{100 * real / slots if slots else 0:5.1f} % real tokens"
                    for rows, length, count, real, slots in self.shapes
                ),
            ]
        )


def rank_loads(planner: Planner, plan: EpochPlan, model: LoadModel = "linear") -> np.ndarray:
    """Every rank's load in every optimizer step, in run order.

    Args:
        planner: the planner that made ``plan``.
        plan: the epoch plan.
        model: ``"linear"`` (Σ examples × longest padded length; packed: the row's tokens),
            ``"quadratic"`` (+ ``quadratic_coef``·n·L²), ``"flops"`` (+ ``flop_attention``·n·L²;
            packed: Σ L²).

    Returns:
        ``(num_steps, world_size)`` float64 loads.

    Raises:
        ValueError: for an unknown ``model``.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner(np.array([2, 9, 9, 4, 2]), PlanConfig(max_tokens=18))
        >>> rank_loads(planner, planner.plan(epoch=0, world_size=2)).tolist()
        [[18.0, 12.0]]
    """
    load = micro_batch_load(planner, micro_batch_figures(planner, plan), model)
    return load[plan.assign].sum(axis=2)


def _budgets(planner: Planner, plan: EpochPlan) -> np.ndarray:
    """Every micro-batch's budget: its dataset's ``max_tokens``, scaled to its rank's budget."""
    if isinstance(planner, MixturePlanner) and plan.micro_batch_dataset is not None:
        own = np.array([planner.budget(d) for d in range(planner.num_datasets)], float)
        budgets = own[plan.micro_batch_dataset]
    else:
        budgets = np.full(plan.micro_batch_cost.shape, float(planner.config.max_tokens))
    if plan.rank_budget is not None:  # each rank's micro-batches fit its own budget
        common = float(planner.config.max_tokens)
        for rank, budget in enumerate(plan.rank_budget):
            ids = plan.assign[:, rank, :]
            budgets[ids] = np.floor(budgets[ids] * float(budget) / common)
    return budgets


def _imbalance(loads: np.ndarray, plan: EpochPlan) -> tuple[float, float]:
    if loads.shape[0] == 0:
        return 1.0, 1.0
    if plan.rank_budget is not None:  # ranks of different speed: time = load / share
        loads = loads / (plan.rank_budget / plan.rank_budget.mean())
    mean = loads.mean(axis=1)
    ratio = np.divide(loads.max(axis=1), mean, out=np.ones_like(mean), where=mean > 0)
    return float(ratio.mean()), float(ratio.max())


def _coverage(planner: Planner, plan: EpochPlan, run_micro_batches: np.ndarray) -> int:
    """Distinct example ids in the run micro-batches (robust to repeated batches and ids)."""
    if run_micro_batches.size == 0:
        return 0
    delta = np.zeros(plan.order.shape[0] + 1, dtype=np.int64)
    np.add.at(delta, plan.micro_batch_start[run_micro_batches], 1)
    np.add.at(
        delta,
        plan.micro_batch_start[run_micro_batches] + plan.micro_batch_size[run_micro_batches],
        -1,
    )
    covered = np.cumsum(delta[:-1]) > 0
    seen = np.zeros(planner.num_examples, dtype=bool)
    seen[plan.order[covered]] = True
    return int(np.count_nonzero(seen))


def diagnose(planner: Planner, plan: EpochPlan) -> PlanDiagnostics:
    """Compute the diagnostics of one epoch plan.

    Micro-batches ``tail="pad"`` runs twice count twice (padding, fill, sizes); dropped ones do not.

    Args:
        planner: the planner that made ``plan`` (its lengths and settings).
        plan: the epoch plan.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner(np.array([2, 9, 9, 4, 2]), PlanConfig(max_tokens=18))
        >>> diag = diagnose(planner, planner.plan(epoch=0, world_size=2))
        >>> diag.imbalance_linear_max, diag.real_tokens, diag.padded_tokens
        (1.2, 26, 30)
    """
    cfg = planner.config
    micro_batches = micro_batch_figures(planner, plan)
    run = np.asarray(plan.assign, dtype=np.int64).reshape(-1)
    size = micro_batches.size[run]
    real = int(micro_batches.real[run].sum())
    padded = int(micro_batches.slots[run].sum())
    (lin_mean, lin_max), (quad_mean, quad_max), (flops_mean, flops_max) = (
        _imbalance(micro_batch_load(planner, micro_batches, model)[plan.assign].sum(axis=2), plan)
        for model in ("linear", "quadratic", "flops")
    )
    per_rank = np.count_nonzero(micro_batches.size[plan.assign] > 0, axis=(0, 2))
    cost = cfg.cost if isinstance(cfg.cost, str) else getattr(cfg.cost, "__qualname__", "custom")
    empty = size.size == 0
    return PlanDiagnostics(
        num_examples=planner.num_examples,
        num_planned=planner.num_planned,
        num_micro_batches=int(run.size),
        micro_batches_per_rank=plan.num_micro_batches_per_rank,
        num_steps=plan.num_steps,
        world_size=plan.world_size,
        accumulate_grad_batches=plan.accumulate_grad_batches,
        max_tokens=cfg.max_tokens,
        cost=str(cost),
        real_tokens=real,
        padded_tokens=padded,
        padding_efficiency=real / padded if padded else 0.0,
        budget_fill=0.0
        if empty
        else float((plan.micro_batch_cost[run] / _budgets(planner, plan)[run]).mean()),
        examples_per_batch_min=0 if empty else int(size.min()),
        examples_per_batch_mean=0.0 if empty else float(size.mean()),
        examples_per_batch_p50=0.0 if empty else float(np.percentile(size, 50)),
        examples_per_batch_p95=0.0 if empty else float(np.percentile(size, 95)),
        examples_per_batch_max=0 if empty else int(size.max()),
        imbalance_linear_mean=lin_mean,
        imbalance_linear_max=lin_max,
        imbalance_quadratic_mean=quad_mean,
        imbalance_quadratic_max=quad_max,
        imbalance_flops_mean=flops_mean,
        imbalance_flops_max=flops_max,
        num_dropped=int(plan.num_dropped),
        num_duplicated=int(plan.num_duplicated),
        num_skipped=int(plan.num_skipped),
        num_truncated=int(plan.num_truncated),
        coverage=(
            _coverage(planner, plan, np.unique(run)) / planner.num_planned
            if planner.num_planned
            else 0.0
        ),
        equal_counts=bool(per_rank.size == 0 or (per_rank == per_rank[0]).all()),
        num_shapes=len(
            np.unique(np.stack([micro_batches.rows[run], micro_batches.longest[run]], 1), axis=0)
        ),
        shapes=_shape_table(plan, micro_batches, run),
    )


def _shape_table(
    plan: EpochPlan, micro_batches: MicroBatchFigures, run: np.ndarray
) -> tuple[tuple[int, int, int, int, int], ...]:
    """Per static shape: rows, length, micro-batches run, real tokens, padded slots."""
    if plan.micro_batch_shape is None or run.size == 0:
        return ()
    shapes, which = np.unique(plan.micro_batch_shape[run], axis=0, return_inverse=True)
    which = which.reshape(-1)
    count = np.bincount(which, minlength=len(shapes))
    real = np.bincount(which, weights=micro_batches.real[run], minlength=len(shapes))
    slots = np.bincount(which, weights=micro_batches.slots[run], minlength=len(shapes))
    order = np.argsort(shapes[:, 1], kind="stable")
    return tuple(
        (int(shapes[k, 0]), int(shapes[k, 1]), int(count[k]), int(real[k]), int(slots[k]))
        for k in order
    )
