"""The remainder guard: every resumed or re-planned epoch is checked before it runs.

Its positive side (real re-plans pass and their ledgers add up) is exercised everywhere a
resume is (the lifecycle model, the sampler and stream tests); here each violation it exists
for is made on purpose, from a real plan, and must be refused with its cause named.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from lightning_varbatch.errors import RemainderError
from lightning_varbatch.planner import EpochPlanner, MixturePlanner, PlanConfig
from lightning_varbatch.planner.remainder_guard import (
    consumed_ledger,
    guard_remainder,
    ids_digest,
)

LENGTHS = np.random.default_rng(0).integers(1, 40, 300)


def _rest(**settings: object) -> tuple[EpochPlanner, object]:
    planner = EpochPlanner(LENGTHS, PlanConfig(max_tokens=120, **settings))  # type: ignore[arg-type]
    return planner, planner.plan_resumed(1, 3, 2, [(2, 1, 7)])


@pytest.mark.parametrize("tail", ["spread", "drop", "pad"])
def test_a_real_replan_passes_and_its_ledger_counts_the_epoch(tail: str) -> None:
    planner, rest = _rest(tail=tail)
    first = planner.plan(1, 2, 1)
    consumed = first.consumed_ids(7)
    ledger = guard_remainder(planner, rest)
    trained = np.bincount(np.concatenate([consumed, rest.example_ids()]), minlength=300)
    assert ledger.consumed == consumed.size and ledger.digest == ids_digest(consumed)
    assert (ledger.dropped, ledger.repeated) == (rest.num_dropped, rest.num_duplicated)
    assert ledger.dropped == int((trained == 0).sum())
    assert ledger.repeated == int(np.maximum(trained - 1, 0).sum())
    # at a later position of the same plan, the ledger counts what it ran too
    half = rest.num_micro_batches_per_rank // 2
    later = guard_remainder(planner, rest, half)
    assert (later.consumed, later.digest) == consumed_ledger(rest, half)
    assert later.consumed == consumed.size + rest.consumed_ids(half).size


def test_a_remainder_that_runs_a_consumed_example_again_is_refused() -> None:
    planner, rest = _rest()
    counts = rest.consumed_counts.copy()
    counts[int(rest.example_ids()[0])] += 1  # as if the earlier topology had run it
    forged = dataclasses.replace(rest, consumed_counts=counts)
    with pytest.raises(RemainderError, match="would train 1 example") as error:
        guard_remainder(planner, forged)
    assert error.value.cause == "repeated"


def test_a_remainder_that_loses_an_example_is_refused() -> None:
    planner, rest = _rest()
    counts = rest.consumed_counts.copy()
    lost = int(np.flatnonzero(counts)[0])
    counts[lost] = 0  # the earlier topology's example: neither consumed nor planned now
    with pytest.raises(RemainderError, match="1 planned example") as error:
        guard_remainder(planner, dataclasses.replace(rest, consumed_counts=counts))
    assert error.value.cause == "lost"


def test_a_remainder_that_repeats_more_than_it_reports_is_refused() -> None:
    planner, rest = _rest(tail="pad")
    with pytest.raises(RemainderError, match="its plan reports") as error:
        guard_remainder(planner, dataclasses.replace(rest, num_duplicated=rest.num_duplicated + 1))
    assert error.value.cause == "repeated"


def test_a_micro_batch_over_its_ranks_budget_is_refused_with_the_rank() -> None:
    planner, rest = _rest()
    tight = np.full(3, int(rest.micro_batch_cost.max()) - 1)
    with pytest.raises(RemainderError, match="over its budget") as error:
        guard_remainder(planner, dataclasses.replace(rest, rank_budget=tight))
    assert error.value.cause == "over budget"


def test_an_example_oversize_skip_leaves_out_may_not_come_back() -> None:
    lengths = LENGTHS.copy()
    lengths[5] = 500
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=120, oversize="skip"))
    rest = planner.plan_resumed(0, 2, 1, [(1, 1, 3)])
    order = rest.order.copy()
    order[0] = 5  # the skipped example in place of a planned one
    with pytest.raises(RemainderError, match="oversize='skip' leaves out") as error:
        guard_remainder(planner, dataclasses.replace(rest, order=order))
    assert error.value.cause == "unplanned"


def test_a_mixture_remainder_is_guarded_in_each_datasets_budget() -> None:
    short, long = np.full(60, 10), np.full(30, 40)
    mixture = MixturePlanner([short, long], PlanConfig(max_tokens=160))
    rest = mixture.plan_resumed(0, 2, 1, [(3, 1, 2)])
    assert guard_remainder(mixture, rest).dropped == 0
    tight = np.full(2, 159)  # the long dataset's micro-batches (4 x 40) no longer fit
    with pytest.raises(RemainderError, match="over its budget"):
        guard_remainder(mixture, dataclasses.replace(rest, rank_budget=tight))


def test_the_digest_is_of_the_multiset_whatever_the_order() -> None:
    rng = np.random.default_rng(1)
    ids = rng.integers(0, 10_000, 500)
    assert ids_digest(ids) == ids_digest(rng.permutation(ids))
    assert ids_digest(ids) == ids_digest(None, np.bincount(ids))
    assert ids_digest(np.append(ids, ids[0])) != ids_digest(ids)  # a repeat counts
    assert ids_digest(np.append(ids[1:], ids[0] + 1)) != ids_digest(ids)
