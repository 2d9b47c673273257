"""TokenBudgetDataModule: every setting is checked when the DataModule is built.

Example:
    >>> len(CASES) > 40
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from torch.utils.data import IterableDataset

from lightning_varbatch import (
    DataSource,
    PaddingCollate,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import POSITIVE_REAL_BAD, int_family, real_family

DM = "lightning_varbatch/data/datamodule.py"
TOKENS = [{"tokens": [1] * n} for n in (3, 5, 2, 7, 4, 6)]
LENGTHS = np.array([3, 5, 2, 7, 4, 6])
VAL = [{"tokens": [1] * n} for n in (7, 6, 5)]
VAL_LENGTHS = np.array([7, 6, 5])


def _dm(**kwargs: Any) -> TokenBudgetDataModule:
    data = kwargs.pop("train_dataset", TOKENS)
    lengths = kwargs.pop("train_lengths", LENGTHS)
    max_tokens = kwargs.pop("max_tokens", 16)
    return TokenBudgetDataModule(data, lengths, max_tokens, **kwargs)


def _built(**kwargs: Any) -> TokenBudgetDataModule:
    """Construct only: a bad setting must fail here, before any loader or Trainer exists."""
    return _dm(**kwargs)


def _used(**kwargs: Any) -> None:
    """Construct and draw every training batch (the accepted cases check the result)."""
    dm = _dm(**kwargs)
    n = sum(int(b["nexamples"]) for b in dm.train_dataloader())
    assert n == len(dm.datasets["train"]), f"an epoch trained {n} examples"


def _setting(name: str, *, use: bool = False, **base: Any) -> Any:
    def call(value: Any) -> Any:
        kwargs = {**base, name: value}
        return _used(**kwargs) if use else _built(**kwargs)

    return call


def _sources(**first: Any) -> list[DataSource]:
    return [
        DataSource(LENGTHS, dataset=TOKENS, name="wmt", **first),
        DataSource(LENGTHS[:4], dataset=TOKENS[:4], name="news"),
    ]


def _mixed(name: str, **base: Any) -> Any:
    def call(value: Any) -> Any:
        return _built(train_dataset=_sources(), train_lengths=None, **{**base, name: value})

    return call


def _val_budget_too_small(tmp: Path) -> None:
    dm = _dm(val_dataset=VAL, val_lengths=VAL_LENGTHS, val_max_tokens=4)
    dm.val_dataloader()


def _callable_wrong_count(tmp: Path) -> None:
    dm = _dm(train_lengths=lambda data: [3, 5, 2])
    dm.train_dataloader()


def _callable_raises(tmp: Path) -> None:
    def lengths(data: Any) -> Any:
        return [len(x["text"]) for x in data]

    _dm(train_lengths=lengths).train_dataloader()


class _Stream(IterableDataset[Any]):
    def __iter__(self) -> Any:
        return iter(TOKENS)


def _saved_state(lengths: Any = LENGTHS) -> dict[str, Any]:
    sampler = TokenBudgetBatchSampler(lengths, 16, rank=0, world_size=1)
    it = iter(sampler)
    next(it)
    return {"train_sampler": sampler.state_dict()}


def _resume_changed_lengths(tmp: Path) -> None:
    changed = LENGTHS.copy()
    changed[[0, 1]] = [5, 3]
    dm = _dm(train_dataset=[{"tokens": [1] * int(n)} for n in changed], train_lengths=changed)
    dm.load_state_dict(_saved_state())
    dm.train_dataloader()


def _fit_resume_changed_lengths(tmp: Path) -> None:
    """Real Trainer: checkpoint mid-epoch, resume with other lengths of the same count."""
    import torch
    from lightning.pytorch import LightningModule, Trainer

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(4, 1)
            self.steps = 0

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.steps += 1
            return self.embed(batch["tokens"]).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def trainer(steps: int) -> Trainer:
        return Trainer(
            max_steps=steps,
            accelerator="cpu",
            devices=1,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=str(tmp),
        )

    lengths = np.array([3, 5, 2, 7, 4, 6, 1, 8, 2, 3, 5, 4])
    first = trainer(2)
    first.fit(
        Model(),
        _dm(
            train_dataset=[{"tokens": [1] * int(n)} for n in lengths],
            train_lengths=lengths,
            max_tokens=8,
            shuffle=False,
        ),
    )
    ckpt = tmp / "mid.ckpt"
    first.save_checkpoint(ckpt)
    changed = lengths.copy()
    changed[[0, 3]] = [7, 3]  # same count, same settings, other lengths (re-tokenised data)
    model = Model()
    try:
        trainer(6).fit(
            model,
            _dm(
                train_dataset=[{"tokens": [1] * int(n)} for n in changed],
                train_lengths=changed,
                max_tokens=8,
                shuffle=False,
            ),
            ckpt_path=ckpt,
        )
    except Exception:
        assert model.steps == 0, f"the error came after {model.steps} training steps"
        raise


def _resume_unknown_key(tmp: Path) -> None:
    _dm().load_state_dict({"train_sampler_v2": _saved_state()["train_sampler"]})


def _resume_none(tmp: Path) -> None:
    _dm().load_state_dict(None)


def _resume_empty(tmp: Path) -> None:
    dm = _dm()
    dm.load_state_dict({})  # a checkpoint saved before the first training batch
    assert len(list(dm.train_dataloader())) > 0


def _resume_good(tmp: Path) -> None:
    dm = _dm()
    dm.load_state_dict(_saved_state())
    batches = list(dm.train_dataloader())
    assert 0 < len(batches) < len(TOKENS)


def _truncate(tmp: Path) -> None:
    data = [{"tokens": [1] * n} for n in (2, 30, 40, 50, 60)]
    _dm(
        train_dataset=data, train_lengths=[2, 30, 40, 50, 60], max_tokens=4, oversize="truncate"
    ).train_dataloader()


def _sources_bad_max_examples(tmp: Path) -> None:
    _built(train_dataset=_sources(max_examples=0), train_lengths=None)


def _sources_bad_max_tokens(tmp: Path) -> None:
    _built(train_dataset=_sources(max_tokens=-8), train_lengths=None)


def _test_missing(tmp: Path) -> None:
    _dm().test_dataloader()


def _collate_pads_more(tmp: Path) -> None:
    from lightning_varbatch import PaddingCollate

    _used(collate=PaddingCollate(pad_to_multiple_of=64))


def _mixing_ignored(tmp: Path) -> None:
    # mixing settings with one plain dataset have no effect: say so instead of ignoring them
    _built(weights=[1.0, 2.0], steps_per_epoch=5)


CASES: list[Case] = [
    *int_family(
        "dm-max_tokens",
        "DataModule",
        "max_tokens",
        _setting("max_tokens"),
        good=16,
        what="TokenBudgetDataModule(data, lengths, max_tokens=",
        fix_in=DM,
    ),
    *int_family(
        "dm-val_max_tokens",
        "DataModule",
        "val_max_tokens",
        _setting("val_max_tokens", val_dataset=VAL, val_lengths=VAL_LENGTHS),
        required=False,
        good=16,
        what="TokenBudgetDataModule(val_max_tokens=",
        fix_in=DM,
        not_blame=("raise max_tokens",),
    ),
    *int_family(
        "dm-num_workers",
        "DataModule",
        "num_workers",
        _setting("num_workers"),
        zero_ok=True,
        good=0,
        what="TokenBudgetDataModule(num_workers=",
        fix_in=DM,
    ),
    *int_family(
        "dm-max_examples",
        "DataModule",
        "max_examples",
        _setting("max_examples", use=True),
        required=False,
        good=2,
        what="TokenBudgetDataModule(max_examples=",
        fix_in=DM,
    ),
    *int_family(
        "dm-bucket_width",
        "DataModule",
        "bucket_width",
        _setting("bucket_width", use=True),
        good=2,
        what="TokenBudgetDataModule(bucket_width=",
        fix_in=DM,
        not_blame=("raise max_tokens",),
    ),
    *int_family(
        "dm-steps_per_epoch",
        "DataModule",
        "steps_per_epoch",
        _mixed("steps_per_epoch"),
        required=False,
        good=4,
        what="TokenBudgetDataModule(two DataSources, steps_per_epoch=",
        fix_in=DM,
    ),
    *real_family(
        "dm-temperature",
        "DataModule",
        "temperature",
        _mixed("temperature", steps_per_epoch=4),
        good=2.0,
        members=[*POSITIVE_REAL_BAD, ("none", None, "None")],
        what="TokenBudgetDataModule(two DataSources, steps_per_epoch=4, temperature=",
        fix_in=DM,
    ),
    error(
        "dm-val-budget-too-small",
        "DataModule",
        "val_max_tokens=4 with validation examples of length 5-7",
        _val_budget_too_small,
        "val_max_tokens",
        "4",
        "7",
        not_blame=("raise max_tokens",),
        fix_in=DM,
        setting="val_max_tokens",
        raises=SettingValueError,
    ),
    error(
        "dm-max_tokens-missing",
        "DataModule",
        "TokenBudgetDataModule(data, lengths)",
        lambda tmp: TokenBudgetDataModule(TOKENS, LENGTHS),
        "max_tokens",
        fix_in=DM,
        raises=SettingTypeError,
    ),
    *int_family(
        "dm-loss_offset",
        "DataModule",
        "loss_offset",
        _setting("loss_offset", use=True),
        zero_ok=True,
        good=1,
        what="TokenBudgetDataModule(loss_offset=",
        fix_in=DM,
    ),
    error(
        "dm-loss_offset-with-train_loss_lengths",
        "DataModule",
        "TokenBudgetDataModule(..., train_loss_lengths=lengths - 1, loss_offset=1)",
        lambda tmp: _built(train_loss_lengths=LENGTHS - 1, loss_offset=1),
        "loss_offset=1",
        "loss_lengths",
        "pass one of them",
        setting="loss_offset",
        raises=SettingValueError,
        fix_in=DM,
    ),
    error(
        "dm-loss_offset-collate-disagrees",
        "DataModule",
        "TokenBudgetDataModule(..., loss_offset=1, collate=PaddingCollate())",
        lambda tmp: _built(loss_offset=1, collate=PaddingCollate()),
        "loss_offset=1",
        "PaddingCollate(loss_offset=0)",
        setting="collate",
        raises=SettingValueError,
        fix_in=DM,
    ),
    error(
        "dm-unknown-setting",
        "DataModule",
        "TokenBudgetDataModule(..., max_token=16)",
        lambda tmp: _built(max_token=16),
        "max_token",
        raises=SettingTypeError,
        fix_in=DM,
    ),
    error(
        "dm-shuffle-str",
        "DataModule",
        "TokenBudgetDataModule(shuffle='false')",
        lambda tmp: _built(shuffle="false"),
        "shuffle",
        "false",
        fix_in=DM,
        raises=SettingTypeError,
        setting="shuffle",
    ),
    error(
        "dm-seed-negative",
        "DataModule",
        "TokenBudgetDataModule(seed=-1)",
        lambda tmp: _built(seed=-1),
        "seed",
        "-1",
        fix_in=DM,
        raises=SettingValueError,
        setting="seed",
    ),
    error(
        "dm-tail-unknown",
        "DataModule",
        "TokenBudgetDataModule(tail='wrap')",
        lambda tmp: _built(tail="wrap"),
        "tail",
        "wrap",
        fix_in=DM,
        raises=SettingValueError,
        setting="tail",
    ),
    error(
        "dm-pair_order-unknown",
        "DataModule",
        "TokenBudgetDataModule(pair_order='sorted')",
        lambda tmp: _built(pair_order="sorted"),
        "pair_order",
        "sorted",
        "max",
        fix_in=DM,
        raises=SettingValueError,
        setting="pair_order",
    ),
    error(
        "dm-pad_to_multiple_of-zero",
        "DataModule",
        "TokenBudgetDataModule(pad_to_multiple_of=0)",
        lambda tmp: _built(pad_to_multiple_of=0),
        "pad_to_multiple_of",
        "0",
        fix_in=DM,
        raises=SettingValueError,
        setting="pad_to_multiple_of",
    ),
    error(
        "dm-mixing-unknown",
        "DataModule",
        "TokenBudgetDataModule(two DataSources, mixing='per_epoch')",
        lambda tmp: _mixed("mixing")("per_epoch"),
        "mixing",
        "per_epoch",
        fix_in=DM,
        raises=SettingValueError,
        setting="mixing",
    ),
    error(
        "dm-weights-count",
        "DataModule",
        "two DataSources with weights=[1, 2, 3] and steps_per_epoch=4",
        lambda tmp: _mixed("weights", steps_per_epoch=4)([1, 2, 3]),
        "weights",
        "3",
        "2",
        fix_in=DM,
        raises=SettingValueError,
        setting="weights",
    ),
    error(
        "dm-mixing-settings-one-dataset",
        "DataModule",
        "weights/steps_per_epoch with a single plain dataset (they would be ignored)",
        _mixing_ignored,
        ("weights", "steps_per_epoch"),
        "DataSource",
        fix_in=DM,
        raises=SettingValueError,
    ),
    error(
        "dm-train_dataset-none",
        "DataModule",
        "TokenBudgetDataModule(None, lengths, 16)",
        lambda tmp: _built(train_dataset=None),
        "train_dataset",
        fix_in=DM,
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-missing",
        "DataModule",
        "TokenBudgetDataModule(data, None, 16)",
        lambda tmp: _built(train_lengths=None),
        "train_lengths",
        fix_in=DM,
        raises=SettingValueError,
    ),
    error(
        "dm-val_lengths-missing",
        "DataModule",
        "val_dataset without val_lengths",
        lambda tmp: _built(val_dataset=VAL),
        "val_lengths",
        fix_in=DM,
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-fewer",
        "DataModule",
        "4 train_lengths for 6 items",
        lambda tmp: _built(train_lengths=LENGTHS[:4]),
        "train_lengths",
        "4",
        "6",
        fix_in=DM,
        setting="train_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-more",
        "DataModule",
        "6 train_lengths for 4 items",
        lambda tmp: _built(train_dataset=TOKENS[:4]),
        "train_lengths",
        "6",
        "4",
        fix_in=DM,
        setting="train_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-val_lengths-count",
        "DataModule",
        "2 val_lengths for 3 validation items",
        lambda tmp: _built(val_dataset=VAL, val_lengths=VAL_LENGTHS[:2]),
        "val_lengths",
        "2",
        "3",
        not_blame=("val_max_tokens",),
        fix_in=DM,
        setting="val_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-test_lengths-count",
        "DataModule",
        "2 test_lengths for 3 test items",
        lambda tmp: _built(test_dataset=VAL, test_lengths=VAL_LENGTHS[:2]),
        "test_lengths",
        "2",
        "3",
        not_blame=("val_max_tokens",),
        fix_in=DM,
        setting="test_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-val-source-negative",
        "DataModule",
        "val_dataset=[DataSource(name='val-news', lengths holding -1)]",
        lambda tmp: _built(
            val_dataset=[DataSource(np.array([3, -1, 5]), dataset=VAL, name="val-news")]
        ).val_dataloader(),
        "val-news",
        "-1",
        not_blame=("val_max_tokens",),
        fix_in=DM,
        setting="val_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-negative",
        "DataModule",
        "train_lengths holding -2",
        lambda tmp: _built(train_lengths=[3, 5, -2, 7, 4, 6]),
        "train_lengths",
        "-2",
        fix_in=DM,
        setting="train_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-ragged",
        "DataModule",
        "train_lengths=[[3, 4], [5], ...] (ragged)",
        lambda tmp: _built(train_lengths=[[3, 4], [5], [1, 1], [2, 2], [3, 3], [4, 4]]),
        "train_lengths",
        fix_in=DM,
        setting="train_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-callable-count",
        "DataModule",
        "train_lengths= a callable returning 3 lengths for 6 items",
        _callable_wrong_count,
        "train_lengths",
        "3",
        "6",
        fix_in=DM,
        setting="train_lengths",
        raises=SettingValueError,
    ),
    error(
        "dm-train_lengths-callable-raises",
        "DataModule",
        "train_lengths= a callable reading a field the items lack",
        _callable_raises,
        "train_lengths",
        "text",
        raises=KeyError,
        fix_in=DM,
    ),
    error(
        "dm-iterable-dataset",
        "DataModule",
        "a torch IterableDataset as train_dataset",
        lambda tmp: _built(train_dataset=_Stream(), train_lengths=LENGTHS),
        ("IterableDataset", "iterable"),
        "train_dataset",
        raises=TypeError,
        fix_in=DM,
    ),
    error(
        "dm-collate-not-callable",
        "DataModule",
        "TokenBudgetDataModule(collate='pad')",
        lambda tmp: _built(collate="pad"),
        "collate",
        "pad",
        fix_in=DM,
        raises=SettingTypeError,
        setting="collate",
    ),
    error(
        "dm-collate-pads-over-plan",
        "DataModule",
        "collate=PaddingCollate(pad_to_multiple_of=64), planner pad_to_multiple_of=1",
        _collate_pads_more,
        "pad_to_multiple_of",
        "64",
        fix_in=DM,
        raises=SettingValueError,
        setting="collate",
    ),
    error(
        "dm-pin_memory-str",
        "DataModule",
        "TokenBudgetDataModule(pin_memory='yes')",
        lambda tmp: _built(pin_memory="yes"),
        "pin_memory",
        "yes",
        fix_in=DM,
        raises=SettingTypeError,
        setting="pin_memory",
    ),
    error(
        "dm-test-missing",
        "DataModule",
        "test_dataloader() without a test_dataset",
        _test_missing,
        "test_dataset",
        raises=ValueError,
        fix_in=DM,
    ),
    error(
        "dm-truncate-almost-all",
        "DataModule",
        "oversize='truncate' with 4 of 5 examples over max_tokens=4",
        _truncate,
        "truncate",
        "4",
        "max_tokens",
        warn_ok=True,
        fix_in="lightning_varbatch/planner/length_checks.py",
        setting="max_tokens",
        raises=SettingValueError,
    ),
    error(
        "dm-source-max_examples-zero",
        "DataModule",
        "DataSource(name='wmt', max_examples=0) in train_dataset",
        _sources_bad_max_examples,
        "max_examples",
        "0",
        "wmt",
        fix_in="lightning_varbatch/planner/mixture.py",
        raises=SettingValueError,
        setting="max_examples",
    ),
    error(
        "dm-source-max_tokens-negative",
        "DataModule",
        "DataSource(name='wmt', max_tokens=-8) in train_dataset",
        _sources_bad_max_tokens,
        "max_tokens",
        "-8",
        "wmt",
        fix_in="lightning_varbatch/planner/mixture.py",
        raises=SettingValueError,
        setting="max_tokens",
    ),
    error(
        "dm-state-changed-lengths",
        "resume/state",
        "DataModule resumed with the same count but different lengths",
        _resume_changed_lengths,
        "lengths",
        raises=ResumeMismatchError,
        fix_in=DM,
    ),
    error(
        "fit-resume-changed-lengths",
        "resume/state",
        "Trainer.fit(ckpt_path=mid-epoch checkpoint) with the same count but other lengths",
        _fit_resume_changed_lengths,
        "lengths",
        raises=ResumeMismatchError,
        fix_in=DM,
    ),
    error(
        "dm-state-unknown-key",
        "resume/state",
        "DataModule.load_state_dict({'train_sampler_v2': ...})",
        _resume_unknown_key,
        "train_sampler_v2",
        fix_in=DM,
        raises=ValueError,
    ),
    error(
        "dm-state-none",
        "resume/state",
        "DataModule.load_state_dict(None)",
        _resume_none,
        "None",
        "state",
        fix_in=DM,
        raises=TypeError,
    ),
    accepted(
        "dm-state-empty",
        "resume/state",
        "DataModule.load_state_dict({}) (saved before the first batch)",
        _resume_empty,
        fix_in=DM,
    ),
    accepted(
        "dm-state-resume",
        "resume/state",
        "DataModule resumed with its own state",
        _resume_good,
        fix_in=DM,
    ),
]
