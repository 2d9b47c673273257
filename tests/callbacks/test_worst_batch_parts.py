"""The pieces of the worst-batch check on their own: peak memory, kept state, report, picks."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch

import lightning_varbatch.callbacks.worst_batch as worst_batch
from lightning_varbatch.callbacks import WorstBatchCheck
from lightning_varbatch.callbacks.training_state import KeepTrainingState
from lightning_varbatch.callbacks.worst_batch_run import failure_message, run_micro_batch, step_once
from lightning_varbatch.callbacks.worst_micro_batches import (
    KINDS,
    WorstBatch,
    check_names,
    worst_micro_batches,
    worst_tiles,
)
from lightning_varbatch.callbacks.worst_ranks import gather_reports, over_limit, worst_metrics
from lightning_varbatch.callbacks.worst_report import advice, format_report, gib
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.peak_memory import (
    measure_peak,
    measure_peak_rise,
    process_status_bytes,
    reset_rss_peak,
)

HAS_PROC = process_status_bytes("VmHWM") is not None


def test_the_check_and_its_names_keep_their_import_paths() -> None:
    assert worst_batch.WorstBatchCheck is WorstBatchCheck
    moved = {
        "KINDS": KINDS,
        "WorstBatch": WorstBatch,
        "advice": advice,
        "check_names": check_names,
        "format_report": format_report,
        "measure_peak": measure_peak,
        "worst_micro_batches": worst_micro_batches,
        "worst_tiles": worst_tiles,
    }
    for name, value in moved.items():
        assert getattr(worst_batch, name) is value, name
        assert name in worst_batch.__all__
    import lightning_varbatch
    import lightning_varbatch.callbacks as callbacks

    assert "WorstBatchCheck" in callbacks.__all__
    assert lightning_varbatch.WorstBatchCheck is WorstBatchCheck


@pytest.mark.skipif(not HAS_PROC or not reset_rss_peak(), reason="needs a resettable VmHWM")
def test_peak_and_rise_see_a_known_allocation() -> None:
    size = 64 * 2**20  # 64 MiB, touched so that it is resident

    def allocate() -> float:
        block = torch.ones(size // 4)
        return float(block[-1])

    _, peak, source = measure_peak(allocate)
    _, rise, rise_source = measure_peak_rise(allocate)
    assert (source, rise_source) == ("cpu_vmhwm", "cpu_vmhwm")
    rss = process_status_bytes("VmRSS")
    assert rss is not None and peak >= size
    assert rise is not None and size * 0.9 <= rise <= peak
    _, nothing, _ = measure_peak_rise(lambda: None)
    assert nothing is not None and nothing < size // 4


def test_measure_peak_returns_the_result_and_passes_errors_through() -> None:
    result, _, _ = measure_peak(lambda: "done")
    assert result == "done"
    with pytest.raises(ZeroDivisionError):
        measure_peak_rise(lambda: 1 / 0)


def test_kept_state_puts_back_buffers_gradients_and_every_rng() -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    model(torch.randn(8, 3)).sum().backward()  # gradients and statistics before the check
    grads = [p.grad.clone() for p in model.parameters()]
    stats = model[1].running_mean.clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    states = (torch.get_rng_state(), np.random.get_state()[1].copy(), random.getstate())  # noqa: NPY002
    with KeepTrainingState(model, [optimizer]):
        model(torch.randn(16, 3) * 5).pow(2).sum().backward()
        np.random.rand(3)  # noqa: NPY002
        random.random()
    assert torch.equal(model[1].running_mean, stats)
    for p, g in zip(model.parameters(), grads, strict=True):
        assert torch.equal(p.grad, g)
    assert torch.equal(torch.get_rng_state(), states[0])
    assert np.array_equal(np.random.get_state()[1], states[1])  # noqa: NPY002
    assert random.getstate() == states[2]


def test_kept_state_restores_missing_gradients_as_none() -> None:
    model = torch.nn.Linear(2, 1)
    with KeepTrainingState(model, []):
        model(torch.ones(1, 2)).sum().backward()
    assert all(p.grad is None for p in model.parameters())


def test_report_words() -> None:
    assert gib(2**31) == "2.00 GiB"
    row = {"kind": "attention", "examples": 2, "longest": 9, "padded_tokens": 18}
    row |= {"attention": 162, "peak_bytes": None, "rank": 3, "memory": "cuda_max_allocated"}
    text = format_report([row], limit=2**30)
    assert (
        text.splitlines()[0] == "worst micro-batches (rank 3, cuda_max_allocated, limit 1.00 GiB):"
    )
    assert text.splitlines()[1].split() == "attention 2 x 9 tokens 18 padded tokens peak ?".split()
    assert format_report([]) == "worst micro-batches: none (this rank has no micro-batches)"


def test_picks_are_the_largest_of_each_kind_on_every_rank() -> None:
    """Against a brute force over each rank's own micro-batches."""
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 60, 400)
    for rank in range(3):
        sampler = TokenBudgetBatchSampler(lengths, 128, rank=rank, world_size=3, seed=1)
        batches = [sampler.micro_batch(i) for i in range(len(sampler))]
        figures = [
            (len(b) * int(lengths[b].max()), len(b), len(b) * int(lengths[b].max()) ** 2)
            for b in batches
        ]
        picks = worst_micro_batches(sampler)
        assert [w.kind for w in picks] == list(KINDS) == check_names(sampler)
        for w, column in zip(picks, range(3), strict=True):
            best = max(f[column] for f in figures)
            first = next(i for i, f in enumerate(figures) if f[column] == best)
            assert (w.position, w.rank) == (first, rank)
            assert (w.examples, w.longest) == (
                len(batches[first]),
                int(lengths[batches[first]].max()),
            )


def test_the_old_tile_names_still_work_and_warn() -> None:
    """Micro-batches were once called tiles: the old names read the new ones, with a warning."""
    sampler = TokenBudgetBatchSampler([2, 2, 2, 8], 8, rank=0, world_size=1, shuffle=False)
    picks = worst_micro_batches(sampler)
    with pytest.warns(DeprecationWarning, match="worst_micro_batches"):
        assert worst_tiles(sampler) == picks
    with pytest.warns(DeprecationWarning, match="micro_batch"):
        assert picks[0].tile == picks[0].micro_batch
    row = picks[0].to_dict()
    assert row["tile"] == row["micro_batch"] == picks[0].micro_batch


@pytest.mark.skipif(not HAS_PROC, reason="needs /proc")
def test_cpu_measurement_needs_no_torch() -> None:
    """The numpy-only benchmarks measure with it without loading torch."""
    import subprocess
    import sys
    from pathlib import Path

    from tests.test_layers import BLOCKER

    code = (
        "from lightning_varbatch.peak_memory import measure_peak, measure_peak_rise\n"
        "out, peak, source = measure_peak(lambda: bytearray(32 << 20)[-1])\n"
        "_, rise, _ = measure_peak_rise(lambda: bytes(bytearray(32 << 20))[-1])\n"
        "print(out, peak > 32 << 20, source, rise is None or rise > 16 << 20)\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & BLOCKED))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER + code],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    first, loaded = done.stdout.strip().splitlines()
    assert first.split()[0:2] == ["0", "True"] and first.split()[3] == "True"
    assert loaded == "[]"


# -- running one micro-batch, and every rank's results ---------------------------------------


def _fake_trainer(step: Any, model: torch.nn.Module) -> SimpleNamespace:
    """What run_micro_batch uses of a Trainer: the strategy's step and backward, optimizers."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = SimpleNamespace(
        batch_to_device=lambda batch: batch,
        training_step=lambda batch, index: step(batch),
        pre_backward=lambda loss: None,
        post_backward=lambda loss: None,
        precision_plugin=SimpleNamespace(backward=lambda loss, module, opt: loss.backward()),
    )
    return SimpleNamespace(strategy=strategy, optimizers=[optimizer], lightning_module=model)


def _one_pick() -> tuple[TokenBudgetBatchSampler, WorstBatch, list[torch.Tensor]]:
    sampler = TokenBudgetBatchSampler([2, 2, 2, 8], 8, rank=0, world_size=1, shuffle=False)
    dataset = [torch.full((n,), float(i)) for i, n in enumerate([2, 2, 2, 8])]
    return sampler, worst_micro_batches(sampler, ("examples",))[0], dataset


def _collate(items: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(items, batch_first=True)


def test_a_checked_micro_batch_runs_forward_and_backward_and_leaves_no_gradient() -> None:
    sampler, pick, dataset = _one_pick()
    model = torch.nn.Linear(2, 1)
    seen: list[tuple[int, ...]] = []

    def step(batch: torch.Tensor) -> dict[str, torch.Tensor]:
        seen.append(tuple(batch.shape))
        return {"loss": model(batch[:, :2]).sum()}

    trainer = _fake_trainer(step, model)
    peak, source = run_micro_batch(trainer, sampler, dataset, _collate, pick, torch.device("cpu"))
    assert seen == [(3, 2)] and peak > 0 and source.startswith("cpu")
    assert all(p.grad is None for p in model.parameters())


def test_out_of_memory_becomes_a_runtime_error_naming_the_shape_and_the_settings() -> None:
    sampler, pick, dataset = _one_pick()

    def step(batch: torch.Tensor) -> torch.Tensor:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore")

    trainer = _fake_trainer(step, torch.nn.Linear(2, 1))
    with pytest.raises(RuntimeError) as caught:
        run_micro_batch(trainer, sampler, dataset, _collate, pick, torch.device("cpu"))
    text = str(caught.value)
    assert "the micro-batch with the most examples (3 examples x 2 tokens" in text
    assert "ran out of memory (OutOfMemoryError: CUDA out of memory. Tried" in text
    assert "more" not in text and "lower max_tokens=8" in text
    assert isinstance(caught.value.__cause__, torch.OutOfMemoryError)


def test_other_errors_keep_their_type_and_get_the_same_words_as_a_note() -> None:
    sampler, pick, dataset = _one_pick()

    def step(batch: torch.Tensor) -> torch.Tensor:
        raise KeyError("target")

    trainer = _fake_trainer(step, torch.nn.Linear(2, 1))
    with pytest.raises(KeyError) as caught:
        run_micro_batch(trainer, sampler, dataset, None, pick, torch.device("cpu"))
    (note,) = caught.value.__notes__
    assert note.startswith(
        failure_message(sampler, pick, "raised KeyError in its forward or backward", "")
    )
    with pytest.raises(RuntimeError, match="returned no loss tensor"):
        step_once(
            _fake_trainer(lambda b: {"x": 1}, torch.nn.Linear(2, 1)), dataset, None, [0], pick
        )


def test_every_ranks_results_and_the_largest_peak_of_each_kind() -> None:
    picks = [
        WorstBatch("examples", 0, 4, 3, 2, 6, 12, peak_bytes=300, rank=0),
        WorstBatch("attention", 1, 7, 1, 8, 8, 64, peak_bytes=500, rank=0),
    ]
    assert [over_limit(w, 400) for w in picks] == [False, True]
    trainer = SimpleNamespace(world_size=1)
    (mine,) = gather_reports(trainer, picks, ["examples", "attention"], 400)  # type: ignore[arg-type]
    assert mine == [
        {"kind": "examples", "examples": 3, "longest": 2, "peak_bytes": 300, "over": False},
        {"kind": "attention", "examples": 1, "longest": 8, "peak_bytes": 500, "over": True},
    ]
    other = [{"kind": "examples", "examples": 5, "longest": 1, "peak_bytes": 350}]
    metrics = worst_metrics([mine, other, []], ["examples", "attention", "shape 4x2"])
    assert metrics == {
        "memory/worst/examples/peak_bytes": 350.0,
        "memory/worst/examples/examples": 5.0,
        "memory/worst/examples/longest": 1.0,
        "memory/worst/attention/peak_bytes": 500.0,
        "memory/worst/attention/examples": 1.0,
        "memory/worst/attention/longest": 8.0,
    }


def test_under_a_shape_budget_the_words_name_examples_and_padded_rows_apart() -> None:
    lengths = np.random.default_rng(0).integers(1, 60, 500)
    sampler = TokenBudgetBatchSampler(lengths, 512, rank=0, world_size=1, max_shapes=3)
    picks = worst_micro_batches(sampler)
    shapes = sampler.planner.shapes.tolist()  # type: ignore[attr-defined]
    masked = 0
    for w in picks:
        assert w.rows is not None and [w.rows, w.longest] in shapes
        assert w.padded_tokens == w.rows * w.longest  # what the words multiply out to
        if w.rows != w.examples:
            masked += 1
            assert w.shape() == f"{w.examples} examples in {w.rows} rows x {w.longest} tokens"
            line = format_report([{**w.to_dict(), "memory": "cpu", "peak_bytes": None}])
            assert f"{w.examples} in {w.rows} rows x {w.longest} tokens" in line
            assert w.shape() in failure_message(sampler, w, "ran out of memory", "")
        else:
            assert w.shape() == f"{w.examples} examples x {w.longest} tokens"
    assert masked, "no pick with masked rows: the case no longer tests the words"
    plain = TokenBudgetBatchSampler(lengths, 512, rank=0, world_size=1)
    assert all(w.rows is None for w in worst_micro_batches(plain))
