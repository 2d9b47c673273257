"""A plan and its collate, column names, and the two DataModules' shared contract.

Example:
    >>> len(CASES) >= 15
    True
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import (
    DataSource,
    PackingCollate,
    PaddingCollate,
    StreamingBatches,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    shards_from_files,
    token_budget_dataloader,
)
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error

PAIRING = "lightning_varbatch/data/pairing.py"
DM = "lightning_varbatch/data/datamodule.py"
STREAM_DM = "lightning_varbatch/data/streaming_datamodule.py"
LENGTHS = np.array([3, 5, 2, 7, 4, 6, 9, 8])
ITEMS = [{"tokens": [1] * int(n)} for n in LENGTHS]


def _sampler(**settings: Any) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(LENGTHS, 16, rank=0, world_size=1, **settings)


def _shards(tmp: Path) -> Any:
    lines = "".join(json.dumps({"tokens": [1] * int(n)}) + "\n" for n in LENGTHS)
    (tmp / "a.jsonl").write_text(lines)
    return shards_from_files(tmp / "a.jsonl", "tokens", cache_dir=None)


def _loader(collate: Any, **settings: Any) -> Any:
    return token_budget_dataloader(ITEMS, _sampler(**settings), collate_fn=collate)


def _stream_state(tmp: Path, version: Any) -> None:
    dm = StreamingDataModule(_shards(tmp), 16)
    dm.train_dataloader()
    dm.load_state_dict({**dm.state_dict(), "version": version})


def _map_state(tmp: Path, version: Any) -> None:
    dm = TokenBudgetDataModule(ITEMS, LENGTHS, 16)
    dm.train_dataloader()
    dm.load_state_dict({**dm.state_dict(), "version": version})


def _stream_resume_other_shards(tmp: Path) -> None:
    dm = StreamingDataModule(_shards(tmp), 16)
    dm.train_dataloader()
    state = dm.state_dict()
    (tmp / "b").mkdir()
    lines = "".join(json.dumps({"tokens": [1] * int(n)}) + "\n" for n in LENGTHS[:5])
    (tmp / "b" / "a.jsonl").write_text(lines)
    StreamingDataModule(shards_from_files(tmp / "b", "tokens", cache_dir=None), 16).check_state(
        state
    )


#: The map-style DataModule's settings a stream refuses, each at its default value.
DEFAULTS: dict[str, Any] = {
    "train_lengths": None,
    "train_loss_lengths": None,
    "mixing": "per_step",
    "weights": "size",
    "temperature": 1.0,
    "steps_per_epoch": None,
}


def _defaults_everywhere(tmp: Path) -> None:
    stream = StreamingDataModule(_shards(tmp), 16, **DEFAULTS)
    assert sum(int(b["nexamples"]) for b in stream.train_dataloader()) == len(LENGTHS)
    mapped = {**DEFAULTS, "train_lengths": LENGTHS}
    dm = TokenBudgetDataModule(ITEMS, **mapped, max_tokens=16)
    assert sum(int(b["nexamples"]) for b in dm.train_dataloader()) == len(LENGTHS)


def _stream_fixed_shares(tmp: Path) -> None:
    dm = StreamingDataModule(_shards(tmp), 32, rank_shares=[1.0, 0.5])
    plan = dm.check(world_size=2)["train"]  # the first window's plan (here every example)
    assert plan.rank_budget is not None and plan.rank_budget.tolist() == [32, 16]
    assert sorted(plan.order.tolist()) == list(range(len(LENGTHS))) and not plan.num_duplicated


CASES: list[Case] = [
    error(
        "pairing-packed-plan-padding-collate",
        "loader",
        "token_budget_dataloader(sampler(layout='packed'), collate_fn=PaddingCollate())",
        lambda tmp: _loader(PaddingCollate(), layout="packed"),
        "layout='packed'",
        "PaddingCollate",
        "PackingCollate",
        raises=SettingValueError,
        setting="collate_fn",
        fix_in=PAIRING,
    ),
    error(
        "pairing-padded-plan-packing-collate",
        "loader",
        "token_budget_dataloader(sampler(), collate_fn=PackingCollate())",
        lambda tmp: _loader(PackingCollate()),
        "layout='padded'",
        "PackingCollate",
        raises=SettingValueError,
        setting="collate_fn",
        fix_in=PAIRING,
    ),
    error(
        "pairing-max-shapes-packing-collate",
        "loader",
        "token_budget_dataloader(sampler(max_shapes=2), collate_fn=PackingCollate())",
        lambda tmp: _loader(PackingCollate(), max_shapes=2),
        "max_shapes=2",
        "PackingCollate",
        raises=SettingValueError,
        setting="collate_fn",
        fix_in=PAIRING,
    ),
    error(
        "pairing-collate-pads-wider",
        "loader",
        "PaddingCollate(pad_to_multiple_of=8) on a plan with pad_to_multiple_of=1",
        lambda tmp: _loader(PaddingCollate(pad_to_multiple_of=8)),
        "pad_to_multiple_of=8",
        "pad_to_multiple_of=1",
        raises=SettingValueError,
        setting="collate_fn",
        fix_in=PAIRING,
    ),
    error(
        "pairing-dm-packed-padding-collate",
        "DataModule",
        "TokenBudgetDataModule(layout='packed', collate=PaddingCollate())",
        lambda tmp: TokenBudgetDataModule(
            ITEMS, LENGTHS, 16, layout="packed", collate=PaddingCollate()
        ),
        "layout='packed'",
        "PaddingCollate",
        raises=SettingValueError,
        setting="collate",
        fix_in=PAIRING,
    ),
    error(
        "pairing-stream-packed-padding-collate",
        "streaming",
        "StreamingBatches(layout='packed', collate=PaddingCollate())",
        lambda tmp: StreamingBatches(
            _shards(tmp),
            16,
            layout="packed",
            loss_offset=1,
            collate=PaddingCollate(),
            rank=0,
            world_size=1,
        ),
        "layout='packed'",
        "PaddingCollate",
        raises=SettingValueError,
        setting="collate",
        fix_in=PAIRING,
    ),
    error(
        "pairing-stream-packed-loss-offset",
        "streaming",
        "StreamingDataModule(layout='packed') with loss_offset=0 (PackingCollate counts n-1)",
        lambda tmp: StreamingDataModule(_shards(tmp), 16, layout="packed"),
        "loss_offset=1",
        "PackingCollate",
        raises=SettingValueError,
        setting="loss_offset",
        fix_in=PAIRING,
    ),
    error(
        "pairing-dm-collate-not-callable",
        "DataModule",
        "TokenBudgetDataModule(collate='pad')",
        lambda tmp: TokenBudgetDataModule(ITEMS, LENGTHS, 16, collate="pad"),
        "collate must be callable",
        "'pad'",
        raises=SettingTypeError,
        setting="collate",
        fix_in=DM,
    ),
    error(
        "pairing-tokens_key-int",
        "collate",
        "PaddingCollate(tokens_key=3)",
        lambda tmp: PaddingCollate(tokens_key=3),  # type: ignore[arg-type]
        "tokens_key",
        "3",
        raises=SettingTypeError,
        setting="tokens_key",
        fix_in="lightning_varbatch/data/collate.py",
    ),
    error(
        "pairing-packing-two-token-keys",
        "collate",
        "PackingCollate(field='ids', tokens_key='input_ids')",
        lambda tmp: PackingCollate(field="ids", tokens_key="input_ids"),
        "field='ids'",
        "tokens_key='input_ids'",
        raises=SettingValueError,
        setting="tokens_key",
        fix_in="lightning_varbatch/data/packed_collate.py",
    ),
    error(
        "pairing-pad_to_multiple_of-str",
        "collate",
        "PackingCollate(pad_to_multiple_of='4') (as PlanConfig)",
        lambda tmp: PackingCollate(pad_to_multiple_of="4"),  # type: ignore[arg-type]
        "pad_to_multiple_of must be a positive integer",
        "'4'",
        raises=SettingTypeError,
        setting="pad_to_multiple_of",
        fix_in="lightning_varbatch/data/packed_collate.py",
    ),
    error(
        "contract-stream-train_lengths",
        "DataModule",
        "StreamingDataModule(source, 16, train_lengths=[...])",
        lambda tmp: StreamingDataModule(_shards(tmp), 16, train_lengths=LENGTHS),
        "train_lengths",
        "shards_from_files",
        raises=SettingValueError,
        setting="train_lengths",
        fix_in=STREAM_DM,
    ),
    error(
        "contract-stream-steps_per_epoch",
        "DataModule",
        "StreamingDataModule(source, 16, steps_per_epoch=10)",
        lambda tmp: StreamingDataModule(_shards(tmp), 16, steps_per_epoch=10),
        "steps_per_epoch",
        "max_steps",
        raises=SettingValueError,
        setting="steps_per_epoch",
        fix_in=STREAM_DM,
    ),
    accepted(
        "contract-stream-map-style-settings-at-defaults",
        "DataModule",
        "a shared config: StreamingDataModule(source, 16, train_lengths=None, "
        "train_loss_lengths=None, mixing='per_step', weights='size', temperature=1.0, "
        "steps_per_epoch=None), and the same to TokenBudgetDataModule",
        _defaults_everywhere,
        fix_in="lightning_varbatch/data/datamodule_settings.py",
    ),
    error(
        "contract-stream-set_rank_shares",
        "DataModule",
        "StreamingDataModule(source, 16, rank_shares=[1.0, 0.5]).set_rank_shares([1.0, 1.0])",
        lambda tmp: StreamingDataModule(_shards(tmp), 16, rank_shares=[1.0, 0.5]).set_rank_shares(
            [1.0, 1.0]
        ),
        "cannot change rank shares during a run",
        "window by window",
        "rank_shares=[...]",
        "TokenBudgetDataModule",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=STREAM_DM,
    ),
    accepted(
        "contract-stream-fixed-rank-shares",
        "DataModule",
        "StreamingDataModule(source, 32, rank_shares=[1.0, 0.5]) on 2 ranks",
        _stream_fixed_shares,
        note="accepted: budgets 32 and 16, every example once",
        fix_in=STREAM_DM,
    ),
    error(
        "contract-stream-data-sources",
        "DataModule",
        "StreamingDataModule([DataSource(...)], 16)",
        lambda tmp: StreamingDataModule([DataSource(LENGTHS, dataset=ITEMS)], 16),  # type: ignore[arg-type]
        "train_source",
        "TokenBudgetDataModule",
        raises=SettingTypeError,
        setting="train_source",
        fix_in=STREAM_DM,
    ),
    error(
        "contract-stream-len",
        "DataModule",
        "len(StreamingDataModule(...).train_dataloader())",
        lambda tmp: len(StreamingDataModule(_shards(tmp), 16).train_dataloader()),
        "no len()",
        "max_steps",
        raises=TypeError,
        fix_in="lightning_varbatch/data/streaming_loader.py",
    ),
    error(
        "contract-stream-state-version",
        "resume/state",
        "StreamingDataModule.load_state_dict({... 'version': 9})",
        lambda tmp: _stream_state(tmp, 9),
        "version 9",
        "version 1",
        raises=ResumeMismatchError,
        fix_in="lightning_varbatch/data/splits.py",
    ),
    error(
        "contract-map-state-version",
        "resume/state",
        "TokenBudgetDataModule.load_state_dict({... 'version': 2})",
        lambda tmp: _map_state(tmp, 2),
        "version 2",
        "version 1",
        raises=ResumeMismatchError,
        fix_in="lightning_varbatch/data/splits.py",
    ),
    error(
        "contract-stream-check-state-other-shards",
        "resume/state",
        "StreamingDataModule.check_state(state saved on other shards)",
        _stream_resume_other_shards,
        "shards",
        "restart_epoch",
        raises=ResumeMismatchError,
        fix_in=STREAM_DM,
    ),
    error(
        "contract-eval-fewer-examples-than-ranks",
        "DataModule",
        "StreamingDataModule(val_dataset of 2 items).check(world_size=4)",
        lambda tmp: StreamingDataModule(
            _shards(tmp), 16, val_dataset=ITEMS[:2], val_lengths=LENGTHS[:2]
        ).check(world_size=4),
        "val_dataset has 2 examples for 4 ranks",
        raises=SettingValueError,
        setting="val_dataset",
        fix_in="lightning_varbatch/data/splits.py",
    ),
]
