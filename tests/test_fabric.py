"""Lightning Fabric loops with real processes: exact token mean, the LR rule, SIGKILL and resume.

One killed launch per strategy (``tests/scripts/fabric_train.py``) records the bad inputs, an
uninterrupted reference run and a run that SIGKILLs itself mid-epoch after ``fabric.save``; a
second launch resumes from the checkpoint, a third on one process (another world size).
"""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.launch import SCRIPTS, launch, start_ranks, wait_ranks
from tests.scripts.fabric_common import REFERENCE, SAVE_AT, STEPS, decay
from tests.scripts.strategy_common import LR
from tests.strategies._reference import params_of, reference_update, step_micro_batches

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]
WORLD = 2


def killed_run(out: Path, strategy: str) -> list[dict[str, Any]]:
    """Launch the killed mode: every rank must die of SIGKILL after writing its reference."""
    procs = start_ranks(
        [sys.executable, str(SCRIPTS / "fabric_train.py"), str(out), strategy, "killed"],
        WORLD,
        env={"DS_ACCELERATOR": "cpu"},
    )
    logs = wait_ranks(procs, f"fabric_train.py {strategy} killed", 180)
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == -signal.SIGKILL, f"rank {rank}: {proc.returncode}\n{log[-3000:]}"
    assert (out / "ckpt").exists()
    return [json.loads((out / f"reference_rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.fixture(scope="module", params=["ddp", "deepspeed"])
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    strategy = request.param
    out = tmp_path_factory.mktemp(f"fabric_{strategy}")
    references = killed_run(out, strategy)
    resumed = launch("fabric_train.py", WORLD, out, strategy, "resume", str(out / "ckpt"))
    return strategy, out, references, resumed


def test_the_bad_inputs_are_refused_in_the_trainer_vocabulary(runs: Any) -> None:
    _, _, references, _ = runs
    for record in references:
        refused = record["refused"]
        assert "use_distributed_sampler=False" in refused["sampler_injected"]
        assert "TokenBudgetBatchSampler" in refused["not_token_budget"]
        assert "accumulate_grad_batches=1, but the loop runs" in refused["accumulation_mismatch"]


def test_every_update_is_the_float64_token_mean_at_the_scaled_lr(runs: Any) -> None:
    """SGD: each step moves by lr_schedule(step) * rule factor * the step's token-mean gradient."""
    _, _, references, _ = runs
    runs_by_rank = [r["reference"] for r in references]
    ref = runs_by_rank[0]
    assert all(r["init"] == ref["init"] for r in runs_by_rank)
    previous = ref["init"]
    for step in range(STEPS):
        for r in runs_by_rank:  # every rank holds the same parameters after every step
            assert r["params"][str(step)] == ref["params"][str(step)]
        record = ref["steps"][step]
        micro = step_micro_batches(runs_by_rank, step)
        assert len(micro) == WORLD * 2
        ntokens = record["step_ntokens"]
        assert record["lr"] == pytest.approx(LR * decay(step))  # the scheduler's, unscaled
        assert record["scale"] == pytest.approx(ntokens / REFERENCE)  # the linear rule
        start = params_of(previous)
        unit = reference_update(previous, micro)  # float64, lr = 1 (LR)
        lr = record["lr"] * record["scale"] / LR
        got = params_of(ref["params"][str(step)])
        for name, value in got.items():
            expected = start[name] + lr * (unit[name] - start[name])
            torch.testing.assert_close(value, expected, rtol=1e-4, atol=1e-5)
        previous = ref["params"][str(step)]


def test_rules_log_through_fabric_and_the_meter_counts_every_token(runs: Any) -> None:
    _, _, references, _ = runs
    logged = references[0]["reference"]["logged"]
    assert references[1]["reference"]["logged"] == []  # rank 0 logs
    scales = {row["step"]: row["train/lr_scale"] for row in logged if "train/lr_scale" in row}
    assert sorted(scales) == [1, 3, 5]  # log_every_n_steps=2
    steps = references[0]["reference"]["steps"]
    for step, scale in scales.items():
        assert scale == pytest.approx(steps[step]["scale"])
    rates = [row for row in logged if "train/tokens_per_sec" in row]
    assert [row["step"] for row in rates] == [1, 3, 5]
    total = sum(s["step_ntokens"] for s in steps)
    for record in references:
        assert record["reference"]["totals"]["train/run/loss_tokens"] == total
    assert rates[-1]["train/total_tokens"] == total


def test_sigkill_then_resume_ends_at_the_same_weights(runs: Any) -> None:
    _, _, references, resumed = runs
    for reference, record in zip(references, resumed, strict=True):
        ref, res = reference["reference"], record["resumed"]
        after = [m for m in ref["micro_batches"] if m["step"] > SAVE_AT - 1]
        assert res["micro_batches"] == after  # the same micro-batches after the checkpoint
        for name, value in params_of(res["final"]).items():
            torch.testing.assert_close(value, params_of(ref["final"])[name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("runs", ["ddp"], indirect=True)  # a ZeRO checkpoint needs its world
def test_a_two_process_checkpoint_resumes_on_one(runs: Any, tmp_path: Path) -> None:
    strategy, out, references, _ = runs
    (record,) = launch("fabric_train.py", 1, tmp_path, strategy, "rest", str(out / "ckpt"))
    before = [
        i
        for r in references
        for m in r["reference"]["micro_batches"]
        if m["step"] < SAVE_AT
        for i in m["ids"]
    ]
    after = [i for m in record["resumed"]["micro_batches"] for i in m["ids"]]
    assert sorted(before + after) == list(range(120))  # the epoch goes on: every example once
