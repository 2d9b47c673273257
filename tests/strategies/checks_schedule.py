"""Checks of the ``schedule`` phase: a batch-size schedule under DDP, FSDP and DeepSpeed ZeRO 2.

The phase (``tests/scripts/schedule_train.py`` on 2 ranks) trains the sequences of the strategy
tests for 2 epochs, ``accumulate_grad_batches=2``, ``batch_schedule=SCHEDULE`` (epoch 0 changes
stage three times, epoch 1 is all full steps), SGD with ``ExponentialLR``,
``BatchSizeLRScaler(rule="sqrt")`` and ``TokenThroughputMonitor``. The checks, from every rank's
record:

- every rank ran every step; every example once per epoch; each step's counts
  (``step_ntokens``, ``step_cost`` recounted from the ids, ``step_budget`` one of the
  schedule's fractions) and the fractions against an independent reading of the schedule on
  the tokens trained;
- each step's parameter update equals the float64 token mean of the step's micro-batches
  (``tests/strategies/_reference.py``) at the LR the update used, within ``TOLERANCE``;
- that LR is the scheduler's value times ``sqrt(step_ntokens / reference)``, our arithmetic;
- the monitor's ``train/schedule/...`` keys are the steps' budgets and costs.

The DDP launch's phase also checkpoints at step ``CHECKPOINT_STEP``, inside a stage; one rank
resumes from it (a launch of its own) and must train every example once per epoch, with the
schedule's fractions going on from the stage it was in (on the new world size) and the LR rule
following the new reference.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any, ClassVar

import pytest

from tests.scripts.strategy_common import ACCUMULATE, LR, MAX_TOKENS, NUM_EXAMPLES, make_sequences
from tests.strategies._reference import params_of, reference_update
from tests.strategies.runs import (
    CHECKPOINT_STEP,
    GAMMA,
    SCHEDULE,
    THRESHOLDS,
    WORLD_SIZE,
    Launch,
    Launches,
    Run,
)

EPOCHS = 2
#: float32 training against a float64 reference (measured: ~1e-7).
TOLERANCE = 1e-5
LENGTHS = [len(s) for s in make_sequences()]


def fraction_at(tokens: float) -> float:
    """The schedule's fraction once ``tokens`` planning tokens were trained."""
    return max(f for t, f in THRESHOLDS if t <= tokens)


def fraction_of(budget: int, world: int) -> float:
    """The schedule's fraction whose step budget is ``budget`` on ``world`` equal ranks."""
    found = [f for _, f in THRESHOLDS if ACCUMULATE * world * int(f * MAX_TOKENS) == budget]
    assert len(found) == 1, f"step_budget {budget} is no fraction of {SCHEDULE!r}"
    return found[0]


def by_step(records: list[dict[str, Any]]) -> dict[int, list[dict[str, Any]]]:
    """Every rank's micro-batches of each optimizer step (Lightning's step), rank by rank."""
    steps: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        for m in r["micro_batches"]:
            steps[m["global_step"]].append(m)
    return dict(sorted(steps.items()))


def check_steps(
    steps: dict[int, list[dict[str, Any]]], world: int, clock: int = 0
) -> dict[int, float]:
    """Each step's counts and its fraction of the schedule; returns the fractions.

    ``clock``: planning tokens trained before the first of ``steps``.
    """
    fractions: dict[int, float] = {}
    full = MAX_TOKENS * world * ACCUMULATE
    for k, mbs in steps.items():
        assert len(mbs) == world * ACCUMULATE, k
        assert [m["micro"] for m in mbs] == list(range(ACCUMULATE)) * world, k
        for name in ("step_ntokens", "step_budget", "step_cost", "epoch"):
            assert len({m[name] for m in mbs}) == 1, (k, name)
        m = mbs[0]
        assert m["step_ntokens"] == sum(x["ntokens"] for x in mbs), k
        # the planned cost of a padded micro-batch: examples x the longest
        cost = sum(len(x["ids"]) * max(LENGTHS[i] for i in x["ids"]) for x in mbs)
        assert m["step_cost"] == cost <= m["step_budget"], k
        f = fractions[k] = fraction_of(m["step_budget"], world)
        # On the schedule's clock (tokens trained): never below the schedule at the step's
        # start, never ahead by more than one full step (a stage's leftover joins the next).
        assert fraction_at(clock) <= f <= fraction_at(clock + full), (k, clock, f)
        clock += sum(LENGTHS[i] for x in mbs for i in x["ids"])
    values = list(fractions.values())
    assert values == sorted(values)  # a step's size only grows
    return fractions


def check_epochs(steps: dict[int, list[dict[str, Any]]], fractions: dict[int, float]) -> None:
    """Every example once per epoch; epoch 0 changes stage within it, epoch 1 is all full."""
    for epoch in range(EPOCHS):
        ids = [i for mbs in steps.values() for m in mbs if m["epoch"] == epoch for i in m["ids"]]
        assert Counter(ids) == Counter(range(NUM_EXAMPLES)), f"epoch {epoch}"
    first = {fractions[k] for k, mbs in steps.items() if mbs[0]["epoch"] == 0}
    assert len(first - {1.0}) >= 3 and 1.0 in first, first
    assert {fractions[k] for k, mbs in steps.items() if mbs[0]["epoch"] == 1} == {1.0}


def expected_lr(step: int, step_ntokens: int, reference: float) -> float:
    """``BatchSizeLRScaler(rule="sqrt")`` on ``ExponentialLR(GAMMA)``'s value at ``step``."""
    return LR * GAMMA**step * math.sqrt(step_ntokens / reference)


def update_errors(
    records: list[dict[str, Any]], steps: dict[int, list[dict[str, Any]]]
) -> tuple[float, float]:
    """The largest difference of any parameter update from the float64 token-mean update at
    the LR used; and the same at the scheduler's unscaled LR (a control that must miss)."""
    record = records[0]
    params = [record["init"]] + [record["params"][str(k + 1)] for k in steps]
    worst = unscaled = 0.0
    for k, mbs in steps.items():
        before, after = params_of(params[k]), params_of(params[k + 1])
        reference = reference_update(params[k], [m["ids"] for m in mbs])  # at LR
        for name, value in reference.items():
            gradient_step = (value - before[name]) / LR
            delta = after[name] - before[name]
            worst = max(worst, float((delta - record["lrs"][k] * gradient_step).abs().max()))
            plain = LR * GAMMA**k * gradient_step
            unscaled = max(unscaled, float((delta - plain).abs().max()))
    return worst, unscaled


def check_logged(records: list[dict[str, Any]], steps: dict[int, list[dict[str, Any]]]) -> None:
    """Rank 0 logged every step's budget, cost and fill; no other rank logged."""
    logged: dict[int, dict[str, float]] = defaultdict(dict)
    for step, metrics in records[0]["logged"]:
        logged[step].update(metrics)
    for k, mbs in steps.items():
        budget, cost = mbs[0]["step_budget"], mbs[0]["step_cost"]
        assert logged[k]["train/schedule/budget_tokens"] == budget, k
        assert logged[k]["train/schedule/cost_tokens"] == cost, k
        assert logged[k]["train/schedule/fill"] == pytest.approx(cost / budget, rel=1e-12), k
    assert all(r["logged"] == [] for r in records[1:])


def clock(steps: dict[int, list[dict[str, Any]]]) -> int:
    """Planning tokens trained in ``steps``."""
    return sum(LENGTHS[i] for mbs in steps.values() for m in mbs for i in m["ids"])


class Schedule:
    """The checks of a launch's ``schedule`` phase."""

    LAUNCH: ClassVar[Launch]

    def test_updates_and_lrs_follow_the_schedule(self, run: Run) -> None:
        records = run.phase("schedule")
        strategy = self.LAUNCH.strategy
        assert [r["rank"] for r in records] == list(range(WORLD_SIZE))
        assert {r["world_size"] for r in records} == {WORLD_SIZE}
        steps = by_step(records)
        assert list(steps) == list(range(len(steps)))
        assert [r["global_step"] for r in records] == [len(steps)] * WORLD_SIZE
        fractions = check_steps(steps, WORLD_SIZE)
        check_epochs(steps, fractions)
        # Lightning followed the epochs' lengths: epoch 0 (smaller steps) has more micro-batches.
        per_epoch = Counter(m["epoch"] for m in records[0]["micro_batches"])
        assert per_epoch[0] > per_epoch[1]

        # The LR of every real update: the scheduler's value times the rule, on every rank.
        reference = MAX_TOKENS * WORLD_SIZE * ACCUMULATE
        assert [r["reference"] for r in records] == [reference] * WORLD_SIZE
        lrs = [expected_lr(k, mbs[0]["step_ntokens"], reference) for k, mbs in steps.items()]
        for r in records:
            assert r["lrs"] == pytest.approx(lrs, rel=1e-12, abs=0)
        lr_error = max(abs(a - b) for a, b in zip(records[0]["lrs"], lrs, strict=True))

        # Every step's update is the float64 token mean of its micro-batches at that LR.
        for step in records[0]["params"]:
            assert all(r["params"][step] == records[0]["params"][step] for r in records), step
        worst, unscaled = update_errors(records, steps)
        print(
            f"{strategy}: {len(steps)} steps, max update difference {worst:.2e} (float64 "
            f"reference; unscaled LR: {unscaled:.2e}), max LR difference {lr_error:.2e}"
        )
        assert worst <= TOLERANCE
        assert unscaled > 100 * TOLERANCE  # the check sees the LR scaling
        check_logged(records, steps)


class Resume:
    """A resume of the DDP launch's ``schedule`` phase from its checkpoint, on one rank."""

    LAUNCH: ClassVar[Launch]

    def test_resume_inside_a_stage_on_another_world_size(
        self, run: Run, launches: Launches
    ) -> None:
        records = run.phase("schedule")
        steps = by_step(records)
        fractions = check_steps(steps, WORLD_SIZE)
        # The checkpoint is inside a stage: the steps on both sides of it share a fraction < 1.
        stage = fractions[CHECKPOINT_STEP]
        assert fractions[CHECKPOINT_STEP - 1] == stage < 1.0
        folder = run.out / "schedule" / "ckpt"
        ckpt = folder / f"epoch=0-step={CHECKPOINT_STEP}.ckpt"
        assert ckpt.exists(), sorted(p.name for p in folder.iterdir())

        resume = Launch("ddp-resume", "ddp", ("schedule",), world_size=1, resume=ckpt)
        (resumed,) = launches.get(resume).phase("schedule")
        assert resumed["world_size"] == 1
        after = by_step([resumed])
        assert list(after) == list(range(CHECKPOINT_STEP, CHECKPOINT_STEP + len(after)))
        assert resumed["global_step"] == CHECKPOINT_STEP + len(after)

        # The fractions go on from the checkpoint's stage, on the schedule's clock (the tokens the
        # two ranks trained before it), as budgets of one rank.
        before = {k: mbs for k, mbs in steps.items() if k < CHECKPOINT_STEP}
        resumed_fractions = check_steps(after, 1, clock(before))
        assert resumed_fractions[CHECKPOINT_STEP] == stage
        assert after[CHECKPOINT_STEP][0]["step_budget"] == ACCUMULATE * int(stage * MAX_TOKENS)
        # Every example once per epoch, over the two runs.
        check_epochs({**before, **after}, {**fractions, **resumed_fractions})

        # The LR rule on the resumed scheduler's value, with the one-rank reference.
        reference = MAX_TOKENS * 1 * ACCUMULATE
        assert resumed["reference"] == reference
        lrs = [expected_lr(k, mbs[0]["step_ntokens"], reference) for k, mbs in after.items()]
        assert resumed["lrs"] == pytest.approx(lrs, rel=1e-12, abs=0)
        lr_error = max(abs(a - b) for a, b in zip(resumed["lrs"], lrs, strict=True))
        print(
            f"resumed on 1 rank: {len(after)} steps, fractions {list(resumed_fractions.values())},"
            f" max LR difference {lr_error:.2e}"
        )
        check_logged([resumed], after)
