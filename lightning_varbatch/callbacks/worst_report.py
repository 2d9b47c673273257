"""The words of :class:`~lightning_varbatch.callbacks.WorstBatchCheck`: advice and report.

:func:`advice` names the settings that shrink a worst micro-batch of a kind, with their values;
:func:`format_report` prints a rank's report as a small table; :func:`gib` shows bytes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["advice", "format_report", "gib"]


def advice(kind: str, config: PlanConfig) -> str:
    """The settings that shrink the worst micro-batch of ``kind``, each as ``name=value`` now.

    From :class:`~lightning_varbatch.PlanConfig`'s fields and
    :data:`~lightning_varbatch.planner.costs.COST_NAMES`: a padded micro-batch's attention term is
    budgeted by ``cost='quadratic'``, a packed row's and a shape's rows by ``max_tokens``.

    Example:
        >>> advice("attention", PlanConfig(max_tokens=4096))
        "lower max_tokens=4096, or budget the attention term with cost='quadratic' (now cost='padded', quadratic_coef=0.015625)"
        >>> advice("examples", PlanConfig(max_tokens=4096, max_examples=64))
        'lower max_examples=64 or max_tokens=4096'
    """  # noqa: E501
    tokens = f"max_tokens={config.max_tokens}"
    if kind == "examples":
        if config.max_examples is None:
            return f"lower {tokens}, or cap the examples with max_examples (now None)"
        return f"lower max_examples={config.max_examples} or {tokens}"
    if kind == "attention" and config.layout == "padded" and config.max_shapes is None:
        if config.cost == "quadratic":
            return (
                f"lower {tokens}, or raise quadratic_coef={config.quadratic_coef:g} (with "
                "cost='quadratic' it budgets the attention term)"
            )
        cost = config.cost if isinstance(config.cost, str) else "a custom cost"
        shown = f"cost={cost!r}" if isinstance(config.cost, str) else cost
        return (
            f"lower {tokens}, or budget the attention term with cost='quadratic' (now "
            f"{shown}, quadratic_coef={config.quadratic_coef:g})"
        )
    if kind == "attention" and config.max_shapes is not None and config.cost == "quadratic":
        return f"lower {tokens}, or raise quadratic_coef={config.quadratic_coef:g}"
    return f"lower {tokens}"


def gib(n: int) -> str:
    """``n`` bytes in GiB, two decimals.

    Example:
        >>> gib(2**30)
        '1.00 GiB'
    """
    return f"{n / 2**30:.2f} GiB"


def format_report(report: Sequence[Mapping[str, Any]], limit: int | None = None) -> str:
    """The report of :class:`WorstBatchCheck` as a small table.

    Example:
        >>> print(format_report([{"kind": "examples", "examples": 4, "longest": 2,
        ...     "padded_tokens": 8, "attention": 16, "peak_bytes": 2**30, "rank": 0,
        ...     "memory": "cpu_vmhwm"}]))  # doctest: +NORMALIZE_WHITESPACE
        worst micro-batches (rank 0, cpu_vmhwm):
          examples       4 x 2 tokens   8 padded tokens   peak 1.00 GiB
    """
    if not report:
        return "worst micro-batches: none (this rank has no micro-batches)"
    head = f"worst micro-batches (rank {report[0]['rank']}, {report[0]['memory']}"
    head += f", limit {gib(limit)}):" if limit is not None else "):"
    lines = [head]
    for r in report:
        peak = "?" if r["peak_bytes"] is None else gib(int(r["peak_bytes"]))
        rows = r.get("rows")
        shape = (
            f"{r['examples']}"
            if rows in (None, r["examples"])
            else (f"{r['examples']} in {rows} rows")
        )
        lines.append(
            f"  {r['kind']:<14} {shape} x {r['longest']} tokens   "
            f"{r['padded_tokens']} padded tokens   peak {peak}"
        )
    return "\n".join(lines)
