"""Checks of what DeepSpeed configures: the batch settings, and a user's own ``config=`` dict."""

from __future__ import annotations

from typing import ClassVar

from tests.scripts.strategy_common import ACCUMULATE
from tests.strategies.runs import STEPS, WORLD_SIZE, Launch, Run


class DeepSpeedSettings:
    """The batch settings DeepSpeed was given follow the trainer (each ``list`` phase)."""

    LAUNCH: ClassVar[Launch]

    def test_deepspeed_batch_settings_follow_the_trainer(self, run: Run, list_phase: str) -> None:
        for r in run.phase(list_phase):
            assert r["strategy"] == "VarBatchDeepSpeedStrategy"
            assert r["deepspeed_config"] == {
                "train_micro_batch_size_per_gpu": 1,
                "gradient_accumulation_steps": ACCUMULATE,
                "train_batch_size": ACCUMULATE * WORLD_SIZE,
                "timers": {"throughput": {"enabled": False}},
            }


class DeepSpeedUserConfigs:
    """A user's ``config=`` dict: a consistent one trains, an inconsistent one fails clearly."""

    LAUNCH: ClassVar[Launch]

    def test_inconsistent_deepspeed_config_fails_on_every_rank_with_the_setting_named(
        self, run: Run
    ) -> None:
        records = run.phase("bad_config")
        assert len(records) == WORLD_SIZE
        for r in records:
            assert "train_batch_size=10" in r["error"]
            assert "train_micro_batch_size_per_gpu (2) * accumulate_grad_batches (2)" in r["error"]
            assert "world size (2) = 8" in r["error"]
            assert "remove train_batch_size from the DeepSpeed config, or set it to 8" in r["error"]

    def test_user_deepspeed_config_trains_with_a_torch_optimizer(self, run: Run) -> None:
        """The recipe of docs/migrate-deepspeed.md: config={"zero_optimization": ...} and SGD.

        Every rank of the launch trains with it (the check once ran a launch of one rank).
        """
        records = run.phase("user_config")
        assert len(records) == WORLD_SIZE
        for r in records:
            assert "error" not in r, r.get("error")
            assert r["global_step"] == STEPS
