"""TokenBudgetLoop in one process: the LR rule under every torch scheduler, misuse, resume.

The multi-process proofs (Fabric DDP and DeepSpeed: float64 token mean, SIGKILL and resume,
another world size) are in ``tests/test_fabric.py``; here what one process shows: the update
uses ``schedule(k) x rule(actual_k / reference)`` under every scheduler class against an
unscaled twin loop, the loop's refusals, and an exact mid-epoch resume from ``state_dict``.
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from lightning_varbatch import (
    BatchSizeLRRule,
    TokenBudgetBatchSampler,
    TokenThroughputMeter,
    keys,
    token_budget_dataloader,
)
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.training_loop import TokenBudgetLoop
from tests.callbacks.test_lr_schedulers import LRS, SCHEDULERS, RecordingSGD

REFERENCE = 40.0
ACCUMULATE = 2
LENGTHS = [3, 9, 4, 12, 5, 2, 7, 11, 6, 8, 10, 1] * 3


def make_loop(
    scheduler: str | None = None, rule: str | None = None, seed: int = 0
) -> tuple[TokenBudgetLoop, torch.nn.Module, RecordingSGD, Any]:
    torch.manual_seed(0)
    net = torch.nn.Linear(1, 2)
    optimizer = RecordingSGD(
        [{"params": [net.weight], "lr": LRS[0]}, {"params": [net.bias], "lr": LRS[1]}]
    )
    sched = None if scheduler is None else SCHEDULERS[scheduler](optimizer)
    items = [{"tokens": [1] * n} for n in LENGTHS]
    sampler = TokenBudgetBatchSampler(LENGTHS, 16, rank=0, world_size=1, seed=seed)
    lr_rule = None if rule is None else BatchSizeLRRule(rule=rule, reference=REFERENCE)  # type: ignore[arg-type]
    loop = TokenBudgetLoop(
        token_budget_dataloader(items, sampler),
        [optimizer],
        model=net,
        accumulate_grad_batches=ACCUMULATE,
        lr_rule=lr_rule,
        meter=TokenThroughputMeter(log_every_n_steps=1),
    )
    return loop, net, optimizer, sched


def train(loop: TokenBudgetLoop, net: torch.nn.Module, sched: Any, epochs: int) -> dict[str, Any]:
    """Train ``epochs`` epochs; the step sizes and the lr of every group between steps."""
    sizes, between, ids = [], [], []
    for epoch in range(loop.epoch, epochs):
        for batch in loop.epoch_batches(epoch):
            ids.append(batch["tokens"].shape)
            x = batch[keys.NTOKENS].float().reshape(1, 1)
            loop.backward(loop.token_mean(net(x).square().sum(), batch))
            if loop.step():
                sizes.append(float(batch[keys.STEP_NTOKENS]))
                if isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                    sched.step(1.0)  # constant: it reduces at every check
                elif sched is not None:
                    sched.step()
                between.append([g["lr"] for g in loop.optimizers[0].param_groups])
    return {"sizes": sizes, "between": between, "shapes": ids}


@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_update_uses_schedule_times_factor_under_every_scheduler(scheduler: str) -> None:
    rule = "linear" if len(scheduler) % 2 else "sqrt"
    twin_loop, twin_net, twin_opt, twin_sched = make_loop(scheduler)
    twin = train(twin_loop, twin_net, twin_sched, 1)
    loop, net, optimizer, sched = make_loop(scheduler, rule)
    scaled = train(loop, net, sched, 1)
    assert scaled["sizes"] == twin["sizes"] and len(set(twin["sizes"])) > 1
    assert len({tuple(u) for u in twin_opt.used}) > 1, "schedule never changed"
    for k, size in enumerate(twin["sizes"]):
        ratio = size / REFERENCE
        factor = ratio if rule == "linear" else math.sqrt(ratio)
        expected = [lr * factor for lr in twin_opt.used[k]]
        assert optimizer.used[k] == pytest.approx(expected, rel=1e-12), f"step {k}"
    assert scaled["between"] == twin["between"]  # the scheduler sees the unscaled schedule


def test_mid_epoch_state_resumes_exactly() -> None:
    loop, net, optimizer, _ = make_loop(rule="sqrt", seed=3)
    full = train(loop, net, None, 2)
    loop, net, optimizer, _ = make_loop(rule="sqrt", seed=3)
    seen = []
    for batch in loop.epoch_batches(0):
        seen.append(batch["tokens"].shape)
        loop.backward(loop.token_mean(net(batch[keys.NTOKENS].float().reshape(1, 1)).sum(), batch))
        if loop.step() and loop.steps == 2:
            state = {"loop": loop.state_dict(), "net": net.state_dict()}
            state["optimizer"] = optimizer.state_dict()
            break
    resumed, net2, _, _ = make_loop(rule="sqrt", seed=3)
    resumed.load_state_dict(state["loop"])
    assert (resumed.epoch, resumed.steps) == (0, 2)
    rest = train(resumed, net2, None, 2)
    assert seen + rest["shapes"] == full["shapes"]
    assert state["loop"]["lr_rule"]["steps"] == 2 and state["loop"]["meter"]["steps"] == 2


def test_misuse_is_refused_with_the_setting_to_change() -> None:
    loop, net, _, _ = make_loop()
    batches = loop.epoch_batches(0)
    batch = next(batches)
    with pytest.raises(RuntimeError, match=r"inside an optimizer step.*after loop.step\(\)"):
        loop.backward(loop.token_mean(net(batch[keys.NTOKENS].float().reshape(1, 1)).sum(), batch))
        loop.step()
        loop.state_dict()
    with pytest.raises(RuntimeError, match=r"call loop.step\(\) after each micro-batch"):
        next(batches)
        next(batches)
    with pytest.raises(SettingValueError, match="accumulate_grad_batches"):
        TokenBudgetLoop(loop.train_dataloader, accumulate_grad_batches=0)
    with pytest.raises(TypeError, match="TokenBudgetBatchSampler"):
        TokenBudgetLoop(torch.utils.data.DataLoader([1, 2], batch_size=1))
