"""Bad inputs to the loader layer fail early and clearly; nothing is trained silently wrong.

Issue 12: every padded field checked against the plan, lengths vs dataset, items checked before
training, the environment, and resuming with other data.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, IterableDataset

from lightning_varbatch import keys
from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.datamodule import TokenBudgetDataModule
from lightning_varbatch.data.loader import (
    TokenBudgetDataLoader,
    _BatchInfoDataset,
    token_budget_dataloader,
)
from lightning_varbatch.data.micro_batch import resolve_rank_world
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.mixture_datasets import DataSource
from tests.scripts.datamodule_common import Model, make_pairs, pair_lengths, quiet_trainer


def long_sources(n: int = 200, seed: int = 0) -> list[dict[str, Any]]:
    """Pairs whose sources are much longer than their targets (translation-like)."""
    rng = np.random.default_rng(seed)
    items = []
    for i in range(n):
        t = int(rng.integers(2, 12))
        s = int(rng.integers(30, 60))
        items.append({"id": i, "source": [1] * s, "target": torch.ones(t, dtype=torch.long)})
    return items


# -- 1. every padded field is checked against the plan -------------------------------------


def test_lengths_that_understate_the_source_are_caught_before_any_batch_exceeds_the_budget() -> (
    None
):
    data = long_sources()
    target_only = [len(x["target"]) for x in data]  # the loss side only: understates the source
    sampler = TokenBudgetBatchSampler(target_only, 256, rank=0, world_size=1)
    collate = PaddingCollate()
    loader = DataLoader(_BatchInfoDataset(data), batch_sampler=sampler, collate_fn=collate)
    with pytest.raises(ValueError) as error:
        for batch in loader:  # today: batches of up to thousands of padded slots, silently
            assert int(batch[keys.PADDED_TOKENS]) <= 2 * 256
    message = str(error.value)
    assert "Field 'source' of dataset item" in message
    assert "epoch 0, step 0, micro-batch 0" in message
    assert "the plan budgeted a length of" in message
    assert "(n, 2) source/target lengths" in message and "loss_lengths" in message


def test_first_item_understating_a_field_fails_at_loader_construction() -> None:
    data = long_sources()
    target_only = [len(x["target"]) for x in data]
    sampler = TokenBudgetBatchSampler(target_only, 256, rank=0, world_size=1)
    with pytest.raises(ValueError, match="Field 'source' of dataset item 0 has"):
        token_budget_dataloader(data, sampler)


@pytest.mark.parametrize("field", ["source", "target", "tokens"])
def test_every_padded_field_is_checked_against_its_planned_length(field: str) -> None:
    # One item (not the first, so the loader is built) has its longest field understated by
    # the lengths: whichever field that is, its batch must be refused, never padded past the plan.
    rng = np.random.default_rng(1)
    sizes = rng.integers(2, 20, size=(60, 2))
    if field == "tokens":
        data: list[dict[str, Any]] = [{"tokens": [1] * int(s)} for s, _ in sizes]
        lengths = sizes[:, 0].copy()
        data[17] = {"tokens": [1] * 40}
    else:
        data = [{"source": [1] * int(s), "target": [1] * int(t)} for s, t in sizes]
        lengths = sizes.copy()
        data[17] = {"source": [1] * 3, "target": [1] * 3, field: [1] * 40}
        lengths[17] = (3, 3)
    sampler = TokenBudgetBatchSampler(lengths, 64, rank=0, world_size=1, shuffle=False)
    loader = token_budget_dataloader(data, sampler, collate_fn=PaddingCollate(check_ntokens=False))
    with pytest.raises(
        ValueError,
        match=f"Field '{field}' of dataset item 17 .* has 40 tokens but the plan budgeted",
    ):
        for batch in loader:
            assert int(batch[keys.PADDED_TOKENS]) <= 64 * (1 if field == "tokens" else 2)


def test_width_check_stays_on_when_loss_lengths_differ() -> None:
    """The translation example's case: check_ntokens off, loss = target - 1."""
    data = long_sources()
    targets = np.array([len(x["target"]) for x in data])
    sampler = TokenBudgetBatchSampler(targets, 256, rank=0, world_size=1, loss_lengths=targets - 1)
    collate = PaddingCollate(check_ntokens=False)
    loader = DataLoader(_BatchInfoDataset(data), batch_sampler=sampler, collate_fn=collate)
    with pytest.raises(ValueError, match="Field 'source'"):
        list(loader)
    # with lengths covering both fields it runs, within budget
    both = pair_lengths(data)
    sampler = TokenBudgetBatchSampler(both, 256, rank=0, world_size=1, loss_lengths=targets - 1)
    batches = list(token_budget_dataloader(data, sampler, collate_fn=collate))
    assert all(b["source"].numel() <= 256 and b["target"].numel() <= 256 for b in batches)
    assert sum(int(b[keys.NEXAMPLES]) for b in batches) == len(data)


def test_width_check_fails_after_truncation_of_the_wrong_field() -> None:
    data = long_sources(40)
    lengths = pair_lengths(data)
    lengths[7, 0] = 3  # one example's source understated: within the plan's other widths
    sampler = TokenBudgetBatchSampler(lengths, 256, rank=0, world_size=1, shuffle=False)
    loader = DataLoader(_BatchInfoDataset(data), batch_sampler=sampler, collate_fn=PaddingCollate())
    with pytest.raises(ValueError, match=r"Field 'source' of dataset item 7 .* has"):
        list(loader)


@pytest.mark.parametrize(
    "settings",
    [
        {"pad_to_multiple_of": 8},
        {"oversize": "truncate", "max_tokens": 52},
        {"bucket_width": 7, "cost": "quadratic"},
        {"max_examples": 3, "tail": "pad"},
    ],
)
def test_width_check_has_no_false_alarms(settings: dict[str, Any]) -> None:
    data = long_sources(120, 3)
    budget = settings.pop("max_tokens", 300)
    sampler = TokenBudgetBatchSampler(
        pair_lengths(data), budget, rank=0, world_size=2, accumulate_grad_batches=2, **settings
    )
    batches = list(token_budget_dataloader(data, sampler))
    assert batches and all(int(b[keys.PADDED_TOKENS]) > 0 for b in batches)


def test_width_check_with_several_datasets() -> None:
    a, b = long_sources(30, 1), make_pairs(40, 2)
    dm = TokenBudgetDataModule(
        [
            DataSource(pair_lengths(a), dataset=a, name="a"),
            DataSource(pair_lengths(b), dataset=b, name="b", max_tokens=30),
        ],
        max_tokens=200,
        oversize="truncate",
    )
    assert sum(int(x[keys.NEXAMPLES]) for x in dm.train_dataloader()) == 70


def test_check_widths_option() -> None:
    with pytest.raises(TypeError, match="check_widths must be True or False"):
        PaddingCollate(check_widths="no")  # type: ignore[arg-type]
    data = long_sources(20)
    sampler = TokenBudgetBatchSampler([len(x["target"]) for x in data], 256, rank=0, world_size=1)
    loose = PaddingCollate(check_widths=False)
    loader = DataLoader(_BatchInfoDataset(data), batch_sampler=sampler, collate_fn=loose)
    assert sum(int(b[keys.NEXAMPLES]) for b in loader) == 20


# -- 3. lengths vs dataset --------------------------------------------------------------------


@pytest.mark.parametrize("count", [59, 61])
def test_lengths_count_differs_from_dataset_size(count: int) -> None:
    data = make_pairs(60, 0)
    lengths = np.resize(pair_lengths(data), (count, 2))
    sampler = TokenBudgetBatchSampler(lengths, 40, rank=0, world_size=1)
    message = f"dataset has 60 items but the sampler plans with {count} lengths"
    with pytest.raises(ValueError, match=message):
        token_budget_dataloader(data, sampler)
    with pytest.raises(ValueError, match=message):
        TokenBudgetDataLoader(data, sampler)
    with pytest.raises(ValueError, match=f"train_lengths has {count} entries but train_dataset"):
        TokenBudgetDataModule(data, lengths, 40)
    with pytest.raises(ValueError, match=f"val_lengths has {count} entries but val_dataset"):
        TokenBudgetDataModule(data, pair_lengths(data), 40, val_dataset=data, val_lengths=lengths)


def test_callable_lengths_are_checked_at_construction() -> None:
    data = make_pairs(10, 0)
    with pytest.raises(ValueError, match="train_lengths has 9 entries but train_dataset has 10"):
        TokenBudgetDataModule(data, lambda d: pair_lengths(d)[:9], 40)
    with pytest.raises(KeyError, match="train_lengths \\(a callable\\) raised KeyError"):
        TokenBudgetDataModule(data, lambda d: [len(x["text"]) for x in d], 40)


def test_settings_are_checked_at_construction() -> None:
    data = make_pairs(10, 0)
    with pytest.raises(SettingValueError, match="tail must be one of") as bad:
        TokenBudgetDataModule(data, pair_lengths, 40, tail="wrap")
    assert (bad.value.setting, bad.value.stage) == ("tail", "train")
    with pytest.raises(SettingValueError, match="train_lengths: lengths\\[2\\] = -2") as bad:
        TokenBudgetDataModule(data, np.array([3, 4, -2, 1, 1, 1, 1, 1, 1, 1]), 40)
    assert (bad.value.setting, bad.value.stage) == ("train_lengths", "train")
    with pytest.raises(ValueError, match="train_dataset is a single dataset"):
        TokenBudgetDataModule(data, pair_lengths, 40, steps_per_epoch=4)
    with pytest.raises(ValueError, match="pad_to_multiple_of=64\\) pads wider than the plan"):
        TokenBudgetDataModule(
            data, pair_lengths, 40, collate=PaddingCollate(pad_to_multiple_of=64)
        ).train_dataloader()
    with pytest.raises(ValueError, match="unknown keys \\['train_sampler_v2'\\]"):
        TokenBudgetDataModule(data, pair_lengths, 40).load_state_dict({"train_sampler_v2": {}})


def test_ragged_lengths_name_the_argument() -> None:
    data = make_pairs(3, 0)
    with pytest.raises(ValueError, match="train_lengths is ragged"):
        TokenBudgetDataModule(data, [[1, 2], [3], [4, 5]], 40)


class Stream(IterableDataset[dict[str, Any]]):
    def __iter__(self) -> Any:
        yield {"tokens": [1, 2]}


def test_iterable_dataset_is_refused_with_what_to_do() -> None:
    sampler = TokenBudgetBatchSampler([2, 2], 8, rank=0, world_size=1)
    with pytest.raises(TypeError, match=r"iterable-style dataset .* needs a map-style dataset"):
        token_budget_dataloader(Stream(), sampler)
    with pytest.raises(TypeError, match="train_dataset is an iterable-style dataset"):
        TokenBudgetDataModule(Stream(), [2, 2], 8)
    with pytest.raises(TypeError, match=r"train_dataset\[0\] \(s\) is an iterable-style"):
        TokenBudgetDataModule([DataSource([2, 2], dataset=Stream(), name="s")], max_tokens=8)


# -- 4. items ---------------------------------------------------------------------------------


def test_first_item_without_target_fails_at_construction() -> None:
    data = make_pairs(20, 0)
    del data[0]["target"]
    with pytest.raises(ValueError, match="dataset item 0 has keys \\['id', 'source'\\]"):
        TokenBudgetDataModule(data, pair_lengths_or_source(data), 40).train_dataloader()


def pair_lengths_or_source(items: list[dict[str, Any]]) -> np.ndarray:
    return np.array([[len(x["source"]), len(x.get("target", x["source"]))] for x in items])


def test_later_item_without_target_names_field_and_index() -> None:
    data = make_pairs(20, 0)
    lengths = pair_lengths(data)
    del data[13]["target"]
    loader = token_budget_dataloader(
        data, TokenBudgetBatchSampler(lengths, 40, rank=0, world_size=1)
    )
    with pytest.raises(ValueError, match=r"dataset item 13 .* has no field 'target'"):
        list(loader)


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        (["a", "b"], TypeError, "not a sequence of integer token ids"),
        ("ab", TypeError, "is a str"),
        ([1.5, 2.0], TypeError, "holds torch.float32 values"),
        (torch.tensor([True, False]), TypeError, "holds torch.bool"),
        ([[1], [2]], ValueError, "1-D sequence"),
        (None, TypeError, "not a sequence of integer token ids"),
    ],
)
def test_bad_token_ids_name_the_field_and_item(ids: Any, error: type, match: str) -> None:
    data = make_pairs(12, 0)
    lengths = pair_lengths(data)
    data[5]["source"] = ids
    loader = token_budget_dataloader(
        data, TokenBudgetBatchSampler(lengths, 40, rank=0, world_size=1)
    )
    with pytest.raises(error, match=match) as raised:
        list(loader)
    assert "Field 'source' of dataset item 5" in str(raised.value)
    data[0]["source"] = ids  # the first item: at construction
    with pytest.raises(error, match=match):
        token_budget_dataloader(data, TokenBudgetBatchSampler(lengths, 40, rank=0, world_size=1))


def test_numpy_and_narrow_integer_ids_are_accepted() -> None:
    batch = PaddingCollate()(
        [
            {"tokens": np.array([3, 4], dtype=np.int32)},
            {"tokens": torch.tensor([5], dtype=torch.int16)},
        ]
    )
    assert batch["tokens"].dtype == torch.long and batch["tokens"].tolist() == [[3, 4], [5, 0]]


@pytest.mark.parametrize("item", [[1, 2, 3], "text", 7])
def test_non_mapping_item_is_a_type_error(item: Any) -> None:
    with pytest.raises(TypeError, match="expects every item to be a mapping"):
        PaddingCollate()([item])
    with pytest.raises(TypeError, match="item 1 of the micro-batch is a"):
        PaddingCollate()([{"tokens": [1]}, item])


@pytest.mark.parametrize("pad_id", [None, 1.5, "0", True])
def test_bad_pad_id(pad_id: Any) -> None:
    with pytest.raises(TypeError, match="pad_id must be an integer"):
        PaddingCollate(pad_id=pad_id)


def test_numpy_settings_are_accepted() -> None:
    collate = PaddingCollate(pad_id=np.int64(0), pad_to_multiple_of=np.int64(2))
    assert collate([{"tokens": [1]}])["tokens"].shape == (1, 2)
    sampler = TokenBudgetBatchSampler(np.array([3, 4]), np.int64(8), rank=0, world_size=1)
    assert sampler.max_tokens == 8 and isinstance(sampler.max_tokens, int)
    dm = TokenBudgetDataModule(
        make_pairs(5, 0), pair_lengths, np.int64(40), val_max_tokens=np.int32(40)
    )
    assert dm.max_tokens == 40


def test_shuffle_must_be_a_bool() -> None:
    with pytest.raises(TypeError, match="shuffle must be True or False, got 'false'"):
        TokenBudgetBatchSampler([3, 4], 8, rank=0, world_size=1, shuffle="false")  # type: ignore[arg-type]


@pytest.mark.parametrize("workers", [-1, 1.5, True])
def test_bad_num_workers(workers: Any) -> None:
    data = make_pairs(5, 0)
    with pytest.raises(ValueError, match="num_workers must be"):
        TokenBudgetDataModule(data, pair_lengths, 40, num_workers=workers)
    sampler = TokenBudgetBatchSampler(pair_lengths(data), 40, rank=0, world_size=1)
    with pytest.raises(ValueError, match="num_workers must be"):
        token_budget_dataloader(data, sampler, num_workers=workers)


def test_val_max_tokens_below_the_longest_validation_example_names_val_max_tokens() -> None:
    data = make_pairs(30, 0)  # lengths up to 11
    with pytest.raises(SettingValueError, match="val_max_tokens=4") as error:
        TokenBudgetDataModule(
            data,
            pair_lengths(data),
            40,
            val_dataset=data,
            val_lengths=pair_lengths,
            val_max_tokens=4,
        )
    assert "raise val_max_tokens" in str(error.value)
    assert "(it defaults to max_tokens)" not in str(error.value)
    # typed: the split and the DataModule's argument are attributes, not text to parse
    assert (error.value.setting, error.value.stage, error.value.value) == (
        "val_max_tokens",
        "val",
        4,
    )
    with pytest.raises(SettingValueError, match="it defaults to max_tokens") as error:
        TokenBudgetDataModule(data, pair_lengths(data), 12, val_dataset=data[:3],
                              val_lengths=[[13, 1]] * 3, oversize="error")  # fmt: skip
    assert (error.value.setting, error.value.stage) == ("val_max_tokens", "val")
    with pytest.raises(ValueError, match="val_max_tokens must be a positive integer"):
        TokenBudgetDataModule(data, pair_lengths(data), 40, val_max_tokens=0)
    with pytest.raises(ValueError, match="max_tokens must be a positive integer"):
        TokenBudgetDataModule(data, pair_lengths(data), -3)


def test_lengths_without_dataset_and_bad_resume_option() -> None:
    data = make_pairs(5, 0)
    with pytest.raises(ValueError, match="val_lengths was given without val_dataset"):
        TokenBudgetDataModule(data, pair_lengths, 40, val_lengths=[1, 2])
    with pytest.raises(ValueError, match="on_resume_mismatch must be one of"):
        TokenBudgetDataModule(data, pair_lengths, 40, on_resume_mismatch="restart")  # type: ignore[arg-type]


def test_datamodule_load_state_dict_of_a_non_dict() -> None:
    dm = TokenBudgetDataModule(make_pairs(5, 0), pair_lengths, 40)
    with pytest.raises(TypeError, match="expects the dict returned by its state_dict"):
        dm.load_state_dict(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="'train_sampler' entry must be"):
        dm.load_state_dict({"train_sampler": 3})


# -- 5. environment ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"RANK": "one"}, "RANK='one' is not an integer >= 0"),
        ({"RANK": "-1"}, "RANK='-1' is not an integer >= 0"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE='0' is not an integer >= 1"),
        ({"WORLD_SIZE": "2.0"}, "WORLD_SIZE='2.0'"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK='2', WORLD_SIZE='2'"),
        ({"LOCAL_RANK": "x"}, "LOCAL_RANK='x'"),
    ],
)
def test_invalid_environment_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], match: str
) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        resolve_rank_world(None, None)
    with pytest.raises(ValueError, match=match):
        TokenBudgetBatchSampler([3, 4], 8)
    assert resolve_rank_world(0, 1) == (0, 1)  # explicit values do not read the environment


# -- 2. resume with other data, through Lightning --------------------------------------------


def _cut(items: list[dict[str, Any]], limit: int) -> list[dict[str, Any]]:
    """The same examples with sources cut to ``limit`` tokens (a lowered max_length)."""
    return [{**x, "source": x["source"][:limit]} for x in items]


def _fit(data: list[dict[str, Any]], tmp: Path, **kwargs: Any) -> tuple[Model, Any]:
    dm = TokenBudgetDataModule(data, pair_lengths, 40, seed=3, **kwargs.pop("dm", {}))
    model = Model()
    callbacks = kwargs.pop("callbacks", [])
    trainer = quiet_trainer(max_epochs=1, callbacks=callbacks, limit_val_batches=0, **kwargs)
    trainer.fit(model, datamodule=dm, ckpt_path=kwargs.get("ckpt_path"))
    return model, trainer


def test_resume_with_other_lengths_refused_or_restarted(tmp_path: Path) -> None:
    data = make_pairs(60, 1)
    saver = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=4, save_top_k=-1)
    _fit(data, tmp_path, callbacks=[saver], max_steps=5, enable_checkpointing=True)
    ckpt = str(tmp_path / "epoch=0-step=4.ckpt")
    changed = _cut(data, 3)  # same count, same settings, other lengths
    dm = TokenBudgetDataModule(changed, pair_lengths, 40, seed=3)
    with pytest.raises(ValueError, match="lengths digest") as error:
        quiet_trainer(max_epochs=1, limit_val_batches=0).fit(Model(), dm, ckpt_path=ckpt)
    assert "on_resume_mismatch='restart_epoch'" in str(error.value)
    dm = TokenBudgetDataModule(
        changed, pair_lengths, 40, seed=3, on_resume_mismatch="restart_epoch"
    )
    model = Model()
    with pytest.warns(UserWarning, match="Starting epoch 0 afresh"):
        quiet_trainer(max_epochs=1, limit_val_batches=0).fit(model, dm, ckpt_path=ckpt)
    ids = sorted(i for r in model.trained for i in r["ids"])
    assert ids == list(range(60))  # every example of the restarted epoch exactly once
    assert {r["epoch"] for r in model.trained} == {0}


def test_datamodule_loss_lengths_per_stage() -> None:
    data = [x for x in make_pairs(40, 0) if len(x["target"]) > 1][:10]
    loss = pair_lengths(data)[:, 1] - 1  # teacher forcing: target minus BOS
    collate = PaddingCollate(loss_offset=1)
    dm = TokenBudgetDataModule(
        data,
        pair_lengths,
        40,
        train_loss_lengths=loss,
        val_dataset=data,
        val_lengths=pair_lengths,
        val_loss_lengths=lambda d: [len(x["target"]) - 1 for x in d],
        collate=collate,
    )
    for loader in (dm.train_dataloader(), dm.val_dataloader()):
        batches = list(loader)  # the collate's loss-count check passes on every batch
        assert sum(int(b[keys.NTOKENS]) for b in batches) == int(loss.sum())
        assert sum(int(b[keys.STEP_NTOKENS]) for b in batches) == int(loss.sum())
    with pytest.raises(TypeError, match="train_loss_lengths="):
        TokenBudgetDataModule(data, pair_lengths, 40, loss_lengths=loss)
    with pytest.raises(ValueError, match="test_loss_lengths was given without test_dataset"):
        TokenBudgetDataModule(data, pair_lengths, 40, test_loss_lengths=loss)
    with pytest.raises(ValueError, match="train_dataset is a list of DataSource"):
        TokenBudgetDataModule(
            [DataSource(pair_lengths(data), dataset=data)], max_tokens=40, train_loss_lengths=loss
        )
    with pytest.raises(SettingValueError, match="val_loss_lengths") as bad:  # the argument
        TokenBudgetDataModule(
            data, pair_lengths, 40, val_dataset=data, val_lengths=pair_lengths,
            val_loss_lengths=loss[:3],
        )  # fmt: skip
    assert (bad.value.setting, bad.value.stage) == ("val_loss_lengths", "val")


def test_datamodule_check_plans_every_stage_without_a_trainer() -> None:
    data = make_pairs(30, 0)
    dm = TokenBudgetDataModule(
        data, pair_lengths, 40, val_dataset=data[:5], val_lengths=pair_lengths
    )
    plans = dm.check(world_size=2, accumulate_grad_batches=3)
    assert sorted(plans) == ["train", "val"] and dm.samplers == {}
    assert (plans["train"].world_size, plans["train"].accumulate_grad_batches) == (2, 3)
    assert (plans["val"].world_size, plans["val"].accumulate_grad_batches) == (2, 1)
    assert plans["val"].num_duplicated == plans["val"].num_dropped == 0
    assert sorted(dm.check(stages=("val",))) == ["val"]
    assert dm.planner("train").num_examples == 30
    with pytest.raises(ValueError, match="5 examples for 8 ranks"):
        dm.check(world_size=8)
    with pytest.raises(ValueError, match="stages must be"):
        dm.check(stages=("valid",))
    with pytest.raises(ValueError, match="no test_dataset"):
        dm.planner("test")
