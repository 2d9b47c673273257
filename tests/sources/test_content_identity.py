"""What a stream's resume is told when the shards it is given differ from the saved ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from lightning_varbatch.sources.content_identity import identity_changes, shard_identity


class Plain:
    """A shard with no file behind it: its name stands in for its content name."""

    def __init__(self, name: str, lengths: list[int]) -> None:
        self.name, self._lengths = name, np.asarray(lengths)

    @property
    def num_rows(self) -> int:
        return len(self._lengths)

    def lengths(self) -> np.ndarray:
        return self._lengths

    def read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        return iter([])


def _ident(file: str, rows: int = 2, size: int | None = 10, lengths: str = "x") -> dict[str, Any]:
    return {"file": file, "rows": rows, "bytes": size, "lengths": lengths}


def test_the_identity_covers_rows_size_and_lengths_but_not_the_folder() -> None:
    one = shard_identity(Plain("s3://bucket/a", [3, 1]))
    assert one["file"] == "s3://bucket/a" and one["rows"] == 2 and one["bytes"] is None
    assert shard_identity(Plain("elsewhere", [3, 1]))["lengths"] == one["lengths"]
    assert shard_identity(Plain("s3://bucket/a", [1, 3]))["lengths"] != one["lengths"]
    given = shard_identity(Plain("a", [3, 1]), np.array([[3, 1], [1, 2]]))
    assert given["lengths"] != one["lengths"]  # lengths passed in are the ones digested


def test_unchanged_shards_resume_and_reordered_ones_say_which_moved() -> None:
    a, b, c = _ident("a"), _ident("b", 1), _ident("c", 3)
    assert identity_changes([a, b, c], [a, b, c]) == ""
    assert identity_changes([a, b, c], [c, b, a]) == (
        "the same 3 shards in another order: a was shards[0], now shards[2]; "
        "c was shards[2], now shards[0]"
    )


def test_changed_added_and_missing_files_are_named_with_what_changed() -> None:
    a, b = _ident("a"), _ident("b")
    message = identity_changes([a, b], [_ident("a", rows=5, size=40), _ident("c")])
    assert message == (
        "a changed (2 rows saved, 5 now, 10 bytes saved, 40 now); b is missing; c was added"
    )
    assert identity_changes([a], [_ident("a", lengths="y")]) == (
        "a changed (the same number of rows with other lengths)"
    )


def test_repeated_names_are_compared_position_by_position() -> None:
    chunk = _ident("chunk-0.bin")
    changed = _ident("chunk-0.bin", rows=3)
    assert identity_changes([chunk, chunk], [chunk, changed]) == "shards[1] (chunk-0.bin) changed"
    assert identity_changes([chunk, chunk], [chunk]) == "shards[1] (chunk-0.bin) is missing"


def test_long_lists_are_cut_after_five() -> None:
    saved = [_ident(f"f{i}") for i in range(8)]
    message = identity_changes(saved, [])
    assert message.endswith("f4 is missing (and 3 more)") and message.count("missing") == 5
