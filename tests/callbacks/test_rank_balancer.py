"""RankShareBalancer: settings, what one process measures, the checkpoint, a real 2-rank run.

The 2-process run (``tests/scripts/rank_balance_train.py``): rank 1's forward sleeps twice as
long per planned token slot as rank 0's, 3 epochs, the balancer with its defaults
(``smoothing=0.5``, ``tolerance=0.05``, ``warmup_steps=1``).
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import LightningModule, Trainer

import lightning_varbatch.callbacks.compute_clock as compute_clock
from lightning_varbatch import TokenBudgetBatchSampler, token_budget_dataloader
from lightning_varbatch.callbacks.rank_balancer import RankShareBalancer
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from tests.callbacks._common import FakeClock, RecordingLogger
from tests.launch import launch

LENGTHS = [3, 5, 2, 7, 4, 6, 1, 8, 2, 5, 3, 7, 6, 4, 2, 8] * 3


class TokenModule(LightningModule):
    """A one-layer model on the library's padded batches; records the ids of every epoch."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.sampler = sampler
        self.trained: dict[int, list[int]] = {}

    def train_dataloader(self) -> Any:
        items = [{"tokens": [1] * n, "id": i} for i, n in enumerate(LENGTHS)]
        return token_budget_dataloader(items, self.sampler)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        return self.layer(batch["tokens"].float().unsqueeze(-1)).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def fit(module: LightningModule, callbacks: list[Any], **kwargs: Any) -> RecordingLogger:
    logger = RecordingLogger()
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        **kwargs,
    )
    trainer.fit(module)
    return logger


@pytest.mark.parametrize(
    ("kwargs", "error", "setting"),
    [
        ({"every_n_epochs": 0}, SettingValueError, "every_n_epochs"),
        ({"every_n_epochs": 1.5}, SettingTypeError, "every_n_epochs"),
        ({"warmup_steps": -1}, SettingValueError, "warmup_steps"),
        ({"smoothing": 1.0}, SettingValueError, "smoothing"),
        ({"smoothing": "0.5"}, SettingTypeError, "smoothing"),
        ({"tolerance": -0.1}, SettingValueError, "tolerance"),
        ({"min_share": 0.0}, SettingValueError, "min_share"),
    ],
)
def test_bad_settings_name_the_setting(
    kwargs: dict[str, Any], error: type[Exception], setting: str
) -> None:
    with pytest.raises(error, match=setting) as caught:
        RankShareBalancer(**kwargs)
    assert caught.value.setting == setting  # type: ignore[attr-defined]


def test_one_process_measures_planned_cost_per_forward_second(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(compute_clock, "perf_counter", FakeClock())  # every interval: 10 s
    sampler = TokenBudgetBatchSampler(LENGTHS, 12, rank=0, world_size=1, seed=0)
    balancer = RankShareBalancer(warmup_steps=2)
    logger = fit(TokenModule(sampler), [balancer], max_epochs=1, accumulate_grad_batches=2)
    plan = sampler.plan
    costs = np.asarray(plan.micro_batch_load)[plan.rank_micro_batches(0)]
    timed = costs[2 * 2 :]  # the first 2 optimizer steps of 2 micro-batches are not timed
    assert balancer.last_period == {
        "seconds": 10.0 * timed.size,
        "work": float(timed.sum()),
        "micro_batches": float(timed.size),
    }
    # One process: nothing gathered, nothing changed, nothing logged.
    assert balancer.shares is None and balancer.history == []
    assert not any("train/rank/" in key for _, m in logger.calls for key in m)


def test_batch_tokens_without_a_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.callbacks._common import Module, micro_batches

    monkeypatch.setattr(compute_clock, "perf_counter", FakeClock())
    balancer = RankShareBalancer(warmup_steps=0)
    fit(Module(micro_batches([[30], [20], [50]])), [balancer], max_epochs=1)
    assert balancer.last_period == {"seconds": 30.0, "work": 100.0, "micro_batches": 3.0}


def test_state_dict_round_trip_and_strict_keys() -> None:
    balancer = RankShareBalancer()
    balancer.shares = (1.0, 0.5)
    balancer.history = [{"epoch": 0, "shares": [1.0, 0.5], "speeds": [2.0, 1.0]}]
    other = RankShareBalancer()
    other.load_state_dict(balancer.state_dict())
    assert other.shares == (1.0, 0.5) and other.history == balancer.history
    with pytest.raises(ValueError, match="another version"):
        other.load_state_dict({"shares": None})


@pytest.mark.multiprocess
def test_two_ranks_balance_towards_the_speed_ratio(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    out = tmp_path_factory.mktemp("rank-balance")
    records = launch("rank_balance_train.py", 2, out, timeout=150.0)
    assert [r["rank"] for r in records] == [0, 1]  # every rank finished and wrote its record
    first, second = records
    n = first["num_examples"]
    # Every example trained exactly once per epoch, with the shares each epoch planned with.
    for epoch in ("0", "1", "2"):
        ids = first["trained"][epoch] + second["trained"][epoch]
        assert sorted(ids) == list(range(n)), epoch
    # Identical decisions on both ranks (the same gathered numbers, the same maths).
    assert first["history"] == second["history"]
    assert first["plans"] == second["plans"]
    history = first["history"]
    assert [h["epoch"] for h in history] == [0, 1, 2]
    # Measured speeds: rank 1 half as fast, up to the forward's un-slept overhead (which
    # makes rank 1 look a little faster than half) and scheduling noise on 2 shared cores.
    for h in history:
        ratio = h["speeds"][1] / h["speeds"][0]
        assert 0.4 < ratio < 0.65, h
    # The first measurement sets the shares at once (a rank's speed does not depend on its
    # share), so epoch 1 already runs balanced; later epochs move them only by the smoothed
    # change of speed (smoothing 0.5), i.e. within the noise of the measured ratio.
    ones = [h["shares"][1] for h in history]
    assert all(h["shares"][0] == 1.0 for h in history)
    first_ratio = history[0]["speeds"][1] / history[0]["speeds"][0]
    assert ones[0] == pytest.approx(first_ratio)
    assert all(0.4 < one < 0.65 for one in ones)
    for before, after in itertools.pairwise(history):  # smoothed, not jumping
        assert after["smoothed"][1] == pytest.approx(
            math.sqrt(before["smoothed"][1] * after["speeds"][1] / after["speeds"][0])
        )
    # Each later epoch was planned with the shares set at the previous epoch's end (rounded
    # to whole-token budgets of max_tokens=48).
    plans = first["plans"]
    assert plans[0]["shares"] is None
    for later in (1, 2):
        assert plans[later]["budgets"][0] == 48
        assert plans[later]["shares"][1] == pytest.approx(ones[later - 1], abs=1 / 48)
    # The checkpoint holds the shares and their history; the state round-trips.
    for r in records:
        assert r["in_checkpoint"] == [r["state"]]
        assert r["round_trip"] == r["state"]
        assert r["state"]["shares"] == r["history"][-1]["shares"]
    # Rank 0 logged the balancer's and the monitor's per-rank figures; rank 1 logged nothing.
    logged = {k for _, m in first["logged"] for k in m}
    # The balancer logs the shares it set for the next period, the monitor those in force.
    for key in ("next_share", "share", "speed", "tokens_per_sec"):
        assert {f"train/rank/0/{key}", f"train/rank/1/{key}"} <= logged
    assert second["logged"] == []
    set_at = [m for _, m in first["logged"] if "train/rank/1/speed" in m]
    assert [m["train/rank/1/next_share"] for m in set_at] == ones
    assert not any("train/rank/1/share" in m for m in set_at)  # not the monitor's key


class FakeTarget:
    """A sampler or DataModule stand-in: the shares in force and what was set."""

    def __init__(self, shares: tuple[float, ...] | None) -> None:
        self.rank_shares = shares
        self.set: list[tuple[float, ...]] = []

    def set_rank_shares(self, shares: Any) -> None:
        self.set.append(tuple(shares))


def fake_trainer(rows: list[list[float]], target: FakeTarget, on_datamodule: bool) -> Any:
    """What the balancer reads from a Trainer of len(rows) ranks; all_gather returns ``rows``."""
    from types import SimpleNamespace

    strategy = SimpleNamespace(
        root_device=torch.device("cpu"),
        all_gather=lambda t: torch.tensor(rows, dtype=t.dtype),
    )
    logger = RecordingLogger()
    return SimpleNamespace(
        strategy=strategy,
        world_size=len(rows),
        datamodule=target if on_datamodule else None,
        train_dataloader=SimpleNamespace(batch_sampler=None if on_datamodule else target),
        current_epoch=4,
        global_step=40,
        is_global_zero=True,
        loggers=[logger],
    )


@pytest.mark.parametrize("on_datamodule", [True, False])
def test_epoch_end_sets_the_same_shares_from_the_gathered_numbers(on_datamodule: bool) -> None:
    # rank 1 ran 300 cost units in 6 s (50/s), rank 0 300 in 3 s (100/s): half as fast.
    rows = [[3.0, 300.0, 10.0], [6.0, 300.0, 10.0]]
    target = FakeTarget(None)
    trainer = fake_trainer(rows, target, on_datamodule)
    balancer = RankShareBalancer(smoothing=0.0)
    balancer.on_train_start(trainer, None)  # type: ignore[arg-type]
    balancer.on_train_epoch_end(trainer, None)  # type: ignore[arg-type]
    assert target.set == [(1.0, 0.5)]
    assert balancer.shares == (1.0, 0.5)
    assert balancer.history == [
        {
            "epoch": 4,
            "shares": [1.0, 0.5],
            "speeds": [100.0, 50.0],
            "smoothed": [1.0, 0.5],
            "seconds": [3.0, 6.0],
            "work": [300.0, 300.0],
            "changed": True,
        }
    ]
    assert trainer.loggers[0].calls == [
        (
            39,
            {
                "train/rank/0/next_share": 1.0,
                "train/rank/1/next_share": 0.5,
                "train/rank/0/speed": 100.0,
                "train/rank/1/speed": 50.0,
            },
        )
    ]


def test_epoch_end_dead_band_and_an_untimed_rank_change_nothing() -> None:
    target = FakeTarget((1.0, 0.5))
    balanced = fake_trainer([[3.0, 300.0, 10.0], [3.1, 150.0, 10.0]], target, False)
    balancer = RankShareBalancer()
    balancer.on_train_start(balanced, None)  # type: ignore[arg-type]
    balancer.on_train_epoch_end(balanced, None)  # type: ignore[arg-type]
    assert target.set == [] and balancer.history[-1]["changed"] is False
    assert balancer.shares == (1.0, 0.5)
    untimed = fake_trainer([[3.0, 300.0, 10.0], [0.0, 0.0, 0.0]], target, False)
    balancer.on_train_epoch_end(untimed, None)  # type: ignore[arg-type]
    assert target.set == [] and len(balancer.history) == 1


def test_resume_sets_the_checkpoint_shares_for_the_same_world_size() -> None:
    balancer = RankShareBalancer()
    balancer.load_state_dict({"shares": [1.0, 0.5], "history": []})
    target = FakeTarget(None)
    balancer.on_train_start(fake_trainer([[0.0] * 3] * 2, target, True), None)  # type: ignore[arg-type]
    assert target.set == [(1.0, 0.5)]
    other = FakeTarget(None)  # 4 ranks now: the 2-rank shares do not apply
    balancer.on_train_start(fake_trainer([[0.0] * 3] * 4, other, True), None)  # type: ignore[arg-type]
    assert other.set == []


def test_no_target_with_several_ranks_is_an_error() -> None:
    trainer = fake_trainer([[0.0] * 3] * 2, FakeTarget(None), False)
    trainer.train_dataloader = None
    with pytest.raises(RuntimeError, match="set_rank_shares"):
        RankShareBalancer().on_train_start(trainer, None)  # type: ignore[arg-type]


def test_a_stream_is_refused_when_the_fit_starts_not_after_a_period() -> None:
    import numpy as np

    from lightning_varbatch import StreamingDataModule
    from lightning_varbatch.errors import SettingValueError
    from lightning_varbatch.sources.shards import ShardedSource

    class Shard:
        name, num_rows = "a", 8

        def lengths(self) -> np.ndarray:
            return np.full(8, 3)

        def read(self, rows: Any) -> Any:
            return ({"tokens": np.ones(3, dtype=np.int64)} for _ in rows)

    stream = StreamingDataModule(ShardedSource([Shard()]), max_tokens=6, window=8)
    trainer = fake_trainer([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]], stream, True)  # type: ignore[arg-type]
    with pytest.raises(SettingValueError, match="plans window by window") as error:
        RankShareBalancer().on_train_start(trainer, None)  # type: ignore[arg-type]
    assert error.value.setting == "rank_shares"
