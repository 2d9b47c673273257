"""DDP, FSDP and DeepSpeed in real processes over gloo, with token-budgeted batches.

Each strategy runs once (2 processes, ``accumulate_grad_batches=2``, 3 optimizer steps, SGD with
lr=1) through ``tests/scripts/strategy_train.py``; the tests below check the records every rank
wrote: completion, step counts, identical parameters, and that the first update equals the
single-process update on the union of that step's micro-batches with the token-mean loss.
DDP, FSDP and DeepSpeed ZeRO 2 also run once with the same sequences as a Hugging Face dataset
(``--source hf``: ``TokenBudgetDataModule(ds, "tokens", ...)``, each micro-batch one Arrow read),
checked against the same reference. And once with padding-free packing (``--layout packed``:
``layout="packed"``, ``loss_lengths = lengths - 1``, ``PackingCollate`` rows, a causal attention
model through ``document_attention``, ``step_token_mean``), checked against the float64 update
computed from every document of the step run alone. DDP and DeepSpeed ZeRO 2 also run with a
And DDP, FSDP and DeepSpeed ZeRO 2 run once each as a mixed cluster
(``--rank-shares 1.0,0.5 --rank-max-tokens 48,20``: rank 1 half as fast, its memory binding,
budgets 40 and 20) with a length warm-up over all their steps (``--length-warmup 3``): rank
1's micro-batches are smaller, the caps grow, and every step's update, not only the first,
equals the float64 token mean of the step's micro-batches (one run checks both policies of
the planner: the strategies see only micro-batches).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.launch import launch
from tests.scripts.hf_source import save_shards
from tests.scripts.strategy_common import (
    ACCUMULATE,
    MAX_TOKENS,
    NUM_EXAMPLES,
    RANK_BUDGETS,
    RANK_MAX_TOKENS,
    RANK_SHARES,
    WARMUP_MIN,
    make_sequences,
    sequence_columns,
)
from tests.strategies._reference import (
    packed_reference_update,
    params_of,
    reference_update,
    step_micro_batches,
)

#: Every test here reads a run of real processes (several tests share one run per key).
pytestmark = pytest.mark.multiprocess

WORLD_SIZE = 2
STEPS = 3
TIMEOUT = 150.0
# float32 training vs a float64 reference: updates agree to ~1e-7 here; the naive recipe
# misses by ~1e-3.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}

CORE = ["ddp", "fsdp_varbatch", "deepspeed_varbatch_stage_2", "deepspeed_varbatch_stage_3"]
EXTRA = [
    "deepspeed_varbatch_stage_0",
    "deepspeed_varbatch_stage_1",
    "deepspeed_varbatch_stage_2_offload",
    "deepspeed_varbatch_stage_3_offload",
]

# One run per strategy with a Hugging Face dataset as the source (the cheapest ZeRO stage).
HF = ["ddp", "fsdp_varbatch", "deepspeed_varbatch_stage_2"]
# One run per strategy with packed rows (``--layout packed``, the cheapest ZeRO stage).
PACKED = ["ddp", "fsdp_varbatch", "deepspeed_varbatch_stage_2"]
# One run per strategy streaming the same sequences from parquet shards (StreamingDataModule).
STREAM = ["ddp", "fsdp_varbatch", "deepspeed_varbatch_stage_2"]
# One run each as a mixed cluster (unequal rank shares and memory budgets, ``--rank-shares``)
# with a length warm-up over every step of the run (``--length-warmup``).
SHARES = ["ddp", "fsdp_varbatch", "deepspeed_varbatch_stage_2"]
# (strategy, source): the list runs keep their test ids, the HF runs are "<strategy>-hf", the
# streamed runs "<strategy>-stream".
CORE_AND_HF = (
    [pytest.param(s, "list", id=s) for s in CORE]
    + [pytest.param(s, "hf", id=f"{s}-hf") for s in HF]
    + [pytest.param(s, "stream", id=f"{s}-stream") for s in STREAM]
)
# (strategy, source, layout): the padded runs above, then the packed runs "<strategy>-packed".
ALL_LAYOUTS = [pytest.param(*p.values, "padded", id=p.id) for p in CORE_AND_HF] + [
    pytest.param(s, "list", "packed", id=f"{s}-packed") for s in PACKED
]

_runs: dict[tuple[str, str, str], list[dict[str, Any]]] = {}


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    """The float64 references are tiny: a second intra-op thread contends on a busy machine.

    Measured on a loaded 2-core machine: one packed reference update in 6 s with two threads,
    0.06 s with one. The ranks already run one thread each (``tests.launch.rank_env``).
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def run(
    strategy: str,
    tmp_path_factory: pytest.TempPathFactory,
    source: str = "list",
    layout: str = "padded",
    length_warmup: int | None = None,
    rank_shares: bool = False,
) -> list[dict[str, Any]]:
    """Every rank's record of one run of ``strategy`` (run once per test session).

    ``rank_shares``: as a mixed cluster (``RANK_SHARES`` and ``RANK_MAX_TOKENS``).
    """
    key = (strategy, source, layout)
    if length_warmup is not None or rank_shares:
        policies = ("warmup",) * (length_warmup is not None) + ("shares",) * rank_shares
        key = (strategy, source, "+".join(policies))
    if key not in _runs:
        extra: tuple[str, ...] = ()
        if source == "stream":
            shards = tmp_path_factory.mktemp(f"{strategy}-shards")
            save_shards(sequence_columns(), shards)
            extra = ("--source", f"stream:{shards}")
        elif source != "list":
            import datasets  # noqa: F401  (the hf extra is part of the test install)

            extra = ("--source", source)
        if layout != "padded":
            extra = (*extra, "--layout", layout)
        if length_warmup is not None:
            extra = (*extra, "--length-warmup", str(length_warmup))
        if rank_shares:
            extra = (*extra, "--rank-shares", ",".join(map(str, RANK_SHARES)))
            extra = (*extra, "--rank-max-tokens", ",".join(map(str, RANK_MAX_TOKENS)))
        out = tmp_path_factory.mktemp("-".join(key))
        _runs[key] = launch("strategy_train.py", WORLD_SIZE, out, strategy, *extra, timeout=TIMEOUT)
    return _runs[key]


def assert_read_as_arrow(records: list[dict[str, Any]]) -> None:
    """Every rank's loader read the Hugging Face dataset, every micro-batch as one Arrow table."""
    for r in records:
        assert r["source"] == "hf"
        assert r["loader"]["part_types"] == ["datasets.Dataset"], r["loader"]
        assert r["loader"]["columnar"] is True, r["loader"]
        assert {m["collated_from"] for m in r["micro_batches"]} == {"ColumnarItems"}


def max_update_error(
    records: list[dict[str, Any]], expected: dict[str, torch.Tensor]
) -> dict[str, float]:
    init, after = params_of(records[0]["init"]), params_of(records[0]["params"]["1"])
    return {
        n: float(((after[n] - init[n]) - (expected[n] - init[n])).abs().max()) for n in expected
    }


@pytest.mark.parametrize(("strategy", "source", "layout"), ALL_LAYOUTS)
def test_every_rank_trains_the_same_steps_and_parameters(
    strategy: str, source: str, layout: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = run(strategy, tmp_path_factory, source, layout)
    if source == "hf":
        assert_read_as_arrow(records)
    assert {r["layout"] for r in records} == {layout}
    assert [r["rank"] for r in records] == list(range(WORLD_SIZE))
    assert {r["world_size"] for r in records} == {WORLD_SIZE}
    assert [r["global_step"] for r in records] == [STEPS] * WORLD_SIZE
    # Every rank ran STEPS x ACCUMULATE micro-batches, in plan order.
    for r in records:
        order = [(m["step"], m["micro"]) for m in r["micro_batches"]]
        assert order == [(s, k) for s in range(STEPS) for k in range(ACCUMULATE)]
    # The batches really vary: in examples per micro-batch, across ranks and steps.
    sizes = [[len(m["ids"]) for m in r["micro_batches"]] for r in records]
    assert len({n for row in sizes for n in row}) > 2
    assert sizes[0] != sizes[1]
    # No example twice within the epoch, over all ranks.
    seen = [i for r in records for m in r["micro_batches"] for i in m["ids"]]
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(NUM_EXAMPLES))
    # Same initial and same updated parameters on every rank, after every step.
    assert records[0]["init"] == records[1]["init"]
    for r in records:
        assert sorted(r["params"], key=int) == [str(s) for s in range(1, STEPS + 1)]
    for step in records[0]["params"]:
        assert records[0]["params"][step] == records[1]["params"][step], step
    assert records[0]["params"][str(STEPS)] != records[0]["init"]


@pytest.mark.parametrize(
    ("strategy", "source", "layout"),
    ALL_LAYOUTS + [pytest.param(s, "list", "padded", id=s) for s in EXTRA],
)
def test_update_equals_single_process_token_mean(
    strategy: str, source: str, layout: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = run(strategy, tmp_path_factory, source, layout)
    reference = packed_reference_update if layout == "packed" else reference_update
    expected = reference(records[0]["init"], step_micro_batches(records, 0))
    init, after = params_of(records[0]["init"]), params_of(records[0]["params"]["1"])
    for name, value in expected.items():
        torch.testing.assert_close(after[name] - init[name], value - init[name], **TOLERANCE)
    if strategy in EXTRA:  # steps and parameter identity, for the stages not covered above
        assert [r["global_step"] for r in records] == [STEPS] * WORLD_SIZE
        assert records[0]["params"][str(STEPS)] == records[1]["params"][str(STEPS)]


def assert_every_step_is_the_token_mean(records: list[dict[str, Any]]) -> None:
    """Every step's update equals the float64 token mean of its micro-batches; ranks agree."""
    params = [records[0]["init"]] + [records[0]["params"][str(s)] for s in range(1, STEPS + 1)]
    for step in range(STEPS):
        expected = reference_update(params[step], step_micro_batches(records, step))
        before, after = params_of(params[step]), params_of(params[step + 1])
        for name, value in expected.items():
            delta = after[name] - before[name]
            torch.testing.assert_close(delta, value - before[name], **TOLERANCE)
    for step in records[0]["params"]:
        assert records[0]["params"][step] == records[1]["params"][step], step


@pytest.mark.parametrize("strategy", SHARES)
def test_update_equals_single_process_token_mean_during_a_length_warmup(
    strategy: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Every step of the run is a warm-up step (--length-warmup STEPS): the first ones hold only
    # short sequences, more of them per step; each step's update is still the float64 token
    # mean over the union of its micro-batches, and the ranks agree.
    records = run(strategy, tmp_path_factory, length_warmup=STEPS, rank_shares=True)
    lengths = [len(s) for s in make_sequences()]
    caps = records[0]["caps"]
    assert all(r["caps"] == caps for r in records)
    assert caps == sorted(caps) and WARMUP_MIN <= caps[0] < max(lengths)
    for step in range(STEPS):
        micro_batches = step_micro_batches(records, step)
        assert max(lengths[i] for ids in micro_batches for i in ids) <= caps[step]
    assert_every_step_is_the_token_mean(records)


def padded_cost(ids: list[int], lengths: list[int]) -> int:
    """What a padded micro-batch costs the planner: examples x the longest."""
    return len(ids) * max(lengths[i] for i in ids)


@pytest.mark.parametrize("strategy", SHARES)
def test_update_equals_single_process_token_mean_with_unequal_rank_shares(
    strategy: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Rank 1 is half as fast (shares 1.0, 0.5) and has less memory (20 against 48): its
    # micro-batches are cut to half rank 0's budget (40 and 20, both holding the longest
    # sequence). Each step's update is still the float64 token mean over the union of its
    # micro-batches, every rank ran every step, and the ranks agree.
    records = run(strategy, tmp_path_factory, length_warmup=STEPS, rank_shares=True)
    assert [r["rank"] for r in records] == list(range(WORLD_SIZE))
    assert [r["global_step"] for r in records] == [STEPS] * WORLD_SIZE
    for r in records:
        assert r["rank_shares"] == list(RANK_SHARES)
        assert r["rank_budgets"] == list(RANK_BUDGETS)
        order = [(m["step"], m["micro"]) for m in r["micro_batches"]]
        assert order == [(s, k) for s in range(STEPS) for k in range(ACCUMULATE)]
    # The shares are in force: every micro-batch within its rank's budget, rank 1's smaller.
    lengths = [len(s) for s in make_sequences()]
    costs = [[padded_cost(m["ids"], lengths) for m in r["micro_batches"]] for r in records]
    for rank, budget in enumerate(RANK_BUDGETS):
        assert max(costs[rank]) <= budget, (rank, costs[rank])
    assert max(costs[1]) < min(RANK_BUDGETS[0], max(costs[0])), costs
    real = [sum(m["ntokens"] for m in r["micro_batches"]) for r in records]
    assert real[1] < 0.75 * real[0], real
    # No example twice within the epoch, over all ranks.
    seen = [i for r in records for m in r["micro_batches"] for i in m["ids"]]
    assert len(seen) == len(set(seen)) and set(seen) <= set(range(NUM_EXAMPLES))
    for step in range(STEPS):
        assert len(step_micro_batches(records, step)) == WORLD_SIZE * ACCUMULATE
    assert_every_step_is_the_token_mean(records)


@pytest.mark.parametrize("strategy", CORE)
def test_naive_micro_batch_mean_is_a_different_update(
    strategy: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The equivalence test above can fail: the usual recipe (each micro-batch's own mean,
    # averaged over accumulation and ranks) is measurably off on the same data and init.
    records = run(strategy, tmp_path_factory)
    naive = reference_update(records[0]["init"], step_micro_batches(records, 0), naive=True)
    errors = max_update_error(records, naive)
    assert max(errors.values()) > 100 * TOLERANCE["atol"], errors
    init, after = params_of(records[0]["init"]), params_of(records[0]["params"]["1"])
    with pytest.raises(AssertionError):
        for name, value in naive.items():
            torch.testing.assert_close(after[name] - init[name], value - init[name], **TOLERANCE)


@pytest.mark.parametrize("strategy", PACKED)
def test_packed_rows_hold_whole_documents_and_count_their_labels(
    strategy: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    records = run(strategy, tmp_path_factory, layout="packed")
    lengths = [len(s) for s in make_sequences()]
    for r in records:
        for m in r["micro_batches"]:
            docs = [lengths[i] for i in m["ids"]]
            # One padding-free row of whole documents, within the budget.
            assert m["row_shape"] == [1, sum(docs)] and sum(docs) <= MAX_TOKENS, m
            bounds = [0]
            for n in docs:
                bounds.append(bounds[-1] + n)
            assert m["cu_seqlens"] == bounds and m["max_seqlen"] == max(docs), m
            # Labels: each document's length minus one, what the plan counted.
            assert m["ntokens"] == m["labelled"] == sum(n - 1 for n in docs), m
    # Rows pack several documents (the update checked, step 0's, has boundaries to respect).
    rows = [m for r in records for m in r["micro_batches"]]
    assert sum(len(m["ids"]) > 1 for m in rows) > len(rows) // 2
    for r in records:
        assert any(len(m["ids"]) > 1 for m in r["micro_batches"] if m["step"] == 0)
    # The step's loss tokens, known to every rank from the plan, are the sum over all rows.
    for step in range(STEPS):
        rows = [m for r in records for m in r["micro_batches"] if m["step"] == step]
        assert len(rows) == WORLD_SIZE * ACCUMULATE
        assert {m["step_ntokens"] for m in rows} == {sum(m["ntokens"] for m in rows)}


@pytest.mark.parametrize("strategy", PACKED)
@pytest.mark.parametrize("mistake", ["naive", "leak"])
def test_packed_update_misses_a_leak_or_the_naive_mean(
    strategy: str, mistake: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # The packed equivalence can fail: attention across the row's documents ("leak"), or each
    # row's own token mean averaged over rows ("naive"), is measurably another update.
    records = run(strategy, tmp_path_factory, layout="packed")
    micro_batches = step_micro_batches(records, 0)
    wrong = packed_reference_update(records[0]["init"], micro_batches, mode=mistake)
    errors = max_update_error(records, wrong)
    assert max(errors.values()) > 100 * TOLERANCE["atol"], errors


@pytest.mark.parametrize("strategy", ["deepspeed_varbatch_stage_2", "deepspeed_varbatch_stage_3"])
def test_deepspeed_batch_settings_follow_the_trainer(
    strategy: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    for r in run(strategy, tmp_path_factory):
        assert r["strategy"] == "VarBatchDeepSpeedStrategy"
        assert r["deepspeed_config"] == {
            "train_micro_batch_size_per_gpu": 1,
            "gradient_accumulation_steps": ACCUMULATE,
            "train_batch_size": ACCUMULATE * WORLD_SIZE,
            "timers": {"throughput": {"enabled": False}},
        }


def test_inconsistent_deepspeed_config_fails_on_every_rank_with_the_setting_named(
    tmp_path: Path,
) -> None:
    config = {
        "zero_optimization": {"stage": 2},
        "train_micro_batch_size_per_gpu": 2,
        "train_batch_size": 10,
    }
    records = launch(
        "strategy_train.py", WORLD_SIZE, tmp_path, "unused", json.dumps(config), timeout=TIMEOUT
    )
    for r in records:
        assert "train_batch_size=10" in r["error"]
        assert "train_micro_batch_size_per_gpu (2) * accumulate_grad_batches (2)" in r["error"]
        assert "world size (2) = 8" in r["error"]
        assert "remove train_batch_size from the DeepSpeed config, or set it to 8" in r["error"]


def test_user_deepspeed_config_trains_with_a_torch_optimizer(tmp_path: Path) -> None:
    """The recipe of docs/migrate-deepspeed.md: config={"zero_optimization": ...} and SGD."""
    config = {"zero_optimization": {"stage": 2}}
    records = launch(
        "strategy_train.py", 1, tmp_path, "unused", json.dumps(config), timeout=TIMEOUT
    )
    assert len(records) == 1
    assert "error" not in records[0], records[0].get("error")
    assert records[0]["global_step"] == STEPS
