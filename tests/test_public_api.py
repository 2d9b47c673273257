"""One public face per package: what each package exports, and where the docs import it from.

For every package of ``lightning_varbatch`` (read with :mod:`ast`, so that a lazy package is
checked without importing what it defers):

* ``__all__``, the lazy-import table (``_WHERE``, which a module ``__getattr__`` reads) and the
  ``if TYPE_CHECKING:`` imports agree exactly: ``__all__`` is the eager imports plus the lazy
  table, and the type checker sees every lazy name from the module the table names;
* every name of ``__all__`` resolves, lazy names to the object of the module the table names;
* every name that the docs (``README.md``, ``docs/*.md``), the examples and the benchmarks
  import from a package is in its ``__all__`` (or is one of its modules);
* each name is imported from one place: the shallowest package that exports it. The docs and
  the examples import only from packages; a benchmark may take a name that no package
  exports (an internal it measures) from its module.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest

from tests import docs_runner

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_varbatch"


@dataclass
class Face:
    """What a package's ``__init__.py`` says it exports."""

    name: str
    all: list[str] | None = None
    eager: dict[str, str] = field(default_factory=dict)  # name -> module it is imported from
    lazy: dict[str, str] | None = None  # the _WHERE table
    type_checking: dict[str, str] = field(default_factory=dict)
    has_getattr: bool = False


def packages() -> list[str]:
    """Every package of the library, by dotted name."""
    return sorted(
        ".".join(p.parent.relative_to(ROOT).parts)
        for p in PACKAGE.rglob("__init__.py")
        if "__pycache__" not in p.parts
    )


def _ours(module: str) -> bool:
    """A public module of the library (not a private one such as ``_registration``)."""
    parts = module.split(".")
    return parts[0] == "lightning_varbatch" and not any(p.startswith("_") for p in parts)


def _imports(nodes: list[ast.stmt]) -> Iterator[tuple[str, str]]:
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.module and _ours(node.module):
            for alias in node.names:
                yield alias.asname or alias.name, node.module


@cache
def face(package: str) -> Face:
    """Parse the package's ``__init__.py``."""
    path = ROOT.joinpath(*package.split("."), "__init__.py")
    found = Face(package)
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            found.type_checking.update(_imports(node.body))
        elif isinstance(node, ast.ImportFrom):
            found.eager.update(_imports([node]))
        elif isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
            found.has_getattr = True
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            target = node.targets[0] if isinstance(node, ast.Assign) else node.target
            if isinstance(target, ast.Name) and node.value is not None:
                if target.id == "__all__":
                    found.all = list(ast.literal_eval(node.value))
                elif target.id == "_WHERE":
                    found.lazy = dict(ast.literal_eval(node.value))
    return found


@pytest.mark.parametrize("package", packages())
def test_all_lazy_table_and_type_checking_imports_agree(package: str) -> None:
    f = face(package)
    if f.all is None:  # a package that exports nothing binds nothing of ours either
        assert (f.eager, f.lazy, f.type_checking) == ({}, None, {}), (
            f"{package} imports names but has no __all__"
        )
        return
    assert len(f.all) == len(set(f.all)), f"{package}.__all__ lists a name twice"
    lazy = f.lazy or {}
    assert f.has_getattr == (f.lazy is not None), (
        f"{package}: a module __getattr__ needs the _WHERE table it reads, and the other way"
    )
    assert not set(f.eager) & set(lazy), f"{package}: imported both eagerly and lazily"
    missing = sorted((set(f.eager) | set(lazy)) - set(f.all))
    unbound = sorted(set(f.all) - set(f.eager) - set(lazy))
    assert (missing, unbound) == ([], []), (
        f"{package}: imported but not in __all__: {missing}; in __all__ but never imported: "
        f"{unbound}"
    )
    assert f.type_checking == lazy, (
        f"{package}: the TYPE_CHECKING imports and _WHERE differ: "
        f"{sorted(set(f.type_checking.items()) ^ set(lazy.items()))}"
    )


@pytest.mark.parametrize("package", packages())
def test_every_exported_name_resolves(package: str) -> None:
    module = importlib.import_module(package)
    f = face(package)
    for name in f.all or []:
        value = getattr(module, name)
        if f.lazy and name in f.lazy:
            assert value is getattr(importlib.import_module(f.lazy[name]), name), name
    assert set(f.all or []) <= set(dir(module))


# -- where the docs, the examples and the benchmarks import from ---------------------------


@dataclass(frozen=True)
class Use:
    """One ``from MODULE import NAME`` of the docs, an example or a benchmark."""

    where: str  # file (and line for Markdown)
    module: str
    name: str

    @property
    def strict(self) -> bool:
        """Docs and examples import only from packages; benchmarks may measure internals."""
        return not self.where.startswith("benchmarks/")


def _uses_in(source: str, where: str, first_line: int = 1) -> Iterator[Use]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "lightning_varbatch"
        ):
            line = f":{first_line + node.lineno - 1}" if where.endswith(".md") else ""
            for alias in node.names:
                yield Use(f"{where}{line}", node.module or "", alias.name)


@cache
def uses() -> tuple[Use, ...]:
    """Every import of a library name in the docs' Python blocks, examples and benchmarks."""
    found: list[Use] = []
    for path in docs_runner.DOC_FILES:
        rel = str(path.relative_to(ROOT))
        for block in docs_runner.parse(path):
            if block.lang == "python":
                found += _uses_in(block.code, rel, block.line)
    for folder in ("examples", "benchmarks"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            found += _uses_in(path.read_text(), str(path.relative_to(ROOT)))
    return tuple(found)


def _is_module(package: str, name: str) -> bool:
    return importlib.util.find_spec(f"{package}.{name}") is not None


@cache
def exporters() -> dict[int, list[str]]:
    """``id(object)`` -> the packages whose ``__all__`` holds it, shallowest first."""
    out: dict[int, list[str]] = {}
    for package in sorted(packages(), key=lambda p: (p.count("."), p)):
        module = importlib.import_module(package)
        for name in face(package).all or []:
            out.setdefault(id(getattr(module, name)), []).append(package)
    return out


def test_the_scan_sees_the_docs_examples_and_benchmarks() -> None:
    where = {u.where.split(":")[0].split("/")[0] for u in uses()}
    assert {"README.md", "docs", "examples", "benchmarks"} <= where


def test_every_name_imported_from_a_package_is_in_its_all() -> None:
    packs = set(packages())
    wrong = sorted(
        f"{u.where}: from {u.module} import {u.name}"
        for u in uses()
        if u.module in packs
        and u.name not in (face(u.module).all or [])
        and not _is_module(u.module, u.name)
    )
    assert wrong == [], "names the docs import that the package does not export:\n" + "\n".join(
        wrong
    )


def test_each_name_is_imported_from_one_place_its_package() -> None:
    packs = set(packages())
    wrong = []
    for u in uses():
        if u.module in packs and _is_module(u.module, u.name):
            continue  # a module of the package (``from lightning_varbatch import keys``)
        value = getattr(importlib.import_module(u.module), u.name)
        home = exporters().get(id(value))
        if home and u.module != home[0]:
            wrong.append(f"{u.where}: import {u.name} from {home[0]}, not {u.module}")
        elif not home and u.strict:
            wrong.append(f"{u.where}: {u.module}.{u.name} is exported by no package")
    assert wrong == [], "\n".join(sorted(wrong))
