"""What every table of the documents is written with: markdown tables, provenance lines, cells.

The tables themselves live beside the benchmarks they render, one ``tables`` module per folder
(:mod:`benchmarks.planning.tables`, :mod:`benchmarks.training.tables`,
:mod:`benchmarks.peers.tables`, ...): each function takes a whole result file (``{"provenance",
"code", "results", ...}``) and returns markdown; :mod:`benchmarks.render` collects their
``TABLES`` for the ``<!-- table:<result>:<name> -->`` markers.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

Result = dict[str, Any]
TIMES = "\u00d7"
"""The multiplication sign the documents write after a ratio."""


def cell(value: Any, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    return format(value, spec)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[str]], align: str = "") -> str:
    """A markdown table; ``align``: one of ``l``/``r`` per column (default: first left)."""
    align = align or "l" + "r" * (len(headers) - 1)
    marks = ["---" if a == "l" else "---:" for a in align]
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(marks) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def provenance_line(result: Result) -> str:
    """``git <commit>, <finished>, load <before> -> <after>, <cpus> CPUs``: one line."""
    p = result["provenance"]
    m = p.get("machine", {})
    load = p.get("load_before") or ["?"]
    after = p.get("load_after") or ["?"]
    dirty = " + uncommitted changes" if p.get("dirty") else ""
    return (
        f"git {p.get('commit', '?')}{dirty}, {p.get('finished', '?')}, "
        f"load {load[0]} -> {after[0]}, {m.get('cpus', '?')} CPUs"
    )
