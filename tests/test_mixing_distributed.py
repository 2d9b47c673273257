"""Two datasets mixed per step under real 2-process DDP (gloo): every rank agrees."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from tests.launch import launch


@pytest.mark.multiprocess
@pytest.mark.parametrize("source", ["list", "hf"])
def test_per_step_mixing_is_identical_on_every_rank(tmp_path: Path, source: str) -> None:
    extra: tuple[str, ...] = ()
    if source != "list":  # each DataSource a Hugging Face dataset, lengths from its column
        pytest.importorskip("datasets")
        extra = ("--source", source)
    records = launch("mixing_ddp.py", 2, tmp_path, *extra)
    assert [r["rank"] for r in records] == [0, 1]
    for r in records:
        assert r["source"] == source
        kind = "datasets.Dataset" if source == "hf" else "builtins.list"
        assert r["loader"]["dataset_type"] == "ConcatDataset"
        assert r["loader"]["part_types"] == [kind, kind], r["loader"]
        assert r["loader"]["columnar"] is True  # the default collate: Arrow reads where it can
    assert {r["global_step"] for r in records} == {12}  # 6 steps x 2 epochs, on both ranks
    per_rank = []
    for record in records:
        steps: dict[tuple[int, int], set[int]] = defaultdict(set)
        for row in record["trained"]:
            steps[row["epoch"], row["global_step"]].add(row["dataset"])
            # homogeneous shapes: 8 x 16 tokens or 4 x 32 tokens under a 128-token budget
            assert (row["rows"], row["width"]) == ((8, 16) if row["dataset"] == 0 else (4, 32))
        assert all(len(d) == 1 for d in steps.values()), "a step mixed datasets on one rank"
        per_rank.append({k: d.pop() for k, d in steps.items()})
    assert per_rank[0] == per_rank[1], "the ranks trained different datasets in some step"
    datasets = list(per_rank[0].values())
    assert sorted(datasets) == [0] * 6 + [1] * 6  # weights 1:1 over 12 steps
    # the loss normaliser: the step's tokens over both ranks and both micro-batches
    totals: dict[tuple[int, int], int] = defaultdict(int)
    for record in records:
        for row in record["trained"]:
            totals[row["epoch"], row["global_step"]] += row["ntokens"]
            assert row["step_ntokens"] == 4 * 128
    assert set(totals.values()) == {4 * 128}
    assert records[0]["weights"] == records[1]["weights"]
    # the throughput monitor found the datasets by itself and summed both ranks' tokens
    by_dataset = [0, 0]
    for record in records:
        for row in record["trained"]:
            by_dataset[row["dataset"]] += row["ntokens"]
    assert records[0]["monitor_dataset_tokens"] == by_dataset
    assert records[1]["monitor_dataset_tokens"] == by_dataset
