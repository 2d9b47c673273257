"""DDP in real processes over gloo, with token-budgeted batches: one launch, every phase.

The checks live by topic in ``checks_*.py``; the phases in ``runs.py``. One rank then resumes
the ``schedule`` phase from its checkpoint (a launch of its own, after this one).
"""

from __future__ import annotations

import pytest

from tests.strategies.checks_callbacks import Callbacks
from tests.strategies.checks_packed import Packed
from tests.strategies.checks_schedule import Resume, Schedule
from tests.strategies.checks_shares import Shares
from tests.strategies.checks_training import Training
from tests.strategies.runs import Launch

#: Every test here reads a launch of real processes.
pytestmark = pytest.mark.multiprocess


PHASES = (
    *("list", "hf", "stream", "packed", "shares", "schedule"),
    *("callbacks_fn", "callbacks_keys_hf"),
)


class TestDDP(Training, Packed, Shares, Schedule, Resume, Callbacks):
    LAUNCH = Launch("ddp", "ddp", PHASES)
