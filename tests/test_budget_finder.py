"""find_max_tokens: fit a + b·B·L + c·B·L² from probes and pick the largest budget that fits."""

from __future__ import annotations

import json
import math
import multiprocessing
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from lightning_varbatch import TokenBudgetBatchSampler
from lightning_varbatch.callbacks.worst_batch import measure_peak
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.memory import Probe, find_max_tokens, fit_memory_model

A, B, C = 5e6, 96.0, 0.75  # bytes: fixed, per padded token, per attention pair
LIMIT = 15_000_000
MARGIN = 0.1


def exact(examples: int, length: int) -> float:
    return A + B * examples * length + C * examples * length * length


def _lengths() -> np.ndarray:
    return np.random.default_rng(0).integers(1, 200, 3000)


def worst_exact(lengths: np.ndarray, max_tokens: int, **settings: object) -> float:
    """Independent scan: the exact memory of every micro-batch a sampler yields, its max."""
    sampler = TokenBudgetBatchSampler(lengths, max_tokens, rank=0, world_size=1, **settings)
    return max(exact(len(b), int(lengths[list(b)].max())) for b in sampler)


@pytest.mark.slow
def test_fit_recovers_the_model_and_the_choice_is_the_optimum(tmp_path: Path) -> None:
    lengths = _lengths()
    grid = list(range(256, 65_537, 256))
    result = find_max_tokens(exact, lengths, LIMIT, candidates=grid, margin=MARGIN)
    np.testing.assert_allclose(result.coefficients, (A, B, C), rtol=1e-6)
    allowed = LIMIT * (1 - MARGIN)
    optimum = max(t for t in grid if t >= 199 and worst_exact(lengths, t) <= allowed)
    assert result.max_tokens == optimum
    assert result.measured_bytes == exact(result.worst_examples, result.worst_longest)
    assert result.measured_bytes <= allowed
    assert result.predicted_bytes == pytest.approx(result.measured_bytes, rel=1e-6)
    assert len(result.probes) == 5  # 4 probes + the verification
    assert result.overrides() == [f"data.max_tokens={optimum}"]
    assert result.overrides("datamodule") == [f"datamodule.max_tokens={optimum}"]
    result.save(tmp_path / "budget.json")
    saved = json.loads((tmp_path / "budget.json").read_text())
    assert saved["max_tokens"] == optimum and len(saved["probes"]) == 5


def test_bisection_is_optimal_within_one_step_with_plan_settings() -> None:
    lengths = _lengths()
    step = 64
    result = find_max_tokens(
        exact, lengths, LIMIT, bounds=(256, 60_000), step=step, max_examples=256, seed=1
    )
    allowed = LIMIT * (1 - MARGIN)
    assert (result.max_tokens - 256) % step == 0
    assert worst_exact(lengths, result.max_tokens, max_examples=256, seed=1) <= allowed
    assert worst_exact(lengths, result.max_tokens + step, max_examples=256, seed=1) > allowed


def test_out_of_memory_probes_push_the_budget_down() -> None:
    lengths = _lengths()

    def run_batch(examples: int, length: int) -> float:
        if examples * length > 6000:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        return exact(examples, length)

    result = find_max_tokens(
        run_batch, lengths, 10 * LIMIT, candidates=range(256, 65_537, 256), rounds=8
    )
    assert result.worst_examples * result.worst_longest <= 6000
    assert any(p.peak_bytes is None for p in result.probes)


def test_errors() -> None:
    lengths = _lengths()
    with pytest.raises(ValueError, match="No budget fits memory_limit_bytes=1000"):
        find_max_tokens(exact, lengths, 1000, candidates=[256, 512])
    with pytest.raises(ValueError, match="margin"):
        find_max_tokens(exact, lengths, LIMIT, margin=1.0)
    with pytest.raises(ValueError, match="probes"):
        find_max_tokens(exact, lengths, LIMIT, probes=2)
    with pytest.raises(TypeError, match="peak memory in bytes"):
        find_max_tokens(lambda b, n: "big", lengths, LIMIT)  # type: ignore[arg-type,return-value]
    with pytest.raises(ValueError, match="at least 3 successful probes"):
        fit_memory_model([Probe(1, 8, 10.0), Probe(2, 8, 12.0)])


class Tiny(nn.Module):
    """Embedding, one attention score matrix (B·L² memory), an output layer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(100, 32)
        self.out = nn.Linear(32, 100)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        scores = torch.softmax(h @ h.transpose(1, 2) / 32**0.5, dim=-1)
        logits = self.out(scores @ h)
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())


def _real_model_budget() -> tuple[int, int, int, int]:
    """find_max_tokens on a real model by CPU RSS; runs in a fresh process (see the test)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = Tiny()

    def run_batch(examples: int, length: int) -> int:
        def step() -> None:
            tokens = torch.randint(1, 100, (examples, length))
            model(tokens).backward()
            model.zero_grad(set_to_none=True)

        return measure_peak(step)[1]

    lengths = np.random.default_rng(1).integers(8, 128, 2000)
    baseline = measure_peak(lambda: None)[1]
    limit = baseline + 96 * 2**20  # ~100 MB on top of what the process holds
    margin = 0.5 * 96 * 2**20 / limit  # 10 % of the whole limit would exceed the headroom
    result = find_max_tokens(
        run_batch, lengths, limit, candidates=range(128, 32_769, 128), margin=margin
    )
    again = run_batch(result.worst_examples, result.worst_longest)
    return result.measured_bytes, limit, again, result.max_tokens


def test_real_model_on_cpu_rss() -> None:
    # The peak is the whole process's resident set. Inside a long test session the allocator
    # keeps memory that earlier tests freed, so the RSS did not grow with the batch at all
    # (probes flat at 886 MB once): measure in a fresh process, as a user's run does.
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        measured, limit, again, max_tokens = pool.apply(_real_model_budget)
    assert measured <= limit  # the finder's own verifying probe
    # Running the chosen worst batch again: the resident-set peak varies by some MB between
    # identical runs (allocator reuse); far above it would mean the budget was not checked.
    assert again <= limit + 48 * 2**20
    assert max_tokens >= 128


def test_with_a_shape_budget_every_shape_fits_and_has_the_most_rows_that_fit() -> None:
    """max_shapes + the cost model fitted to memory: per-shape rows follow the memory model.

    With ``cost="quadratic"`` and ``quadratic_coef = c / b``, the planner's cost of ``B`` rows of
    length ``L`` is the memory model's variable part over ``b``: each shape gets the most rows
    that fit the found budget, and every shape (masked rows included) fits the limit.
    """
    lengths = _lengths()
    settings = {"max_shapes": 4, "cost": "quadratic", "quadratic_coef": C / B}
    grid = list(range(1024, 262_145, 1024))
    result = find_max_tokens(exact, lengths, LIMIT, candidates=grid, margin=MARGIN, **settings)
    sampler = TokenBudgetBatchSampler(lengths, result.max_tokens, rank=0, world_size=1, **settings)
    shapes = sampler.planner.shapes
    assert shapes is not None and len(shapes) == 4
    allowed = LIMIT * (1 - MARGIN)
    for rows, length in shapes.tolist():  # the memory of the shape itself: rows x length
        assert exact(rows, length) <= allowed
        assert (rows + 1) * (length + C / B * length**2) > result.max_tokens  # no row to spare
    # The batches the sampler yields have exactly these shapes, and the next budget up would
    # put a shape over the limit (the finder chose the largest that fits).
    seen = {(b.pad_rows, b.pad_length) for b in sampler}
    assert seen <= {tuple(s) for s in shapes.tolist()}
    bigger = TokenBudgetBatchSampler(
        lengths, result.max_tokens + 1024, rank=0, world_size=1, **settings
    ).planner.shapes
    assert bigger is not None
    assert max(exact(r, n) for r, n in bigger.tolist()) > allowed


class Counted:
    """``exact``, counting its calls: a bad setting must be refused before any probe runs."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, examples: int, length: int) -> float:
        self.calls += 1
        return exact(examples, length)


@pytest.mark.parametrize(
    ("returned", "kind"),
    [
        (0, ValueError),
        (0.0, ValueError),
        (-5.0, ValueError),
        (float("nan"), ValueError),
        (float("inf"), ValueError),
        (np.float32("nan"), ValueError),
        ("big", TypeError),
        (None, TypeError),
        (True, TypeError),
        (torch.tensor(5e6), TypeError),
    ],
    ids=["zero", "zero-float", "negative", "nan", "inf", "np-nan", "str", "none", "bool", "tensor"],
)
def test_a_probe_that_measures_nothing_is_named(returned: object, kind: type) -> None:
    with pytest.raises(kind) as info:
        find_max_tokens(lambda b, n: returned, _lengths(), LIMIT)  # type: ignore[arg-type,return-value]
    assert type(info.value) is kind
    text = str(info.value)
    assert "run_batch(examples=1, length=199)" in text  # the first probe: one longest example
    assert repr(returned) in text and "peak memory in bytes" in text


@pytest.mark.parametrize(
    "run_batch",
    [
        lambda b, n: 7e6,  # flat: measures something that does not hold the batch
        lambda b, n: 1e9 - 10 * b * n,  # decreasing
        lambda b, n: 1e9 - b * n * n,  # decreasing in the attention term
    ],
    ids=["flat", "decreasing", "decreasing-quadratic"],
)
def test_memory_that_does_not_grow_with_the_batch_is_refused(run_batch: Any) -> None:
    with pytest.raises(ValueError, match="does not grow with the batch") as info:
        find_max_tokens(run_batch, _lengths(), LIMIT, candidates=range(256, 65_537, 256))
    assert type(info.value) is ValueError
    text = str(info.value)
    assert f"1 x 199 tokens: {run_batch(1, 199):.0f} bytes" in text  # the first probe
    assert text.count(" tokens: ") == 4  # every probe is listed with its figure


@pytest.mark.parametrize(
    ("settings", "error", "named"),
    [
        ({"max_examples": 0}, SettingValueError, "max_examples"),
        ({"max_examples": "8"}, SettingTypeError, "max_examples"),
        ({"pad_to_multiple_of": "4"}, SettingTypeError, "pad_to_multiple_of"),
        ({"cost": "flops"}, ValueError, "flops"),
        ({"max_example": 8}, SettingTypeError, "did you mean 'max_examples'"),
        ({"max_tokens": 4096}, SettingValueError, "candidates="),
    ],
    ids=["max_examples-0", "max_examples-str", "pad-str", "cost-unknown", "typo", "max_tokens"],
)
def test_plan_settings_are_checked_before_any_probe(
    settings: dict[str, Any], error: type, named: str
) -> None:
    run_batch = Counted()
    with pytest.raises(error) as info:
        find_max_tokens(run_batch, _lengths(), LIMIT, candidates=[512, 1024], **settings)
    assert run_batch.calls == 0
    assert named in str(info.value)
    assert "Raise the limit" not in str(info.value) and "No budget fits" not in str(info.value)


def _smallest_budget(length: int, multiple: int = 1, coef: float | None = None) -> int:
    """What one example of ``length`` costs on its own, computed by hand."""
    padded = -(-length // multiple) * multiple
    return padded if coef is None else math.ceil(padded + coef * padded**2)


@pytest.mark.parametrize(
    ("settings", "needed"),
    [
        ({}, _smallest_budget(199)),
        ({"pad_to_multiple_of": 8}, _smallest_budget(199, 8)),
        ({"cost": "quadratic", "quadratic_coef": 0.5}, _smallest_budget(199, coef=0.5)),
        ({"layout": "packed", "pad_to_multiple_of": 16}, _smallest_budget(199, 16)),
    ],
    ids=["padded", "pad-8", "quadratic", "packed"],
)
def test_budgets_all_below_the_longest_example_name_it(
    settings: dict[str, Any], needed: int
) -> None:
    lengths = _lengths()
    index = int(np.argmax(lengths))
    for search in ({"candidates": [64, needed - 1]}, {"bounds": (16, needed - 1)}):
        run_batch = Counted()
        with pytest.raises(SettingValueError) as info:
            find_max_tokens(run_batch, lengths, LIMIT, **search, **settings)  # type: ignore[arg-type]
        text = str(info.value)
        assert run_batch.calls == 0
        assert f"example {index} has length 199" in text
        assert f"max_tokens={needed}" in text
        assert info.value.setting == next(iter(search))
    # one budget that holds it is enough, and it is the one chosen when memory allows
    result = find_max_tokens(
        exact, lengths, 10**12, candidates=[64, needed - 1, needed], **settings
    )
    assert result.max_tokens == needed


def test_default_bounds_start_at_the_longest_examples_cost() -> None:
    """With cost='quadratic', budgets between the longest length and its cost cannot hold it."""
    lengths = _lengths()
    settings = {"cost": "quadratic", "quadratic_coef": C / B}
    result = find_max_tokens(exact, lengths, LIMIT, **settings)  # type: ignore[arg-type]
    assert result.max_tokens >= _smallest_budget(199, coef=C / B)
    allowed = LIMIT * (1 - MARGIN)
    assert worst_exact(lengths, result.max_tokens, **settings) <= allowed


def test_oversize_skip_may_search_below_the_longest_example() -> None:
    lengths = np.concatenate([np.full(2000, 20), [199]])
    result = find_max_tokens(exact, lengths, LIMIT, candidates=[40, 80, 120], oversize="skip")
    assert result.max_tokens == 120 and result.worst_longest == 20


@pytest.mark.parametrize(
    ("kwargs", "error", "setting"),
    [
        ({"memory_limit_bytes": "15e6"}, SettingTypeError, "memory_limit_bytes"),
        ({"memory_limit_bytes": 0}, SettingValueError, "memory_limit_bytes"),
        ({"margin": float("nan")}, SettingValueError, "margin"),
        ({"margin": 1.0}, SettingValueError, "margin"),
        ({"margin": "0.1"}, SettingTypeError, "margin"),
        ({"probes": 2}, SettingValueError, "probes"),
        ({"rounds": 0}, SettingValueError, "rounds"),
        ({"epochs": 1.0}, SettingTypeError, "epochs"),
        ({"world_size": 0}, SettingValueError, "world_size"),
        ({"step": 0, "bounds": (256, 4096)}, SettingValueError, "step"),
        ({"bounds": (4096, 256)}, SettingValueError, "bounds"),
        ({"bounds": (256,)}, SettingTypeError, "bounds"),
        ({"bounds": (256.0, 4096)}, SettingTypeError, "bounds"),
        ({"candidates": []}, SettingValueError, "candidates"),
        ({"candidates": [512, 0]}, SettingValueError, "candidates"),
        ({"candidates": 4096}, SettingTypeError, "candidates"),
        ({"run_batch": 5}, SettingTypeError, "run_batch"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_own_settings_use_the_shared_checks(
    kwargs: dict[str, Any], error: type, setting: str
) -> None:
    args: dict[str, Any] = {"run_batch": Counted(), "memory_limit_bytes": LIMIT}
    args.update(kwargs)
    run_batch = args.pop("run_batch")
    with pytest.raises(error) as info:
        find_max_tokens(run_batch, _lengths(), **args)
    assert type(info.value) is error and info.value.setting == setting
    assert setting in str(info.value)
    assert getattr(run_batch, "calls", 0) == 0


def test_memory_error_is_an_out_of_memory_probe_and_other_errors_propagate() -> None:
    lengths = _lengths()

    def python_oom(examples: int, length: int) -> float:
        if examples * length > 6000:
            raise MemoryError
        return exact(examples, length)

    result = find_max_tokens(
        python_oom, lengths, 10 * LIMIT, candidates=range(256, 65_537, 256), rounds=8
    )
    assert result.worst_examples * result.worst_longest <= 6000
    assert any(p.peak_bytes is None for p in result.probes)

    def cpu_allocator(examples: int, length: int) -> float:
        # what torch's CPU allocator raises: a plain RuntimeError, not told apart by its text
        torch.empty(2**40, dtype=torch.uint8)
        return 1.0

    with pytest.raises(RuntimeError) as info:
        find_max_tokens(cpu_allocator, lengths, LIMIT)
    assert type(info.value) is RuntimeError
