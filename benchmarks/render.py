"""Render every figure of the documents from the result files (``benchmarks/results/``).

Run from the repository root::

    python -m benchmarks.render            # rewrite the figures of README.md, docs/*.md and
                                           # benchmarks/RESULTS.md from the result files
    python -m benchmarks.render --check    # change nothing; exit 1 naming every figure that
                                           # differs from its file and every stale result

A figure in a document sits between two HTML comments (invisible on GitHub)::

    one rank's epoch in <!-- fig:planning:main.ours_s:.2f -->0.47<!-- /fig --> s

``fig:<result>:<path>:<format>``: the result file ``benchmarks/results/<result>.json``, the
dotted path to a value under its ``results`` (list items by index; ``@`` starts a path from
the file's top, e.g. ``@provenance.commit``), and a Python format spec, optionally followed
by ``*<factor>`` (``.1f*100``: a fraction shown in percent). A whole table (or code block)
sits between ``<!-- table:<result>:<renderer> -->`` and ``<!-- /table -->`` on lines of their
own; the renderer is a function of :data:`TABLES` (each folder's ``tables`` module). Put no marker
inside a code block: write the table marker around the block instead.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT
from benchmarks.peers.tables import TABLES as PEERS
from benchmarks.planning.tables import TABLES as PLANNING
from benchmarks.results import load_result, stale_results
from benchmarks.sources.tables import TABLES as SOURCES
from benchmarks.training.tables import TABLES as TRAINING

FIGURE = re.compile(r"<!-- fig:(?P<spec>[^\s]+) -->(?P<body>[^<]*)<!-- /fig -->")
"""A figure: its text holds no ``<`` (so a marker quoted in prose never spans to another)."""
TABLE = re.compile(
    r"(?P<open><!-- table:(?P<spec>[^\s]+) -->\n)(?P<body>.*?)(?P<close><!-- /table -->)",
    re.DOTALL,
)

TABLES = PLANNING | PEERS | TRAINING | SOURCES
"""Every table renderer of the documents, by the name its marker gives."""


def documents() -> list[Path]:
    """README.md, docs/*.md and benchmarks/RESULTS.md."""
    root = Path(ROOT)
    return [
        root / "README.md",
        *sorted((root / "docs").glob("*.md")),
        root / "benchmarks/RESULTS.md",
    ]


def lookup(data: dict[str, Any], path: str) -> Any:
    """The value at a dotted ``path`` under ``data["results"]`` (``@...``: under ``data``).

    Example:
        >>> lookup({"results": {"a": [{"b": 0.5}]}, "name": "x"}, "a.0.b")
        0.5
        >>> lookup({"results": {}, "name": "x"}, "@name")
        'x'
    """
    value: Any = data if path.startswith("@") else data["results"]
    for part in path.lstrip("@").split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def format_value(value: Any, spec: str) -> str:
    """``value`` under a format spec, ``spec*factor`` scaling it first.

    Example:
        >>> format_value(0.0036, ".2f*100"), format_value(4500000, ","), format_value("a", "")
        ('0.36', '4,500,000', 'a')
    """
    if "*" in spec:
        spec, factor = spec.split("*", 1)
        value = value * float(factor)
    return format(value, spec)


class Results:
    """Result files, read once each."""

    def __init__(self) -> None:
        self._cache: dict[str, dict[str, Any]] = {}

    def __call__(self, name: str) -> dict[str, Any]:
        if name not in self._cache:
            self._cache[name] = load_result(name)
        return self._cache[name]


@dataclass
class Difference:
    """A figure whose document text differs from what its file renders to (or cannot render)."""

    document: str
    line: int
    spec: str
    found: str
    rendered: str

    def __str__(self) -> str:
        found = self.found if len(self.found) < 60 else self.found[:57] + "..."
        rendered = self.rendered if len(self.rendered) < 60 else self.rendered[:57] + "..."
        where = f"{self.document}:{self.line}: {self.spec}"
        return f"{where}: document has {found!r}, file gives {rendered!r}"


def _figure(spec: str, results: Results) -> str:
    name, path, fmt = [*spec.split(":", 2), "", ""][:3]
    return format_value(lookup(results(name), path), fmt)


def _table(spec: str, results: Results) -> str:
    name, renderer = spec.split(":", 1)
    if renderer not in TABLES:
        raise KeyError(f"no table renderer {renderer!r} in any benchmarks.<folder>.tables.TABLES")
    text = TABLES[renderer](results(name))
    return text if text.endswith("\n") else text + "\n"


def render_text(text: str, results: Results, where: str = "") -> tuple[str, list[Difference]]:
    """``text`` with every figure and table rendered, and the differences found."""
    diffs: list[Difference] = []

    def replace(kind: str, make: Callable[[str, Results], str]) -> Callable[[re.Match[str]], str]:
        def one(m: re.Match[str]) -> str:
            line = text.count("\n", 0, m.start()) + 1
            try:
                new = make(m["spec"], results)
            except (KeyError, IndexError, TypeError, ValueError, FileNotFoundError) as e:
                diffs.append(
                    Difference(where, line, f"{kind}:{m['spec']}", m["body"], f"error: {e}")
                )
                return m.group(0)
            if new != m["body"]:
                diffs.append(Difference(where, line, f"{kind}:{m['spec']}", m["body"], new))
            if kind == "table":
                return m["open"] + new + m["close"]
            return f"<!-- fig:{m['spec']} -->{new}<!-- /fig -->"

        return one

    text = TABLE.sub(replace("table", _table), text)
    return FIGURE.sub(replace("fig", _figure), text), diffs


def render_all(write: bool) -> list[Difference]:
    """Render every document; rewrite those that differ when ``write``; the differences."""
    results = Results()
    diffs: list[Difference] = []
    for path in documents():
        old = path.read_text()
        new, found = render_text(old, results, str(path.relative_to(ROOT)))
        diffs += found
        if write and new != old:
            path.write_text(new)
    return diffs


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Render the documents' figures from the result files.")
    p.add_argument("--check", action="store_true", help="change nothing; report and exit 1")
    args = p.parse_args(argv)
    diffs = render_all(write=not args.check)
    errors = [d for d in diffs if d.rendered.startswith("error:")]
    for d in diffs if args.check else errors:
        print(d)
    stale = stale_results()
    for name, modules in stale.items():
        print(
            f"stale: benchmarks/results/{name}.json: its measured code changed since: "
            + ", ".join(modules)
        )
    if not args.check:
        print(f"rendered: {len(diffs) - len(errors)} figure(s) updated, {len(errors)} error(s)")
    return 1 if errors or stale or (args.check and diffs) else 0


if __name__ == "__main__":
    sys.exit(main())
