"""The sampler in real processes over gloo: every rank finishes, with equal batch counts."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from tests.launch import launch


@pytest.mark.multiprocess
@pytest.mark.parametrize("world_size", [2, 3])
def test_every_rank_finishes_with_equal_counts_and_full_coverage(
    tmp_path: Path, world_size: int
) -> None:
    records = launch("sampler_ranks.py", world_size, tmp_path)
    assert sorted(r["rank"] for r in records) == list(range(world_size))
    steps = {r["steps"] for r in records}
    assert len(steps) == 1 and steps.pop() > 0
    assert all(r["counts"] == [records[0]["steps"]] * world_size for r in records)
    seen = Counter(i for r in records for i in r["ids"])
    assert sorted(seen) == list(range(4000)) and set(seen.values()) == {1}
