"""Test tiers: ``slow``, ``multiprocess`` and ``gpu`` markers (registered in pyproject.toml).

``python -m pytest -m "not slow"`` is the inner loop (every unit, property, doc and bad-input
test that runs in under ~1.5 s); the full suite, as CI runs it, is plain ``python -m pytest``.
A test that starts several ranks is marked ``multiprocess``, one that needs CUDA ``gpu``; both
are slow too, so the inner loop never starts a process group or waits for a device: a test
that calls :func:`tests.launch.launch` without the marker fails, naming itself.
"""

from __future__ import annotations

from collections.abc import Iterator

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


@pytest.fixture(autouse=True, scope="module")
def _hydra_config_store_kept() -> Iterator[None]:
    """Hydra's global ConfigStore without what a test module's imports stored in it.

    Importing fairseq (the peer benchmarks' optional package) registers its ``FairseqConfig``
    schema as ``config``: the examples' ``compose("config")`` in a later module of the same
    process (an xdist worker runs many files) would then be merged with it and fail. The
    entries a module added at the top are removed after it, but Hydra's own (``hydra``, which
    its plugins register once per process).
    """
    try:
        from hydra.core.config_store import ConfigStore
    except ImportError:  # the oldest-Lightning environment has no Hydra
        yield
        return
    repo = ConfigStore.instance().repo
    before = set(repo)
    yield
    for key in set(repo) - before - {"hydra"}:
        del repo[key]
