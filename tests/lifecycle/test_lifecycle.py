"""The lifecycle model in two tiers: a quick one in the inner loop, a soak in the slow tier.

Each tier runs :class:`~tests.lifecycle.machine.LifecycleMachine` (random runs through build,
take, save, change, load and the next epoch, on every front end) and fails with the shortest
path hypothesis finds to a lost, repeated or over-budget micro-batch, a change not refused or a
refusal not named. The soak prints how many distinct paths it explored.
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

from tests.lifecycle.machine import FINDINGS, PATHS, LifecycleMachine, ScheduledMachine

_COMMON = {
    "deadline": None,
    "suppress_health_check": [HealthCheck.too_slow, HealthCheck.filter_too_much],
    "derandomize": True,
}


def test_lifecycle_quick() -> None:
    run_state_machine_as_test(
        LifecycleMachine,
        settings=settings(max_examples=40, stateful_step_count=12, **_COMMON),
    )


def test_lifecycle_quick_under_a_batch_schedule() -> None:
    run_state_machine_as_test(
        ScheduledMachine,
        settings=settings(max_examples=12, stateful_step_count=10, **_COMMON),
    )


#: Lifecycles of the soak: ``LIFECYCLE_SOAK=2000 pytest -m slow tests/lifecycle`` for a long
#: one (a quarter of them under a batch schedule); CI runs the default.
SOAK = int(os.environ.get("LIFECYCLE_SOAK", "140"))


@pytest.mark.slow
def test_lifecycle_soak(capsys: pytest.CaptureFixture[str]) -> None:
    PATHS.clear()
    FINDINGS.clear()
    scheduled_runs = max(1, SOAK // 4)
    run_state_machine_as_test(
        LifecycleMachine,
        settings=settings(max_examples=SOAK - scheduled_runs, stateful_step_count=16, **_COMMON),
    )
    before = len(PATHS)
    run_state_machine_as_test(
        ScheduledMachine,
        settings=settings(max_examples=scheduled_runs, stateful_step_count=16, **_COMMON),
    )
    with capsys.disabled():
        print(
            f"\nlifecycle soak: {SOAK} lifecycles, {len(PATHS)} distinct paths "
            f"({len(PATHS) - before} more under a batch schedule); checks passed: "
            + ", ".join(f"{k} {v}" for k, v in sorted(FINDINGS.items()))
        )
