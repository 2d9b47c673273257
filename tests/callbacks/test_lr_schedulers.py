"""BatchSizeLRScaler against every torch LR scheduler: the update uses schedule × factor, exactly.

The reference is an *unscaled twin run*: the same module, data and scheduler without the
scaler. Its optimizer steps use ``schedule(k)``; with the scaler, step ``k`` must use
``schedule(k) × rule(actual_k / reference)`` for every param group, and the scheduler's own
state, the optimizer's ``lr`` between steps and what ``LearningRateMonitor`` logs must equal the
twin's (the unscaled schedule). ``actual_k`` comes from the test's own token table, not from
the scaler. A factor that leaked into a chainable scheduler (ExponentialLR, CosineAnnealingLR,
...) or into ReduceLROnPlateau would compound and break the equality within two steps.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch import LightningModule, Trainer
from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint
from torch.optim import lr_scheduler as S
from torch.utils.data import DataLoader

from lightning_varbatch.callbacks import BatchSizeLRScaler
from tests.callbacks._common import RecordingLogger, micro_batches

REFERENCE = 100.0
ACCUMULATE = 2
# Token counts of each micro-batch of one epoch: 2 optimizer steps of 2 micro-batches.
EPOCH = [[30, 20], [150, 50]]
EPOCHS = 4
STEPS = len(EPOCH) * EPOCHS
LRS = (0.1, 0.05)  # two param groups

SCHEDULERS: dict[str, Any] = {
    "LambdaLR": lambda o: S.LambdaLR(o, lambda k: 1 / (k + 1)),
    "MultiplicativeLR": lambda o: S.MultiplicativeLR(o, lambda k: 0.9),
    "StepLR": lambda o: S.StepLR(o, step_size=2, gamma=0.5),
    "MultiStepLR": lambda o: S.MultiStepLR(o, milestones=[1, 3], gamma=0.5),
    "ConstantLR": lambda o: S.ConstantLR(o, factor=0.5, total_iters=3),
    "LinearLR": lambda o: S.LinearLR(o, start_factor=0.25, total_iters=5),
    "ExponentialLR": lambda o: S.ExponentialLR(o, gamma=0.8),
    "SequentialLR": lambda o: S.SequentialLR(
        o, [S.LinearLR(o, start_factor=0.5, total_iters=2), S.ExponentialLR(o, 0.8)], [2]
    ),
    "CosineAnnealingLR": lambda o: S.CosineAnnealingLR(o, T_max=6, eta_min=0.001),
    "ChainedScheduler": lambda o: S.ChainedScheduler(
        [S.ExponentialLR(o, 0.9), S.MultiplicativeLR(o, lambda k: 0.95)]
    ),
    "ReduceLROnPlateau": lambda o: S.ReduceLROnPlateau(o, factor=0.5, patience=0),
    "CyclicLR": lambda o: S.CyclicLR(
        o, base_lr=0.01, max_lr=[0.1, 0.05], step_size_up=2, cycle_momentum=False
    ),
    "CosineAnnealingWarmRestarts": lambda o: S.CosineAnnealingWarmRestarts(o, T_0=3),
    "OneCycleLR": lambda o: S.OneCycleLR(
        o, max_lr=[0.1, 0.05], total_steps=2 * STEPS + 2, cycle_momentum=False
    ),
    "PolynomialLR": lambda o: S.PolynomialLR(o, total_iters=6, power=2.0),
}
CASES = [  # (interval, frequency)
    ("step", 1),
    ("step", 2),
    ("epoch", 1),
]


def test_every_scheduler_class_is_covered() -> None:
    concrete = {
        name
        for name in S.__all__
        if inspect.isclass(getattr(S, name)) and name != "LRScheduler"  # the abstract base
    }
    assert concrete == set(SCHEDULERS)


class RecordingSGD(torch.optim.SGD):
    """SGD that records, inside its update, the lr of every param group it really used."""

    def __init__(self, groups: list[dict[str, Any]]) -> None:
        super().__init__(groups, lr=LRS[0])
        self.used: list[list[float]] = []

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        self.used.append([float(g["lr"]) for g in self.param_groups])
        super().step()
        return loss


class Module(LightningModule):
    def __init__(
        self, scheduler: str, interval: str, frequency: int, per_epoch: list[int] | None = None
    ) -> None:
        super().__init__()
        self.a, self.b = torch.nn.Linear(3, 1), torch.nn.Linear(3, 1)
        self.batches = micro_batches(EPOCH)
        self.per_epoch = per_epoch
        self.scheduler, self.interval, self.frequency = scheduler, interval, frequency
        self.between: list[list[float]] = []  # lr after each step's last micro-batch

    def train_dataloader(self) -> DataLoader[Any]:
        batches = self.batches
        if self.per_epoch is not None:  # every micro-batch of epoch e has per_epoch[e] tokens
            tokens = self.per_epoch[self.trainer.current_epoch % len(self.per_epoch)]
            batches = micro_batches([[tokens] * ACCUMULATE] * len(EPOCH))
        return DataLoader(batches, batch_size=None)  # type: ignore[arg-type]

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.log("plateau", 1.0)  # constant: ReduceLROnPlateau reduces at every check
        return (self.a(batch["x"]) + self.b(batch["x"])).sum()

    def on_train_batch_end(self, *args: Any) -> None:
        if (args[-1] + 1) % ACCUMULATE == 0:
            self.between.append([float(g["lr"]) for g in self.optimizer.param_groups])

    def configure_optimizers(self) -> Any:
        self.optimizer = RecordingSGD(
            [
                {"params": self.a.parameters(), "lr": LRS[0]},
                {"params": self.b.parameters(), "lr": LRS[1]},
            ]
        )
        config = {
            "scheduler": SCHEDULERS[self.scheduler](self.optimizer),
            "interval": self.interval,
            "frequency": self.frequency,
            "monitor": "plateau",
        }
        return {"optimizer": self.optimizer, "lr_scheduler": config}


def run(
    scheduler: str,
    interval: str,
    frequency: int,
    scaler: BatchSizeLRScaler | None,
    max_steps: int = STEPS,
    ckpt_path: str | None = None,
    save_at: tuple[int, Path] | None = None,
    per_epoch: list[int] | None = None,
) -> tuple[Module, RecordingLogger]:
    module = Module(scheduler, interval, frequency, per_epoch)
    logger = RecordingLogger()
    callbacks: list[Any] = [LearningRateMonitor(logging_interval="step")]
    if scaler is not None:
        callbacks.append(scaler)
    if save_at is not None:  # a checkpoint in the middle of training, as a real run writes it
        step, dirpath = save_at
        callbacks.append(ModelCheckpoint(dirpath=dirpath, filename="mid", every_n_train_steps=step))
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        accumulate_grad_batches=ACCUMULATE,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=save_at is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
        reload_dataloaders_every_n_epochs=int(per_epoch is not None),
    )
    trainer.fit(module, ckpt_path=ckpt_path)
    return module, logger


def factor(rule: str, step: int) -> float:
    ratio = sum(EPOCH[step % len(EPOCH)]) / REFERENCE
    return {"linear": ratio, "sqrt": math.sqrt(ratio)}[rule]


def lr_monitor(logger: RecordingLogger) -> list[dict[int, float]]:
    keys = sorted({k for _, m in logger.calls for k in m if k.startswith("lr-")})
    assert len(keys) == len(LRS), keys
    return [logger.series(k) for k in keys]


@pytest.mark.parametrize(("interval", "frequency"), CASES, ids=[f"{i}{f}" for i, f in CASES])
@pytest.mark.parametrize("scheduler", sorted(SCHEDULERS))
def test_update_uses_schedule_times_factor(scheduler: str, interval: str, frequency: int) -> None:
    rule = "linear" if len(scheduler) % 2 else "sqrt"  # both rules over the family
    twin, twin_log = run(scheduler, interval, frequency, None)
    scaler = BatchSizeLRScaler(rule=rule, reference=REFERENCE)  # type: ignore[arg-type]
    scaled, scaled_log = run(scheduler, interval, frequency, scaler)

    assert len(twin.optimizer.used) == len(scaled.optimizer.used) == STEPS
    # The schedule must move at least once, or the test proves nothing about compounding.
    assert len({tuple(u) for u in twin.optimizer.used}) > 1, "schedule never changed"
    expected = [[lr * factor(rule, k) for lr in twin.optimizer.used[k]] for k in range(STEPS)]
    for k in range(STEPS):
        assert scaled.optimizer.used[k] == pytest.approx(expected[k], rel=1e-12), f"step {k}"
    # Between steps, in the scheduler and in what LearningRateMonitor logs: the unscaled schedule.
    assert scaled.between == twin.between  # the very values the twin's scheduler computed
    sched, twin_sched = (m.trainer.lr_scheduler_configs[0].scheduler for m in (scaled, twin))
    assert sched.state_dict().get("_last_lr") == twin_sched.state_dict().get("_last_lr")
    assert lr_monitor(scaled_log) == lr_monitor(twin_log)
    assert scaler.steps == STEPS


@pytest.mark.parametrize("scheduler", ["ExponentialLR", "CosineAnnealingLR", "ReduceLROnPlateau"])
def test_resume_mid_run_continues_exactly(scheduler: str, tmp_path: Path) -> None:
    # Lightning replays a plain loader from the start of the epoch it resumes in, so every
    # micro-batch of an epoch has the same size here (the sizes still change every epoch):
    # the resumed steps then see the same sizes as the uninterrupted run.
    sizes = [25, 100, 50, 200]

    def scaler() -> BatchSizeLRScaler:
        return BatchSizeLRScaler(rule="linear", reference=REFERENCE)

    half = STEPS // 2 + 1  # mid-epoch
    whole, _ = run(scheduler, "step", 1, scaler(), save_at=(half, tmp_path), per_epoch=sizes)
    assert len({u[0] / w[0] for u, w in zip(whole.optimizer.used, whole.between, strict=True)}) > 1
    ckpt = tmp_path / "mid.ckpt"
    saved = torch.load(ckpt, weights_only=False)
    assert saved["global_step"] == half
    # The checkpoint holds the unscaled schedule (what the optimizer held when it was saved).
    assert [g["lr"] for g in saved["optimizer_states"][0]["param_groups"]] == (
        whole.between[half - 1]
    )
    if scheduler != "ReduceLROnPlateau":  # (which steps after checkpoints, at the batch's end)
        next_factor = sizes[half // len(EPOCH)] * ACCUMULATE / REFERENCE
        assert whole.between[half - 1] == pytest.approx(
            [lr / next_factor for lr in whole.optimizer.used[half]], rel=1e-12
        )
    resumed = scaler()
    second, _ = run(scheduler, "step", 1, resumed, STEPS, ckpt_path=str(ckpt), per_epoch=sizes)
    assert resumed.steps == STEPS
    if scheduler != "ReduceLROnPlateau":
        assert second.optimizer.used == whole.optimizer.used[half:]
        return
    # Lightning saves the checkpoint before it steps plateau schedulers, so a resumed run
    # misses that one update with or without the scaler: compare with a resumed unscaled twin.
    run(scheduler, "step", 1, None, save_at=(half, tmp_path / "twin"), per_epoch=sizes)
    twin, _ = run(
        scheduler,
        "step",
        1,
        None,
        STEPS,
        ckpt_path=str(tmp_path / "twin" / "mid.ckpt"),
        per_epoch=sizes,
    )
    factors = [sizes[k // len(EPOCH)] * ACCUMULATE / REFERENCE for k in range(half, STEPS)]
    expected = [
        [lr * f for lr in used] for used, f in zip(twin.optimizer.used, factors, strict=True)
    ]
    assert len(second.optimizer.used) == len(expected) == STEPS - half
    for got, want in zip(second.optimizer.used, expected, strict=True):
        assert got == pytest.approx(want, rel=1e-12)
