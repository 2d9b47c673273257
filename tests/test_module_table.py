"""The module → tests table of ``docs/architecture.md`` is current, and every module has a test.

A module "has a test" when some file under ``tests/`` imports it directly (see
:mod:`tests.module_table`); modules listed in ``REEXPORT_SHIMS`` (pure re-exports) are exempt.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import module_table


def test_the_table_in_the_docs_is_current() -> None:
    text = module_table.DOC.read_text()
    assert module_table.replace_table(text, module_table.render()) == text, (
        "docs/architecture.md's module table is stale: run python -m tests.module_table"
    )


def test_every_module_has_a_test_that_imports_it_directly() -> None:
    untested = [
        m
        for m, files in module_table.table().items()
        if not files and m not in module_table.REEXPORT_SHIMS
    ]
    assert untested == [], (
        "modules that no test imports directly (write a behaviour test for each): "
        + ", ".join(untested)
    )


def test_the_exemptions_are_modules_without_direct_tests() -> None:
    """An exemption that is no longer needed (or names no module) goes."""
    rows = module_table.table()
    assert {m: rows.get(m) for m in module_table.REEXPORT_SHIMS} == {
        m: [] for m in module_table.REEXPORT_SHIMS
    }


def test_the_scan_sees_every_way_of_importing(tmp_path: Path) -> None:
    known = {"lightning_varbatch", "lightning_varbatch.memory", "lightning_varbatch.memory.model"}
    known |= {"lightning_varbatch.loss", "lightning_varbatch.keys", "lightning_varbatch.planner"}
    path = tmp_path / "test_x.py"
    path.write_text(
        "from typing import TYPE_CHECKING\n"
        "import lightning_varbatch.loss\n"
        "from lightning_varbatch import keys\n"
        "from lightning_varbatch.memory.model import Probe\n"
        "if TYPE_CHECKING:\n"
        "    from lightning_varbatch.planner import EpochPlan\n"
        "def test() -> None:\n"
        "    from lightning_varbatch.memory import find_max_tokens\n"
    )
    assert module_table.imported_modules(path, known) == {
        "lightning_varbatch",
        "lightning_varbatch.loss",
        "lightning_varbatch.keys",
        "lightning_varbatch.memory",
        "lightning_varbatch.memory.model",
    }


def test_missing_markers_are_an_error() -> None:
    with pytest.raises(ValueError, match="needs the markers"):
        module_table.replace_table("# Architecture\n", "table")
