from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from lightning_varbatch.data.datamodule import TokenBudgetDataModule
from lightning_varbatch.data.loader import TokenBudgetDataLoader, token_budget_dataloader
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from tests.launch import launch
from tests.scripts.datamodule_common import (
    NUM_TRAIN,
    NUM_VAL,
    Model,
    fit,
    make_pairs,
    pair_lengths,
    quiet_trainer,
)


def trained_ids(records: list[dict[str, Any]], epoch: int) -> list[int]:
    return [i for r in records if r["epoch"] == epoch for i in r["ids"]]


def val_runs(records: list[dict[str, Any]]) -> dict[int, list[int]]:
    runs: dict[int, list[int]] = {}
    for r in records:
        if not r["sanity"]:
            runs.setdefault(r["epoch"], []).extend(r["ids"])
    return runs


def test_single_process_fit() -> None:
    trainer, model, dm = fit(accumulate=2, max_epochs=2)
    sampler = dm.samplers["train"]
    assert isinstance(trainer.train_dataloader, TokenBudgetDataLoader)
    assert len(trainer.train_dataloader) == sampler.epoch_length == trainer.num_training_batches
    for epoch in (0, 1):
        ids = trained_ids(model.trained, epoch)
        assert sorted(ids) == list(range(NUM_TRAIN)), f"epoch {epoch}"
        assert sum(r["epoch"] == epoch for r in model.trained) == sampler.epoch_length
    assert trained_ids(model.trained, 0) != trained_ids(model.trained, 1)  # reshuffled
    assert trainer.global_step == 2 * sampler.epoch_length // 2
    runs = val_runs(model.validated)
    assert set(runs) == {0, 1}
    for ids in runs.values():
        assert sorted(ids) == list(range(NUM_VAL))  # after a partial sanity check, too
    assert any(r["sanity"] for r in model.validated)


@pytest.mark.multiprocess
def test_ddp_two_processes(tmp_path: Path) -> None:
    start = time.monotonic()
    records = launch("datamodule_ddp.py", 2, tmp_path, timeout=120)
    print(f"ddp run: {time.monotonic() - start:.1f}s")
    assert [r["rank"] for r in records] == [0, 1]
    assert len({r["global_step"] for r in records}) == 1
    assert records[0]["global_step"] > 0
    assert all(r["use_distributed_sampler"] for r in records)  # the default, left alone
    assert all(r["len_train_dataloader"] == r["epoch_length"] for r in records)
    for epoch in (0, 1):
        union = [i for r in records for i in trained_ids(r["trained"], epoch)]
        assert sorted(union) == list(range(NUM_TRAIN)), f"epoch {epoch}"
        counts = {sum(t["epoch"] == epoch for t in r["trained"]) for r in records}
        assert len(counts) == 1  # same number of micro-batches on every rank
    # every micro-batch of a step agrees on the step's global token count
    steps = Counter()
    for r in records:
        for t in r["trained"]:
            steps[(t["epoch"], t["global_step"])] += t["ntokens"]
    step_tokens = {
        (t["epoch"], t["global_step"]): t["step_ntokens"] for r in records for t in r["trained"]
    }
    assert steps == Counter(step_tokens)
    runs = [val_runs(r["validated"]) for r in records]
    for epoch in (0, 1):
        union = [i for run in runs for i in run[epoch]]
        assert sorted(union) == list(range(NUM_VAL)), f"val epoch {epoch}"


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["ddp", "fsdp_varbatch", "deepspeed_varbatch"])
def test_resume_mid_epoch_two_processes(tmp_path: Path, strategy: str) -> None:
    start = time.monotonic()
    records = launch("datamodule_ddp.py", 2, tmp_path, "resume", strategy, timeout=240)
    print(f"{strategy} resume runs: {time.monotonic() - start:.1f}s")
    every, accumulate = 2, 2
    for r in records:
        assert r["epoch_length"] > every * accumulate
        assert r["resumed"] == r["full"][every * accumulate :], f"rank {r['rank']}"
        assert r["global_steps"][1] == r["global_steps"][0] + 1
    union = [i for r in records for ids in r["full"] for i in ids]
    assert Counter(union) == Counter({i: 2 for i in range(NUM_TRAIN)})  # two epochs


@pytest.mark.parametrize("num_workers", [0, 2])
def test_resume_mid_epoch(tmp_path: Path, num_workers: int) -> None:
    accumulate, every = 2, 4
    _, full, dm = fit(accumulate=accumulate, max_epochs=2, num_workers=num_workers, with_val=False)
    steps_per_epoch = dm.samplers["train"].epoch_length // accumulate
    assert steps_per_epoch > every + 1
    reference = [r["ids"] for r in full.trained]

    fit(
        accumulate=accumulate,
        max_epochs=2,
        max_steps=every + 2,
        ckpt_dir=tmp_path,
        ckpt_every=every,
        num_workers=num_workers,
        with_val=False,
    )
    ckpt = tmp_path / f"epoch=0-step={every}.ckpt"
    assert ckpt.exists(), sorted(p.name for p in tmp_path.iterdir())
    trainer, resumed, _ = fit(
        accumulate=accumulate,
        max_epochs=2,
        ckpt_path=str(ckpt),
        num_workers=num_workers,
        with_val=False,
    )
    assert [r["ids"] for r in resumed.trained] == reference[every * accumulate :]
    assert resumed.trained[0]["batch_idx"] == every * accumulate
    assert trainer.global_step == full.trained[-1]["global_step"] + 1


def test_resume_from_epoch_end(tmp_path: Path) -> None:
    _, full, dm = fit(accumulate=1, max_epochs=2, with_val=False)
    length = dm.samplers["train"].epoch_length
    fit(accumulate=1, max_epochs=1, ckpt_dir=tmp_path, ckpt_every=length, with_val=False)
    ckpt = tmp_path / f"epoch=0-step={length}.ckpt"
    assert ckpt.exists(), sorted(p.name for p in tmp_path.iterdir())
    _, resumed, _ = fit(accumulate=1, max_epochs=2, ckpt_path=str(ckpt), with_val=False)
    assert [r["ids"] for r in resumed.trained] == [r["ids"] for r in full.trained][length:]


def test_outside_trainer_and_errors() -> None:
    data = make_pairs(10, 0)
    dm = TokenBudgetDataModule(
        data, pair_lengths(data), 40, val_dataset=data[:3], val_lengths=pair_lengths(data[:3])
    )
    loader = dm.train_dataloader()
    assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(10))
    assert sorted(i for b in dm.val_dataloader() for i in b["id"].tolist()) == [0, 1, 2]
    assert sorted(i for b in dm.val_dataloader() for i in b["id"].tolist()) == [0, 1, 2]
    with pytest.raises(TypeError, match="Unknown planner setting"):
        TokenBudgetDataModule(data, pair_lengths(data), 40, max_token=3)
    with pytest.raises(ValueError, match="val_lengths"):
        TokenBudgetDataModule(data, pair_lengths(data), 40, val_dataset=data)
    with pytest.raises(ValueError, match="train_lengths"):
        TokenBudgetDataModule(data, pair_lengths(data)[:5], 40).train_dataloader()
    small = TokenBudgetDataModule(
        data, pair_lengths(data), 40, val_dataset=data[:1], val_lengths=[[1, 1]]
    )
    small.samplers["val"] = TokenBudgetBatchSampler(
        pair_lengths(data[:1]), 40, rank=0, world_size=1
    )
    small.samplers["val"].set_distributed(0, 2)
    with pytest.raises(ValueError, match="val_dataset has 1 examples for 2 ranks"):
        small.val_dataloader()


def test_token_budget_dataloader_len_after_restore() -> None:
    data = make_pairs(30, 0)
    sampler = TokenBudgetBatchSampler(pair_lengths(data), 30, rank=0, world_size=1)
    loader = token_budget_dataloader(data, sampler)
    first = [b["id"].tolist() for b in loader]
    state = sampler.state_dict(consumed=2)
    other = TokenBudgetBatchSampler(pair_lengths(data), 30, rank=0, world_size=1)
    other.load_state_dict(state)
    resumed = token_budget_dataloader(data, other)
    assert len(resumed) == len(first)  # the whole epoch, as Lightning counts it
    assert [b["id"].tolist() for b in resumed] == first[2:]


def test_without_val_dataset_fit_skips_validation() -> None:
    data = make_pairs(NUM_TRAIN, 1)
    dm = TokenBudgetDataModule(data, pair_lengths(data), 40)
    model = Model()  # has a validation_step
    trainer = quiet_trainer(max_epochs=1)
    trainer.fit(model, dm)
    assert trainer.global_step > 0 and model.validated == []
    with pytest.raises(ValueError, match="has no test_dataset"):
        dm.test_dataloader()


@pytest.mark.multiprocess
def test_ranks_with_different_data_fail_together_instead_of_hanging(tmp_path: Path) -> None:
    records = launch("mismatched_data.py", 2, tmp_path, timeout=120)
    for record in records:
        assert "error" in record, f"rank {record['rank']} trained on mismatched data"
        assert "planned from different training data" in record["error"]
        assert "[[0], [1]]" in record["error"]
