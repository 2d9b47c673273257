"""StreamingDataModule in Lightning: real 2-process DDP runs over very unequal shards, resume.

The 2-process run (``tests/scripts/streaming_ddp.py``, gloo, two DataLoader workers per rank,
two epochs, a checkpoint every ``EVERY`` steps) is shared by the DDP tests (a module fixture);
the resumed runs start from its checkpoint after step ``EVERY`` (inside a window) with two
ranks and with one. The epoch-end resume and the argument checks run in this process.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_varbatch.data.datamodule import TokenBudgetDataModule
from lightning_varbatch.data.streaming import StreamingBatches
from lightning_varbatch.data.streaming_datamodule import StreamingDataModule
from lightning_varbatch.data.streaming_loader import StreamingDataLoader
from tests.launch import launch
from tests.scripts.streaming_common import (
    EVERY,
    MAX_TOKENS,
    NUM_EXAMPLES,
    SHARDS,
    WINDOW,
    fit,
    source,
    write_shards,
)

WORLD = 2
ACCUMULATE = 2  # streaming_common.fit's default


def batches(record: dict[str, Any], epoch: int | None = None) -> list[list[int]]:
    return [b["ids"] for b in record["trained"] if epoch is None or b["epoch"] == epoch]


def planned(folder: Path, rank: int, world: int, epoch: int) -> list[list[int]]:
    """The ids of the micro-batches the stream plans for ``rank`` in ``epoch``."""
    stream = StreamingBatches(
        source(folder),
        MAX_TOKENS,
        window=WINDOW,
        rank=rank,
        world_size=world,
        accumulate_grad_batches=ACCUMULATE,
        seed=5,
    )
    stream.set_epoch(epoch)
    return [b["id"].tolist() for b in stream]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_shards(tmp_path_factory.mktemp("shards") / "data")[0].parent


@pytest.fixture(scope="module")
def trained(data: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("ddp")
    records = launch("streaming_ddp.py", WORLD, out, str(data), "train", "--workers", "2")
    return {"out": out, "records": records}


def test_shards_are_very_unequal(data: Path) -> None:
    tokens = [int(source(data).shard_lengths(s).sum()) for s in range(len(SHARDS))]
    assert min(tokens[0] / t for t in tokens[1:]) > 7  # split by rank: one rank ~2x the other


@pytest.mark.multiprocess
def test_ddp_ranks_end_together_and_see_every_example_once(
    trained: dict[str, Any], data: Path
) -> None:
    records = trained["records"]
    assert sorted(r["rank"] for r in records) == list(range(WORLD))
    assert {r["global_step"] for r in records} == {records[0]["global_step"]}  # equal steps
    assert records[0]["global_step"] > 0 and {r["epoch"] for r in records} == {2}
    for epoch in (0, 1):
        counts = {len(batches(r, epoch)) for r in records}
        assert len(counts) == 1 and counts.pop() % ACCUMULATE == 0
        seen = Counter(i for r in records for ids in batches(r, epoch) for i in ids)
        assert sorted(seen) == list(range(NUM_EXAMPLES)) and set(seen.values()) == {1}
    # an iterable dataset has no len: Lightning counts the batches itself
    assert all(r["num_training_batches"] == "inf" for r in records)
    for r in records:  # no sampler was injected or complained about
        assert not [w for w in r["warnings"] if "ampler" in w or "IterableDataset" in w], r


@pytest.mark.multiprocess
def test_workers_stream_each_epochs_plan_in_order(trained: dict[str, Any], data: Path) -> None:
    """With 2 workers, every epoch is the stream's plan of that epoch (the epoch reached the
    workers' copies of the dataset), in plan order."""
    for record in trained["records"]:
        for epoch in (0, 1):
            assert batches(record, epoch) == planned(data, record["rank"], WORLD, epoch)
    assert batches(trained["records"][0], 0) != batches(trained["records"][0], 1)


def datamodule_state(path: Path) -> dict[str, Any]:
    """The datamodule's entry of a checkpoint (Lightning keys it by the class name)."""
    return dict(torch.load(path, weights_only=False)["TimedDataModule"])


def checkpoint(trained: dict[str, Any]) -> Path:
    path = trained["out"] / "ckpt" / f"epoch=0-step={EVERY}.ckpt"
    state = datamodule_state(path)["stream"]
    assert state["epoch"] == 0 and state["consumed"] > 0  # the checkpoint is inside a window
    return path


@pytest.mark.multiprocess
def test_resume_same_world_trains_exactly_the_rest(
    trained: dict[str, Any], data: Path, tmp_path: Path
) -> None:
    records = launch(
        "streaming_ddp.py", WORLD, tmp_path, str(data), "resume", str(checkpoint(trained))
    )
    done = EVERY * ACCUMULATE  # micro-batches per rank in the checkpoint
    for ref, got in zip(trained["records"], records, strict=True):
        assert batches(got) == batches(ref)[done:]
        assert got["trained"][0]["global_step"] == EVERY
        assert got["global_step"] == ref["global_step"]
        # no replay: the restore is cheap and only the rows still to train are read
        assert max(got["loader_seconds"]) < 1.0
        assert got["rows_read"] == sum(len(ids) for ids in batches(got))


@pytest.mark.multiprocess
def test_resume_two_ranks_on_one_loses_and_repeats_nothing(
    trained: dict[str, Any], data: Path, tmp_path: Path
) -> None:
    (got,) = launch("streaming_ddp.py", 1, tmp_path, str(data), "resume", str(checkpoint(trained)))
    before = [
        ids
        for r in trained["records"]
        for b in r["trained"]
        if b["epoch"] == 0 and b["global_step"] < EVERY
        for ids in [b["ids"]]
    ]
    epoch0 = Counter(i for ids in before + batches(got, 0) for i in ids)
    assert sorted(epoch0) == list(range(NUM_EXAMPLES)) and set(epoch0.values()) == {1}
    assert batches(got, 1) == planned(data, 0, 1, 1)  # the next epoch is planned for one rank
    assert max(got["loader_seconds"]) < 1.0
    assert got["rows_read"] == sum(len(ids) for ids in batches(got))


def test_resume_from_the_end_of_an_epoch_starts_the_next(data: Path, tmp_path: Path) -> None:
    fit(data, max_epochs=1, callbacks=[ModelCheckpoint(dirpath=tmp_path)])
    (ckpt,) = tmp_path.glob("*.ckpt")
    state = datamodule_state(ckpt)
    windows = StreamingBatches(source(data), MAX_TOKENS, window=WINDOW, rank=0, world_size=1)
    # epoch 0, finished (past its last window): the next epoch's set_epoch starts epoch 1
    assert state["stream"]["epoch"] == 0
    assert state["stream"]["window"] == windows.planner.num_windows
    _, model, _ = fit(data, max_epochs=2, ckpt_path=str(ckpt))
    assert batches({"trained": model.trained}) == planned(data, 0, 1, 1)  # epoch 1, whole


# -- without a Trainer ---------------------------------------------------------------------


def test_state_round_trip_without_trainer(data: Path) -> None:
    dm = StreamingDataModule(source(data), MAX_TOKENS, window=WINDOW)
    assert dm.state_dict() == {"version": 1}  # nothing trained yet: only the version
    loader = dm.train_dataloader()
    assert isinstance(loader, StreamingDataLoader) and loader.batch_size is None
    state = dm.state_dict()
    assert state["trained"] == 0 and state["stream"]["window"] == 0
    other = StreamingDataModule(source(data), MAX_TOKENS, window=WINDOW)
    other.load_state_dict(state)
    assert other.state_dict() == state  # pending until the stream is built
    assert sum(int(b["nexamples"]) for b in other.train_dataloader()) == NUM_EXAMPLES


def test_validation_is_map_style_and_complete(data: Path) -> None:
    items = [{"id": i, "tokens": list(range(1, n + 1))} for i, n in enumerate([3, 9, 4, 1, 6])]
    dm = StreamingDataModule(
        source(data), MAX_TOKENS, window=WINDOW, val_dataset=items, val_lengths=[3, 9, 4, 1, 6]
    )
    ids = sorted(i for b in dm.val_dataloader() for i in b["id"].tolist())
    assert ids == list(range(5))
    assert StreamingDataModule(source(data), MAX_TOKENS).val_dataloader() == []


def test_teacher_forcing_counts_loss_tokens_alike_in_training_and_validation(
    data: Path,
) -> None:
    """loss_offset=1 (predict tokens[1:]): both loaders count every example's length minus 1."""
    lengths = [3, 9, 4, 1, 6]
    items = [{"tokens": list(range(1, n + 1))} for n in lengths]
    dm = StreamingDataModule(
        source(data),
        MAX_TOKENS,
        window=WINDOW,
        loss_offset=1,
        val_dataset=items,
        val_lengths=lengths,
    )
    val = [b for b in dm.val_dataloader()]
    assert sum(int(b["ntokens"]) for b in val) == sum(n - 1 for n in lengths)
    train = list(dm.train_dataloader())
    real = sum(int(b["tokens_mask"].sum()) for b in train)
    assert sum(int(b["ntokens"]) for b in train) == real - sum(int(b["nexamples"]) for b in train)


def test_bad_arguments_get_clear_errors(data: Path) -> None:
    src = source(data)
    with pytest.raises(TypeError, match=r"train_source must be a ShardedSource.*got list"):
        StreamingDataModule([1, 2], MAX_TOKENS)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="reads world_size from the Trainer"):
        StreamingDataModule(src, MAX_TOKENS, world_size=2)
    with pytest.raises(ValueError, match="max_tokens"):
        StreamingDataModule(src, 0)
    with pytest.raises(ValueError, match="window"):
        StreamingDataModule(src, MAX_TOKENS, window=0)
    with pytest.raises(TypeError):
        StreamingDataModule(src, MAX_TOKENS, no_such_setting=1)
    with pytest.raises(ValueError, match="val_dataset and val_lengths"):
        StreamingDataModule(src, MAX_TOKENS, val_dataset=[{"tokens": [1]}])
    with pytest.raises(ValueError, match="val_lengths has 2 entries but val_dataset has 1"):
        StreamingDataModule(src, MAX_TOKENS, val_dataset=[{"tokens": [1]}], val_lengths=[1, 2])
    stream = StreamingBatches(src, MAX_TOKENS, rank=0, world_size=1)
    with pytest.raises(ValueError, match="persistent_workers"):
        StreamingDataLoader(stream, num_workers=1, persistent_workers=True)
    with pytest.raises(ValueError, match="collate_fn cannot be set"):
        StreamingDataLoader(stream, collate_fn=list)
    with pytest.raises(TypeError, match=r"StreamingBatches.*got list"):
        StreamingDataLoader([1])  # type: ignore[arg-type]
    dm = StreamingDataModule(src, MAX_TOKENS)
    lengths = np.array([1, 2])
    map_style = TokenBudgetDataModule([{"tokens": [1]}, {"tokens": [1, 2]}], lengths, 4)
    map_style.train_dataloader()
    with pytest.raises(ValueError, match="Not a StreamingDataModule state"):
        dm.load_state_dict(map_style.state_dict())
    with pytest.raises(TypeError, match="expects the dict"):
        dm.load_state_dict([])  # type: ignore[arg-type]
    other = StreamingDataModule(src, MAX_TOKENS + 1)
    other.train_dataloader()
    dm.load_state_dict(other.state_dict())
    with pytest.raises(ValueError, match="max_tokens: saved 65, now 64"):
        dm.train_dataloader()
