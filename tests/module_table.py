"""The module → tests table of ``docs/architecture.md``: which test files import each module.

``python -m tests.module_table`` renders, for every module of ``lightning_varbatch``, the test
files under ``tests/`` that import it *directly* (``import M``, ``from M import x``, or
``from PACKAGE import M`` for a submodule; also inside functions, not under
``TYPE_CHECKING``), and writes the table into ``docs/architecture.md`` between the two
marker comments. ``--check`` only says whether the docs are up to date (exit 1 if not).
``tests/test_module_table.py`` fails when the table is stale or a module has no direct test.

Example:
    >>> rows = table()
    >>> "lightning_varbatch.memory.search" in rows
    True
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_varbatch"
TESTS = ROOT / "tests"
DOC = ROOT / "docs" / "architecture.md"
BEGIN = "<!-- module-table: begin (python -m tests.module_table) -->"
END = "<!-- module-table: end -->"

#: Modules that are pure re-exports of other modules: a test of what they re-export tests
#: them. Each entry says which modules' tests cover it. Keep this list short.
REEXPORT_SHIMS: dict[str, str] = {}


def module_name(path: Path) -> str:
    """The dotted name of a repository file (a package for ``__init__.py``)."""
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def library_modules() -> list[str]:
    """Every module and package of the library, sorted."""
    return sorted(module_name(p) for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_files() -> list[Path]:
    """Every Python file under ``tests/`` (test modules and their helpers), sorted."""
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The library modules ``path`` imports directly (not under ``TYPE_CHECKING``)."""
    tree = ast.parse(path.read_text(), str(path))
    skip = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
    }
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module in known:
                found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names} & known
    return found


def table() -> dict[str, list[str]]:
    """Every library module -> the test files (relative paths) that import it directly."""
    modules = library_modules()
    known = set(modules)
    rows: dict[str, list[str]] = {m: [] for m in modules}
    for path in test_files():
        for module in imported_modules(path, known):
            rows[module].append(str(path.relative_to(ROOT)))
    return {m: sorted(files) for m, files in rows.items()}


def render(rows: dict[str, list[str]] | None = None) -> str:
    """The markdown table, markers included."""
    rows = table() if rows is None else rows
    lines = [
        BEGIN,
        "",
        "| module | test files that import it directly |",
        "|---|---|",
    ]
    for module, files in rows.items():
        shown = ", ".join(f"`{f.removeprefix('tests/')}`" for f in files)
        if not files and module in REEXPORT_SHIMS:
            shown = f"(re-exports; {REEXPORT_SHIMS[module]})"
        lines.append(f"| `{module}` | {shown or '**none**'} |")
    return "\n".join([*lines, "", END])


def replace_table(text: str, rendered: str) -> str:
    """``text`` with the part between the markers (inclusive) replaced by ``rendered``.

    Raises:
        ValueError: when the markers are missing or out of order.
    """
    start, end = text.find(BEGIN), text.find(END)
    if start < 0 or end < start:
        raise ValueError(f"{DOC} needs the markers {BEGIN!r} and {END!r}, in that order.")
    return text[:start] + rendered + text[end + len(END) :]


def main(argv: list[str] | None = None) -> int:
    """Write the table into the docs (or, with ``--check``, compare)."""
    parser = argparse.ArgumentParser(prog="python -m tests.module_table", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the docs are stale")
    args = parser.parse_args(argv)
    text = DOC.read_text()
    updated = replace_table(text, render())
    if args.check:
        if updated != text:
            print(f"{DOC.relative_to(ROOT)} is stale: run python -m tests.module_table")
            return 1
        return 0
    if updated != text:
        DOC.write_text(updated)
        print(f"updated {DOC.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
