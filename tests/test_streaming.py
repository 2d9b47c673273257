"""Streaming (issue 15): windowed plans, StreamingBatches over every shard source, resume.

Everything is checked against references computed here from the raw data: the stream's
order from the shard sizes, micro-batch costs from the lengths, token counts from the items.
"""

from __future__ import annotations

import json
import multiprocessing
import re
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader

from lightning_varbatch.data.streaming import StreamingBatches
from lightning_varbatch.data.streaming_state import ResumableStream
from lightning_varbatch.errors import ResumeMismatchError, SettingValueError
from lightning_varbatch.planner.diagnostics import diagnose
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.synthetic import wmt_like_lengths
from lightning_varbatch.planner.windows import WindowedPlanner
from lightning_varbatch.sources.file_shards import ParquetShard
from lightning_varbatch.sources.shards import ShardedSource, shards_from_files

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)

# ------------------------------------------------------------------ 1. WindowedPlanner


@st.composite
def streams(draw: st.DrawFn) -> dict:
    rows = draw(st.lists(st.integers(0, 30), min_size=1, max_size=8))
    assume(sum(rows) > 0)
    pairs = draw(st.booleans())
    high = draw(st.sampled_from([3, 20, 60]))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    lengths = [rng.integers(1, high + 1, size=(r, 2) if pairs else r) for r in rows]
    longest = max(int(x.max()) for x in lengths if x.size)
    return {
        "rows": rows,
        "lengths": lengths,
        "config": PlanConfig(
            max_tokens=draw(st.integers(longest, 8 * longest)),
            seed=draw(st.integers(0, 5)),
            tail=draw(st.sampled_from(["spread", "spread", "drop", "pad"])),
        ),
        "window": draw(st.integers(1, sum(rows) + 5)),
        "world": draw(st.integers(1, 4)),
        "acc": draw(st.integers(1, 3)),
        "epoch": draw(st.integers(0, 3)),
        "shuffle": draw(st.booleans()),
    }


def _key(lengths: list[np.ndarray]) -> np.ndarray:
    """Planning length of every global id (max(source, target) for pairs)."""
    flat = np.concatenate([x.reshape(-1, x.shape[1] if x.ndim == 2 else 1) for x in lengths])
    return flat.max(axis=1)


def _reference_windows(
    rows: list[int], order: np.ndarray, window: int, sizes: np.ndarray
) -> list[np.ndarray]:
    """Global ids of every window: the stream (shards in ``order``) cut into ``sizes``.

    ``sizes`` must be ``ceil(n / window)`` near-equal parts (differing by at most one).
    """
    offsets = np.concatenate([[0], np.cumsum(rows)])
    stream = np.concatenate([np.arange(offsets[s], offsets[s + 1]) for s in order])
    n = stream.size
    assert sizes.size == -(-n // window) and sizes.sum() == n
    assert int(sizes.max()) - int(sizes.min()) <= 1 and int(sizes.max()) <= window
    cuts = np.concatenate([[0], np.cumsum(sizes)])
    return [stream[cuts[w] : cuts[w + 1]] for w in range(sizes.size)]


@SETTINGS
@given(streams())
def test_window_plans_keep_every_plan_guarantee(case: dict) -> None:
    rows, lengths, config = case["rows"], case["lengths"], case["config"]
    world, acc, epoch = case["world"], case["acc"], case["epoch"]
    calls: list[int] = []

    def shard_lengths(s: int) -> np.ndarray:
        calls.append(s)
        return lengths[s]

    wp = WindowedPlanner(
        rows, shard_lengths, config, window=case["window"], shuffle_shards=case["shuffle"]
    )
    key = _key(lengths)
    n = int(sum(rows))
    assert wp.num_examples == n
    order = wp.shard_order(epoch)
    assert sorted(order.tolist()) == list(range(len(rows)))
    if not case["shuffle"]:
        assert order.tolist() == list(range(len(rows)))
    sizes = np.diff(wp.window_bounds())
    assert wp.num_windows == sizes.size
    reference = _reference_windows(rows, order, case["window"], sizes)

    seen: Counter[int] = Counter()
    dropped = duplicated = 0
    all_planned = True
    last_pos: dict[int, int] = {}
    for w, expected in enumerate(reference):
        # The window's pieces follow the epoch's shard order; each shard's rows in read order.
        spans = wp.window_spans(epoch, w)
        pieces = [np.arange(a, b) + int(wp.offsets[s]) for s, a, b in spans]
        assert np.array_equal(np.concatenate(pieces), expected)
        for s, a, b in spans:
            assert b > a and a == last_pos.get(s, 0)  # contiguous, front to back
            last_pos[s] = b
        calls.clear()
        try:
            wplan = wp.window_plan(epoch, w, world, acc)
        except SettingValueError as err:  # a window (or stream) too small for the ranks
            assert err.setting in ("window", "tail") and config.tail != "pad"
            assert config.tail == "drop" or expected.size < world * acc
            all_planned = False
            continue
        except ValueError as err:
            assert "More ranks than batches" in str(err)
            assert config.tail != "pad"
            assert config.tail == "drop" or expected.size < world * acc
            all_planned = False
            continue
        # Only the window's own shards were asked for their lengths.
        assert set(calls) <= {s for s, _, _ in spans}
        assert np.array_equal(wplan.ids, expected)  # local ids = positions in the window
        plan = wplan.plan
        # Equal micro-batches on every rank, whole optimizer steps, none empty, none over budget.
        per_rank = [plan.rank_micro_batches(r).size for r in range(world)]
        assert len(set(per_rank)) == 1 and per_rank[0] == plan.num_micro_batches_per_rank
        # a window too small for one step under "drop", after the run's first, is dropped whole
        whole = config.tail == "drop" and plan.num_dropped == expected.size and (epoch, w) != (0, 0)
        assert per_rank[0] % acc == 0 and (per_rank[0] > 0 or whole)
        for r in range(world):
            for t in plan.rank_micro_batches(r).tolist():
                ids = wplan.micro_batch_ids(t)
                assert ids.size >= 1
                assert set(ids.tolist()) <= set(expected.tolist())
                assert ids.size * int(key[ids].max()) <= config.max_tokens
        seen.update(wplan.example_ids().tolist())
        dropped += plan.num_dropped
        duplicated += plan.num_duplicated
        # Same seed and epoch: the same plan, from a fresh planner.
        again = WindowedPlanner(
            rows, lengths.__getitem__, config, window=case["window"], shuffle_shards=case["shuffle"]
        ).window_plan(epoch, w, world, acc)
        for r in range(world):
            assert np.array_equal(again.example_ids(r), wplan.example_ids(r))
    if not all_planned:
        return
    if config.tail == "drop":
        assert max(seen.values(), default=1) == 1 and n - len(seen) == dropped
    elif duplicated == 0:  # spread with enough examples (or pad that needed none)
        assert sorted(seen.elements()) == list(range(n))
    else:
        assert set(seen) == set(range(n)) and sum(seen.values()) - n == duplicated


def test_shard_order_changes_with_the_epoch_and_seed_only() -> None:
    rows = [3] * 12
    config = PlanConfig(max_tokens=20)
    wp = WindowedPlanner(rows, lambda s: np.full(3, 2), config, window=7)
    orders = [tuple(wp.shard_order(e).tolist()) for e in range(6)]
    assert len(set(orders)) == 6
    same = WindowedPlanner(rows, lambda s: np.full(3, 2), config, window=7)
    assert [tuple(same.shard_order(e).tolist()) for e in range(6)] == orders
    other_seed = WindowedPlanner(rows, lambda s: np.full(3, 2), PlanConfig(20, seed=1), window=7)
    assert tuple(other_seed.shard_order(0).tolist()) != orders[0]
    fixed = WindowedPlanner(rows, lambda s: np.full(3, 2), config, window=7, shuffle_shards=False)
    assert {tuple(fixed.shard_order(e).tolist()) for e in range(3)} == {tuple(range(12))}


# ------------------------------------------------------------------ shard data on disk

SHARD_ROWS = (17, 0, 23, 11, 14)  # one empty shard
NUM_ITEMS = sum(SHARD_ROWS)
MAX_TOKENS = 64
WINDOW = 20
KINDS = ["jsonl", "parquet", "arrow", "hf_parquet", "litdata"]


def make_item(i: int) -> dict:
    """Example ``i``: its source starts with ``i + 1`` (no token is 0, the pad id)."""
    rng = np.random.default_rng(1000 + i)
    n_src, n_tgt = int(rng.integers(1, 25)), int(rng.integers(1, 17))
    return {
        "source": [i + 1, *rng.integers(1, 1000, n_src - 1).tolist()],
        "target": rng.integers(1, 1000, n_tgt).tolist(),
        "id": i,
    }


ITEMS = [make_item(i) for i in range(NUM_ITEMS)]
TGT_LEN = np.array([len(it["target"]) for it in ITEMS])


def litdata_item(i: int) -> dict:
    item = make_item(i)
    return {**item, "source": np.asarray(item["source"], dtype=np.int64)}


@pytest.fixture(scope="module", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory):
    """The default cache folder (cache_dir=True) in a temporary folder, never the user's."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LIGHTNING_VARBATCH_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


def write_shards(folder: Path, kind: str, shard_rows=SHARD_ROWS, first: int = 0) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    schema = pa.Table.from_pylist(ITEMS[:1]).schema
    start = first
    for s, count in enumerate(shard_rows):
        items = [make_item(i) for i in range(start, start + count)]
        start += count
        table = pa.Table.from_pylist(items, schema=schema)
        if kind == "parquet":
            pq.write_table(table, folder / f"part-{s}.parquet", row_group_size=5)
        elif kind == "arrow":
            with pa.ipc.new_file(str(folder / f"part-{s}.arrow"), schema) as writer:
                writer.write_table(table, max_chunksize=6)
        else:
            (folder / f"part-{s}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in items))


@pytest.fixture(scope="module")
def data_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("streams")
    for kind in ("jsonl", "parquet", "arrow"):
        write_shards(root / kind, kind)
    # datasets cannot stream an empty parquet file (pyarrow: "BatchSize must be > 0")
    write_shards(root / "hf_parquet", "parquet", tuple(r for r in SHARD_ROWS if r))
    return root


@pytest.fixture(scope="module")
def litdata_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import litdata  # the streaming extra: installed by the test command, never skipped

    out = tmp_path_factory.mktemp("litdata") / "optimized"
    method = multiprocessing.get_start_method(allow_none=True)
    try:
        litdata.optimize(
            fn=litdata_item,
            inputs=list(range(NUM_ITEMS)),
            output_dir=str(out),
            chunk_size=16,
            num_workers=1,
            verbose=False,
            start_method="fork",  # its default, spawn, re-imports torch in a fresh process
        )
    finally:  # optimize sets the process-wide start method to "spawn": slow DataLoader workers
        multiprocessing.set_start_method(method, force=True)
    return out


@pytest.fixture
def make(data_root: Path, request: pytest.FixtureRequest):
    """``make(kind)``: a fresh ShardedSource (fresh read counts) over the kind's shards."""

    def _make(kind: str) -> ShardedSource:
        columns = ("source", "target")
        if kind in ("jsonl", "parquet", "arrow"):
            return shards_from_files(data_root / kind, columns)
        if kind == "hf_parquet":
            import datasets  # the hf extra: installed by the test command, never skipped

            from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable

            files = sorted(str(p) for p in (data_root / kind).iterdir())
            ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True)
            return shards_from_hf_iterable(ds, columns)
        from lightning_varbatch.sources.litdata_shards import shards_from_litdata

        return shards_from_litdata(request.getfixturevalue("litdata_dir"), columns)

    return _make


def stream(source: ShardedSource, rank: int, world: int, **kwargs: Any) -> StreamingBatches:
    settings_ = {"max_tokens": MAX_TOKENS, "window": WINDOW, **kwargs}
    return StreamingBatches(source, rank=rank, world_size=world, **settings_)


def decode(batch: dict) -> list[int]:
    """The example ids of a batch, from its real (masked) tokens, each checked against the data."""
    ids = []
    for row in range(batch["source"].shape[0]):
        src = batch["source"][row][batch["source_mask"][row]].tolist()
        tgt = batch["target"][row][batch["target_mask"][row]].tolist()
        i = src[0] - 1
        assert src == ITEMS[i]["source"] and tgt == ITEMS[i]["target"]
        assert int(batch["id"][row]) == i
        # padding is the pad id, outside the mask only
        assert not batch["source"][row][~batch["source_mask"][row]].any()
        ids.append(i)
    return ids


def check_batch(batch: dict) -> list[int]:
    ids = decode(batch)
    assert batch["source"].numel() <= MAX_TOKENS and batch["target"].numel() <= MAX_TOKENS
    assert int(batch["ntokens"]) == int(TGT_LEN[ids].sum())
    assert int(batch["nexamples"]) == len(ids)
    return ids


def same_batches(a: list[dict], b: list[dict]) -> bool:
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x.keys() != y.keys():
            return False
        for k in x:
            if isinstance(x[k], torch.Tensor):
                if not (x[k].dtype == y[k].dtype and torch.equal(x[k], y[k])):
                    return False
            elif x[k] != y[k]:
                return False
    return True


# ------------------------------------------------------------------ 2. end to end


@pytest.mark.parametrize("kind", KINDS)
def test_every_rank_streams_every_example_once(kind: str, make) -> None:
    for world, acc in [(1, 1), (2, 2), (3, 1)]:
        per_rank = []
        for rank in range(world):
            source = make(kind)
            batches = list(stream(source, rank, world, accumulate_grad_batches=acc))
            per_rank.append(batches)
            for s, shard in enumerate(source.shards):
                assert shard.stats.backward_seeks == 0, (kind, world, rank, s)
        counts = {len(b) for b in per_rank}
        assert len(counts) == 1, (kind, world, counts)  # equal micro-batch counts: no hang
        count = counts.pop()
        assert count % acc == 0
        ids_per_rank = [[check_batch(b) for b in batches] for batches in per_rank]
        everything = [i for ids in ids_per_rank for batch in ids for i in batch]
        assert sorted(everything) == list(range(NUM_ITEMS)), (kind, world)
        # One optimizer step = micro-batches [g*acc, (g+1)*acc) of every rank.
        for g in range(count // acc):
            step = [(r, j) for r in range(world) for j in range(g * acc, (g + 1) * acc)]
            tokens = sum(int(TGT_LEN[ids_per_rank[r][j]].sum()) for r, j in step)
            examples = sum(len(ids_per_rank[r][j]) for r, j in step)
            for r, j in step:
                assert int(per_rank[r][j]["step_ntokens"]) == tokens
                assert int(per_rank[r][j]["step_nexamples"]) == examples


@pytest.mark.parametrize("kind", KINDS)
def test_two_workers_yield_the_same_batches(kind: str, make) -> None:
    single = list(DataLoader(stream(make(kind), 1, 2), batch_size=None, num_workers=0))
    two = list(DataLoader(stream(make(kind), 1, 2), batch_size=None, num_workers=2))
    assert len(single) > 2
    assert same_batches(two, single)


def test_another_epoch_another_order_same_coverage(make) -> None:
    batches = {e: [] for e in (0, 1)}
    for epoch in (0, 1):
        for rank in range(2):
            sb = stream(make("jsonl"), rank, 2)
            sb.set_epoch(epoch)
            batches[epoch].append([check_batch(b) for b in sb])
    for epoch in (0, 1):
        assert sorted(i for r in batches[epoch] for b in r for i in b) == list(range(NUM_ITEMS))
    assert batches[0] != batches[1]


# ------------------------------------------------------------------ 3. resume


def run_all(kind: str, make, world: int, acc: int = 1) -> list[list[dict]]:
    return [list(stream(make(kind), r, world, accumulate_grad_batches=acc)) for r in range(world)]


@pytest.fixture(scope="module")
def full_runs(data_root: Path) -> dict:
    """Uninterrupted jsonl runs per world size (module cache: they are compared often)."""
    out = {}
    for world in (1, 2, 3):
        out[world] = [
            list(stream(shards_from_files(data_root / "jsonl", ("source", "target")), r, world))
            for r in range(world)
        ]
    return out


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(world=st.integers(1, 3), where=st.floats(0, 1, exclude_max=True))
def test_resume_continues_with_exactly_the_remaining_batches(
    world: int, where: float, full_runs: dict, make
) -> None:
    full = full_runs[world]
    k = int(where * len(full[0]))
    states = [stream(make("jsonl"), r, world).state_dict(trained=k) for r in range(world)]
    assert all(s == states[0] for s in states)  # the position is the same on every rank
    for rank in range(world):
        source = make("jsonl")
        sb = stream(source, rank, world)
        sb.load_state_dict(states[0])
        rest = list(sb)
        assert same_batches(rest, full[rank][k:]), (world, k, rank)
        # Resume reads only the remaining rows (the index comes from the cache).
        assert source.stats.rows_read == sum(int(b["nexamples"]) for b in rest)
        assert all(sh.stats.backward_seeks == 0 for sh in source.shards)


@pytest.mark.parametrize("world", [1, 2])
def test_resume_at_the_end_of_the_epoch_yields_nothing(world: int, full_runs: dict, make) -> None:
    """A checkpoint after the epoch's last micro-batch (what state_dict saves) must load."""
    total = len(full_runs[world][0])
    state = stream(make("jsonl"), 0, world).state_dict(trained=total)
    for rank in range(world):
        sb = stream(make("jsonl"), rank, world)
        sb.load_state_dict(state)
        assert list(sb) == []


def test_the_checkpoint_half_saves_the_position_after_trained_micro_batches(make) -> None:
    """``ResumableStream`` saves the window, its micro-batches done and the ledger of them."""
    sb = stream(make("jsonl"), 0, 2)
    assert isinstance(sb, ResumableStream)
    sizes = [sb.window_plan(w).plan.num_micro_batches_per_rank for w in range(3)]
    trained = sizes[0] + 1  # one micro-batch into the second window
    state = sb.state_dict(trained=trained)
    assert (state["window"], state["consumed"]) == (1, 1)
    assert state["steps"] == sb.window_plan(0).plan.num_steps
    assert state["ledger"]["examples"] == sb.window_plan(1).plan.consumed_ids(1).size
    with pytest.raises(ValueError, match="Not a StreamingBatches state"):
        sb.load_state_dict({"epoch": 0})


def test_resume_with_two_workers(full_runs: dict, make) -> None:
    full = full_runs[2]
    k = len(full[0]) // 2 + 1
    state = stream(make("jsonl"), 0, 2).state_dict(trained=k)
    sb = stream(make("jsonl"), 1, 2)
    sb.load_state_dict(state)
    assert same_batches(list(DataLoader(sb, batch_size=None, num_workers=2)), full[1][k:])


def _consume(
    make, state: dict | None, world: int, acc: int, k: int | None
) -> tuple[list[int], dict | None, list[int]]:
    """Ranks of ``world`` resume at ``state`` and run ``k`` micro-batches each (None: to the end).

    Returns the examples they ran, the state after them, and each rank's count.
    """
    seen: list[int] = []
    counts = []
    saved = None
    for rank in range(world):
        sb = stream(make("jsonl"), rank, world, accumulate_grad_batches=acc)
        if state is not None:
            sb.load_state_dict(state)
        batches = list(sb)
        counts.append(len(batches))
        take = batches if k is None else batches[:k]
        seen.extend(i for b in take for i in check_batch(b))
        if k is not None:
            s = sb.state_dict(trained=min(k, len(batches)))
            assert saved is None or s == saved
            saved = s
    return seen, saved, counts


@pytest.mark.parametrize(
    "chain",
    [
        [(2, 1, 3), (3, 1, None)],
        [(3, 1, 5), (1, 1, None)],
        [(2, 2, 4), (3, 1, None)],
        [(2, 1, 1), (1, 1, 2), (2, 1, None)],  # two topology changes inside one window
        [(2, 1, 4), (1, 1, 7), (2, 1, None)],
        [(2, 1, 2), (1, 1, 1), (2, 1, 1), (1, 1, 3), (2, 1, None)],  # 2 -> 1 -> 2, twice
    ],
)
def test_resume_with_another_world_size_loses_and_repeats_nothing(chain: list, make) -> None:
    state = None
    everything: list[int] = []
    for world, acc, k in chain:
        seen, state, counts = _consume(make, state, world, acc, k)
        assert len(set(counts)) == 1, (world, counts)  # equal counts on the new ranks
        everything += seen
    assert sorted(everything) == list(range(NUM_ITEMS))


@pytest.mark.parametrize(
    ("changed", "named"),
    [
        ("max_tokens", r"max_tokens\D*64\D+96"),
        ("window", r"window\D*20\D+32"),
    ],
)
def test_resume_refuses_a_state_of_other_settings_naming_what_differs(
    changed: str, named: str, make
) -> None:
    """Like the sampler's load_state_dict: the message says which setting differs, and how."""
    state = stream(make("jsonl"), 0, 2).state_dict(trained=3)
    sb = stream(make("jsonl"), 0, 2, **{changed: {"max_tokens": 96, "window": 32}[changed]})
    with pytest.raises(ResumeMismatchError, match=named) as caught:
        sb.load_state_dict(state)
    assert caught.value.changed == [changed]


# ------------------------------------------------------------------ 3b. shard identity


def _run_rest(source: ShardedSource, state: dict, world: int = 2) -> list[list[dict]]:
    out = []
    for rank in range(world):
        sb = stream(source, rank, world)
        sb.load_state_dict(state)
        out.append(list(sb))
    return out


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow", "litdata"])
def test_identical_shards_in_another_folder_resume_exactly(
    kind: str, data_root: Path, tmp_path: Path, make, request: pytest.FixtureRequest
) -> None:
    """Node-local disk: the same files copied elsewhere (new mtimes, cold cache) resume."""
    import shutil

    full = [list(stream(make(kind), r, 2)) for r in range(2)]
    k = len(full[0]) // 2
    state = stream(make(kind), 0, 2).state_dict(trained=k)
    if kind == "litdata":
        folder = request.getfixturevalue("litdata_dir")
        shutil.copytree(folder, tmp_path / "local")  # copytree copies mtimes: touch them
        from lightning_varbatch.sources.litdata_shards import shards_from_litdata

        for f in (tmp_path / "local").iterdir():
            f.touch()
        copy = shards_from_litdata(tmp_path / "local", ("source", "target"), cache_dir=tmp_path)
    else:
        (tmp_path / "local").mkdir()
        for f in (data_root / kind).iterdir():
            shutil.copy(f, tmp_path / "local" / f.name)  # new mtime: the index is rebuilt
        copy = shards_from_files(tmp_path / "local", ("source", "target"), cache_dir=tmp_path)
    assert copy.fingerprint() != make(kind).fingerprint()  # other paths...
    assert copy.content_fingerprint() == make(kind).content_fingerprint()  # ...same content
    rest = _run_rest(copy, state)
    for rank in range(2):
        assert same_batches(rest[rank], full[rank][k:])
    # the ranks agree on the stream whatever folder each reads (the rank-agreement check)
    assert stream(copy, 0, 2).fingerprint() == stream(make(kind), 1, 2).fingerprint()


def test_a_position_saved_before_shard_identities_still_resumes(full_runs: dict, make) -> None:
    """Checkpoints of the earlier format (no shard_identity): same shards, same path resume."""
    full = full_runs[2]
    k = 5
    state = stream(make("jsonl"), 0, 2).state_dict(trained=k)
    old = {key: value for key, value in state.items() if key != "shard_identity"}
    for rank in range(2):
        sb = stream(make("jsonl"), rank, 2)
        sb.load_state_dict(old)
        assert same_batches(list(sb), full[rank][k:])


def test_an_old_position_on_moved_shards_says_to_resume_from_the_original_folder(
    data_root: Path, tmp_path: Path, make
) -> None:
    import shutil

    state = stream(make("jsonl"), 0, 2).state_dict(trained=3)
    old = {key: value for key, value in state.items() if key != "shard_identity"}
    shutil.copytree(data_root / "jsonl", tmp_path / "moved")
    sb = stream(shards_from_files(tmp_path / "moved", ("source", "target")), 0, 2)
    with pytest.raises(ResumeMismatchError, match="original folder") as caught:
        sb.load_state_dict(old)
    assert caught.value.changed == ["shards"]


def _copy_jsonl(src: Path, dst: Path, order: list[int] | None = None) -> list[Path]:
    import shutil

    dst.mkdir()
    files = sorted(src.glob("*.jsonl"))
    for f in files:
        shutil.copy(f, dst / f.name)
    copied = [dst / f.name for f in files]
    return copied if order is None else [copied[i] for i in order]


def test_reordered_shards_are_refused_naming_which_moved(
    data_root: Path, tmp_path: Path, make
) -> None:
    state = stream(make("jsonl"), 0, 2).state_dict(trained=3)
    files = _copy_jsonl(data_root / "jsonl", tmp_path / "c", order=[2, 0, 1, 3, 4])
    sb = stream(shards_from_files(files, ("source", "target")), 0, 2)
    with pytest.raises(ResumeMismatchError) as caught:
        sb.load_state_dict(state)
    text = str(caught.value)
    assert caught.value.changed == ["shards"]
    assert "the same 5 shards in another order" in text
    assert "part-2.jsonl was shards[2], now shards[0]" in text
    assert "part-0.jsonl was shards[0], now shards[1]" in text
    assert "part-3.jsonl" not in text  # it did not move


@pytest.mark.parametrize(
    ("edit", "named"),
    [
        ("append", r"part-3\.jsonl changed \(11 rows saved, 12 now"),
        ("longer", r"part-3\.jsonl changed \(the same number of rows with other lengths"),
        ("retoken", r"part-3\.jsonl changed \(\d+ bytes saved, \d+ now\)"),
        ("remove", r"part-3\.jsonl is missing"),
        ("add", r"part-9\.jsonl was added"),
    ],
)
def test_changed_shards_are_refused_naming_the_file_and_what_changed(
    edit: str, named: str, data_root: Path, tmp_path: Path, make
) -> None:
    state = stream(make("jsonl"), 0, 2).state_dict(trained=3)
    files = _copy_jsonl(data_root / "jsonl", tmp_path / "c")
    target = tmp_path / "c" / "part-3.jsonl"
    rows = [json.loads(line) for line in target.read_text().splitlines()]
    if edit == "append":
        rows.append(make_item(999))
    elif edit == "longer":
        rows[0]["source"] = rows[0]["source"] + [7] * 30
    elif edit == "retoken":  # same lengths, other token ids (one more digit)
        rows[0]["target"] = [t + 1000 for t in rows[0]["target"]]
    elif edit == "remove":
        files.remove(target)
    else:
        (tmp_path / "c" / "part-9.jsonl").write_text(json.dumps(make_item(1)) + "\n")
        files.append(tmp_path / "c" / "part-9.jsonl")
    if edit in ("append", "longer", "retoken"):
        target.write_text("".join(json.dumps(r) + "\n" for r in rows))
    sb = stream(shards_from_files(files, ("source", "target")), 0, 2)
    with pytest.raises(ResumeMismatchError, match=named) as caught:
        sb.load_state_dict(state)
    assert caught.value.changed == ["shards"]
    assert "part-0.jsonl" not in str(caught.value)  # unchanged files are not blamed


def test_other_columns_are_refused_naming_them(data_root: Path, make) -> None:
    state = stream(make("jsonl"), 0, 2).state_dict(trained=3)
    sb = stream(shards_from_files(data_root / "jsonl", ("target", "source")), 0, 2)
    with pytest.raises(ResumeMismatchError, match=r"columns saved \['source', 'target'\]"):
        sb.load_state_dict(state)


# ------------------------------------------------------------------ 3c. impossible settings


def test_a_window_too_small_for_the_ranks_names_the_window_that_works(make) -> None:
    source = make("jsonl")  # 65 examples
    with pytest.raises(SettingValueError, match=r"set window >= (\d+)") as caught:
        list(stream(source, 0, 4, window=3, accumulate_grad_batches=2))
    assert caught.value.setting == "window" and caught.value.value == 3
    smallest = int(re.search(r"window >= (\d+)", str(caught.value)).group(1))
    counts = {
        len(list(stream(make("jsonl"), r, 4, window=smallest, accumulate_grad_batches=2)))
        for r in range(4)
    }
    assert len(counts) == 1  # the window it names works
    with pytest.raises(SettingValueError, match="window"):
        list(stream(make("jsonl"), 0, 4, window=smallest - 1, accumulate_grad_batches=2))


def test_tail_drop_on_a_window_too_small_to_keep_a_step_names_window_and_tail(make) -> None:
    with pytest.raises(SettingValueError, match=r"drop them all: set window to about") as e:
        list(stream(make("jsonl"), 0, 4, window=6, tail="drop", max_tokens=512))
    assert e.value.setting == "window" and "tail='spread'" in str(e.value)
    assert "more data" not in str(e.value)


def test_a_stream_too_small_for_the_ranks_names_tail(make) -> None:
    with pytest.raises(SettingValueError, match=r"only 65 examples.*tail='pad'") as caught:
        list(stream(make("jsonl"), 0, 70))
    assert caught.value.setting == "tail"
    assert "more data" not in str(caught.value)
    assert len(list(stream(make("jsonl"), 0, 70, tail="pad"))) >= 1


@pytest.mark.parametrize("kind", ["jsonl", "parquet", "arrow"])
def test_an_example_over_the_budget_names_its_file_and_row(
    kind: str, data_root: Path, make
) -> None:
    source = make(kind)
    lengths = source.lengths().max(axis=1)
    budget = int(lengths.max()) - 1
    longest = int(np.argmax(lengths))
    shard = int(np.searchsorted(source.offsets, longest, side="right") - 1)
    row = longest - int(source.offsets[shard])
    with pytest.raises(SettingValueError) as caught:
        list(stream(source, 0, 1, max_tokens=budget, window=1000))
    text = str(caught.value)
    assert caught.value.setting == "max_tokens"
    assert f"part-{shard}.{kind}" in text and f"row {row} " in text
    assert f"max_tokens >= {int(lengths.max())}" in text


# ------------------------------------------------------------------ 4. parity with offline


@pytest.mark.parametrize(
    ("max_tokens", "num", "window", "windows"),
    [
        (4096, 50_000, 10_000, 5),  # the 10k window: ~90 micro-batches per window
        (16384, 400_000, None, 5),  # 10k would be only ~23 micro-batches (7 % more padding):
    ],  # the default window holds ~200 micro-batches (auto_window)
)
def test_windowed_padding_is_within_two_percent_of_the_offline_plan(
    max_tokens: int, num: int, window: int | None, windows: int
) -> None:
    lengths = wmt_like_lengths(num, seed=3)
    shards = np.array_split(lengths, 10)
    config = PlanConfig(max_tokens=max_tokens)
    wp = WindowedPlanner([s.shape[0] for s in shards], shards.__getitem__, config, window=window)
    assert wp.num_windows == windows
    real = padded = 0
    covered = []
    key = lengths.max(axis=1)
    imbalance = []
    for w in range(wp.num_windows):
        window_plan = wp.window_plan(0, w, world_size=4, accumulate_grad_batches=2)
        diag = diagnose(window_plan.planner, window_plan.plan)
        real, padded = real + diag.real_tokens, padded + diag.padded_tokens
        imbalance.append(diag.imbalance_linear_mean)
        covered.append(window_plan.example_ids())
        run = window_plan.plan.assign.reshape(-1)
        sizes = window_plan.plan.micro_batch_size[run]
        longest = np.array([key[window_plan.micro_batch_ids(t)].max() for t in run.tolist()])
        assert (sizes * longest <= config.max_tokens).all()
    assert np.array_equal(np.sort(np.concatenate(covered)), np.arange(num))
    assert real == int(key.sum())
    planner = EpochPlanner(lengths, config)
    offline = diagnose(planner, planner.plan(0, world_size=4, accumulate_grad_batches=2))
    assert real / padded >= offline.padding_efficiency - 0.02
    assert np.mean(imbalance) <= offline.imbalance_linear_mean + 0.01


# ------------------------------------------------------------------ 5. bad inputs


def test_bad_inputs(data_root: Path, tmp_path: Path, make) -> None:
    source = make("jsonl")
    with pytest.raises(TypeError, match="ShardedSource"):
        StreamingBatches([ITEMS], max_tokens=64, rank=0, world_size=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="window"):
        StreamingBatches(source, max_tokens=64, window=0, rank=0, world_size=1)
    with pytest.raises(ValueError, match="max_shapes"):
        StreamingBatches(source, max_tokens=64, max_shapes=2, rank=0, world_size=1)
    with pytest.raises(ValueError, match="max_shapes"):
        WindowedPlanner([3], lambda s: np.ones(3), PlanConfig(8, max_shapes=2))

    class Wrong(ParquetShard):
        def lengths(self) -> np.ndarray:
            return super().lengths()[:-1]

    path = data_root / "parquet" / "part-0.parquet"
    with pytest.raises(ValueError, match=r"shards\[0\] .*shape \(16, 2\), expected \(17,\)"):
        ShardedSource([Wrong(path, ("source", "target"))])
    # lengths that stop matching the rows later are refused when the window is planned
    wp = WindowedPlanner([4, 4], lambda s: np.ones(3 + s), PlanConfig(8), window=8)
    with pytest.raises(ValueError, match=r"shard 0 has 4 rows but its lengths have 3"):
        wp.window_plan(0, 0)
