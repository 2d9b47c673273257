"""Every rank's worst micro-batches in one place: one all-gather, and the metrics over ranks.

:func:`gather_reports` collects each rank's ``(kind, examples, longest, peak_bytes, over)`` rows on
every rank (one all-gather: a rank over the memory limit is known to all, none waits);
:func:`worst_metrics` turns them into ``WorstBatchCheck``'s metrics: each kind's largest peak.

Example:
    >>> reports = [[{"kind": "examples", "examples": 4, "longest": 2, "peak_bytes": 10}],
    ...            [{"kind": "examples", "examples": 3, "longest": 3, "peak_bytes": 12}]]
    >>> worst_metrics(reports, ["examples"])["memory/worst/examples/peak_bytes"]
    12.0
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning.pytorch import Trainer

from lightning_varbatch.callbacks.worst_micro_batches import WorstBatch

__all__ = ["gather_reports", "over_limit", "worst_metrics"]


def over_limit(w: WorstBatch, limit: int | None) -> bool:
    """Whether micro-batch ``w`` ran with a peak above ``limit`` (never, without a limit).

    Example:
        >>> w = WorstBatch("examples", 0, 0, 3, 2, 6, 12, peak_bytes=100)
        >>> over_limit(w, 99), over_limit(w, 100), over_limit(w, None)
        (True, False, False)
    """
    return limit is not None and w.peak_bytes is not None and w.peak_bytes > limit


def gather_reports(
    trainer: Trainer, report: Sequence[WorstBatch], names: Sequence[str], limit: int | None
) -> list[list[dict[str, Any]]]:
    """Every rank's (kind, examples, longest, peak_bytes, over), one list per rank.

    ``names``: the kinds every rank checks, in order; a rank without micro-batches contributes
    an empty list. One all-gather on every rank when ``trainer.world_size > 1``.
    """
    rows = [[w.examples, w.longest, w.peak_bytes or 0, float(over_limit(w, limit))] for w in report]
    if int(trainer.world_size) < 2:
        gathered = [rows]
    else:
        rows += [[0, 0, 0, 0.0]] * (len(names) - len(rows))  # a rank without batches
        local = torch.tensor(rows, dtype=torch.float64, device=trainer.strategy.root_device)
        out = trainer.strategy.all_gather(local).reshape(-1, len(names), 4)
        gathered = out.cpu().tolist()
    return [
        [
            {
                "kind": kind,
                "examples": int(r[0]),
                "longest": int(r[1]),
                "peak_bytes": int(r[2]),
                "over": bool(r[3]),
            }
            for kind, r in zip(names, ranks, strict=False)
            if r[0] > 0
        ]
        for ranks in gathered
    ]


def worst_metrics(
    all_reports: Sequence[Sequence[dict[str, Any]]], names: Sequence[str]
) -> dict[str, float]:
    """For each kind, the largest peak over ranks and that micro-batch's shape, as metrics.

    Keys: ``memory/worst/<kind>/peak_bytes``, ``.../examples``, ``.../longest`` (spaces: ``_``).
    """
    metrics: dict[str, float] = {}
    for i, kind in enumerate(names):
        rows = [rows[i] for rows in all_reports if len(rows) > i]
        if not rows:
            continue
        top = max(rows, key=lambda x: x["peak_bytes"])
        base = f"memory/worst/{kind.replace(' ', '_')}"
        metrics[f"{base}/peak_bytes"] = float(top["peak_bytes"])
        metrics[f"{base}/examples"] = float(top["examples"])
        metrics[f"{base}/longest"] = float(top["longest"])
    return metrics
