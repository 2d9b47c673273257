"""Per-row lengths of python items, and items handed over with numpy token ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.sources.shard_items import (
    lengths_array,
    numpy_fields,
    row_lengths,
    table_items,
)


def test_ints_are_lengths_and_lists_are_counted() -> None:
    rows = row_lengths(
        [{"src": [1, 2, 3], "n": 4}, {"src": np.arange(2), "n": np.int32(1)}], ("src", "n"), "w"
    )
    assert rows == [(3, 4), (2, 1)]
    assert lengths_array(rows, ("src", "n"), "w").tolist() == [[3, 4], [2, 1]]
    assert lengths_array([(5,), (2,)], ("src",), "w").tolist() == [5, 2]


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        ("some text", TypeError, r"w: row 1 field 'ids' is text \('some text'\)"),
        ([1.5, 2.0], TypeError, r"row 1 field 'ids' is a list holding 1.5, not token ids"),
        ([1, None], TypeError, r"row 1 field 'ids' is a list holding a null"),
        (None, ValueError, r"row 1 has a null 'ids'"),
        (True, TypeError, r"row 1 field 'ids' is bool"),
    ],
)
def test_what_is_not_a_length_is_refused_naming_the_row(
    value: object, error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        row_lengths([{"ids": [1]}, {"ids": value}], ("ids",), "w")


def test_a_missing_field_names_the_setting_and_the_fields_there_are() -> None:
    match = r"row 0 has no field 'ids'; its fields are \['a'"
    with pytest.raises(SettingValueError, match=match) as info:
        row_lengths([{"a": 1}], ("ids",), "w")
    assert info.value.setting == "columns" and info.value.value == ["ids"]


def test_the_planners_rules_refuse_a_zero_length() -> None:
    with pytest.raises(ValueError, match=r"w \(column 'ids'\)"):
        lengths_array([(3,), (0,)], ("ids",), "w")


def test_items_carry_token_ids_as_int64_arrays_and_leave_other_fields_alone() -> None:
    item = numpy_fields({"ids": [4, 5], "flags": [True, False], "text": "hi", "n": 2})
    assert item["ids"].dtype == np.int64 and item["ids"].tolist() == [4, 5]
    assert item["flags"] == [True, False] and item["text"] == "hi" and item["n"] == 2


def test_table_rows_become_items_and_a_column_with_null_rows_stays_python() -> None:
    table = pa.table({"ids": [[1, 2], [3]], "maybe": [[1, 2], None], "s": ["a", "b"]})
    first, second = table_items(table)
    assert first["ids"].tolist() == [1, 2] and isinstance(first["ids"], np.ndarray)
    assert first["maybe"] == [1, 2] and second["maybe"] is None and second["s"] == "b"
    assert table_items(table.slice(0, 0)) == []
    # a null token id inside a row stays None (never a float64 NaN the collate misreports)
    holes = table_items(pa.table({"ids": [[1, 2], [3, None]]}))
    assert holes[1]["ids"] == [3, None] and holes[0]["ids"] == [1, 2]
