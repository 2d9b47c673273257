"""Checks of the ``shares`` phase: a mixed cluster under a length warm-up.

``--rank-shares 1.0,0.5 --rank-max-tokens 48,20``: rank 1 half as fast, its memory binding,
budgets 40 and 20; with a length warm-up over all the steps (``--length-warmup 3``): rank 1's
micro-batches are smaller, the caps grow, and every step's update, not only the first, equals
the float64 token mean of the step's micro-batches (one phase checks both policies of the
planner: the strategies see only micro-batches).
"""

from __future__ import annotations

from typing import ClassVar

from tests.scripts.strategy_common import (
    ACCUMULATE,
    NUM_EXAMPLES,
    RANK_BUDGETS,
    RANK_SHARES,
    WARMUP_MIN,
    make_sequences,
)
from tests.strategies._reference import reference_update, step_micro_batches
from tests.strategies.checks_training import assert_every_update_is
from tests.strategies.runs import STEPS, WORLD_SIZE, Launch, Run


def padded_cost(ids: list[int], lengths: list[int]) -> int:
    """What a padded micro-batch costs the planner: examples x the longest."""
    return len(ids) * max(lengths[i] for i in ids)


class Shares:
    """The checks of a launch's ``shares`` phase."""

    LAUNCH: ClassVar[Launch]

    def test_update_equals_single_process_token_mean_during_a_length_warmup(self, run: Run) -> None:
        # Every step of the run is a warm-up step (--length-warmup STEPS): the first ones hold
        # only short sequences, more of them per step; each step's update is still the float64
        # token mean over the union of its micro-batches, and the ranks agree.
        records = run.phase("shares")
        lengths = [len(s) for s in make_sequences()]
        caps = records[0]["caps"]
        assert all(r["caps"] == caps for r in records)
        assert caps == sorted(caps) and WARMUP_MIN <= caps[0] < max(lengths)
        for step in range(STEPS):
            micro_batches = step_micro_batches(records, step)
            assert max(lengths[i] for ids in micro_batches for i in ids) <= caps[step]
        assert_every_update_is(records, reference_update)

    def test_update_equals_single_process_token_mean_with_unequal_rank_shares(
        self, run: Run
    ) -> None:
        # Rank 1 is half as fast (shares 1.0, 0.5) and has less memory (20 against 48): its
        # micro-batches are cut to half rank 0's budget (40 and 20, both holding the longest
        # sequence). Each step's update is still the float64 token mean over the union of its
        # micro-batches, every rank ran every step, and the ranks agree.
        records = run.phase("shares")
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
        assert_every_update_is(records, reference_update)
