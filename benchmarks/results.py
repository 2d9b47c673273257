"""Result files: what a benchmark measured, on which code, machine and load.

Every benchmark whose figures a document quotes writes one JSON file,
``benchmarks/results/<name>.json`` (committed), with :class:`Run`::

    {"name": ..., "provenance": {"commit", "dirty", "started", "finished", "machine",
     "load_before", "load_after", "command", "settings"},
     "code": {<module>: <fingerprint>, ...}, "results": {...}}

The documents quote those files only through :mod:`benchmarks.render`.

**The code a result measured** (``code``) is fingerprinted module by module, so that a result
goes stale only when code it ran changed, not on every edit of the repository:

* the package's side is the *import closure* of the entry modules the benchmark names
  (``package=``): every ``lightning_varbatch`` (and ``examples``) module they import, directly
  or through other modules, following a name re-exported by a package's ``__init__`` to the
  module that defines it (:func:`import_closure`); the ``__init__`` files Python runs on the
  way are not followed, they only re-export;
* the benchmark's side is the modules it names (``bench=``), as they are: the code that builds
  the workload, times it and computes the figures; not the shared plumbing (tables, JSON).

A module's fingerprint is the sha256 of its syntax tree without docstrings
(:func:`fingerprint`): comments, formatting and documentation edits do not make a result stale;
any change to what the code does does. :func:`stale_modules` names the modules of one result
that changed since it was written; ``tests/test_figures.py`` fails on every such result.
"""

from __future__ import annotations

import argparse
import ast
import functools
import hashlib
import json
import os
import platform
import sys
from collections.abc import Iterable, Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, git_changed, git_revision, utc_now

RESULTS_DIR = Path(ROOT) / "benchmarks" / "results"
"""Where the committed result files live."""

PACKAGES = ("lightning_varbatch", "examples")
"""The top-level packages an import closure follows (never ``benchmarks``: listed by hand)."""


# -- the code a result measured ------------------------------------------------------------------


def module_path(module: str) -> Path | None:
    """The source file of a dotted module of this repository (a package: its ``__init__``)."""
    base = Path(ROOT, *module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            first = body[0] if body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]
    return tree


def fingerprint(module: str) -> str:
    """sha256 (16 hex digits) of the module's syntax tree without docstrings; ``missing``."""
    path = module_path(module)
    if path is None:
        return "missing"
    stat = path.stat()
    return _file_fingerprint(str(path), stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=4096)
def _file_fingerprint(path: str, mtime_ns: int, size: int) -> str:
    """:func:`fingerprint_source` of a file, cached while it is unchanged."""
    return fingerprint_source(Path(path).read_text())


def fingerprint_source(source: str) -> str:
    """:func:`fingerprint` of a module's source text."""
    tree = _strip_docstrings(ast.parse(source))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()[:16]


def _is_package(module: str) -> bool:
    return Path(ROOT, *module.split("."), "__init__.py").is_file()


def _defining_module(package: str, name: str, seen: set[tuple[str, str]]) -> str:
    """The module that defines ``name`` imported ``from package``: a submodule, or the module
    the package's ``__init__`` re-exports it from, or the package itself."""
    if (package, name) in seen:
        return package
    seen.add((package, name))
    sub = f"{package}.{name}"
    if module_path(sub) is not None:
        return sub
    init = module_path(package)
    if init is None or not _is_package(package):
        return package
    for node in ast.parse(init.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _defining_module(node.module, alias.name, seen)
    return package


def _imports(module: str) -> set[str]:
    """The modules of the package that ``module`` imports (anywhere in its body)."""
    path = module_path(module)
    if path is None:
        return set()
    own_package = module if _is_package(module) else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] in PACKAGES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = own_package.split(".")
                parent = ".".join(parts[: len(parts) - node.level + 1])
                base = f"{parent}.{base}".strip(".")
            if base.split(".")[0] not in PACKAGES:
                continue
            for alias in node.names:
                found.add(_defining_module(base, alias.name, set()))
    return found


def import_closure(entries: Iterable[str]) -> list[str]:
    """Every package module the entry modules import, directly or not, entries included.

    Example:
        >>> "lightning_varbatch.planner.settings" in import_closure(
        ...     ["lightning_varbatch.planner.epoch_planner"])
        True
    """
    todo, done = list(entries), set()
    while todo:
        module = todo.pop()
        if module in done:
            continue
        done.add(module)
        todo.extend(_imports(module) - done)
    return sorted(done)


def measured_code(package: Sequence[str], bench: Sequence[str]) -> dict[str, str]:
    """``{module: fingerprint}`` of the closure of ``package`` and the modules ``bench``."""
    modules = sorted(set(import_closure(package)) | set(bench))
    return {m: fingerprint(m) for m in modules}


def source_digest(module: str) -> str:
    """sha256 (16 hex digits) of a module's file as it is (``missing``): a cheap first check."""
    path = module_path(module)
    return "missing" if path is None else hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def stale_modules(result: Mapping[str, Any]) -> list[str]:
    """The modules of ``result["code"]`` whose code changed since the result was written.

    A module whose file is byte for byte the one recorded (``result["sources"]``) is current
    without parsing it; any other is compared by :func:`fingerprint`.
    """
    code = result.get("code") or {}
    if not code:
        return ["(no code fingerprint recorded)"]
    sources = result.get("sources") or {}
    return [
        m
        for m, digest in sorted(code.items())
        if not (m in sources and source_digest(m) == sources[m]) and fingerprint(m) != digest
    ]


# -- the run's provenance ------------------------------------------------------------------------


def load_now() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (``None`` where unsupported)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


LIBRARIES = ("numpy", "torch", "lightning", "deepspeed", "lhotse", "transformers", "accelerate")
"""Libraries whose installed versions a result records."""


def _versions() -> dict[str, str]:
    """Python's version and the installed versions of :data:`LIBRARIES`."""
    out = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def machine() -> dict[str, Any]:
    """Architecture, CPU count, memory and the versions of the libraries loaded."""
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = round(int(f.readline().split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return {
        "arch": platform.machine(),
        "cpus": os.cpu_count(),
        "memory_gib": mem,
        "system": platform.system(),
        **_versions(),
    }


def dirty_files(paths: Iterable[str]) -> list[str]:
    """The given paths (relative to the root) with uncommitted changes."""
    return git_changed(list(paths))


def command_line() -> str:
    """This process's command as typed: ``python -m benchmarks.<name> <arguments>``."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    head = f"python -m {spec.name}" if spec is not None else f"python {sys.argv[0]}"
    return " ".join([head, *sys.argv[1:]])


class Run:
    """Provenance of one benchmark run: create it before measuring, :meth:`write` after.

    Example (``path=None`` writes nothing and returns the record)::

        run = Run("planning", settings=vars(args), package=[...], bench=[...])
        ...  # measure
        run.write({"ours": {...}})
    """

    def __init__(
        self,
        name: str,
        *,
        settings: Mapping[str, Any],
        package: Sequence[str],
        bench: Sequence[str],
    ) -> None:
        self.name = name
        self.settings = dict(settings)
        self.package, self.bench = list(package), list(bench)
        self.started = utc_now()
        self.load_before = load_now()
        self.code = measured_code(self.package, self.bench)  # the code as it starts to run
        self.sources = {m: source_digest(m) for m in self.code}
        files = [os.path.relpath(str(module_path(m)), ROOT) for m in self.code]
        self.commit, self.dirty = git_revision(), dirty_files(files)

    def record(self, results: Mapping[str, Any]) -> dict[str, Any]:
        return {
            "name": self.name,
            "provenance": {
                "commit": self.commit,
                "dirty": self.dirty,
                "started": self.started,
                "finished": utc_now(),
                "machine": machine(),
                "load_before": self.load_before,
                "load_after": load_now(),
                "command": command_line(),
                "settings": self.settings,
            },
            "entries": {"package": self.package, "bench": self.bench},
            "code": self.code,
            "sources": self.sources,
            "results": dict(results),
        }

    def write(self, results: Mapping[str, Any], path: str | None = "") -> Path | None:
        """Write the result file (``""``: ``benchmarks/results/<name>.json``; ``None``: none)."""
        if path is None:
            return None
        target = Path(path) if path else RESULTS_DIR / f"{self.name}.json"
        if target.parent.resolve() == RESULTS_DIR.resolve():
            self.name = target.stem  # a result file is looked up by its name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(self.record(results), indent=1) + "\n")
        print(f"result file: {os.path.relpath(target, ROOT)}")
        return target


def add_result_option(parser: argparse.ArgumentParser, name: str) -> None:
    """``--result [PATH]``: where the result file goes (see :func:`result_path`)."""
    parser.add_argument(
        "--result",
        nargs="?",
        const="",
        default=None,
        help=f"write the result file (default benchmarks/results/{name}.json; written by "
        "default without --quick)",
    )
    parser.add_argument("--no-result", action="store_true", help="write no result file")


def result_path(args: argparse.Namespace) -> str | None:
    """The result file to write: ``--result``'s path, ``""`` for the default place, or
    ``None`` (``--no-result``, or ``--quick`` without ``--result``: smoke tests never replace a
    committed result)."""
    if getattr(args, "no_result", False):
        return None
    if args.result is not None:
        return str(args.result)
    return None if getattr(args, "quick", False) else ""


def load_result(name: str) -> dict[str, Any]:
    """The result file ``benchmarks/results/<name>.json``."""
    path = RESULTS_DIR / f"{name}.json"
    if not path.is_file():
        raise FileNotFoundError(f"no result file {os.path.relpath(path, ROOT)}")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def result_names() -> list[str]:
    """The names of every committed result file."""
    return sorted(p.stem for p in RESULTS_DIR.glob("*.json"))


def stale_results() -> dict[str, list[str]]:
    """``{name: changed modules}`` for every result file whose measured code changed."""
    out = {}
    for name in result_names():
        changed = stale_modules(load_result(name))
        if changed:
            out[name] = changed
    return out
