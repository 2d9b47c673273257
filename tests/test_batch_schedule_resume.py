"""The batch-size schedule (issue 32) through the sampler: resume, refusals, the DataModule.

Exact resume replays the saved plan; elastic resume (another world size, other shares or
memory budgets) plans the rest of the epoch with the schedule's clock continued; a changed
schedule is refused. The oracle is the test's own (:mod:`tests.batch_schedule_oracle`).
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from lightning_varbatch import (
    MixturePlanner,
    PlanConfig,
    StreamingBatches,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.errors import ResumeMismatchError, SettingValueError
from lightning_varbatch.planner import EpochPlanner
from lightning_varbatch.planner.windows import WindowedPlanner
from lightning_varbatch.sources.shards import ShardedSource
from tests.batch_schedule_oracle import (
    assert_on_schedule,
    check_plan,
    micro_batch_cost,
    rank_budgets,
    step_capacity,
    thresholds,
)
from tests.lifecycle.drivers import _trainer
from tests.lifecycle.spec import RunSpec

LENGTHS = np.random.default_rng(1).integers(5, 60, 600)
EPOCH = int(LENGTHS.sum())
MAX_TOKENS = 400
SCHEDULE = f"0:0.25 {EPOCH // 5}:0.5 {EPOCH // 2}:1"
REFERENCE = thresholds((0, 0.25), (EPOCH // 5, 0.5), (EPOCH // 2, 1.0))


def _samplers(world: int, acc: int = 1, **settings: Any) -> list[TokenBudgetBatchSampler]:
    settings.setdefault("batch_schedule", SCHEDULE)
    return [
        TokenBudgetBatchSampler(
            LENGTHS, MAX_TOKENS, rank=r, world_size=world, accumulate_grad_batches=acc, **settings
        )
        for r in range(world)
    ]


def _take(iterators: list[Iterator[Any]], count: int) -> list[list[list[int]]]:
    return [[list(next(it)) for _ in range(count)] for it in iterators]


def _consumed(world: int, acc: int, k: int) -> tuple[dict[str, Any], list[list[list[int]]], Any]:
    """``k`` micro-batches on every rank of a fresh run: its state, the batches, iterators."""
    samplers = _samplers(world, acc)
    iterators = [iter(s) for s in samplers]
    taken = _take(iterators, k)
    return samplers[0].state_dict(consumed=k), taken, iterators


def _ids(batches: list[list[list[int]]]) -> list[int]:
    return [i for rank in batches for batch in rank for i in batch]


def test_exact_resume_inside_a_stage_replays_the_plan() -> None:
    state, taken, iterators = _consumed(2, 2, 5)  # mid-step 2, at fraction 0.25
    clock = int(LENGTHS[_ids(taken)].sum())
    assert clock < EPOCH // 5, "the test means to save inside the first stage"
    rest_there = [[list(b) for b in it] for it in iterators]  # the run that was not stopped
    fresh = _samplers(2, 2)
    for sampler in fresh:
        sampler.load_state_dict(state)
    got = [list(sampler) for sampler in fresh]
    assert [[list(b) for b in rank] for rank in got] == rest_there
    assert got[0][0].step == 2 and got[0][0].micro == 1  # the step continues where it stopped
    counts = np.bincount(_ids(taken) + _ids(rest_there), minlength=LENGTHS.size)
    assert counts.min() == counts.max() == 1


@pytest.mark.parametrize(
    ("world", "acc", "settings"),
    [
        (3, 1, {}),
        (1, 2, {}),
        (2, 2, {"rank_shares": (1.0, 0.6)}),  # the saved plan goes on: shares from next epoch
        (2, 2, {"rank_max_tokens": (400, 300)}),  # a budget below the saved one: re-planned
        (3, 1, {"rank_shares": (1.0, 0.6, 0.8)}),
        (4, 1, {"rank_shares": (1.0, 0.7, 0.8, 1.0), "rank_max_tokens": (400, 380, 400, 350)}),
    ],
    ids=["3-ranks", "1-rank-acc2", "shares", "rank_max_tokens", "3-ranks-shares", "4-ranks-both"],
)
def test_elastic_resume_continues_the_clock(world: int, acc: int, settings: dict) -> None:
    state, taken, _ = _consumed(2, 2, 5)
    consumed = _ids(taken)
    clock = int(LENGTHS[consumed].sum())
    fresh = _samplers(world, acc, **settings)
    for sampler in fresh:
        sampler.load_state_dict(state)
    got = [[list(b) for b in sampler] for sampler in fresh]
    assert len({len(rank) for rank in got}) == 1, "ranks run different numbers of micro-batches"
    counts = np.bincount(consumed + _ids(got), minlength=LENGTHS.size)
    assert counts.min() == counts.max() == 1, "an example lost or repeated across the resume"
    plan = fresh[0].plan  # the rest of the epoch, or the saved plan that goes on
    for rank, batches in enumerate(got):  # what every rank runs is the plan's (its end)
        own = plan.rank_micro_batches(rank)[plan.num_micro_batches_per_rank - len(batches) :]
        assert batches == [plan.micro_batch_ids(int(b)).tolist() for b in own]
    replanned = plan.num_micro_batches_per_rank == len(got[0])
    assert replanned == ((world, acc, settings) != (2, 2, {"rank_shares": (1.0, 0.6)}))
    if replanned:
        shares, memory = settings.get("rank_shares"), settings.get("rank_max_tokens")
        budgets = rank_budgets(MAX_TOKENS, world, shares, memory)
        found = check_plan(plan, LENGTHS, "padded", budgets, REFERENCE, clock)
    else:  # the saved plan with its budgets, from the epoch's start
        budgets = rank_budgets(MAX_TOKENS, world)
        found = check_plan(plan, LENGTHS, "padded", budgets, REFERENCE, 0)
    assert_on_schedule(found, REFERENCE, budgets, acc, int(LENGTHS.max()))
    assert found.fractions[0] < 1 and found.fractions[-1] == 1.0  # the schedule goes on


@pytest.mark.parametrize(
    "changed",
    [
        f"0:0.5 {EPOCH // 2}:1",
        None,
        f"ramp:0.25:{EPOCH // 2}",
        f"0:0.25 {EPOCH // 5}:0.5 {EPOCH}:1",
    ],
    ids=["other-thresholds", "no-schedule", "ramp", "later-end"],
)
def test_a_changed_schedule_is_refused_naming_it(changed: str | None) -> None:
    state, _, _ = _consumed(2, 1, 3)
    sampler = _samplers(2, 1, batch_schedule=changed)[0]
    with pytest.raises(ResumeMismatchError) as refused:
        sampler.load_state_dict(state)
    assert refused.value.changed == ["batch_schedule"]
    assert "batch_schedule" in str(refused.value)


def test_a_schedule_written_another_way_is_the_same_schedule() -> None:
    state, _, iterators = _consumed(2, 1, 3)
    rest_there = [[list(b) for b in it] for it in iterators]
    same = [(0, 0.25), (EPOCH // 5, 0.5), (EPOCH // 2, 1.0)]
    fresh = _samplers(2, 1, batch_schedule=same)
    for sampler in fresh:
        sampler.load_state_dict(state)
    assert [[list(b) for b in sampler] for sampler in fresh] == rest_there


def test_a_changed_schedule_may_restart_the_epoch() -> None:
    state, _, _ = _consumed(2, 1, 3)
    fresh = _samplers(2, 1, batch_schedule=f"0:0.5 {EPOCH // 2}:1")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for sampler in fresh:
            sampler.load_state_dict(state, on_mismatch="restart_epoch")
    assert any("batch_schedule" in str(w.message) for w in caught)
    got = [[list(b) for b in sampler] for sampler in fresh]
    counts = np.bincount(_ids(got), minlength=LENGTHS.size)
    assert counts.min() == counts.max() == 1  # the whole epoch afresh, under the new schedule
    budgets = rank_budgets(MAX_TOKENS, 2)
    found = check_plan(fresh[0].plan, LENGTHS, "padded", budgets, REFERENCE, 0)
    assert found.fractions[0] == 0.5


# -- refusals -------------------------------------------------------------------------------


class _Shard:
    """An in-memory shard of token rows."""

    def __init__(self, name: str, lengths: np.ndarray) -> None:
        self.name, self.rows = name, [[1] * int(n) for n in lengths]

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return np.array([len(r) for r in self.rows])

    def read(self, rows: Any) -> Iterator[dict[str, Any]]:
        return ({"tokens": np.array(self.rows[i])} for i in rows)


def _source() -> ShardedSource:
    return ShardedSource([_Shard("a", LENGTHS[:300]), _Shard("b", LENGTHS[300:])])


_SMALL = "0:0.5 1000:1"
REFUSED = {
    "max_shapes": lambda: PlanConfig(512, batch_schedule=_SMALL, max_shapes=2),
    "length_warmup": lambda: PlanConfig(512, batch_schedule=_SMALL, length_warmup=4),
    "MixturePlanner": lambda: MixturePlanner(
        [LENGTHS, LENGTHS], PlanConfig(MAX_TOKENS, batch_schedule=_SMALL)
    ),
    "from_sources": lambda: TokenBudgetBatchSampler.from_sources(
        [LENGTHS, LENGTHS], MAX_TOKENS, rank=0, world_size=1, batch_schedule=_SMALL
    ),
    "WindowedPlanner": lambda: WindowedPlanner(
        [600], lambda s: LENGTHS, PlanConfig(MAX_TOKENS, batch_schedule=_SMALL)
    ),
    "StreamingBatches": lambda: StreamingBatches(
        _source(), MAX_TOKENS, rank=0, world_size=1, batch_schedule=_SMALL
    ),
    "StreamingDataModule": lambda: StreamingDataModule(
        _source(), MAX_TOKENS, batch_schedule=_SMALL
    ).train_dataloader(),
}


@pytest.mark.parametrize("where", list(REFUSED))
def test_where_a_schedule_cannot_go_it_is_refused_naming_it(where: str) -> None:
    with pytest.raises(SettingValueError) as refused:
        REFUSED[where]()
    assert refused.value.setting == "batch_schedule"
    assert "batch_schedule" in str(refused.value)


@pytest.mark.parametrize(
    ("shares", "rank", "need"),
    [(None, 0, 59 / 400), ((1.0, 0.5), 1, 59 / 200)],
    ids=["equal", "shares"],
)
def test_a_first_fraction_too_small_for_the_longest_example_names_the_fraction_needed(
    shares: tuple[float, ...] | None, rank: int, need: float
) -> None:
    assert int(LENGTHS.max()) == 59
    config = PlanConfig(MAX_TOKENS, batch_schedule="0:0.1 5K:1", rank_shares=shares)
    with pytest.raises(SettingValueError) as refused:
        EpochPlanner(LENGTHS, config).plan(0, 2)
    message = str(refused.value)
    assert refused.value.setting == "batch_schedule" and f"rank {rank}" in message
    named = re.search(r"at least ([0-9.]+)", message)
    assert named is not None, message
    fraction = float(named.group(1))
    assert need <= fraction <= need + 0.01, f"the message names {fraction}, {need:.4f} is needed"
    # the advice works: a schedule that starts at the fraction named plans
    advised = PlanConfig(MAX_TOKENS, batch_schedule=f"0:{fraction} 5K:1", rank_shares=shares)
    EpochPlanner(LENGTHS, advised).plan(0, 2)


# -- the DataModule --------------------------------------------------------------------------


def test_the_data_module_reports_each_steps_budget_and_cost() -> None:
    world, acc = 2, 2
    items = [{"tokens": [1] * int(n), "id": i} for i, n in enumerate(LENGTHS)]
    spec = RunSpec("datamodule", (LENGTHS,), MAX_TOKENS, world=world, acc=acc)
    ranks = []
    for rank in range(world):
        dm = TokenBudgetDataModule(items, LENGTHS, MAX_TOKENS, batch_schedule=SCHEDULE)
        dm.trainer = _trainer(spec, rank, 0, 0, resumed=False)
        ranks.append([dict(b) for b in dm.train_dataloader()])
    assert len({len(r) for r in ranks}) == 1
    budgets = rank_budgets(MAX_TOKENS, world)
    level = {step_capacity(f, budgets, acc): f for f in REFERENCE.fractions}
    assert len(level) == len(REFERENCE.fractions)  # each level's step budget tells it
    clock, seen = 0, []
    for step in range(len(ranks[0]) // acc):
        batches = [ranks[r][step * acc + m] for r in range(world) for m in range(acc)]
        step_budget = {int(b["step_budget"]) for b in batches}
        step_cost = {int(b["step_cost"]) for b in batches}
        assert len(step_budget) == len(step_cost) == 1, "micro-batches of a step disagree"
        fraction = level[step_budget.pop()]
        ids = [b["id"].tolist() for b in batches]
        flat = [i for micro in ids for i in micro]
        costs = [micro_batch_cost(LENGTHS[i], "padded") for i in ids]
        assert step_cost.pop() == sum(costs)
        for r, cost in enumerate(costs):
            assert cost <= int(fraction * budgets[r // acc])
        longest = int(LENGTHS.max())  # a level's steps run in another order than its examples
        assert fraction >= REFERENCE.at(clock - longest), f"step {step} below its schedule"
        assert REFERENCE.reached(fraction) - clock <= 2 * step_capacity(fraction, budgets, acc)
        assert int(batches[0]["step_ntokens"]) == int(LENGTHS[flat].sum())
        clock += int(LENGTHS[flat].sum())
        seen += flat
    assert sorted(seen) == list(range(LENGTHS.size))
