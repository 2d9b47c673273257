"""The training benchmarks' tables for the documents.

Each function takes a whole result file and returns markdown; :data:`TABLES` names them for
:mod:`benchmarks.render`.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.render_tables import Result, cell, markdown

TRAINING_LABELS = {
    "a": "(a) ours: token budget",
    "m": "(a') ours, pairs by max(source, target)",
    "b": "(b) random, fixed B",
    "c": "(c) sorted, fixed B",
}


def training_throughput(result: Result) -> str:
    """The training-throughput benchmark's configurations as a markdown table."""
    configs = result["results"]["configs"]
    rows = []
    for kind, label in TRAINING_LABELS.items():
        if kind not in configs:
            continue
        c = configs[kind]
        rows.append(
            [
                label,
                f"{c['steps']}",
                f"{c['mean_examples']:.1f}",
                f"{c['tps_median']:,.0f}",
                f"{min(c['tps']):,.0f}..{max(c['tps']):,.0f}",
                f"{c['speedup_vs_b']:.2f}",
                f"{c['pad_fraction']:.3f}",
                cell(c.get("peak_mb"), ".0f"),
            ]
        )
    headers = ["configuration", "steps", "B mean", "tgt tok/s", "min..max", "x (b)", "pad frac"]
    return markdown([*headers, "peak MB"], rows)


def straggler(result: Result) -> str:
    """The straggler benchmark's dealings as a markdown table."""
    rows = [
        [
            kind,
            f"{c['imb_lin']:.4f}",
            f"{c['imb_quad']:.4f}",
            f"{c['wait_median_s']:.2f}",
            f"{c['wait_vs_ours']:.2f}",
            f"{c['wait_pct_compute']:.1f}",
            f"{c['gap_vs_ours']:.2f}",
            f"{c['epoch_vs_ours']:.3f}",
            " / ".join(f"{w:.2f}" for w in c["wait_s"]),
        ]
        for kind, c in result["results"]["configs"].items()
    ]
    headers = ["dealing", "imb lin", "imb quad", "wait s", "x ours", "wait % compute"]
    headers += ["gap x ours", "epoch x ours", "wait s per round"]
    return markdown(headers, rows)


TABLES: dict[str, Callable[[Result], str]] = {
    "training_throughput": training_throughput,
    "straggler": straggler,
}
