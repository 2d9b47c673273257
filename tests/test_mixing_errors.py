"""Bad multi-dataset input gets a clear error naming the setting (or dataset) to fix."""

from __future__ import annotations

import numpy as np
import pytest

from lightning_varbatch import (
    DataSource,
    MixturePlanner,
    PlanConfig,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.loader import _BatchInfoDataset

A, B = np.full(20, 4), np.full(10, 8)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"weights": [1.0], "steps_per_epoch": 4}, "weights has 1 entries but there are 2"),
        ({"weights": [1.0, -1.0], "steps_per_epoch": 4}, "must be finite and >= 0"),
        ({"weights": [0.0, 0.0], "steps_per_epoch": 4}, "weights are all zero"),
        ({"weights": [1.0, float("nan")], "steps_per_epoch": 4}, "must be finite"),
        ({"weights": "tokens", "steps_per_epoch": 4}, "Unknown weights='tokens'"),
        ({"weights": [1.0, 2.0]}, "set steps_per_epoch"),
        ({"temperature": 2.0}, "set steps_per_epoch"),
        ({"temperature": 0.0, "steps_per_epoch": 4}, "temperature must be a finite number > 0"),
        ({"steps_per_epoch": 0}, "steps_per_epoch must be a positive integer"),
        ({"mixing": "per_epoch"}, "mixing must be one of 'per_step', 'per_batch', got 'per_epoch'"),
    ],
)
def test_bad_mixture_settings(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        MixturePlanner([A, B], PlanConfig(max_tokens=16), **kwargs)


def test_empty_or_oversize_dataset_is_named() -> None:
    with pytest.raises(ValueError, match=r"Dataset 'empty' \(index 1\): lengths is empty"):
        MixturePlanner([A, DataSource(np.zeros(0, int), name="empty")], PlanConfig(16))
    with pytest.raises(ValueError, match=r"Dataset 'long' \(index 0\): Example 0 has length 9"):
        MixturePlanner([DataSource(np.full(3, 9), name="long", max_tokens=8), A], PlanConfig(16))
    with pytest.raises(ValueError, match="sources is empty"):
        MixturePlanner([], PlanConfig(16))
    with pytest.raises(ValueError, match="names must be unique"):
        MixturePlanner([DataSource(A, name="x"), DataSource(B, name="x")], PlanConfig(16))


def test_dataset_too_small_for_the_ranks_is_named() -> None:
    planner = MixturePlanner([A, DataSource(np.full(1, 8), name="tiny")], PlanConfig(16))
    with pytest.raises(ValueError, match=r"Dataset 'tiny' \(index 1\): More ranks than batches"):
        planner.plan(0, world_size=4)


def test_datamodule_rejects_inconsistent_sources() -> None:
    items = [{"tokens": [1] * 4}] * 20
    with pytest.raises(ValueError, match="has no dataset: set DataSource"):
        TokenBudgetDataModule([DataSource(A)], max_tokens=16)
    with pytest.raises(ValueError, match="has 20 items but 10 lengths"):
        TokenBudgetDataModule([DataSource(B, dataset=items)], max_tokens=16)
    with pytest.raises(ValueError, match="train_lengths must be None"):
        TokenBudgetDataModule([DataSource(A, dataset=items)], A, max_tokens=16)
    with pytest.raises(TypeError, match="mixes DataSource and other items"):
        TokenBudgetDataModule([DataSource(A, dataset=items), items], max_tokens=16)
    with pytest.raises(TypeError, match="max_tokens must be a positive integer, got None"):
        TokenBudgetDataModule([DataSource(A, dataset=items)])


def test_datamodule_over_two_datasets_fetches_their_items() -> None:
    short = [{"tokens": [1] * 4, "origin": 0} for _ in range(20)]
    long = [{"tokens": [2] * 8, "origin": 1} for _ in range(10)]
    dm = TokenBudgetDataModule(
        [DataSource(A, dataset=short, name="short"), DataSource(B, dataset=long, name="long")],
        max_tokens=16,
        val_dataset=[DataSource(A[:5], dataset=short[:5]), DataSource(B[:3], dataset=long[:3])],
        steps_per_epoch=6,
        weights=[1, 2],
    )
    batches = list(dm.train_dataloader())
    assert len(batches) == 6
    for batch in batches:
        origin = set(batch["origin"].tolist())
        assert origin == {int(batch["dataset"])}, "a batch's items are not from its dataset"
        assert int(batch["nexamples"]) == (4 if origin == {0} else 2)
    assert sorted(int(b["dataset"]) for b in batches) == [0, 0, 1, 1, 1, 1]
    val = list(dm.val_dataloader())
    assert sorted((int(b["dataset"]), int(b["nexamples"])) for b in val) == [
        (0, 1),
        (0, 4),
        (1, 1),
        (1, 2),
    ]


def test_each_dataset_is_truncated_to_its_own_budget() -> None:
    sampler = TokenBudgetBatchSampler.from_sources(
        [
            DataSource(np.array([3, 12]), name="a", max_tokens=6),
            DataSource(np.array([5, 20]), name="b"),
        ],
        10,
        oversize="truncate",
        rank=0,
        world_size=1,
    )
    data = _BatchInfoDataset([{"tokens": [1] * n} for n in (3, 12, 5, 20)])
    collate = PaddingCollate().with_truncation(sampler.truncate_to)
    widths = {}
    for mb in sampler:
        batch = collate(data.__getitems__(mb))
        widths.setdefault(int(batch["dataset"]), []).append(batch["tokens"].shape[1])
        assert int(batch["ntokens"]) == mb.ntokens
    assert sampler.truncate_to is None  # the datasets differ: each batch says its own
    assert sorted(widths[0]) == [3, 6] and sorted(widths[1]) == [5, 10]
