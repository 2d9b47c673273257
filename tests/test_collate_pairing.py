"""Every pairing of a plan's layout with a collate, over every source kind and entry point.

layout (padded, packed, max_shapes) x collate (default, PaddingCollate, PackingCollate, a
user's function) x source (a list of dicts, a Hugging Face ``datasets.Dataset``, parquet and
JSON-lines shards streamed) x entry (the DataModule of the source, the bare loader). Accepted
pairings keep every micro-batch within ``max_tokens`` (padded slots counted, the reference
computed here from the items' lengths) and see every example exactly once; refused ones raise
``SettingValueError`` naming the plan's setting and the collate's class, at construction.

The tokens are in a field named like Hugging Face's, ``input_ids``, and the lengths name it
(``"input_ids"``) for Arrow and shards: the default collates read it without renaming.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from lightning_varbatch import (
    PackingCollate,
    PaddingCollate,
    StreamingBatches,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    shards_from_files,
    token_budget_dataloader,
)
from lightning_varbatch.errors import SettingValueError

torch.set_num_threads(1)

MAX_TOKENS = 48
LENGTHS = np.random.default_rng(7).integers(2, 21, size=40)
LAYOUTS = {"padded": {}, "packed": {"layout": "packed"}, "max_shapes": {"max_shapes": 3}}
COLLATES = ("default", "padding", "packing", "callable")
SOURCES = ("list", "arrow", "parquet", "jsonl")
ENTRIES = ("datamodule", "loader")
SETTING_TEXT = {
    "padded": "layout='padded'",
    "packed": "layout='packed'",
    "max_shapes": "max_shapes=3",
}


def rows() -> list[dict[str, Any]]:
    return [{"id": i, "input_ids": list(range(1, n + 1))} for i, n in enumerate(LENGTHS.tolist())]


def user_collate(items: Any) -> dict[str, Any]:
    """A user's function: returns the ids and lengths (its padding is its own business)."""
    return {
        "ids": [int(x["id"]) for x in items],
        "lengths": [len(x["input_ids"]) for x in items],
    }


def make_collate(kind: str) -> Callable[[Any], Any] | None:
    return {
        "default": None,
        "padding": PaddingCollate(tokens_key="input_ids"),
        "packing": PackingCollate(tokens_key="input_ids"),
        "callable": user_collate,
    }[kind]


def expected_refusal(layout: str, collate: str, source: str) -> str | None:
    """The setting the pairing is refused for, or None when accepted."""
    if layout == "max_shapes" and source in ("parquet", "jsonl"):
        return "max_shapes"  # a stream cannot choose shapes from data it has not read
    if collate == "padding" and layout == "packed":
        return "collate"
    if collate == "packing" and layout != "packed":
        return "collate"
    return None


@pytest.fixture(scope="module")
def shard_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    data = rows()
    out = {}
    for kind in ("parquet", "jsonl"):
        folder = tmp_path_factory.mktemp(kind)
        for s, part in enumerate((data[:15], data[15:])):
            if kind == "parquet":
                pq.write_table(pa.Table.from_pylist(part), folder / f"part-{s}.parquet")
            else:
                text = "".join(json.dumps(r) + "\n" for r in part)
                (folder / f"part-{s}.jsonl").write_text(text)
        out[kind] = folder
    return out


def build(layout: str, collate: str, source: str, entry: str, shard_dirs: dict[str, Path]) -> Any:
    """The training loader of the pairing (its construction may refuse it)."""
    settings: dict[str, Any] = {**LAYOUTS[layout], "seed": 3}
    packed = layout == "packed"
    if source in ("parquet", "jsonl"):
        shards = shards_from_files(shard_dirs[source], "input_ids", cache_dir=None)
        offset = {"loss_offset": 1} if packed else {}  # a packed row has length - 1 labels
        if entry == "datamodule":
            dm = StreamingDataModule(
                shards, MAX_TOKENS, window=16, collate=make_collate(collate), **offset, **settings
            )
            return dm.train_dataloader()
        return StreamingBatches(
            shards, MAX_TOKENS, window=16, collate=make_collate(collate), rank=0, world_size=1,
            **offset, **settings,
        )  # fmt: skip
    data: Any = rows() if source == "list" else datasets.Dataset.from_list(rows())
    lengths: Any = LENGTHS if source == "list" else "input_ids"
    # the library's packing collate counts length - 1 labels: plan them (the default
    # PackingCollate of the DataModule does it by itself)
    loss = LENGTHS - 1 if packed and collate == "packing" else None
    if entry == "datamodule":
        dm = TokenBudgetDataModule(
            data, lengths, MAX_TOKENS, collate=make_collate(collate), train_loss_lengths=loss,
            **settings,
        )  # fmt: skip
        return dm.train_dataloader()
    sampler = TokenBudgetBatchSampler(
        LENGTHS, MAX_TOKENS, rank=0, world_size=1,
        loss_lengths=LENGTHS - 1 if packed and collate in ("packing", "default") else None,
        **settings,
    )  # fmt: skip
    return token_budget_dataloader(data, sampler, collate_fn=make_collate(collate))


def slots(batch: dict[str, Any], layout: str) -> tuple[list[int], int]:
    """The batch's example ids and the token slots it occupies (padding counted)."""
    if "ids" in batch:  # the user's function: slots as the plan lays the examples out
        lengths = batch["lengths"]
        used = sum(lengths) if layout == "packed" else len(lengths) * max(lengths)
        return batch["ids"], used
    ids = batch["id"].tolist()
    used = int(batch["padded_tokens"])
    field = "input_ids"
    assert batch[field].numel() == used  # the reference: the tensors' own size
    return ids, used


@pytest.mark.slow
@pytest.mark.parametrize("entry", ENTRIES)
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("collate", COLLATES)
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_pairing(
    layout: str, collate: str, source: str, entry: str, shard_dirs: dict[str, Path]
) -> None:
    refused = expected_refusal(layout, collate, source)
    if refused == "max_shapes":  # the windowed planner's refusal, whatever the collate
        with pytest.raises(ValueError, match="max_shapes"):
            build(layout, collate, source, entry, shard_dirs)
        return
    if refused is not None:
        with pytest.raises(SettingValueError) as error:
            build(layout, collate, source, entry, shard_dirs)
        assert type(error.value) is SettingValueError
        if refused == "collate":
            assert error.value.setting in ("collate", "collate_fn")
            assert SETTING_TEXT[layout] in str(error.value)  # the plan's setting ...
            assert type(make_collate(collate)).__name__ in str(error.value)  # ... the collate's
        else:
            assert error.value.setting == refused
        return
    seen: list[int] = []
    for batch in build(layout, collate, source, entry, shard_dirs):
        ids, used = slots(batch, layout)
        assert used <= MAX_TOKENS, (ids, used)
        seen.extend(ids)
    assert sorted(seen) == list(range(len(LENGTHS)))  # every example exactly once


def test_a_padded_collate_on_a_packed_plan_would_exceed_the_budget() -> None:
    """Why the pairing is refused: padding a packed plan's micro-batches overflows it."""
    sampler = TokenBudgetBatchSampler(LENGTHS, MAX_TOKENS, rank=0, world_size=1, layout="packed")
    padded = [len(mb) * int(LENGTHS[list(mb)].max()) for mb in sampler]
    assert max(padded) > MAX_TOKENS  # what PaddingCollate would have built, silently
    with pytest.raises(SettingValueError, match=r"PaddingCollate.*layout='packed'") as error:
        token_budget_dataloader(rows(), sampler, collate_fn=PaddingCollate())
    assert error.value.setting == "collate_fn"


def test_packed_datamodule_with_its_default_collate_trains_exactly() -> None:
    """TokenBudgetDataModule(layout="packed") needs nothing else: PackingCollate, length-1."""
    dm = TokenBudgetDataModule(rows(), LENGTHS, MAX_TOKENS, layout="packed")
    batches = list(dm.train_dataloader())
    assert all(int(b["padded_tokens"]) <= MAX_TOKENS for b in batches)
    assert sum(int(b["ntokens"]) for b in batches) == int((LENGTHS - 1).sum())
    assert sum(int(b["step_ntokens"]) for b in batches) == int((LENGTHS - 1).sum())


def test_max_shapes_batches_have_the_plans_shapes() -> None:
    sampler = TokenBudgetBatchSampler(LENGTHS, MAX_TOKENS, rank=0, world_size=1, max_shapes=3)
    shapes = {tuple(b["input_ids"].shape) for b in token_budget_dataloader(rows(), sampler)}
    assert len(shapes) <= 3 and all(r * w <= MAX_TOKENS for r, w in shapes)


def test_a_collate_padding_wider_than_the_plan_is_refused() -> None:
    sampler = TokenBudgetBatchSampler(LENGTHS, MAX_TOKENS, rank=0, world_size=1)
    with pytest.raises(SettingValueError, match="pad_to_multiple_of=8") as error:
        token_budget_dataloader(rows(), sampler, collate_fn=PaddingCollate(pad_to_multiple_of=8))
    assert error.value.setting == "collate_fn"
