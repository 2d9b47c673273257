"""FSDP (``fsdp_varbatch``) in real processes over gloo: one launch, every phase.

The checks live by topic in ``checks_*.py``; the phases in ``runs.py``.
"""

from __future__ import annotations

import pytest

from tests.strategies.checks_packed import Packed
from tests.strategies.checks_schedule import Schedule
from tests.strategies.checks_shares import Shares
from tests.strategies.checks_training import Training
from tests.strategies.runs import Launch

#: Every test here reads a launch of real processes.
pytestmark = pytest.mark.multiprocess


class TestFSDP(Training, Packed, Shares, Schedule):
    LAUNCH = Launch(
        "fsdp", "fsdp_varbatch", ("list", "hf", "stream", "packed", "shares", "schedule")
    )
