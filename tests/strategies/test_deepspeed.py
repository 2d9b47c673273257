"""DeepSpeed in real processes over gloo: one launch, every ZeRO stage.

ZeRO 2 (``deepspeed_varbatch_stage_2``) runs every phase of ``runs.py``; then ZeRO 3 and the
stages 0, 1, 2 and 3 with offload run the ``list`` phase, the registered default
(``deepspeed_varbatch``) the callbacks, and a user's own ``config=`` dicts: a consistent one
with a torch optimizer, and one that contradicts the trainer (last: it ends in an error on every
rank). DeepSpeed's first initialisation in a process is its costly part (about 40 s of a loaded
2-core machine), so the stages share one launch. The checks live by topic in ``checks_*.py``.
"""

from __future__ import annotations

import pytest

from tests.strategies.checks_callbacks import Callbacks
from tests.strategies.checks_deepspeed import DeepSpeedSettings, DeepSpeedUserConfigs
from tests.strategies.checks_packed import Packed
from tests.strategies.checks_schedule import Schedule
from tests.strategies.checks_shares import Shares
from tests.strategies.checks_training import Training
from tests.strategies.runs import Launch

#: Every test here reads a launch of real processes.
pytestmark = pytest.mark.multiprocess

OTHER_STAGES = ("3", "0", "1", "2_offload", "3_offload")
PHASES = (
    *("list", "hf", "stream", "packed", "shares", "schedule"),
    *(f"list:deepspeed_varbatch_stage_{stage}" for stage in OTHER_STAGES),
    "callbacks_keys:deepspeed_varbatch",
    *("user_config", "bad_config"),
)


class TestDeepSpeed(
    Training, Packed, Shares, Schedule, Callbacks, DeepSpeedSettings, DeepSpeedUserConfigs
):
    LAUNCH = Launch("deepspeed", "deepspeed_varbatch_stage_2", PHASES)
