"""Loops without a Trainer: TokenBudgetLoop, loop_token_mean, Fabric's DeepSpeed strategy.

The same vocabulary as the Trainer path: a setting's error names it, a loader without our
sampler names the sampler to use, a batch planned for another accumulation names both.

Example:
    >>> len(CASES) > 10
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from lightning_varbatch import (
    TokenBudgetBatchSampler,
    TokenBudgetLoop,
    VarBatchFabricDeepSpeedStrategy,
    loop_token_mean,
    token_budget_dataloader,
)
from tests.bad_inputs.case import Case, error
from tests.bad_inputs.families import int_family

LOOP = "lightning_varbatch/training_loop.py"
LOSS = "lightning_varbatch/loss.py"
FDS = "lightning_varbatch/strategies/fabric_deepspeed.py"


def _loader() -> Any:
    lengths = [3, 5, 2, 7]
    sampler = TokenBudgetBatchSampler(lengths, 8, rank=0, world_size=1, seed=0)
    return token_budget_dataloader([{"tokens": [1] * n} for n in lengths], sampler)


def _loop(name: str) -> Any:
    def call(value: Any) -> Any:
        return TokenBudgetLoop(_loader(), **{name: value})

    return call


def _planned_for_one(tmp: Path) -> None:
    batch = next(iter(_loader()))  # planned for accumulation 1
    loop_token_mean(torch.tensor(1.0), batch, accumulate_grad_batches=2)


CASES: list[Case] = [
    *int_family(
        "loop-accumulate",
        "callbacks",
        "accumulate_grad_batches",
        _loop("accumulate_grad_batches"),
        good=2,
        what="TokenBudgetLoop(accumulate_grad_batches=",
        fix_in=LOOP,
    ),
    *int_family(
        "loop-log_every_n_steps",
        "callbacks",
        "log_every_n_steps",
        _loop("log_every_n_steps"),
        good=10,
        what="TokenBudgetLoop(log_every_n_steps=",
        fix_in=LOOP,
    ),
    error(
        "loop-plain-loader",
        "callbacks",
        "TokenBudgetLoop(DataLoader(data, batch_size=2))",
        lambda tmp: TokenBudgetLoop(torch.utils.data.DataLoader([1, 2], batch_size=2)),
        "TokenBudgetBatchSampler",
        "BatchSampler",
        raises=TypeError,
        fix_in=LOOP,
    ),
    error(
        "loop-token-mean-accumulation",
        "callbacks",
        "loop_token_mean(..., accumulate_grad_batches=2) on a batch planned for 1",
        _planned_for_one,
        "accumulate_grad_batches=1",
        "accumulate_grad_batches=2",
        raises=RuntimeError,
        fix_in=LOSS,
    ),
    *int_family(
        "fabric-ds-accumulate",
        "strategies",
        "accumulate_grad_batches",
        lambda value: VarBatchFabricDeepSpeedStrategy(accumulate_grad_batches=value),
        good=2,
        what="VarBatchFabricDeepSpeedStrategy(accumulate_grad_batches=",
        fix_in=FDS,
    ),
]
