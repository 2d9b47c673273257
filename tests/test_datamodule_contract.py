"""One contract for TokenBudgetDataModule and StreamingDataModule (docs/datamodules.md).

The docs' tables are parsed and checked against both classes; a user swaps one DataModule for
the other by changing one line and trains and evaluates the same examples; both offer the
same splits, loss lengths, check(), versioned state, resume policy and public budget; column
names give the default collate its fields.
"""

from __future__ import annotations

import inspect
import re
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from lightning.pytorch import LightningModule

from lightning_varbatch import (
    BatchSizeLRScaler,
    DataSource,
    PaddingCollate,
    StreamingDataModule,
    TokenBudgetDataModule,
    shards_from_files,
)
from lightning_varbatch.callbacks.lr_scaling import training_budget
from lightning_varbatch.data.streaming_datamodule import REFUSED
from lightning_varbatch.errors import (
    ResumeMismatchError,
    SettingError,
    SettingTypeError,
    SettingValueError,
)
from tests.scripts.datamodule_common import quiet_trainer

torch.set_num_threads(1)

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "datamodules.md"
CLASSES = {
    "TokenBudgetDataModule": TokenBudgetDataModule,
    "StreamingDataModule": StreamingDataModule,
}
ERRORS = {"SettingValueError": SettingValueError, "SettingTypeError": SettingTypeError}
N = 30
LENGTHS = [2 + (7 * i) % 11 for i in range(N)]
MAX_TOKENS = 40


def rows(offset: int = 0, n: int = N) -> list[dict[str, Any]]:
    return [{"id": offset + i, "input_ids": list(range(1, LENGTHS[i % N] + 1))} for i in range(n)]


def shards(tmp_path: Path, data: list[dict[str, Any]] | None = None, name: str = "s") -> Any:
    data = rows() if data is None else data
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    pq.write_table(pa.Table.from_pylist(data[:12]), folder / "a.parquet")
    pq.write_table(pa.Table.from_pylist(data[12:]), folder / "b.parquet")
    return shards_from_files(folder, "input_ids", cache_dir=None)


def table(title: str) -> list[list[str]]:
    """The rows of the Markdown table under the heading ``title``, cells stripped."""
    text = DOC.read_text().split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in text.splitlines() if line.startswith("| ")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]


def params(cls: type) -> set[str]:
    return set(inspect.signature(cls.__init__).parameters) - {"self"}


# -- the docs' tables are true ------------------------------------------------------------


def test_the_arguments_table_matches_both_signatures(tmp_path: Path) -> None:
    header = DOC.read_text().split("## Arguments\n", 1)[1].splitlines()
    assert any(
        line.startswith("| argument | TokenBudgetDataModule | StreamingDataModule")
        for line in header
    )
    rows_ = table("Arguments")
    listed = {re.sub(r"`", "", r[0]) for r in rows_}
    # every named argument of either class is in the table (planner settings are **kwargs)
    named = (params(TokenBudgetDataModule) | params(StreamingDataModule)) - {
        "sampler_kwargs",
        "plan_settings",
        "train_source",
    }
    assert named <= listed, named - listed
    src = shards(tmp_path)
    for cells in rows_:
        name, map_style, stream = re.sub(r"`", "", cells[0]), cells[1], cells[2]
        if map_style.startswith("—"):
            assert name not in params(TokenBudgetDataModule)
        else:
            assert name in params(TokenBudgetDataModule), name
        refused = re.match(r"refused \(`(\w+)`\)", stream)
        if stream.startswith("same"):
            assert name in params(StreamingDataModule), name
        elif refused:
            kind = ERRORS[refused.group(1)]
            with pytest.raises(kind) as error:
                StreamingDataModule(src, MAX_TOKENS, **{name: object()})
            assert type(error.value) is kind and error.value.setting == name
            assert REFUSED[name] in str(error.value)  # the reason and the alternative
        elif stream.startswith("as `"):
            other = re.match(r"as `(\w+)`", stream).group(1)  # type: ignore[union-attr]
            assert other in params(StreamingDataModule)
            first = list(inspect.signature(StreamingDataModule.__init__).parameters)[1]
            assert first == other  # the first positional argument of each
        else:
            assert name in params(StreamingDataModule), name


def test_the_members_table_matches_both_classes(tmp_path: Path) -> None:
    map_dm = TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS)
    stream_dm = StreamingDataModule(shards(tmp_path), MAX_TOKENS)
    for cells in table("Methods and attributes"):
        name, map_style, stream = re.sub(r"`", "", cells[0]), cells[1], cells[2]
        for dm, cell in ((map_dm, map_style), (stream_dm, stream)):
            assert hasattr(dm, name) == (not cell.startswith("—")), (type(dm).__name__, name)


def test_a_list_of_data_sources_is_refused_with_the_alternative(tmp_path: Path) -> None:
    mixture = [DataSource(LENGTHS, dataset=rows())]
    with pytest.raises(SettingTypeError, match="TokenBudgetDataModule") as error:
        StreamingDataModule(mixture, MAX_TOKENS)  # type: ignore[arg-type]
    assert error.value.setting == "train_source"
    dm = StreamingDataModule(shards(tmp_path), MAX_TOKENS)
    with pytest.raises(TypeError, match="no len"):
        len(dm.train_dataloader())


# -- the one-line swap ---------------------------------------------------------------------


class Recorder(LightningModule):
    """Records the example ids of every split."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.seen: dict[str, list[int]] = {"train": [], "val": [], "test": []}

    def _step(self, stage: str, batch: dict[str, Any]) -> torch.Tensor:
        self.seen[stage].extend(batch["id"].tolist())
        return (self.weight * batch["input_ids"].float().sum()).sum() / batch["step_ntokens"]

    def training_step(self, batch: dict[str, Any], _: int) -> torch.Tensor:
        return self._step("train", batch)

    def validation_step(self, batch: dict[str, Any], _: int) -> None:
        self._step("val", batch)

    def test_step(self, batch: dict[str, Any], _: int) -> None:
        self._step("test", batch)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.0)


def test_swapping_one_line_trains_and_evaluates_the_same_examples(tmp_path: Path) -> None:
    train = datasets.Dataset.from_list(rows())
    val, test = rows(100, 9), rows(200, 7)
    common: dict[str, Any] = dict(
        max_tokens=MAX_TOKENS,
        val_dataset=datasets.Dataset.from_list(val),
        val_lengths="input_ids",
        test_dataset=test,
        test_lengths=[len(r["input_ids"]) for r in test],
        val_max_tokens=2 * MAX_TOKENS,
        seed=5,
        pad_to_multiple_of=2,
    )
    seen = []
    for dm in (
        TokenBudgetDataModule(train, "input_ids", **common),
        StreamingDataModule(shards(tmp_path), **common),  # the one changed line
    ):
        model = Recorder()
        trainer = quiet_trainer(max_epochs=1, num_sanity_val_steps=0)
        trainer.fit(model, dm)
        trainer.test(model, dm, verbose=False)
        seen.append({k: sorted(v) for k, v in model.seen.items()})
        assert dm.max_tokens == MAX_TOKENS and dm.val_max_tokens == 2 * MAX_TOKENS
    assert seen[0] == seen[1]
    assert seen[0] == {
        "train": list(range(N)),
        "val": list(range(100, 109)),
        "test": list(range(200, 207)),
    }


# -- the same contract, member by member ---------------------------------------------------


def both(tmp_path: Path, **kwargs: Any) -> list[Any]:
    return [
        TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS, **kwargs),
        StreamingDataModule(shards(tmp_path), MAX_TOKENS, **kwargs),
    ]


def test_check_plans_every_split_before_a_trainer(tmp_path: Path) -> None:
    val = rows(100, 5)
    for dm in both(tmp_path, val_dataset=val, val_lengths=LENGTHS[:5], test_dataset=val,
                   test_lengths=LENGTHS[:5]):  # fmt: skip
        plans = dm.check(world_size=2, accumulate_grad_batches=2)
        assert sorted(plans) == ["test", "train", "val"]
        assert plans["train"].world_size == 2 and plans["val"].world_size == 2
        assert plans["val"].num_duplicated == 0 and plans["val"].num_dropped == 0
        with pytest.raises(SettingValueError) as error:  # 5 examples cannot feed 8 ranks
            dm.check(world_size=8)
        assert (error.value.setting, error.value.stage) == ("val_dataset", "val")


def test_loss_lengths_per_split_count_every_evaluation_batch(tmp_path: Path) -> None:
    val = rows(100, 6)
    loss = np.array(LENGTHS[:6]) - 1
    for dm in both(tmp_path, val_dataset=val, val_lengths=LENGTHS[:6], val_loss_lengths=loss,
                   test_dataset=val, test_lengths=LENGTHS[:6], test_loss_lengths=loss,
                   collate=PaddingCollate(loss_offset=1)):  # fmt: skip
        for loader in (dm.val_dataloader(), dm.test_dataloader()):
            batches = list(loader)
            assert sum(int(b["ntokens"]) for b in batches) == int(loss.sum())
            assert sum(int(b["step_ntokens"]) for b in batches) == int(loss.sum())


def test_planning_errors_carry_the_split(tmp_path: Path) -> None:
    for build in (
        lambda: TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS, tail="wrap"),
        lambda: StreamingDataModule(shards(tmp_path), MAX_TOKENS, tail="wrap"),
    ):
        with pytest.raises(SettingValueError) as error:
            build()
        assert (error.value.setting, error.value.stage) == ("tail", "train")


def test_states_are_versioned_and_old_states_load(tmp_path: Path) -> None:
    for dm in both(tmp_path):
        dm.train_dataloader()
        state = dm.state_dict()
        assert state["version"] == 1
        again = (
            type(dm)(dm.train_source, MAX_TOKENS)
            if hasattr(dm, "train_source")
            else (TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS))
        )
        old = {k: v for k, v in state.items() if k != "version"}  # saved before versions
        again.load_state_dict(old)
        again.train_dataloader()
        assert again.state_dict() == state
        with pytest.raises(ResumeMismatchError, match="version 7") as error:
            again.load_state_dict({**state, "version": 7})
        assert error.value.changed == ["version"]


def test_a_stream_resumed_on_other_shards(tmp_path: Path) -> None:
    dm = StreamingDataModule(shards(tmp_path), MAX_TOKENS, window=8)
    loader = iter(dm.train_dataloader())
    next(loader)
    state = dm.state_dict()
    other = shards(tmp_path, rows()[:25], name="fewer")  # the shards changed
    strict = StreamingDataModule(other, MAX_TOKENS, window=8)
    with pytest.raises(ResumeMismatchError) as error:
        strict.check_state(state)
    assert "shards" in error.value.changed
    strict.load_state_dict(state)
    with pytest.raises(ResumeMismatchError):
        strict.train_dataloader()
    # restart_epoch: the saved epoch again from its first window, on the current shards
    lenient = StreamingDataModule(other, MAX_TOKENS, window=8, on_resume_mismatch="restart_epoch")
    lenient.load_state_dict(state)
    ids = sorted(i for b in lenient.train_dataloader() for i in b["id"].tolist())
    assert ids == list(range(25))
    StreamingDataModule(shards(tmp_path), MAX_TOKENS, window=8).check_state(state)  # same data


def test_batch_size_lr_scaler_finds_either_budget(tmp_path: Path) -> None:
    for dm in both(tmp_path):
        trainer = type("T", (), {"train_dataloader": dm.train_dataloader(), "datamodule": dm})()
        assert training_budget(trainer) == MAX_TOKENS
        trainer.train_dataloader = None
        assert training_budget(trainer) == MAX_TOKENS  # from the DataModule
    model = Recorder()
    scaler = BatchSizeLRScaler(tokens_fn=lambda b: int(b["ntokens"]))
    dm = StreamingDataModule(shards(tmp_path), MAX_TOKENS)
    quiet_trainer(max_epochs=1, callbacks=[scaler]).fit(model, dm)
    assert scaler.reference == MAX_TOKENS  # one rank, no accumulation


# -- column names ---------------------------------------------------------------------------


def pairs(n: int = 20) -> list[dict[str, Any]]:
    return [{"id": i, "src_ids": [5] * (2 + i % 5), "tgt_ids": [6] * (1 + i % 4)} for i in range(n)]


def test_pair_columns_name_the_default_collates_fields(tmp_path: Path) -> None:
    data = pairs()
    folder = tmp_path / "pairs"
    folder.mkdir()
    pq.write_table(pa.Table.from_pylist(data), folder / "p.parquet")
    for dm in (
        TokenBudgetDataModule(datasets.Dataset.from_list(data), ("src_ids", "tgt_ids"), 24),
        StreamingDataModule(shards_from_files(folder, ("src_ids", "tgt_ids"), cache_dir=None), 24),
    ):
        batches = list(dm.train_dataloader())
        assert sorted(i for b in batches for i in b["id"].tolist()) == list(range(20))
        assert sum(int(b["ntokens"]) for b in batches) == sum(len(x["tgt_ids"]) for x in data)
        for b in batches:  # the plan's cost of pairs: rows x the longer side's width
            width = max(b["src_ids"].shape[1], b["tgt_ids"].shape[1])
            assert b["src_ids"].shape[0] * width <= 24


def test_input_ids_items_need_no_renaming() -> None:
    data = [{"input_ids": [1] * n} for n in LENGTHS]  # a list of dicts as a tokenizer returns
    batches = list(TokenBudgetDataModule(data, LENGTHS, MAX_TOKENS).train_dataloader())
    assert sum(int(b["ntokens"]) for b in batches) == sum(LENGTHS)
    with pytest.raises(ValueError, match="tokens_key"):  # another name is not guessed
        PaddingCollate()([{"ids": [1]}])
    assert PaddingCollate(tokens_key="ids")([{"ids": [1, 2]}])["ids"].tolist() == [[1, 2]]


def test_a_length_column_names_no_field() -> None:
    data = [{"n": n, "tokens": [1] * n} for n in LENGTHS]
    dm = TokenBudgetDataModule(datasets.Dataset.from_list(data), "n", MAX_TOKENS)
    batches = list(dm.train_dataloader())
    assert sum(int(b["ntokens"]) for b in batches) == sum(LENGTHS)


def test_collate_settings_share_the_planners_checks() -> None:
    from lightning_varbatch import PackingCollate, PlanConfig

    errors: list[SettingError] = []
    for build in (
        lambda: PlanConfig(max_tokens=8, pad_to_multiple_of="4"),
        lambda: PaddingCollate(pad_to_multiple_of="4"),
        lambda: PackingCollate(pad_to_multiple_of="4"),
    ):
        with pytest.raises(SettingTypeError) as error:
            build()
        errors.append(error.value)
    assert len({str(e) for e in errors}) == 1
    assert {(e.setting, e.value) for e in errors} == {("pad_to_multiple_of", "4")}


class _OwnData(TokenBudgetDataModule):
    """A user's subclass: Lightning saves its state under "_OwnData", not the base's name."""


@pytest.mark.parametrize("resumed_with", ["TokenBudgetDataModule", "StreamingDataModule"])
def test_a_checkpoint_of_another_datamodule_class_is_refused_mid_epoch(
    tmp_path: Path, resumed_with: str
) -> None:
    # Lightning hands a DataModule only the state saved under its own class name: resuming a
    # subclass's mid-epoch checkpoint with another class used to restart the epoch silently.
    trainer = quiet_trainer(max_steps=3, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(Recorder(), _OwnData(rows(), LENGTHS, MAX_TOKENS))
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    assert "_OwnData" in torch.load(ckpt, weights_only=False)
    dm = (
        TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS)
        if resumed_with == "TokenBudgetDataModule"
        else StreamingDataModule(shards(tmp_path), MAX_TOKENS)
    )
    model = Recorder()
    with pytest.raises(ResumeMismatchError, match=f"holds no {resumed_with} state") as caught:
        quiet_trainer(max_steps=6).fit(model, dm, ckpt_path=ckpt)
    assert caught.value.changed == ["datamodule"]
    assert model.seen["train"] == []  # refused before any micro-batch was trained again
    # the same class resumes; so does a fresh fit of the other class (no checkpoint)
    model = Recorder()
    quiet_trainer(max_steps=6).fit(model, _OwnData(rows(), LENGTHS, MAX_TOKENS), ckpt_path=ckpt)
    assert len(model.seen["train"]) > 0


def test_a_checkpoint_of_a_finished_epoch_resumes_with_any_class(tmp_path: Path) -> None:
    trainer = quiet_trainer(max_epochs=1, enable_checkpointing=True, default_root_dir=tmp_path)
    trainer.fit(Recorder(), _OwnData(rows(), LENGTHS, MAX_TOKENS))
    (ckpt,) = (tmp_path / "checkpoints").glob("*.ckpt")
    model = Recorder()
    quiet_trainer(max_epochs=2).fit(
        model, TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS), ckpt_path=ckpt
    )
    assert sorted(model.seen["train"]) == list(range(N))  # epoch 1, whole
