"""The pieces of the budget finder on their own: model, probes, prediction, settings, result.

:func:`~lightning_varbatch.memory.find_max_tokens` as a whole is tested in
``tests/test_budget_finder.py``; here each module's contract, as the search relies on it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.memory.model import Probe, check_growth, fit_memory_model
from lightning_varbatch.memory.prediction import planning_lengths, predict_worst, single_budget
from lightning_varbatch.memory.probes import OUT_OF_MEMORY, probe_shapes, run_probe
from lightning_varbatch.memory.result import BudgetResult
from lightning_varbatch.memory.search import find_max_tokens
from lightning_varbatch.memory.settings import check_plan_settings, search_settings
from lightning_varbatch.planner import EpochPlanner, PlanConfig


def _peak(examples: int, length: int) -> float:
    return 1000.0 + 8 * examples * length + examples * length**2 / 16


# -- model ---------------------------------------------------------------------------------


def test_the_fit_recovers_known_coefficients_and_drops_a_negative_one() -> None:
    shapes = [(1, 64), (8, 64), (4, 128), (2, 256), (16, 32)]
    assert fit_memory_model([Probe(b, n, _peak(b, n)) for b, n in shapes]) == (1000, 8, 1 / 16)
    # memory that shrinks with L² (noise) gets c = 0, and a, b refitted on their own
    probes = [Probe(b, n, 500 + 3 * b * n - 1e-6 * b * n * n) for b, n in shapes]
    a, b, c = fit_memory_model(probes)
    assert c == 0.0 and b == pytest.approx(3, rel=1e-3) and a > 0


def test_the_fit_needs_three_successful_probes_of_separable_shapes() -> None:
    with pytest.raises(ValueError, match="at least 3 successful probes, got 2"):
        fit_memory_model([Probe(1, 8, 10.0), Probe(2, 8, 20.0), Probe(4, 8, None)])
    with pytest.raises(ValueError, match="cannot separate a, b and c"):
        fit_memory_model([Probe(1, 8, 10.0), Probe(2, 8, 20.0), Probe(3, 8, 30.0)])


def test_memory_that_does_not_grow_is_refused_naming_each_probe() -> None:
    check_growth((0.0, 0.0, 1.0), [])  # grows with L²: fine
    probes = [Probe(4, 8, 100.0), Probe(1, 8, 100.0), Probe(2, 2, None)]
    with pytest.raises(ValueError, match=r"\(flat or decreasing as the batch grows: 1 x 8 "):
        check_growth((100.0, 0.0, 0.0), probes)


# -- probes --------------------------------------------------------------------------------


@pytest.mark.parametrize("error", OUT_OF_MEMORY)
def test_an_out_of_memory_probe_is_a_result_other_errors_propagate(error: type) -> None:
    def run(examples: int, length: int) -> int:
        raise error("out of memory") if error is not MemoryError else MemoryError()

    assert run_probe(run, 3, 7) == Probe(3, 7, None)

    def crash(examples: int, length: int) -> int:
        raise RuntimeError("can't allocate memory")  # torch's CPU allocator: not told apart

    with pytest.raises(RuntimeError, match="allocate"):
        run_probe(crash, 3, 7)


@pytest.mark.parametrize(
    ("value", "error", "match"),
    [
        (True, TypeError, "returned True"),
        ("1e9", TypeError, "returned '1e9'"),
        (torch.tensor(5.0), TypeError, "Tensor"),
        (0, ValueError, "no memory at all"),
        (-3.0, ValueError, "no byte count"),
        (float("nan"), ValueError, "no byte count"),
    ],
)
def test_a_probe_must_return_positive_bytes(value: object, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        run_probe(lambda b, n: value, 2, 4)  # type: ignore[arg-type,return-value]
    assert run_probe(lambda b, n: np.int64(7), 2, 4) == Probe(2, 4, 7.0)  # type: ignore[arg-type,return-value]


@pytest.mark.parametrize("count", [3, 4, 7])
def test_probe_shapes_alternate_lengths_grow_and_are_distinct(count: int) -> None:
    shapes = probe_shapes(90, [90, 20_000], count)
    assert len(shapes) == count == len(set(shapes))
    assert [n for _, n in shapes] == [90 if i % 2 == 0 else 30 for i in range(count)]
    tokens = [b * n for b, n in shapes]
    assert tokens[0] == 90 and tokens == sorted(tokens)


# -- prediction ----------------------------------------------------------------------------


def test_the_predicted_worst_is_the_brute_force_worst_over_epochs() -> None:
    rng = np.random.default_rng(0)
    lengths = rng.integers(4, 200, 600)
    coef = (1000.0, 8.0, 1 / 16)
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=2048))
    want = max(
        (_peak(len(mb), int(lengths[mb].max())), len(mb), int(lengths[mb].max()))
        for epoch in range(3)
        for mb in (
            planner.plan(epoch=epoch, world_size=2).micro_batch(s, r, m)
            for s in range(planner.plan(epoch=epoch, world_size=2).num_steps)
            for r in range(2)
            for m in range(1)
        )
        if len(mb)
    )
    assert predict_worst(lengths, 2048, coef, 3, 2, {}) == pytest.approx(want)


def test_a_budget_that_cannot_be_planned_is_recorded_not_raised() -> None:
    refused: list[tuple[int, ValueError]] = []
    assert predict_worst([10, 500], 100, (0.0, 1.0, 0.0), 1, 1, {}, refused) is None
    assert [b for b, _ in refused] == [100] and "500" in str(refused[0][1])


def test_planning_lengths_and_the_budget_of_one_example() -> None:
    assert planning_lengths(np.array([[3, 9], [7, 2]])).tolist() == [9, 7]
    with pytest.raises(ValueError, match="lengths"):
        planning_lengths([3, -1])
    assert single_budget(PlanConfig(max_tokens=64, pad_to_multiple_of=8), 61) == 64
    quadratic = PlanConfig(max_tokens=64, cost="quadratic", quadratic_coef=0.5)
    assert single_budget(quadratic, 10) == 60  # 10 + 0.5 * 10²


# -- settings ------------------------------------------------------------------------------


def test_settings_resolve_the_range_and_check_before_any_probe() -> None:
    s = search_settings(_peak, [30, 61, 90], 10**6, plan_settings={"pad_to_multiple_of": 8})
    assert (s.longest, s.needed, s.low, s.high) == (96, 96, 96, 64 * 96)
    assert s.step == max(8, -(-(s.high - s.low) // 1024)) and s.allowed == 0.9 * 10**6
    grid = search_settings(_peak, [30, 90], 10**6, candidates=[4096, 1024, 1024])
    assert (grid.grid, grid.low, grid.high, grid.step) == ([1024, 4096], 1024, 4096, None)
    # the first bad setting is the one reported, whatever comes after it
    with pytest.raises(SettingTypeError, match="memory_limit_bytes"):
        search_settings(None, [3], "1e9")  # type: ignore[arg-type]
    with pytest.raises(SettingValueError, match="every budget of bounds"):
        search_settings(_peak, [30, 500], 10**6, bounds=(10, 400))


def test_plan_settings_refuse_max_tokens_and_suggest_a_spelling() -> None:
    assert check_plan_settings({"max_examples": 3}, top=64) == PlanConfig(64, max_examples=3)
    with pytest.raises(SettingValueError, match="chooses max_tokens itself"):
        check_plan_settings({"max_tokens": 64}, top=64)
    with pytest.raises(SettingTypeError, match="did you mean 'max_examples'"):
        check_plan_settings({"max_example": 3}, top=64)


# -- result and search ---------------------------------------------------------------------


def test_the_result_predicts_and_saves_what_it_holds(tmp_path: Path) -> None:
    probes = (Probe(1, 8, 100.0), Probe(2, 8, None))
    result = BudgetResult(4096, 2**30, 0.1, (10.0, 2.0, 0.5), 4, 64, 2570.0, 2600.0, probes)
    assert result.predict(4, 64) == 10 + 2 * 4 * 64 + 0.5 * 4 * 64 * 64
    assert result.overrides("datamodule") == ["datamodule.max_tokens=4096"]
    result.save(tmp_path / "budget.json")
    saved = json.loads((tmp_path / "budget.json").read_text())
    assert saved == result.to_dict()
    assert saved["probes"][1] == {"examples": 2, "length": 8, "peak_bytes": None}


def test_the_search_picks_the_largest_candidate_whose_worst_fits() -> None:
    lengths = np.arange(8, 129).repeat(20)
    result = find_max_tokens(_peak, lengths, 200_000, candidates=range(1024, 16385, 1024))
    assert result.max_tokens == 10240
    for budget in (result.max_tokens, result.max_tokens + 1024):
        worst = predict_worst(lengths, budget, result.coefficients, 1, 1, {})
        assert worst is not None
        assert (worst[0] <= 0.9 * 200_000) == (budget == result.max_tokens)
