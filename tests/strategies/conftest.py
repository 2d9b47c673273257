"""Fixtures of the strategy tests: one launch per strategy, shared by the checks that read it.

A test class names its launch (``LAUNCH``, a :class:`~tests.strategies.runs.Launch`); the
``run`` fixture gives the class's tests that launch's records, started once per session (per
xdist worker: each strategy's tests sit in one file, so ``--dist loadfile`` starts it once). A
test that takes ``phase`` runs once for each plain-training phase the launch holds (see
:func:`pytest_generate_tests`).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from tests.strategies.runs import CALLBACKS, TRAINING, Launches, Run, kind_of

PHASE_PARAMETERS = {"phase": TRAINING, "list_phase": ("list",), "callbacks_phase": CALLBACKS}


@pytest.fixture(scope="session")
def launches(tmp_path_factory: pytest.TempPathFactory) -> Launches:
    return Launches(tmp_path_factory)


@pytest.fixture
def run(request: pytest.FixtureRequest, launches: Launches) -> Run:
    """The records of the test class's launch (``LAUNCH``)."""
    return launches.get(request.cls.LAUNCH)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """A test that takes ``phase`` (``list_phase``, ``callbacks_phase``) runs once for each
    phase of the class's launch of a kind in ``runs.TRAINING`` (``list``, ``runs.CALLBACKS``)."""
    if metafunc.cls is None:
        return
    for name, kinds in PHASE_PARAMETERS.items():
        if name in metafunc.fixturenames:
            phases = [p for p in metafunc.cls.LAUNCH.phases if kind_of(p) in kinds]
            metafunc.parametrize(name, phases)


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The float64 references are tiny: a second intra-op thread contends on a busy machine.

    Measured on a loaded 2-core machine: one packed reference update in 6 s with two threads,
    0.06 s with one. The ranks already run one thread each (``tests.launch.rank_env``).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
