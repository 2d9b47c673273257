"""Hugging Face datasets and Arrow columns: column names as lengths, token counting, batches.

Example:
    >>> len(CASES) > 25
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa

from lightning_varbatch import (
    DataSource,
    PaddingCollate,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    token_budget_dataloader,
)
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.sources import column_lengths, tokenized_lengths
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import int_family

AREA = "HF datasets"
LENGTHS = "lightning_varbatch/sources/arrow_lengths.py"
TOKENIZED = "lightning_varbatch/sources/tokenized_lengths.py"
COLLATE = "lightning_varbatch/data/collate.py"

IDS = [[1, 2, 3], [4, 5], [6], [7, 8, 9, 10]]


def _ds(**columns: Any) -> datasets.Dataset:
    return datasets.Dataset.from_dict({"ids": IDS, **columns})


def _lengths(column: Any, ds: Any = None, name: str = "train_lengths") -> Any:
    return column_lengths(_ds() if ds is None else ds, column, name)


def _module(ds: Any, lengths: Any, **kwargs: Any) -> TokenBudgetDataModule:
    return TokenBudgetDataModule(ds, lengths, 16, **kwargs)


def _drain(ds: Any, lengths: Any, **kwargs: Any) -> list[Any]:
    sampler = TokenBudgetBatchSampler(lengths, 16, rank=0, world_size=1)
    return list(token_budget_dataloader(ds, sampler, **kwargs))


def _split(texts: list[str]) -> list[list[str]]:
    return [t.split() for t in texts]


def _accept_widths(tmp: Path) -> None:
    for kind in (pa.int8(), pa.uint64(), pa.int16()):
        table = pa.table({"n": pa.array([3, 2, 1, 4], type=kind)})
        assert column_lengths(datasets.Dataset(table), "n").tolist() == [3, 2, 1, 4]


def _accept_list_kinds(tmp: Path) -> None:
    for kind in (pa.large_list(pa.int32()), pa.list_(pa.uint16())):
        ds = datasets.Dataset(pa.table({"ids": pa.array(IDS, type=kind)}))
        assert column_lengths(ds, "ids").tolist() == [3, 2, 1, 4]


def _accept_shuffled(tmp: Path) -> None:
    ds = _ds().shuffle(seed=1)
    assert column_lengths(ds, "ids").tolist() == [len(r) for r in ds["ids"]]


def _accept_module(tmp: Path) -> None:
    module = _module(datasets.Dataset.from_dict({"tokens": IDS}), "tokens")
    total = sum(int(b["nexamples"]) for b in module.train_dataloader())
    assert total == len(IDS)


def _accept_saved(tmp: Path) -> None:
    datasets.Dataset.from_dict({"tokens": IDS}).save_to_disk(str(tmp / "d"))
    loaded = datasets.load_from_disk(str(tmp / "d"))
    batches = _drain(loaded, column_lengths(loaded, "tokens"))
    assert sum(int(b["ntokens"]) for b in batches) == 10


def _text_tokens(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"tokens": ["a b c", "d"]})
    _drain(ds, np.array([3, 1]))


def _null_row(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"tokens": [[1, 2], None]})
    _drain(ds, np.array([2, 1]))


def _null_inside(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"tokens": [[1, 2], [3], [4, None]]})
    _drain(ds, np.array([2, 1, 2]), check_first_items=False)


def _float_ids(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"tokens": [[1.5, 2.0], [3.0]]})
    _drain(ds, np.array([2, 1]), check_first_items=False)


def _understated(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"tokens": IDS})
    _drain(
        ds,
        np.array([1, 1, 1, 1]),
        collate_fn=PaddingCollate(check_ntokens=False),
        check_first_items=False,
    )


def _counts_mismatch(tmp: Path) -> None:
    ds = datasets.Dataset.from_dict({"tokens": IDS})
    _drain(ds, np.array([3, 2, 1, 3]), check_first_items=False)


def _tokenize_setting(name: str) -> Any:
    def call(value: Any) -> Any:
        ds = datasets.Dataset.from_dict({"t": ["a b", "c"]})
        return tokenized_lengths(ds, _split, "t", cache_dir=None, progress=False, **{name: value})

    return call


class _OnePerCall:
    def __call__(self, text: Any) -> list[int]:
        return [1, 2]


CASES: list[Case] = [
    *int_family(
        "hf-tokenize-batch_size",
        AREA,
        "batch_size",
        _tokenize_setting("batch_size"),
        what="tokenized_lengths(batch_size=",
        fix_in=TOKENIZED,
    ),
    *int_family(
        "hf-tokenize-num_proc",
        AREA,
        "num_proc",
        _tokenize_setting("num_proc"),
        required=False,
        good=1,
        what="tokenized_lengths(num_proc=",
        fix_in=TOKENIZED,
    ),
    error(
        "hf-column-unknown",
        AREA,
        "train_lengths='num_tokens' (no such column)",
        lambda tmp: _module(_ds(), "num_tokens"),
        "train_lengths",
        "num_tokens",
        "ids",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-column-text",
        AREA,
        "train_lengths names a text column",
        lambda tmp: _module(_ds(text=["a", "b", "c", "d"]), "text"),
        "train_lengths",
        "text",
        "tokenized_lengths",
        fix_in=LENGTHS,
        raises=SettingTypeError,
        setting="train_lengths",
    ),
    error(
        "hf-column-float",
        AREA,
        "a float64 length column",
        lambda tmp: _lengths("n", _ds(n=[1.0, 2.5, 3.0, 1.0])),
        "train_lengths",
        "'n'",
        "float",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-column-bool",
        AREA,
        "a bool column",
        lambda tmp: _lengths("b", _ds(b=[True, False, True, True])),
        "'b'",
        "bool",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-column-null",
        AREA,
        "a length column with a null",
        lambda tmp: _lengths("n", _ds(n=[3, None, 1, 4])),
        "'n'",
        "null",
        "row 1",
        fix_in=LENGTHS,
        raises=SettingValueError,
        setting="train_lengths",
    ),
    error(
        "hf-column-null-list",
        AREA,
        "a token-id column with a null row",
        lambda tmp: _lengths("x", _ds(x=[[1], None, [2], [3]])),
        "'x'",
        "row 1",
        "is null",
        fix_in=LENGTHS,
        raises=SettingValueError,
        setting="train_lengths",
    ),
    error(
        "hf-column-null-inside-list",
        AREA,
        "a token-id column with a null token id inside row 2",
        lambda tmp: _lengths("x", _ds(x=[[1], [2], [3, None], [4]])),
        "'x'",
        "row 2",
        "null token id",
        "ds.filter",
        fix_in=LENGTHS,
        raises=SettingTypeError,
        setting="train_lengths",
        not_blame=("row 0",),
    ),
    error(
        "hf-column-zeros",
        AREA,
        "a length column of zeros",
        lambda tmp: _lengths("n", _ds(n=[0, 0, 0, 0])),
        "train_lengths",
        "'n'",
        ">= 1",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-column-negative",
        AREA,
        "a negative length",
        lambda tmp: _lengths("n", _ds(n=[3, -2, 1, 4])),
        "'n'",
        "-2",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-column-empty-list",
        AREA,
        "a token-id column with an empty row",
        lambda tmp: _lengths("x", _ds(x=[[1], [], [2], [3]])),
        "'x'",
        "[1] = 0",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-column-list-of-str",
        AREA,
        "a column of lists of strings",
        lambda tmp: _lengths("w", _ds(w=[["a"], ["b"], ["c"], ["d"]])),
        "'w'",
        "string",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-column-list-of-float",
        AREA,
        "a column of lists of floats",
        lambda tmp: _lengths("w", _ds(w=[[1.0], [2.0], [3.0], [4.0]])),
        "'w'",
        "double",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-column-nested",
        AREA,
        "a column of lists of lists",
        lambda tmp: _lengths("w", _ds(w=[[[1]], [[2]], [[3]], [[4]]])),
        "'w'",
        "list",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-columns-three",
        AREA,
        "three column names",
        lambda tmp: _lengths(("ids", "ids2", "ids3")),
        "train_lengths",
        "3 columns",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-columns-twice",
        AREA,
        "the same column twice",
        lambda tmp: _lengths(("ids", "ids")),
        "train_lengths",
        "'ids' twice",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-columns-empty-name",
        AREA,
        "an empty column name",
        lambda tmp: _lengths(""),
        "train_lengths",
        "''",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-datasetdict",
        AREA,
        "a DatasetDict instead of a split",
        lambda tmp: _lengths("ids", datasets.DatasetDict({"train": _ds()})),
        "DatasetDict",
        "ds['train']",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-streaming",
        AREA,
        "a streaming IterableDataset with column lengths",
        lambda tmp: _lengths("ids", _ds().to_iterable_dataset()),
        "streaming",
        "streaming=True",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-not-arrow",
        AREA,
        "column names with a list of dicts",
        lambda tmp: _module([{"ids": x} for x in IDS], "ids"),
        "train_lengths",
        "list",
        "Arrow",
        fix_in=LENGTHS,
        raises=TypeError,
    ),
    error(
        "hf-source-no-dataset",
        AREA,
        "DataSource(lengths='ids') without a dataset",
        lambda tmp: TokenBudgetBatchSampler.from_sources([DataSource("ids")], 16),
        "sources[0]",
        "'ids'",
        "dataset",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-source-bad-column",
        AREA,
        "DataSource naming a missing column",
        lambda tmp: _module([DataSource("nope", dataset=_ds(), name="wmt")], None),
        "train_dataset[0]",
        "wmt",
        "'nope'",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-sampler-column-name",
        AREA,
        "TokenBudgetBatchSampler('ids', ...) (a name)",
        lambda tmp: TokenBudgetBatchSampler("ids", 16, rank=0, world_size=1),
        "lengths",
        "column_lengths",
        setting="lengths",
        raises=SettingTypeError,
        fix_in="lightning_varbatch/planner/lengths.py",
    ),
    error(
        "hf-loss-column-unknown",
        AREA,
        "train_loss_lengths='nope'",
        lambda tmp: _module(_ds(), "ids", train_loss_lengths="nope"),
        "train_loss_lengths",
        "'nope'",
        fix_in=LENGTHS,
        raises=SettingValueError,
    ),
    error(
        "hf-batch-text",
        AREA,
        "a text column where token ids are padded",
        _text_tokens,
        "tokens",
        "text",
        "tokenize",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "hf-batch-null",
        AREA,
        "a null row in a token-id column",
        _null_row,
        "tokens",
        "item 1",
        "is null",
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "hf-batch-null-inside",
        AREA,
        "a null token id inside row 2 of an Arrow token column (lengths given as an array)",
        _null_inside,
        "tokens",
        "dataset item 2",
        "null token id",
        raises=TypeError,
        fix_in="lightning_varbatch/data/ragged.py",
        not_blame=("item 0",),
    ),
    error(
        "hf-batch-float-ids",
        AREA,
        "float token ids in an Arrow column",
        _float_ids,
        "tokens",
        "double",
        "integer",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "hf-batch-understated",
        AREA,
        "lengths understating an Arrow token column",
        _understated,
        "tokens",
        "budgeted",
        "max_tokens",
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "hf-batch-count-mismatch",
        AREA,
        "lengths that miscount one row of an HF dataset",
        _counts_mismatch,
        "lengths",
        "tokens",
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "hf-tokenize-not-dataset",
        AREA,
        "tokenized_lengths on a list of strings",
        lambda tmp: tokenized_lengths(["a b"], _split, "text"),
        "datasets.Dataset",
        "list",
        fix_in=TOKENIZED,
        raises=TypeError,
    ),
    error(
        "hf-tokenize-unknown-column",
        AREA,
        "tokenized_lengths of a missing column",
        lambda tmp: tokenized_lengths(_ds(), _split, "text", cache_dir=None),
        "'text'",
        "ids",
        fix_in=TOKENIZED,
        raises=SettingValueError,
    ),
    error(
        "hf-tokenize-ids-column",
        AREA,
        "tokenized_lengths of a token-id column",
        lambda tmp: tokenized_lengths(_ds(), _split, "ids", cache_dir=None),
        "'ids'",
        "column_lengths",
        fix_in=TOKENIZED,
        raises=TypeError,
    ),
    error(
        "hf-tokenize-bad-tokenizer",
        AREA,
        "tokenizer=42",
        lambda tmp: tokenized_lengths(_ds(t=list("abcd")), 42, "t", cache_dir=None),
        "tokenizer",
        "int",
        fix_in=TOKENIZED,
        raises=SettingTypeError,
    ),
    error(
        "hf-tokenize-per-string",
        AREA,
        "a tokenizer of one string, not a batch",
        lambda tmp: tokenized_lengths(
            _ds(t=list("abcd")), _OnePerCall(), "t", cache_dir=None, progress=False
        ),
        "2 results",
        "4 strings",
        "one per string",
        fix_in=TOKENIZED,
        raises=ValueError,
    ),
    error(
        "hf-tokenize-empty-text",
        AREA,
        "an empty text with a tokenizer adding nothing",
        lambda tmp: tokenized_lengths(
            _ds(t=["a", "", "b", "c"]), _split, "t", cache_dir=None, progress=False
        ),
        "'t'",
        "[1] = 0",
        "empty",
        fix_in=TOKENIZED,
        raises=ValueError,
    ),
    accepted("hf-ok-int-widths", AREA, "length columns of int8/int16/uint64", _accept_widths),
    accepted(
        "hf-ok-list-kinds", AREA, "large_list and uint16 token-id columns", _accept_list_kinds
    ),
    accepted("hf-ok-shuffled", AREA, "a shuffled dataset (indices mapping)", _accept_shuffled),
    accepted("hf-ok-module", AREA, "TokenBudgetDataModule(ds, 'tokens', 16)", _accept_module),
    accepted("hf-ok-saved", AREA, "a dataset saved to disk and loaded again", _accept_saved),
]
