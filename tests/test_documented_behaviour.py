"""Behaviour the docs promise, each checked against a reference written here (issue 22, item 6).

- the default ``flop_attention`` and what it changes (docs/packing.md);
- where loss lengths go, and that they are no ``PlanConfig`` setting (docs/planning.md);
- which static shape an example runs in, and that only the tail has masked rows
  (docs/compile-and-memory.md);
- how the non-token fields of a batch line up with its rows (docs/compile-and-memory.md);
- the grouped-query head order of ``document_attention`` (docs/packing.md);
- empty shards and where a stream's position is saved (docs/streaming.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import datasets
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lightning_varbatch import (
    DataSource,
    EpochPlanner,
    MixturePlanner,
    PaddingCollate,
    PlanConfig,
    StreamingBatches,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    document_attention,
    plan_epoch,
    shards_from_files,
    token_budget_dataloader,
    transformer_flops,
)
from lightning_varbatch.planner.settings import DEFAULT_FLOP_ATTENTION

# -- the default flop_attention (docs/packing.md) -------------------------------------------


def test_default_flop_attention_is_a_causal_transformer_1024_wide() -> None:
    d = 1024
    per_token, per_pair = 24 * d * d, 2 * d  # the docs' counts, per layer
    assert DEFAULT_FLOP_ATTENTION == per_pair / per_token == 1 / (12 * 1024)
    for layers in (1, 24):
        model = transformer_flops(d_model=d, num_layers=layers)
        assert model.per_token == layers * per_token and model.per_pair == layers * per_pair
        assert model.flop_attention == DEFAULT_FLOP_ATTENTION  # the layer count cancels
    lengths = np.arange(1, 41)
    assert PlanConfig(64).flop_attention == DEFAULT_FLOP_ATTENTION
    sampler = TokenBudgetBatchSampler(lengths, 64, layout="packed", rank=0, world_size=1)
    assert sampler.config.flop_attention == DEFAULT_FLOP_ATTENTION


def _long_documents(n: int = 4000, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.minimum(rng.lognormal(5.5, 1.0, n).astype(np.int64) + 2, 4096)


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 8])
@pytest.mark.parametrize("accumulate", [1, 3])
def test_flop_attention_deals_packed_plans_and_leaves_padded_plans_alone(
    world_size: int, accumulate: int
) -> None:
    lengths = _long_documents()
    values = (0.0, DEFAULT_FLOP_ATTENTION, transformer_flops(d_model=128).flop_attention)
    for layout in ("padded", "packed"):
        plans, prints = [], set()
        for value in values:
            planner = EpochPlanner(
                lengths, PlanConfig(4096, layout=layout, flop_attention=value, seed=3)
            )
            plans.append(
                planner.plan(epoch=0, world_size=world_size, accumulate_grad_batches=accumulate)
            )
            prints.add(planner.config.fingerprint())
        first = plans[0]
        for plan in plans[1:]:  # never what a micro-batch holds
            assert np.array_equal(plan.order, first.order)
            assert np.array_equal(plan.micro_batch_start, first.micro_batch_start)
            assert np.array_equal(plan.micro_batch_size, first.micro_batch_size)
        if layout == "padded":
            assert len(prints) == 1
            assert all(np.array_equal(p.assign, first.assign) for p in plans)
        else:  # which micro-batches form a step and which rank runs each
            assert len(prints) == len(values)
            assert not all(np.array_equal(p.assign, first.assign) for p in plans)


# -- loss lengths (docs/planning.md) --------------------------------------------------------


def _pairs(n: int = 300, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(2, 50, (n, 2))


def test_loss_lengths_is_not_a_plan_setting_anywhere() -> None:
    lengths = _pairs()
    loss = lengths[:, 1] - 1
    items = [{"source": [1] * int(s), "target": [1] * int(t)} for s, t in lengths]
    with pytest.raises(TypeError):
        PlanConfig(max_tokens=256, loss_lengths=loss)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="train_loss_lengths"):
        TokenBudgetDataModule(items, lengths, 256, loss_lengths=loss)
    with pytest.raises(TypeError):
        StreamingBatches(_shard_source(), 64, rank=0, world_size=1, loss_lengths=[1, 1, 1])
    with pytest.raises(TypeError):
        StreamingDataModule(_shard_source(), 64, loss_lengths=[1, 1, 1])


def test_loss_lengths_go_where_the_docs_say() -> None:
    lengths = _pairs()
    loss = lengths[:, 1] - 1
    expected = int(loss.sum())  # no tail repeats or drops at world size 1
    config = PlanConfig(max_tokens=256, seed=1)
    assert int(EpochPlanner(lengths, config, loss).plan(0).step_tokens.sum()) == expected
    assert int(plan_epoch(lengths, 256, loss_lengths=loss).step_tokens.sum()) == expected
    sampler = TokenBudgetBatchSampler(lengths, 256, loss_lengths=loss, rank=0, world_size=1)
    assert sum(int(mb.ntokens) for mb in sampler) == expected
    other = _pairs(100, seed=1)
    mixture = MixturePlanner([DataSource(lengths, loss_lengths=loss), DataSource(other)], config)
    assert int(mixture.plan(0).step_tokens.sum()) == expected + int(other[:, 1].sum())
    items = [{"source": [1] * int(s), "target": [1] * int(t)} for s, t in lengths]
    dm = TokenBudgetDataModule(
        items, lengths, 256, train_loss_lengths=loss, collate=PaddingCollate(loss_offset=1)
    )
    assert sum(int(b["ntokens"]) for b in dm.train_dataloader()) == expected


def test_a_stream_counts_loss_tokens_with_loss_offset() -> None:
    source = _shard_source()
    counted = source.lengths()
    for offset in (0, 1, 2):
        stream = StreamingBatches(source, 64, window=4, rank=0, world_size=1, loss_offset=offset)
        expected = int(np.maximum(counted - offset, 0).sum())
        assert sum(int(b["ntokens"]) for b in stream) == expected


# -- which shape an example runs in (docs/compile-and-memory.md) ----------------------------


def _own_shape(lengths: np.ndarray, shape_lengths: np.ndarray, multiple: int) -> np.ndarray:
    """The docs' rule: the shortest shape length holding the rounded planning length."""
    key = lengths.max(axis=1) if lengths.ndim == 2 else lengths
    key = -(-key // multiple) * multiple
    holds = shape_lengths[None, :] >= key[:, None]
    return np.where(holds, shape_lengths[None, :], np.iinfo(np.int64).max).min(axis=1)


def _layout_order(plan: Any) -> np.ndarray:
    return np.argsort(plan.micro_batch_start, kind="stable")


@st.composite
def shape_cases(draw: Any) -> dict[str, Any]:
    n = draw(st.integers(1, 400))
    seed = draw(st.integers(0, 2**16))
    high = draw(st.integers(2, 120))
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, high, (n, 2) if draw(st.booleans()) else n)
    return {
        "lengths": lengths,
        "max_shapes": draw(st.integers(1, 6)),
        "multiple": draw(st.sampled_from([1, 1, 4])),
        "cost": draw(st.sampled_from(["padded", "quadratic"])),
        "max_examples": draw(st.sampled_from([None, None, 7])),
        "world": draw(st.integers(1, 4)),
        "accumulate": draw(st.integers(1, 3)),
        "seed": seed,
        "shuffle": draw(st.booleans()),
    }


def _plan(case: dict[str, Any], tail: str) -> tuple[EpochPlanner, Any] | None:
    config = PlanConfig(
        max_tokens=512,  # holds every example on its own: nothing over the budget
        max_shapes=case["max_shapes"],
        pad_to_multiple_of=case["multiple"],
        cost=case["cost"],
        max_examples=case["max_examples"],
        tail=tail,
        seed=case["seed"],
        shuffle=case["shuffle"],
    )
    planner = EpochPlanner(case["lengths"], config)
    try:
        plan = planner.plan(0, world_size=case["world"], accumulate_grad_batches=case["accumulate"])
    except ValueError:  # more ranks than the data can serve: not this test's subject
        return None
    return planner, plan


@given(case=shape_cases())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_an_example_runs_in_its_own_shape_or_fills_up_a_longer_one(case: dict[str, Any]) -> None:
    for tail in ("spread", "drop", "pad"):
        made = _plan(case, tail)
        if made is None:
            continue
        planner, plan = made
        shapes = planner.shapes
        assert shapes is not None
        own = _own_shape(case["lengths"], shapes[:, 1], case["multiple"])
        # 1. ordered by own shape, longest first
        assert (np.diff(own[plan.order]) <= 0).all()
        # 2. consecutive micro-batches, each padded to its longest example's shape, within its rows
        tiles = _layout_order(plan)
        assert (np.diff(plan.micro_batch_shape[tiles, 1]) <= 0).all()
        for t in tiles:
            members = own[plan.micro_batch_ids(int(t))]
            rows, length = plan.micro_batch_shape[t]
            assert length == members.max() and len(members) <= rows
            assert (rows, length) in {tuple(s) for s in shapes.tolist()}


@given(case=shape_cases())
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_only_the_tail_has_masked_rows(case: dict[str, Any]) -> None:
    made = {tail: _plan(case, tail) for tail in ("pad", "drop", "spread")}
    if any(m is None for m in made.values()):
        return
    multiple = case["world"] * case["accumulate"]

    def short(plan: Any) -> np.ndarray:
        """Whether each tile of the layout order has masked rows."""
        tiles = _layout_order(plan)
        return plan.micro_batch_size[tiles] < plan.micro_batch_shape[tiles, 0]

    greedy = made["pad"][1]  # type: ignore[index]
    # "pad" and "drop" keep the greedy cut: only its last micro-batch may be short
    for tail in ("pad", "drop"):
        assert not short(made[tail][1])[:-1].any()  # type: ignore[index]
    # "spread" re-cuts whole steps at the end of the cut; everything before is the greedy cut
    spread = made["spread"][1]  # type: ignore[index]
    a, b = _layout_order(spread), _layout_order(greedy)
    same = 0
    while (
        same < min(a.size, b.size)
        and spread.micro_batch_start[a[same]] == greedy.micro_batch_start[b[same]]
        and spread.micro_batch_size[a[same]] == greedy.micro_batch_size[b[same]]
    ):
        same += 1
    # the re-cut is whole steps at the end (its first tiles may equal the greedy ones)
    recut = min(a.size, -(-(a.size - same) // multiple) * multiple)
    # (a re-cut that equals the greedy cut leaves its last, short micro-batch in place)
    assert not short(spread)[: min(a.size - recut, a.size - 1)].any()
    if not case["shuffle"]:  # steps run in the cut's order: the tail steps run last
        is_short = spread.micro_batch_size < spread.micro_batch_shape[:, 0]
        steps = np.flatnonzero(is_short[spread.assign].any(axis=(1, 2)))
        if steps.size:
            assert steps.tolist() == list(range(spread.num_steps - steps.size, spread.num_steps))


# -- non-token fields and the rows (docs/compile-and-memory.md) ----------------------------


def _shape_items(n: int = 400, seed: int = 0, pairs: bool = False) -> tuple[np.ndarray, list[dict]]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 60, (n, 2) if pairs else n)
    items = []
    for i, length in enumerate(lengths):
        item: dict[str, Any] = {"id": i, "name": f"doc-{i}", "weight": float(i) / 2}
        if pairs:
            item["source"] = list(range(1, int(length[0]) + 1))
            item["target"] = list(range(1, int(length[1]) + 1))
        else:
            item["tokens"] = list(range(1, int(length) + 1))
        items.append(item)
    return lengths, items


@pytest.mark.parametrize("pairs", [False, True], ids=["tokens", "pairs"])
@pytest.mark.parametrize("kind", ["list", "arrow"])
@pytest.mark.parametrize("world_size", [1, 2])
def test_other_fields_line_up_with_the_real_rows(pairs: bool, kind: str, world_size: int) -> None:
    lengths, items = _shape_items(seed=1, pairs=pairs)  # a seed whose plans have masked rows
    data: Any = items if kind == "list" else datasets.Dataset.from_list(items)
    fields = ("source", "target") if pairs else ("tokens",)
    masked_batches = 0
    for rank in range(world_size):
        sampler = TokenBudgetBatchSampler(
            lengths, 200, max_shapes=4, rank=rank, world_size=world_size, seed=2
        )
        expected = [list(mb) for mb in sampler]
        loader = token_budget_dataloader(data, sampler)
        for ids, batch in zip(expected, loader, strict=True):
            n = int(batch["nexamples"])
            assert n == len(ids)
            for field in fields:
                mask = batch[f"{field}_mask"]
                assert mask.shape == batch[field].shape
                assert mask[:n].any(1).all() and not mask[n:].any()  # real rows first
            # other entries: one per real example, in row order
            assert batch["id"].dtype == torch.long and batch["id"].tolist() == ids
            assert batch["name"] == [f"doc-{i}" for i in ids]
            assert batch["weight"] == [i / 2 for i in ids]
            for row, i in enumerate(ids):
                want = lengths[i] if not pairs else lengths[i][1]
                field = "target" if pairs else "tokens"
                assert int(batch[f"{field}_mask"][row].sum()) == int(want)
            masked_batches += batch[fields[0]].shape[0] > n
    assert masked_batches  # the case does have masked rows


# -- grouped-query head order (docs/packing.md) ---------------------------------------------


def _flex_importable() -> bool:
    try:
        from torch.nn.attention import flex_attention  # noqa: F401
    except Exception:
        return False
    return True


def _flash_importable() -> bool:
    try:
        import flash_attn  # noqa: F401
    except Exception:
        return False
    return torch.cuda.is_available()


BACKENDS = [
    pytest.param("sdpa", "cpu", torch.float64, id="sdpa-cpu"),
    pytest.param(
        "flex",
        "cpu",
        torch.float64,
        id="flex-cpu",
        marks=pytest.mark.skipif(not _flex_importable(), reason="no FlexAttention"),
    ),
    pytest.param(
        "sdpa",
        "cuda",
        torch.float32,
        id="sdpa-cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"),
        ],
    ),
    pytest.param(
        "flex",
        "cuda",
        torch.float32,
        id="flex-cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"),
        ],
    ),
    pytest.param(
        "flash",
        "cuda",
        torch.bfloat16,
        id="flash-cuda",
        marks=[
            pytest.mark.gpu,
            pytest.mark.skipif(not _flash_importable(), reason="no flash_attn on CUDA"),
        ],
    ),
]


def _one_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """One query head against one key/value head, explicit softmax, ``(tokens, dim)``."""
    scores = (q @ k.T) / q.shape[-1] ** 0.5
    if causal:
        n = q.shape[0]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


@pytest.mark.parametrize(("backend", "device", "dtype"), BACKENDS)
@pytest.mark.parametrize(("heads", "kv_heads"), [(4, 4), (6, 2), (6, 3), (8, 1)])
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("batched", [False, True])
def test_query_head_h_uses_key_value_head_h_over_group_size(
    backend: str,
    device: str,
    dtype: torch.dtype,
    heads: int,
    kv_heads: int,
    causal: bool,
    batched: bool,
) -> None:
    lengths, dim = [3, 5, 1, 4], 16
    total = sum(lengths) + 2  # two slots of trailing alignment padding
    g = torch.Generator().manual_seed(heads * 10 + kv_heads)
    q = torch.randn(total, heads, dim, generator=g, dtype=torch.float64)
    k, v = (torch.randn(total, kv_heads, dim, generator=g, dtype=torch.float64) for _ in "kv")
    cu = torch.tensor([0, *np.cumsum(lengths).tolist()], dtype=torch.int32)
    args = [x.to(device=device, dtype=dtype) for x in (q, k, v)]
    if batched:
        args = [x[None] for x in args]
    with torch.no_grad():
        out = document_attention(*args, cu.to(device), causal=causal, backend=backend)
    out = (out[0] if batched else out).double().cpu()
    group = heads // kv_heads
    expected = torch.zeros_like(out)
    tiled = torch.zeros_like(out)
    start = 0
    for n in lengths:
        rows = slice(start, start + n)
        for h in range(heads):
            kv = h // group  # the documented order
            expected[rows, h] = _one_head(q[rows, h], k[rows, kv], v[rows, kv], causal)
            other = h % kv_heads  # the other order (k.repeat), for contrast
            tiled[rows, h] = _one_head(q[rows, h], k[rows, other], v[rows, other], causal)
        start += n
    tol = {torch.float64: 1e-10, torch.float32: 1e-4, torch.bfloat16: 3e-2}[dtype]
    torch.testing.assert_close(out, expected, atol=tol, rtol=tol)
    if 1 < kv_heads < heads:
        assert not torch.allclose(out, tiled, atol=tol, rtol=tol)


# -- empty shards and the stream's saved position (docs/streaming.md) -----------------------


class _Shard:
    """A minimal in-memory shard (the ``Shard`` protocol)."""

    def __init__(self, name: str, rows: list[list[int]]) -> None:
        self.name, self.rows = name, rows

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return np.array([len(r) for r in self.rows], dtype=np.int64)

    def read(self, rows: Any) -> Any:
        return ({"tokens": np.array(self.rows[i])} for i in rows)


def _shard_source() -> Any:
    from lightning_varbatch.sources.shards import ShardedSource

    rows = [[list(range(1, n + 1)) for n in (3, 5, 2)], [list(range(1, n + 1)) for n in (7, 4)]]
    return ShardedSource([_Shard("a", rows[0]), _Shard("b", rows[1])])


def _write(path: Path, table: pa.Table) -> None:
    if path.suffix == ".parquet":
        pq.write_table(table, path)
    elif path.suffix == ".arrow":
        feather.write_feather(table, path)
    else:
        lines = [json.dumps(row) for row in table.to_pylist()]
        path.write_text("".join(line + "\n" for line in lines))


def _table(ids: range) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(list(ids), type=pa.int64()),
            "tokens": pa.array([list(range(1, 2 + i % 9)) for i in ids], type=pa.list_(pa.int64())),
        }
    )


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
@pytest.mark.parametrize("world_size", [1, 2])
@pytest.mark.parametrize("empty_at", [0, 1, 3])
def test_an_empty_shard_is_a_shard_of_no_rows(
    tmp_path: Path, suffix: str, world_size: int, empty_at: int
) -> None:
    counts = [40, 25, 30]
    counts.insert(empty_at, 0)
    start = 0
    for s, count in enumerate(counts):
        _write(tmp_path / f"part-{s}{suffix}", _table(range(start, start + count)))
        start += count
    source = shards_from_files(tmp_path, "tokens", cache_dir=None)
    assert [shard.num_rows for shard in source.shards] == counts
    seen: list[int] = []
    per_rank = []
    for rank in range(world_size):
        stream = StreamingBatches(source, 32, window=30, rank=rank, world_size=world_size, seed=1)
        batches = list(stream)
        per_rank.append(len(batches))
        seen += [i for b in batches for i in b["id"].tolist()]
    assert sorted(seen) == list(range(sum(counts)))  # every row once
    assert len(set(per_rank)) == 1  # equal counts on every rank


@pytest.mark.parametrize("suffix", [".parquet", ".arrow", ".jsonl"])
def test_a_stream_of_empty_shards_is_refused_when_built(tmp_path: Path, suffix: str) -> None:
    for s in range(2):
        _write(tmp_path / f"part-{s}{suffix}", _table(range(0)))
    source = shards_from_files(tmp_path, "tokens", cache_dir=None)
    assert source.num_rows == 0
    with pytest.raises(ValueError):
        StreamingBatches(source, 32, rank=0, world_size=1)
    with pytest.raises(ValueError):
        StreamingDataModule(source, 32)


def test_a_stream_state_holds_the_stream_position_and_the_trained_count() -> None:
    dm = StreamingDataModule(_shard_source(), max_tokens=10, window=4)
    list(dm.train_dataloader())  # outside a Trainer: rank 0 of 1, nothing trained
    state = dm.state_dict()
    assert {"stream", "trained"} <= set(state) and state["trained"] == 0
    stream = state["stream"]
    for key in ("epoch", "window", "consumed", "world_size", "accumulate_grad_batches"):
        assert key in stream
    assert (stream["epoch"], stream["window"], stream["consumed"]) == (0, 0, 0)
    restored = StreamingDataModule(_shard_source(), max_tokens=10, window=4)
    restored.load_state_dict(state)
    assert sum(int(b["nexamples"]) for b in restored.train_dataloader()) == 5


def test_datasets_select_of_a_range_builds_no_indices_mapping() -> None:
    """docs/hf-datasets.md: contiguous splits need no mapping, unlike ``shuffle``."""
    ds = datasets.Dataset.from_dict({"n": list(range(100))})
    for split in (ds.select(range(10, 60)), ds.train_test_split(0.1, shuffle=False)["train"]):
        assert split._indices is None
    assert ds.shuffle(seed=0)._indices is not None
