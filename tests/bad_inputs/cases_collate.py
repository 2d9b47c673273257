"""PaddingCollate and the loader: settings, dataset items, and lengths that lie about them.

Example:
    >>> len(CASES) > 40
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, RandomSampler

from lightning_varbatch import PaddingCollate, TokenBudgetBatchSampler, token_budget_dataloader
from lightning_varbatch.data.loader import TokenBudgetDataLoader
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import int_family

COLLATE = "lightning_varbatch/data/collate.py"
LOADER = "lightning_varbatch/data/loader.py"
ITEM_1 = ("item 1", "items[1]", "index 1", "example 1", "item #1")

PAIRS = [{"source": [1] * s, "target": [2] * t} for s, t in ((3, 2), (5, 4), (2, 2), (6, 3))]
PAIR_LENGTHS = np.array([[3, 2], [5, 4], [2, 2], [6, 3]])
TOKENS = [{"tokens": [1] * n} for n in (3, 5, 2, 7, 4, 6)]
TOKEN_LENGTHS = np.array([3, 5, 2, 7, 4, 6])


def _collate_setting(name: str) -> Any:
    def call(value: Any) -> Any:
        collate = PaddingCollate(**{name: value})
        return collate([{"tokens": [5, 6, 7]}, {"tokens": [8]}])

    return call


def _collate(items: Any, **kwargs: Any) -> Any:
    return PaddingCollate(**kwargs)(items)


def _sampler(lengths: Any, max_tokens: int = 16, **kwargs: Any) -> TokenBudgetBatchSampler:
    return TokenBudgetBatchSampler(lengths, max_tokens, rank=0, world_size=1, **kwargs)


def _drain(loader: Any) -> list[Any]:
    return list(loader)


def _pad_id_np(tmp: Path) -> None:
    batch = _collate([{"tokens": [5, 6, 7]}, {"tokens": [8]}], pad_id=np.int64(-1))
    assert batch["tokens"].tolist() == [[5, 6, 7], [8, -1, -1]]


def _tensor_tokens(tmp: Path) -> None:
    items = [{"tokens": torch.tensor([5, 6], dtype=torch.int32)}, {"tokens": np.array([7])}]
    batch = _collate(items)
    assert batch["tokens"].tolist() == [[5, 6], [7, 0]]


def _tuple_tokens(tmp: Path) -> None:
    assert _collate([{"tokens": (5, 6)}])["tokens"].tolist() == [[5, 6]]


def _understated_source(tmp: Path) -> None:
    # The loss side (target) is right, the source side is understated by the lengths.
    lengths = PAIR_LENGTHS.copy()
    lengths[:, 0] = 1
    _drain(token_budget_dataloader(PAIRS, _sampler(lengths, max_tokens=8)))


def _understated_target(tmp: Path) -> None:
    lengths = PAIR_LENGTHS.copy()
    lengths[:, 1] = 1
    _drain(token_budget_dataloader(PAIRS, _sampler(lengths, max_tokens=8)))


def _target_only_lengths(tmp: Path) -> None:
    # 1-D lengths of the target side for pair items: the source side is not budgeted.
    _drain(token_budget_dataloader(PAIRS, _sampler(PAIR_LENGTHS[:, 1], max_tokens=6)))


def _source_over_budget_no_check(tmp: Path) -> None:
    # check_ntokens=False turns off the loss-count check, not the budget of the padded fields.
    lengths = PAIR_LENGTHS.copy()
    lengths[:, 0] = 1
    collate = PaddingCollate(check_ntokens=False)
    _drain(token_budget_dataloader(PAIRS, _sampler(lengths, max_tokens=8), collate_fn=collate))


def _tokens_understated(tmp: Path) -> None:
    _drain(token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS - 1)))


def _fewer_lengths(tmp: Path) -> None:
    token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS[:4]))


def _more_lengths(tmp: Path) -> None:
    token_budget_dataloader(TOKENS[:4], _sampler(TOKEN_LENGTHS))


class _Stream(IterableDataset[Any]):
    def __iter__(self) -> Any:
        return iter(TOKENS)


def _iterable(tmp: Path) -> None:
    token_budget_dataloader(_Stream(), _sampler(TOKEN_LENGTHS))


def _missing_later(tmp: Path) -> None:
    data = [dict(x) for x in PAIRS]
    del data[1]["target"]
    _drain(token_budget_dataloader(data, _sampler(PAIR_LENGTHS)))


def _missing_all(tmp: Path) -> None:
    data = [{"source": x["source"]} for x in PAIRS]
    token_budget_dataloader(data, _sampler(PAIR_LENGTHS), collate_fn=PaddingCollate())


def _collate_pads_more(tmp: Path) -> None:
    # The plan budgets padding to 1; the collate pads to 64: 4 x 64 slots for a budget of 16.
    collate = PaddingCollate(pad_to_multiple_of=64)
    _drain(token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS), collate_fn=collate))


def _good_loader(tmp: Path) -> None:
    batches = _drain(token_budget_dataloader(PAIRS, _sampler(PAIR_LENGTHS, max_tokens=12)))
    assert sum(int(b["nexamples"]) for b in batches) == len(PAIRS)


CASES: list[Case] = [
    *int_family(
        "collate-pad_to_multiple_of",
        "collate",
        "pad_to_multiple_of",
        _collate_setting("pad_to_multiple_of"),
        what="PaddingCollate(pad_to_multiple_of=",
        fix_in=COLLATE,
    ),
    *int_family(
        "collate-loss_offset",
        "collate",
        "loss_offset",
        _collate_setting("loss_offset"),
        zero_ok=True,
        good=1,
        what="PaddingCollate(loss_offset=",
        fix_in=COLLATE,
    ),
    *int_family(
        "collate-truncate_to",
        "collate",
        "truncate_to",
        _collate_setting("truncate_to"),
        required=False,
        what="PaddingCollate(truncate_to=",
        fix_in=COLLATE,
    ),
    error(
        "collate-pad_id-str",
        "collate",
        "PaddingCollate(pad_id='<pad>')",
        lambda tmp: PaddingCollate(pad_id="<pad>"),
        "pad_id",
        "<pad>",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="pad_id",
    ),
    error(
        "collate-pad_id-float",
        "collate",
        "PaddingCollate(pad_id=0.5)",
        lambda tmp: PaddingCollate(pad_id=0.5),
        "pad_id",
        "0.5",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="pad_id",
    ),
    error(
        "collate-pad_id-none",
        "collate",
        "PaddingCollate(pad_id=None)",
        lambda tmp: PaddingCollate(pad_id=None),
        "pad_id",
        "None",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="pad_id",
    ),
    error(
        "collate-pad_id-nan",
        "collate",
        "PaddingCollate(pad_id=nan)",
        lambda tmp: PaddingCollate(pad_id=float("nan")),
        "pad_id",
        "nan",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="pad_id",
    ),
    error(
        "collate-pad_id-bool",
        "collate",
        "PaddingCollate(pad_id=True)",
        lambda tmp: PaddingCollate(pad_id=True),
        "pad_id",
        "True",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="pad_id",
    ),
    accepted(
        "collate-pad_id-int64",
        "collate",
        "PaddingCollate(pad_id=np.int64(-1))",
        _pad_id_np,
        fix_in=COLLATE,
    ),
    error(
        "collate-same-keys",
        "collate",
        "PaddingCollate(source_key='text', target_key='text')",
        lambda tmp: PaddingCollate(source_key="text", target_key="text"),
        "source_key",
        "target_key",
        "text",
        fix_in=COLLATE,
        raises=SettingValueError,
        setting="target_key",
    ),
    error(
        "collate-key-none",
        "collate",
        "PaddingCollate(source_key=None)",
        lambda tmp: PaddingCollate(source_key=None),
        "source_key",
        "None",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="source_key",
    ),
    error(
        "collate-key-empty",
        "collate",
        "PaddingCollate(target_key='')",
        lambda tmp: PaddingCollate(target_key=""),
        "target_key",
        "''",
        fix_in=COLLATE,
        raises=SettingValueError,
        setting="target_key",
    ),
    error(
        "collate-check_ntokens-str",
        "collate",
        "PaddingCollate(check_ntokens='no')",
        lambda tmp: PaddingCollate(check_ntokens="no"),
        "check_ntokens",
        "no",
        fix_in=COLLATE,
        raises=SettingTypeError,
        setting="check_ntokens",
    ),
    # -- items -----------------------------------------------------------------------------
    error(
        "item-missing-target",
        "collate",
        "item 1 of a pair batch has no 'target'",
        lambda tmp: _collate([{"source": [1], "target": [2]}, {"source": [3]}]),
        "target",
        ITEM_1,
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "item-missing-source",
        "collate",
        "item 1 of a pair batch has only 'tokens'",
        lambda tmp: _collate([{"source": [1], "target": [2]}, {"tokens": [3]}]),
        "source",
        ITEM_1,
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "item-no-token-field",
        "collate",
        "items with only a 'text' field",
        lambda tmp: _collate([{"text": [1, 2]}]),
        "text",
        ("tokens", "source"),
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "item-str-tokens",
        "collate",
        "tokens=['a', 'b'] (strings, not ids)",
        lambda tmp: _collate([{"tokens": ["a", "b"]}]),
        "tokens",
        ("'a'", "str"),
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-str-text",
        "collate",
        "tokens='hello world' (untokenized text)",
        lambda tmp: _collate([{"tokens": "hello world"}]),
        "tokens",
        ("str", "hello"),
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-float-tokens",
        "collate",
        "tokens=[1.5, 2.0] (floats)",
        lambda tmp: _collate([{"tokens": [1.5, 2.0]}]),
        "tokens",
        ("float", "1.5"),
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-bool-tokens",
        "collate",
        "tokens=[True, False]",
        lambda tmp: _collate([{"tokens": [True, False]}]),
        "tokens",
        "bool",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-2d-tokens",
        "collate",
        "tokens=[[1, 2], [3, 4]] (2-D)",
        lambda tmp: _collate([{"tokens": [[1, 2], [3, 4]]}]),
        "tokens",
        "(2, 2)",
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "item-0d-tokens",
        "collate",
        "tokens=7 (a single int)",
        lambda tmp: _collate([{"tokens": 7}]),
        "tokens",
        ("()", "int", "7"),
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "item-none-tokens",
        "collate",
        "tokens=None",
        lambda tmp: _collate([{"tokens": None}]),
        "tokens",
        "None",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-list",
        "collate",
        "items are lists of ids, not mappings",
        lambda tmp: _collate([[1, 2, 3], [4]]),
        ("item", "items"),
        "list",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-str",
        "collate",
        "items are strings",
        lambda tmp: _collate(["ab", "cd"]),
        ("item", "items"),
        "str",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-none",
        "collate",
        "item 1 is None",
        lambda tmp: _collate([{"tokens": [1]}, None]),
        ITEM_1,
        "None",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "item-tensor",
        "collate",
        "items are bare tensors",
        lambda tmp: _collate([torch.tensor([1, 2])]),
        ("item", "items"),
        "Tensor",
        raises=TypeError,
        fix_in=COLLATE,
    ),
    error(
        "collate-empty-batch",
        "collate",
        "an empty micro-batch",
        lambda tmp: _collate([]),
        "empty",
        raises=ValueError,
        fix_in=COLLATE,
    ),
    accepted(
        "item-tensor-and-array-tokens",
        "collate",
        "int32 tensors and numpy arrays as tokens",
        _tensor_tokens,
        fix_in=COLLATE,
    ),
    accepted("item-tuple-tokens", "collate", "tuples as tokens", _tuple_tokens, fix_in=COLLATE),
    # -- lengths that lie about the items (loader) -----------------------------------------
    error(
        "loader-source-understated",
        "loader",
        "(n, 2) lengths whose source column is 1 for every item",
        _understated_source,
        "source",
        "lengths",
        fix_in=COLLATE,
        raises=ValueError,
    ),
    error(
        "loader-target-understated",
        "loader",
        "(n, 2) lengths whose target column is 1 for every item",
        _understated_target,
        "target",
        "lengths",
        fix_in=COLLATE,
        raises=ValueError,
    ),
    error(
        "loader-target-only-lengths",
        "loader",
        "1-D lengths of the target side for source/target items",
        _target_only_lengths,
        "source",
        "lengths",
        fix_in=COLLATE,
        raises=ValueError,
    ),
    error(
        "loader-source-over-budget-unchecked",
        "loader",
        "understated source lengths with PaddingCollate(check_ntokens=False)",
        _source_over_budget_no_check,
        "source",
        "lengths",
        fix_in=COLLATE,
        raises=ValueError,
    ),
    error(
        "loader-tokens-understated",
        "loader",
        "lengths one less than every item's tokens",
        _tokens_understated,
        "tokens",
        "lengths",
        fix_in=COLLATE,
        raises=ValueError,
    ),
    error(
        "loader-fewer-lengths",
        "loader",
        "4 lengths for a dataset of 6 items",
        _fewer_lengths,
        "lengths",
        "4",
        "6",
        fix_in=LOADER,
        raises=ValueError,
    ),
    error(
        "loader-more-lengths",
        "loader",
        "6 lengths for a dataset of 4 items",
        _more_lengths,
        "lengths",
        "6",
        "4",
        fix_in=LOADER,
        raises=ValueError,
    ),
    error(
        "loader-iterable-dataset",
        "loader",
        "a torch IterableDataset",
        _iterable,
        ("IterableDataset", "iterable"),
        ("map-style", "__getitem__"),
        raises=TypeError,
        fix_in=LOADER,
    ),
    error(
        "loader-dataset-none",
        "loader",
        "token_budget_dataloader(None, sampler)",
        lambda tmp: token_budget_dataloader(None, _sampler(TOKEN_LENGTHS)),
        "dataset",
        "None",
        fix_in=LOADER,
        raises=TypeError,
    ),
    error(
        "loader-batch_sampler-list",
        "loader",
        "TokenBudgetDataLoader(data, [[0, 1], [2]])",
        lambda tmp: TokenBudgetDataLoader(TOKENS, [[0, 1], [2]]),
        "batch_sampler",
        "list",
        raises=SettingTypeError,
        fix_in=LOADER,
    ),
    error(
        "loader-collate-not-callable",
        "loader",
        "collate_fn='pad'",
        lambda tmp: token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS), collate_fn="pad"),
        "collate_fn",
        "pad",
        fix_in=LOADER,
        raises=SettingTypeError,
        setting="collate_fn",
    ),
    error(
        "loader-num_workers-negative",
        "loader",
        "num_workers=-1",
        lambda tmp: token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS), num_workers=-1),
        "num_workers",
        "-1",
        fix_in=LOADER,
        raises=SettingValueError,
        setting="num_workers",
    ),
    error(
        "loader-batch_size-kwarg",
        "loader",
        "token_budget_dataloader(..., batch_size=4)",
        lambda tmp: token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS), batch_size=4),
        "batch_size",
        fix_in=LOADER,
        raises=SettingTypeError,
    ),
    error(
        "loader-sampler-kwarg",
        "loader",
        "token_budget_dataloader(..., sampler=RandomSampler(data))",
        lambda tmp: token_budget_dataloader(
            TOKENS, _sampler(TOKEN_LENGTHS), sampler=RandomSampler(TOKENS)
        ),
        "sampler",
        fix_in=LOADER,
        raises=SettingTypeError,
    ),
    error(
        "loader-drop_last-kwarg",
        "loader",
        "token_budget_dataloader(..., drop_last=True)",
        lambda tmp: token_budget_dataloader(TOKENS, _sampler(TOKEN_LENGTHS), drop_last=True),
        "drop_last",
        fix_in=LOADER,
        raises=SettingTypeError,
    ),
    error(
        "item-missing-target-later",
        "loader",
        "item 1 of 4 lacks 'target' (the others have it)",
        _missing_later,
        "target",
        "1",
        raises=ValueError,
        fix_in=COLLATE,
    ),
    error(
        "item-missing-target-all",
        "loader",
        "no item has 'target': fails when the loader is built, before training",
        _missing_all,
        "target",
        raises=ValueError,
        fix_in=LOADER,
    ),
    error(
        "loader-collate-pads-over-plan",
        "loader",
        "PaddingCollate(pad_to_multiple_of=64) with a sampler planned for pad_to_multiple_of=1",
        _collate_pads_more,
        "pad_to_multiple_of",
        "64",
        fix_in=COLLATE,
        raises=SettingValueError,
        setting="collate_fn",
    ),
    accepted(
        "loader-good-pairs",
        "loader",
        "(n, 2) lengths matching source/target items",
        _good_loader,
        fix_in=LOADER,
    ),
]
