"""TokenThroughputMonitor logs ``train/length_cap`` during a length warm-up, from the plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from lightning.pytorch import Trainer

from lightning_varbatch import TokenBudgetBatchSampler
from lightning_varbatch.callbacks import TokenThroughputMonitor
from tests.callbacks._common import RecordingLogger, Tokens

WARMUP = 5


def _run(accumulate: int, **settings: Any) -> tuple[TokenBudgetBatchSampler, RecordingLogger]:
    rng = np.random.default_rng(0)
    lengths = rng.integers(2, 60, 400)
    docs = [{"tokens": list(range(1, int(n) + 1))} for n in lengths]
    sampler = TokenBudgetBatchSampler(
        lengths, 128, rank=0, world_size=1, accumulate_grad_batches=accumulate, **settings
    )
    logger = RecordingLogger()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=WARMUP + 3,
        accumulate_grad_batches=accumulate,
        callbacks=[TokenThroughputMonitor(log_every_n_steps=1)],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Tokens(sampler, docs))
    return sampler, logger


@pytest.mark.parametrize("accumulate", [1, 2])
def test_the_cap_is_logged_at_every_warmup_step_and_not_after(accumulate: int) -> None:
    sampler, logger = _run(
        accumulate, length_warmup=WARMUP, length_warmup_min=8, length_warmup_schedule="root"
    )
    trace = sampler.plan.length_warmup
    assert trace is not None
    logged = {step: m["train/length_cap"] for step, m in logger.calls if "train/length_cap" in m}
    caps = [trace.cap_at(k) for k in range(WARMUP)]
    assert logged == {k: float(cap) for k, cap in enumerate(caps) if cap is not None}
    assert len(logged) == WARMUP and trace.cap_at(WARMUP) is None
    assert list(logged.values()) == sorted(logged.values())  # the cap grows
    assert logged[0] >= 8 and logged[WARMUP - 1] <= 59
    # the other metrics still come at every step, the cap only during the warm-up
    steps = {step for step, m in logger.calls if "train/tokens_per_sec" in m}
    assert steps == set(range(WARMUP + 3))


def test_no_cap_without_a_warmup() -> None:
    _, logger = _run(1)
    assert not any("train/length_cap" in m for _, m in logger.calls)
    assert any("train/tokens_per_sec" in m for _, m in logger.calls)
