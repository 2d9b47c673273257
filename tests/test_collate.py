from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lightning_varbatch import keys
from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.loader import _BatchInfoDataset
from lightning_varbatch.data.micro_batch import MicroBatch
from lightning_varbatch.data.plan_items import PlanItems
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler


def micro(
    ids: list[int], ntokens: int, step_ntokens: int = 50, step_nexamples: int = 9
) -> MicroBatch:
    return MicroBatch(
        ids,
        epoch=1,
        step=2,
        micro=0,
        rank=0,
        ntokens=ntokens,
        step_ntokens=step_ntokens,
        step_nexamples=step_nexamples,
    )


PAIRS = [
    {"source": [5, 6, 7], "target": torch.tensor([1, 2])},
    {"source": [8], "target": torch.tensor([3, 4, 5, 6])},
]


def test_pairs_padding_masks_and_counts() -> None:
    batch = PaddingCollate(pad_id=-1)(PAIRS)
    assert batch["source"].tolist() == [[5, 6, 7], [8, -1, -1]]
    assert batch["source_mask"].tolist() == [[True, True, True], [True, False, False]]
    assert batch["target"].tolist() == [[1, 2, -1, -1], [3, 4, 5, 6]]
    assert batch["target_mask"].dtype == torch.bool
    assert batch["target_mask"].tolist() == [[True, True, False, False], [True] * 4]
    assert {k: int(batch[k]) for k in (keys.NTOKENS, keys.NEXAMPLES)} == {
        "ntokens": 6,
        "nexamples": 2,
    }
    assert int(batch[keys.PADDED_TOKENS]) == 2 * 3 + 2 * 4
    assert int(batch[keys.INPUT_TOKENS]) == 4 + 6
    assert batch[keys.NTOKENS].dtype == torch.long and batch[keys.NTOKENS].dim() == 0
    assert keys.STEP_NTOKENS not in batch  # plain list: no plan metadata


def test_single_field_and_extra_entries() -> None:
    batch = PaddingCollate()(
        [{"tokens": [4, 4], "id": 7, "name": "a"}, {"tokens": [9], "id": 3, "name": "b"}]
    )
    assert batch["tokens"].tolist() == [[4, 4], [9, 0]]
    assert batch["tokens_mask"].tolist() == [[True, True], [True, False]]
    assert int(batch[keys.NTOKENS]) == int(batch[keys.INPUT_TOKENS]) == 3
    assert int(batch[keys.PADDED_TOKENS]) == 4
    assert batch["id"].tolist() == [7, 3] and batch["name"] == ["a", "b"]


def test_pad_to_multiple_of() -> None:
    batch = PaddingCollate(pad_to_multiple_of=4)(PAIRS)
    assert batch["source"].shape == (2, 4) and batch["target"].shape == (2, 4)
    assert batch["source_mask"].sum() == 4 and int(batch[keys.PADDED_TOKENS]) == 16
    batch = PaddingCollate(pad_to_multiple_of=3)([{"tokens": [1] * 4}])
    assert batch["tokens"].shape == (1, 6) and batch["tokens_mask"].sum() == 4


def test_truncation() -> None:
    batch = PaddingCollate(truncate_to=2)(PAIRS)
    assert batch["source"].tolist() == [[5, 6], [8, 0]]
    assert batch["target"].tolist() == [[1, 2], [3, 4]]
    assert int(batch[keys.NTOKENS]) == 4


def test_metadata_and_check() -> None:
    items = PlanItems(PAIRS, info=_BatchInfoDataset(PAIRS).__getitems__(micro([0, 1], 6)).info)
    batch = PaddingCollate()(items)
    assert int(batch[keys.STEP_NTOKENS]) == 50 and int(batch[keys.STEP_NEXAMPLES]) == 9
    assert int(batch[keys.DATASET]) == 0
    wrong = _BatchInfoDataset(PAIRS).__getitems__(micro([0, 1], 5))
    with pytest.raises(ValueError, match="`lengths` do not match the dataset"):
        PaddingCollate()(wrong)
    assert int(PaddingCollate(check_ntokens=False)(wrong)[keys.NTOKENS]) == 6


def test_bad_input() -> None:
    with pytest.raises(ValueError, match="pad_to_multiple_of"):
        PaddingCollate(pad_to_multiple_of=0)
    with pytest.raises(ValueError, match="truncate_to"):
        PaddingCollate(truncate_to=0)
    with pytest.raises(ValueError, match="source_key"):
        PaddingCollate()([{"text": [1]}])
    with pytest.raises(ValueError, match="1-D"):
        PaddingCollate()([{"tokens": [[1, 2]]}])


def test_pickles_with_metadata() -> None:
    mb = pickle.loads(pickle.dumps(micro([3, 1], 4)))
    assert isinstance(mb, MicroBatch) and mb == [3, 1] and mb.step_ntokens == 50
    items = pickle.loads(pickle.dumps(PlanItems([1], info={"ntokens": 2})))
    assert items == [1] and items.info == {"ntokens": 2}


class Tokens:
    def __init__(self, sequences: list[list[int]]) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"tokens": self.sequences[i], "id": i}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_metadata_through_dataloader(num_workers: int) -> None:
    rng = np.random.default_rng(0)
    seqs = [list(range(1, int(n) + 1)) for n in rng.integers(1, 9, size=30)]
    sampler = TokenBudgetBatchSampler(
        [len(s) for s in seqs], 16, rank=0, world_size=1, accumulate_grad_batches=2
    )
    expected = list(sampler)
    loader = DataLoader(
        _BatchInfoDataset(Tokens(seqs)),
        batch_sampler=sampler,
        collate_fn=PaddingCollate(),
        num_workers=num_workers,
    )
    batches = list(loader)
    assert len(batches) == len(expected)
    for batch, mb in zip(batches, expected, strict=True):
        assert batch["id"].tolist() == list(mb)
        assert int(batch[keys.NTOKENS]) == mb.ntokens
        assert int(batch[keys.STEP_NTOKENS]) == mb.step_ntokens
        assert int(batch[keys.STEP_NEXAMPLES]) == mb.step_nexamples
    assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(30))


@pytest.mark.parametrize("num_workers", [0, 2])
def test_lengths_mismatch_error(num_workers: int) -> None:
    seqs = [[1, 2, 3], [4], [5, 6]]
    sampler = TokenBudgetBatchSampler([3, 2, 2], 16, rank=0, world_size=1)  # item 1 has 1 token
    loader = DataLoader(
        _BatchInfoDataset(Tokens(seqs)),
        batch_sampler=sampler,
        collate_fn=PaddingCollate(),
        num_workers=num_workers,
    )
    with pytest.raises(ValueError, match="lengths"):
        list(loader)


def test_every_plan_count_reaches_the_batch_under_its_key() -> None:
    """keys.PLAN_COUNTS is the one table: each keyed MicroBatch attribute lands on the batch."""
    import inspect

    params = inspect.signature(MicroBatch.__init__).parameters
    values = {c.attribute: 11 + i for i, c in enumerate(keys.PLAN_COUNTS)}
    values["ntokens"] = 6  # the plan's count, checked against the items' real tokens
    assert all(c.attribute in params for c in keys.PLAN_COUNTS)
    mb = MicroBatch([0, 1], rank=0, planned_lengths=None, **values)
    batch = PaddingCollate(check_widths=False)(_BatchInfoDataset(PAIRS).__getitems__(mb))
    keyed = [c for c in keys.PLAN_COUNTS if c.key is not None]
    assert {c.key for c in keyed} == {
        keys.STEP_NTOKENS, keys.STEP_NEXAMPLES, keys.DATASET, keys.PLAN_WORLD_SIZE,
        keys.PLAN_ACCUMULATE, keys.STEP_BUDGET, keys.STEP_COST,
    }  # fmt: skip
    for count in keyed:
        assert int(batch[count.key]) == values[count.attribute], count
    assert len({c.key for c in keyed}) == len(keyed)  # no key used twice
    plain = PaddingCollate()(PAIRS)  # a plain list of items: no plan counts on the batch
    assert not any(c.key in plain for c in keyed)


def test_unknown_topology_is_left_off_the_batch() -> None:
    batch = PaddingCollate()(_BatchInfoDataset(PAIRS).__getitems__(micro([0, 1], 6)))
    assert keys.PLAN_WORLD_SIZE not in batch and keys.PLAN_ACCUMULATE not in batch
    assert int(batch[keys.DATASET]) == 0


def test_loss_offset_counts_and_checks_target_minus_offset() -> None:
    items = _BatchInfoDataset(PAIRS).__getitems__(micro([0, 1], 4))  # targets 2 + 4, minus 1 each
    with pytest.raises(ValueError, match="lengths` do not match"):
        PaddingCollate()(items)
    batch = PaddingCollate(loss_offset=1)(items)
    assert int(batch[keys.NTOKENS]) == 4 and int(batch[keys.INPUT_TOKENS]) == 10
    with pytest.raises(ValueError, match="loss_offset=2 per example"):
        PaddingCollate(loss_offset=2)(items)
    for bad in (-1, 1.0, True, "1"):
        with pytest.raises(ValueError, match="loss_offset"):
            PaddingCollate(loss_offset=bad)  # type: ignore[arg-type]
