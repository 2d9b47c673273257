"""The batch-size schedule in the plan report: steps, budgets, tokens and fill per stage.

A plan under ``PlanConfig.batch_schedule`` holds each step's fraction of the full step
(``plan.step_fraction``). :func:`schedule_report` groups the steps by it, one row per level (a
ramp's many levels in at most ``rows - 1`` groups), the last row the full steps, and gives what
each row's steps really hold: the per-rank budget, tokens and examples per step and their fill.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> lengths = np.random.default_rng(0).integers(1, 120, 5000)
    >>> config = PlanConfig(max_tokens=1024, batch_schedule="0:0.25 20K:0.5 60K:1")
    >>> planner = EpochPlanner(lengths, config)
    >>> report = schedule_report(planner, planner.plan(epoch=0, world_size=2))
    >>> [(row.label, row.budget_min) for row in report.rows]
    [('0.25', 256), ('0.5', 512), ('1 (full)', 1024)]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lightning_varbatch.planner.batch_schedule import BatchSchedule
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.scheduled_plan import schedule_counts
from lightning_varbatch.planner.warmup_report import step_figures

__all__ = ["ScheduleReport", "ScheduleStage", "schedule_report"]

_ROW = "  {:<15} {:>6} {:>12} {:>3} {:>11} {:>10} {:>10} {:>10} {:>8} {:>7} {:>8}"


@dataclass(frozen=True)
class ScheduleStage:
    """One level of the schedule (or consecutive levels grouped), or the full steps.

    Attributes:
        label: the fraction (``"0.25"``), a group's range (``"0.25-0.31"``) or ``"1 (full)"``.
        fraction_min: the row's smallest fraction of the full step.
        fraction_max: its largest.
        levels: the schedule's levels the row's steps run at (one shorter than a step joins next).
        first_step: the plan's step the row starts at.
        num_steps: steps in the row.
        start_tokens: the schedule's clock (planning tokens trained) at the row's first step.
        micro_batches: micro-batches per step per rank (the accumulation; they grow, not multiply).
        budget_min: the smallest micro-batch budget of a rank in the row (tokens).
        budget_max: the largest (unlike ``budget_min`` over grouped levels or per-rank budgets).
        step_budget: mean scheduled tokens per step (every rank's budget × accumulation).
        tokens_per_step: mean planning tokens per step (the clock's unit; pairs: max(src, tgt)).
        min_tokens: the fewest planning tokens of one step.
        loss_tokens_per_step: mean loss tokens per step (target tokens for pairs).
        min_loss_tokens: the fewest loss tokens of one step.
        examples_per_step: mean examples per step.
        fill: mean of each step's planned cost over its scheduled budget.
        min_fill: the emptiest step's (the spread step where the schedule reaches 1, a tail).
    """

    label: str
    fraction_min: float
    fraction_max: float
    levels: int
    first_step: int
    num_steps: int
    start_tokens: int
    micro_batches: int
    budget_min: int
    budget_max: int
    step_budget: float
    tokens_per_step: float
    min_tokens: int
    loss_tokens_per_step: float
    min_loss_tokens: int
    examples_per_step: float
    fill: float
    min_fill: float


@dataclass(frozen=True)
class ScheduleReport:
    """A plan's steps by schedule stage (``rows``), the last row the full steps.

    Attributes:
        schedule: the schedule's canonical text.
        start_tokens: the schedule's clock at the plan's first step.
        rows: the stages.
    """

    schedule: str
    start_tokens: int
    rows: tuple[ScheduleStage, ...]

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for JSON or a logger."""
        return {
            "schedule": self.schedule,
            "start_tokens": self.start_tokens,
            "stages": [asdict(r) for r in self.rows],
        }

    def format(self) -> str:
        """A table: one line per stage.

        Example:
            >>> row = ScheduleStage("0.5", 0.5, 0.5, 1, 0, 4, 0, 2, 512, 512, 2048.0, 1990.0,
            ...                     1900, 1500.0, 1400, 40.0, 0.97, 0.95)
            >>> table = ScheduleReport("0:0.5 8000:1.0", 0, (row,)).format()
            >>> " ".join(table.splitlines()[2].split())
            '0.5 4 0 2 512 1,990 1,900 1,500 40.0 97.0 % 95.0 %'
        """
        head = "fraction steps from_token mb budget tok/step min_tok loss/step ex/step fill"
        names = [name.replace("_", " ") for name in [*head.split(), "min_fill"]]
        lines = [f"batch schedule   {_short(self.schedule)}", _ROW.format(*names)]
        for r in self.rows:
            budget = f"{r.budget_min}"
            if r.budget_max != r.budget_min:
                budget += f"-{r.budget_max}"
            lines.append(
                _ROW.format(
                    r.label,
                    r.num_steps,
                    f"{r.start_tokens:,}",
                    r.micro_batches,
                    budget,
                    f"{r.tokens_per_step:,.0f}",
                    f"{r.min_tokens:,}",
                    f"{r.loss_tokens_per_step:,.0f}",
                    f"{r.examples_per_step:.1f}",
                    f"{100 * r.fill:.1f} %",
                    f"{100 * r.min_fill:.1f} %",
                )
            )
        return "\n".join(lines)


def _short(text: str) -> str:
    """The schedule's text, or for many levels (a ramp) its first and last."""
    schedule = BatchSchedule.parse(text)
    if schedule.num_levels <= 4:
        return text
    first = schedule.fractions[0]
    return f"{schedule.num_levels} levels, {first:.3g} at 0 to 1 at {schedule.full_from:,} tokens"


def _groups(fractions: list[float], rows: int) -> list[list[float]]:
    """The levels below 1 in at most ``rows - 1`` runs of consecutive levels, then ``[1.0]``."""
    below = np.asarray([f for f in fractions if f < 1.0])
    runs = np.array_split(below, min(below.size, rows - 1)) if below.size else []
    groups = [[float(f) for f in run] for run in runs]
    return [*groups, [1.0]] if 1.0 in fractions else groups


def _label(levels: list[float]) -> str:
    if levels == [1.0]:
        return "1 (full)"
    lo, hi = levels[0], levels[-1]
    return f"{lo:.3g}" if lo == hi else f"{lo:.3g}-{hi:.3g}"


def schedule_report(
    planner: Planner, plan: EpochPlan, rows: int = 8, clock: int | None = None
) -> ScheduleReport | None:
    """The steps of ``plan`` by the schedule's levels (at most ``rows`` rows).

    Args:
        planner: the plan's planner (its ``config.batch_schedule``, lengths and budgets).
        plan: a plan it made.
        rows: the most rows, the full steps' included (at least 2).
        clock: planning tokens trained before the plan's first step (``None``: a whole epoch's,
            ``plan.epoch`` × the planner's ``epoch_tokens``; give it for the rest of an epoch).

    Returns:
        The report (``None``: no schedule); a plan past the schedule is one row of full steps.

    Raises:
        ValueError: for ``rows`` below 2.
    """
    config = getattr(planner, "config", None)
    text = getattr(config, "batch_schedule", None)
    if config is None or text is None:
        return None
    if rows < 2:
        raise ValueError(f"rows must be at least 2 (a level and the full steps), got {rows}.")
    counts = schedule_counts(plan, planner)
    assert counts is not None  # the planner has a schedule
    budget, cost = counts
    steps = plan.num_steps
    fraction = np.ones(steps) if plan.step_fraction is None else plan.step_fraction
    figures = step_figures(planner, plan)
    real = figures["real"].astype(np.int64)
    if clock is None:
        clock = plan.epoch * int(getattr(planner, "epoch_tokens", 0))
    at = clock + np.cumsum(real) - real
    full = plan.rank_budget
    if full is None:
        full = np.full(plan.world_size, config.max_tokens)
    loss = plan.step_tokens
    fill = cost / np.maximum(budget, 1)
    out = []
    for levels in _groups(sorted(set(fraction.tolist())), rows):
        mask = np.isin(fraction, levels)
        index = np.flatnonzero(mask)
        per_rank = np.floor(np.asarray(levels)[:, None] * full[None, :]).astype(np.int64)
        out.append(
            ScheduleStage(
                label=_label(levels),
                fraction_min=levels[0],
                fraction_max=levels[-1],
                levels=len(levels),
                first_step=int(index[0]),
                num_steps=int(index.size),
                start_tokens=int(at[index[0]]),
                micro_batches=plan.accumulate_grad_batches,
                budget_min=int(per_rank.min()),
                budget_max=int(per_rank.max()),
                step_budget=float(budget[mask].mean()),
                tokens_per_step=float(real[mask].mean()),
                min_tokens=int(real[mask].min()),
                loss_tokens_per_step=float(loss[mask].mean()),
                min_loss_tokens=int(loss[mask].min()),
                examples_per_step=float(figures["examples"][mask].mean()),
                fill=float(fill[mask].mean()),
                min_fill=float(fill[mask].min()),
            )
        )
    return ScheduleReport(text, int(clock), tuple(out))
