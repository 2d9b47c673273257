"""Lightning's loop runs every epoch's length of our loaders, with no call by the user.

Lightning reads the train loader's length once per ``fit``; the number of micro-batches per
rank changes between epochs with new rank shares (by hand or from ``RankShareBalancer``),
packed rows over wide buckets, and packed mixtures. ``tests/scripts/epoch_length_ddp.py`` runs
each case on 2 gloo ranks (one launch, the scenarios one after the other) and records the ids
trained per epoch. Before the loader followed the length (shares by hand, no
``follow_epoch_length`` call): shares set at epoch 0's end trained 68 of 120 examples in
epoch 1 (13 micro-batches per rank counted, 23 planned), through the DataModule and through a
user's own loader alike; packed rows lost 10 of 120 in epoch 1 (12 counted, 13 planned); the
packed mixture lost 16 and 12 in epochs 1 and 3 (14 counted, 15 planned). The balancer's
scenario, the warm-up (its epochs plan as many micro-batches as later ones) and the stream
(no length: Lightning runs it to its end) trained every example once before too; they guard it.
"""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities import CombinedLoader

from lightning_varbatch import TokenBudgetBatchSampler, token_budget_dataloader
from lightning_varbatch.callbacks import follow_epoch_length as exported
from lightning_varbatch.data.lightning_loop import (
    calling_trainer,
    fit_epoch,
    follow_epoch_length,
    trained_this_epoch,
)
from tests.launch import launch

LENGTHS = [3, 5, 2, 7, 4, 6, 1, 8, 2, 5, 3, 7, 6, 4, 2, 8] * 3

# -- one process ---------------------------------------------------------------------------


class Sized:
    """An iterable whose length the test changes between epochs."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Any:
        return iter(range(self.n))


def fit_loop_of(loader: Any, limit: float | int = 1.0, interval: float | int = 1.0) -> Any:
    """A Trainer's fit loop as ``setup_data`` leaves it, over Lightning's own CombinedLoader."""
    combined = CombinedLoader(loader, "max_size_cycle")
    length = len(loader)
    combined.limits = [min(length, limit) if isinstance(limit, int) else int(length * limit)]
    iter(combined)
    loop = SimpleNamespace(_combined_loader=combined, max_batches=len(combined))
    check = interval if isinstance(interval, int) else max(1, int(len(combined) * interval))
    return SimpleNamespace(
        fit_loop=loop, limit_train_batches=limit, val_check_interval=interval, val_check_batch=check
    )


def test_follow_epoch_length_sets_what_setup_data_set() -> None:
    loader = Sized(4)
    trainer = fit_loop_of(loader, interval=0.5)
    loader.n = 10
    follow_epoch_length(trainer)
    combined = trainer.fit_loop._combined_loader
    assert (trainer.fit_loop.max_batches, trainer.val_check_batch) == (10, 5)
    assert len(list(iter(combined))) == 10  # the next epoch's iterator runs all of it
    loader.n = 3
    follow_epoch_length(trainer)
    assert (trainer.fit_loop.max_batches, trainer.val_check_batch, len(combined)) == (3, 1, 3)
    assert exported is follow_epoch_length  # still public where it was


def test_follow_epoch_length_keeps_the_limits_and_an_integer_interval() -> None:
    loader = Sized(8)
    trainer = fit_loop_of(loader, limit=0.5, interval=2)
    loader.n = 12
    follow_epoch_length(trainer)
    assert (trainer.fit_loop.max_batches, trainer.val_check_batch) == (6, 2)
    capped = fit_loop_of(loader, limit=5)
    loader.n = 20
    follow_epoch_length(capped)
    assert capped.fit_loop.max_batches == 5


def test_nothing_to_follow_outside_a_fit_or_without_a_length() -> None:
    follow_epoch_length(None)
    assert calling_trainer() is None and fit_epoch(None) == 0 and trained_this_epoch(None) == 0
    endless = fit_loop_of(Sized(4))
    endless.fit_loop.max_batches = float("inf")
    follow_epoch_length(endless)
    assert endless.fit_loop.max_batches == float("inf")


def test_calling_trainer_is_the_trainer_of_the_loop_on_the_stack() -> None:
    from lightning.pytorch.loops.loop import _Loop

    trainer = object()

    def relay() -> Any:  # a frame without a loop between, like Lightning's _set_sampler_epoch
        return calling_trainer()

    class Loop(_Loop):
        def run(self) -> Any:
            return relay()

    assert Loop(trainer).run() is trainer  # type: ignore[arg-type]


class TokenModule(LightningModule):
    """A user's module with its own loader; records ids, epoch and trained counts per batch."""

    def __init__(self, sampler: TokenBudgetBatchSampler) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.sampler = sampler
        self.trained: dict[int, list[int]] = {}
        self.counters: list[tuple[int, int, int, int]] = []

    def train_dataloader(self) -> Any:
        items = [{"tokens": [1] * n, "id": i} for i, n in enumerate(LENGTHS)]
        return token_budget_dataloader(items, self.sampler)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.trained.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        trainer = self.trainer
        self.counters.append(
            (fit_epoch(trainer), self.current_epoch, trained_this_epoch(trainer), batch_idx)
        )
        return self.layer(batch["tokens"].float().unsqueeze(-1)).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class ShareChange(Callback):
    """Halve rank 1's share of a 2-rank plan at the end of epoch 0 (run on rank 0 alone)."""

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if trainer.current_epoch == 0:
            trainer.train_dataloader.batch_sampler.set_rank_shares([1.0, 0.5])  # type: ignore[union-attr]


def test_a_longer_epoch_is_trained_whole_with_no_call() -> None:
    # Rank 0's view of a 2-rank plan: new shares give epoch 1 more micro-batches per rank
    # than epoch 0; nothing but the callback that sets them.
    sampler = TokenBudgetBatchSampler(LENGTHS, 12, rank=0, world_size=2, seed=0)
    first = len(sampler)
    module = TokenModule(sampler)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        callbacks=[ShareChange()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module)
    assert sampler.epoch_length > first
    assert trainer.num_training_batches == sampler.epoch_length
    assert sorted(module.trained[1]) == sorted(sampler.plan.example_ids(0).tolist())
    assert len(module.trained[0]) == len(sampler.planner.plan(0, 2).example_ids(0))
    # the fit loop's counters, as the DataModules read them: epoch, and batches trained before
    assert all(
        epoch == current and done == index for epoch, current, done, index in module.counters
    )


# -- two ranks, every source of a change ---------------------------------------------------

NUM_EXAMPLES = 120
#: scenario of epoch_length_ddp.py -> epochs it trains
EPOCHS = {
    "hand_shares": 3,
    "own_loader_shares": 3,
    "balancer": 3,
    "packed": 4,
    "warmup": 3,
    "mixture": 4,
    "stream": 2,
}
#: scenarios whose number of micro-batches per rank changes between epochs
CHANGING = {"hand_shares", "own_loader_shares", "balancer", "packed", "mixture"}
#: scenarios that change it inside ``on_train_epoch_start`` (counted from the epoch's iter())
CHANGED_AT_START = {"own_loader_shares"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("epoch-length")
    return launch("epoch_length_ddp.py", 2, out, *EPOCHS, timeout=300.0)


@pytest.mark.multiprocess
@pytest.mark.parametrize("scenario", list(EPOCHS))
def test_every_example_once_per_epoch_on_two_ranks(
    runs: list[dict[str, Any]], scenario: str
) -> None:
    first, second = (record[scenario] for record in runs)  # every rank finished
    assert sorted(first["trained"], key=int) == [str(e) for e in range(EPOCHS[scenario])]
    for epoch in first["trained"]:
        ids = Counter(first["trained"][epoch] + second["trained"][epoch])
        lost = sorted(set(range(NUM_EXAMPLES)) - set(ids))
        twice = sorted(i for i, n in ids.items() if n > 1)
        assert (lost, twice, len(ids)) == ([], [], NUM_EXAMPLES), (scenario, epoch)
    assert first["lengths"] == second["lengths"]
    if scenario in CHANGING:
        assert len(set(first["lengths"])) > 1, "the scenario no longer changes the length"
    # Lightning counts each epoch's length: from the first batch on, and already in
    # on_train_epoch_start (progress bars) unless the change was made in that hook
    for record in (first, second):
        assert record["counted"] == record["lengths"]
        if scenario not in CHANGED_AT_START:
            assert record["at_start"] == record["lengths"]
