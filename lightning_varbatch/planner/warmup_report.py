"""The length warm-up in the plan report: realised cap, examples, tokens and padding per stage.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> lengths = np.random.default_rng(0).integers(1, 120, 5000)
    >>> planner = EpochPlanner(lengths, PlanConfig(max_tokens=1024, length_warmup=20))
    >>> report = warmup_report(planner, planner.plan(epoch=0, world_size=2), stages=2)
    >>> [row.label for row in report.rows]
    ['steps 0-9', 'steps 10-19', 'after']
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.micro_batch_figures import micro_batch_figures
from lightning_varbatch.planner.protocol import Planner

__all__ = ["WarmupReport", "WarmupStage", "step_figures", "warmup_report"]


@dataclass(frozen=True)
class WarmupStage:
    """One stage of the warm-up (a run of steps), or the steps after it.

    Attributes:
        label: ``"steps a-b"`` (the run's optimizer steps) or ``"after"``.
        num_steps: steps in the stage.
        cap_min: the lowest realised cap (``0`` after the warm-up: no cap).
        cap_max: the highest realised cap.
        longest: the longest example the stage ran.
        examples_per_step: mean examples per optimizer step.
        real_tokens_per_step: mean real tokens (planning lengths) per step.
        min_real_tokens: the fewest real tokens of one step.
        padding_efficiency: real tokens / token slots over the stage.
        advanced: steps where the schedule advanced (nothing left fitted its cap).
        advanced_by: the most tokens the cap was raised by at one of those steps.
        dataset_caps: a mixture's: every dataset's ``(lowest, highest)`` realised cap.
    """

    label: str
    num_steps: int
    cap_min: int
    cap_max: int
    longest: int
    examples_per_step: float
    real_tokens_per_step: float
    min_real_tokens: int
    padding_efficiency: float
    advanced: int
    advanced_by: int
    dataset_caps: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class WarmupReport:
    """A plan's length warm-up stages (``rows``; last: steps after); ``datasets``: a mixture's."""

    first_step: int
    rows: tuple[WarmupStage, ...]
    datasets: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Plain values, for JSON or a logger."""
        out: dict[str, Any] = {"first_step": self.first_step}
        if self.datasets:
            out["datasets"] = list(self.datasets)
        out["stages"] = [asdict(r) for r in self.rows]
        return out

    def format(self) -> str:
        """A table: one line per stage.

        Example:
            >>> row = WarmupStage("after", 3, 0, 0, 90, 12.0, 1000.0, 990, 0.99, 0, 0)
            >>> print(WarmupReport(0, (row,)).format().splitlines()[1])
              after              3   -            90    12.0     1,000       990  99.0 %       0
        """
        head = (
            "length warm-up   steps  cap       longest  ex/step  tokens/step  min tok  "
            "padding  advanced"
        )
        lines = [head]
        for r in self.rows:
            cap = "-" if r.cap_max == 0 else f"{r.cap_min}-{r.cap_max}"
            moved = f"{r.advanced} (+{r.advanced_by})" if r.advanced else "0"
            lines.append(
                f"  {r.label:<14} {r.num_steps:>5}   {cap:<9} {r.longest:>5} "
                f"{r.examples_per_step:>7.1f} {r.real_tokens_per_step:>9,.0f} "
                f"{r.min_real_tokens:>9,} {100 * r.padding_efficiency:5.1f} %  {moved:>6}"
            )
            if r.dataset_caps:
                names = self.datasets or tuple(map(str, range(len(r.dataset_caps))))
                caps = ", ".join(
                    f"{name} {lo}-{hi}"
                    for name, (lo, hi) in zip(names, r.dataset_caps, strict=True)
                )
                lines.append(f"  {'':<14} cap per dataset: {caps}")
        return "\n".join(lines)


def step_figures(planner: Planner, plan: EpochPlan) -> dict[str, np.ndarray]:
    """Per-step examples, real tokens and token slots of ``plan`` (in plan order).

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner(np.array([4, 4, 2, 2]), PlanConfig(max_tokens=8))
        >>> sorted(step_figures(planner, planner.plan(epoch=0))["real"].tolist())
        [4, 8]
    """
    figures = micro_batch_figures(planner, plan)
    steps = plan.assign.shape[0]

    def per_step(values: np.ndarray) -> np.ndarray:
        return np.asarray(
            values[plan.assign].reshape(steps, plan.assign[0].size if steps else 0).sum(axis=1)
        )

    return {
        "examples": per_step(figures.size),
        "real": per_step(figures.real),
        "slots": per_step(figures.slots),
    }


def _stage(
    label: str,
    span: slice,
    figures: dict[str, np.ndarray],
    caps: Any,
    per_dataset: np.ndarray | None = None,
) -> WarmupStage:
    real, slots = figures["real"][span], figures["slots"][span]
    longest, realised, raised = caps[0], caps[2], caps[3]
    own: tuple[tuple[int, int], ...] = ()
    if per_dataset is not None and per_dataset[:, span].size:
        own = tuple((int(row.min()), int(row.max())) for row in per_dataset[:, span])
    n = int(real.size)
    if n == 0:
        return WarmupStage(label, 0, 0, 0, 0, 0.0, 0.0, 0, 0.0, 0, 0)
    capped = realised[span]
    moved = raised[span]
    return WarmupStage(
        label=label,
        num_steps=n,
        cap_min=int(capped.min()) if capped.size else 0,
        cap_max=int(capped.max()) if capped.size else 0,
        longest=int(longest[span].max()),
        examples_per_step=float(figures["examples"][span].mean()),
        real_tokens_per_step=float(real.mean()),
        min_real_tokens=int(real.min()),
        padding_efficiency=float(real.sum() / slots.sum()) if slots.sum() else 0.0,
        advanced=int(np.count_nonzero(moved > 0)),
        advanced_by=int(moved.max(initial=0)),
        dataset_caps=own,
    )


def warmup_report(planner: Planner, plan: EpochPlan, stages: int = 4) -> WarmupReport | None:
    """Split the warm-up of ``plan`` into ``stages`` runs of steps, and the steps after it.

    Returns:
        The report, or ``None`` for a plan without a warm-up.
    """
    trace = plan.length_warmup
    if trace is None:
        return None
    figures = step_figures(planner, plan)
    w = trace.num_steps
    bounds = np.unique(np.linspace(0, w, min(stages, w) + 1).round().astype(np.int64))
    caps = (trace.step_longest, trace.scheduled, trace.realised, trace.raised)
    rows = []
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist(), strict=True):
        first = trace.first_step
        label = f"steps {first + a}-{first + b - 1}"
        rows.append(_stage(label, slice(a, b), figures, caps, trace.dataset_realised))
    none = np.zeros(0, dtype=np.int64)
    rows.append(_stage("after", slice(w, None), figures, (trace.step_longest, none, none, none)))
    names = () if trace.dataset_realised is None else tuple(getattr(planner, "names", ()))
    return WarmupReport(trace.first_step, tuple(rows), names)
