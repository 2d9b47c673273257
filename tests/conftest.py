"""Test tiers: ``slow``, ``multiprocess`` and ``gpu`` markers (registered in pyproject.toml).

``python -m pytest -m "not slow"`` is the inner loop (every unit, property, doc and bad-input
test that runs in under ~1.5 s); the full suite, as CI runs it, is plain ``python -m pytest``.
A test that starts several ranks is marked ``multiprocess``, one that needs CUDA ``gpu``; both
are slow too, so the inner loop never starts a process group or waits for a device: a test
that calls :func:`tests.launch.launch` without the marker fails, naming itself.
"""

from __future__ import annotations

import pytest

import tests.launch

#: Markers that imply ``slow``.
SLOW_KINDS = ("multiprocess", "gpu")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every ``multiprocess`` or ``gpu`` test ``slow`` as well."""
    for item in items:
        if any(item.get_closest_marker(kind) for kind in SLOW_KINDS):
            item.add_marker(pytest.mark.slow)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """Let :func:`tests.launch.launch` refuse a test not marked ``multiprocess`` (before any
    fixture of the test is set up: a module fixture that launches counts as the test's)."""
    marked = item.get_closest_marker("multiprocess") is not None
    tests.launch.UNMARKED = None if marked else item.nodeid


def pytest_runtest_teardown(item: pytest.Item) -> None:
    """Teardown runs no launch: forget the test."""
    del item
    tests.launch.UNMARKED = None
