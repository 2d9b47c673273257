"""Checks of the plain-training phases (``list``, ``hf``, ``stream``, ``packed``) of a launch.

Each phase: 2 processes, ``accumulate_grad_batches=2``, 3 optimizer steps, SGD with lr=1. The
checks read the records every rank wrote: completion, step counts, identical parameters, and
that every step's update equals the single-process update on the union of that step's
micro-batches with the token-mean loss (packed rows: the float64 update computed from every
document of the step run alone). The ``hf`` phase must also have read every micro-batch as one
Arrow table. A control shows the equivalence can fail: the usual per-micro-batch mean is
measurably another update.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

import pytest
import torch

from tests.scripts.strategy_common import ACCUMULATE, NUM_EXAMPLES
from tests.strategies._reference import (
    packed_reference_update,
    params_of,
    reference_update,
    step_micro_batches,
)
from tests.strategies.runs import STEPS, WORLD_SIZE, Launch, Run, kind_of

# float32 training vs a float64 reference: updates agree to ~1e-7 here; the naive recipe
# misses by ~1e-3.
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
#: A float64 reference update: (parameters before, the step's micro-batches) -> parameters after.
Reference = Callable[[dict[str, list[Any]], list[list[int]]], dict[str, torch.Tensor]]
LAYOUTS = {"list": "padded", "hf": "padded", "stream": "padded", "packed": "packed"}


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


def assert_first_update_is(records: list[dict[str, Any]], expected: dict[str, Any]) -> None:
    init, after = params_of(records[0]["init"]), params_of(records[0]["params"]["1"])
    for name, value in expected.items():
        torch.testing.assert_close(after[name] - init[name], value - init[name], **TOLERANCE)


def assert_every_update_is(records: list[dict[str, Any]], reference: Reference) -> None:
    """Every step's update equals ``reference`` from the parameters before it, on the union of
    the step's micro-batches; and the ranks agree after every step."""
    params = [records[0]["init"]] + [records[0]["params"][str(s)] for s in range(1, STEPS + 1)]
    for step in range(STEPS):
        expected = reference(params[step], step_micro_batches(records, step))
        before, after = params_of(params[step]), params_of(params[step + 1])
        for name, value in expected.items():
            delta = after[name] - before[name]
            torch.testing.assert_close(delta, value - before[name], **TOLERANCE)
    for step in records[0]["params"]:
        assert records[0]["params"][step] == records[1]["params"][step], step


class Training:
    """The checks every strategy's launch passes, on each of its plain-training phases."""

    LAUNCH: ClassVar[Launch]

    def test_every_rank_trains_the_same_steps_and_parameters(self, run: Run, phase: str) -> None:
        records = run.phase(phase)
        if kind_of(phase) == "hf":
            assert_read_as_arrow(records)
        assert {r["layout"] for r in records} == {LAYOUTS[kind_of(phase)]}
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

    def test_update_equals_single_process_token_mean(self, run: Run, phase: str) -> None:
        records = run.phase(phase)
        # Every step, not only the first: a step whose micro-batches hold equal token counts
        # (the stream phase's first) cannot tell the token mean from the naive one.
        reference = packed_reference_update if kind_of(phase) == "packed" else reference_update
        assert_every_update_is(records, reference)

    def test_naive_micro_batch_mean_is_a_different_update(self, run: Run, list_phase: str) -> None:
        # The equivalence test above can fail: the usual recipe (each micro-batch's own mean,
        # averaged over accumulation and ranks) is measurably off on the same data and init.
        records = run.phase(list_phase)
        naive = reference_update(records[0]["init"], step_micro_batches(records, 0), naive=True)
        errors = max_update_error(records, naive)
        assert max(errors.values()) > 100 * TOLERANCE["atol"], errors
        with pytest.raises(AssertionError):
            assert_first_update_is(records, naive)
