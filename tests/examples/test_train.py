"""``train(cfg)`` end to end: one process, and two processes under DDP, FSDP and DeepSpeed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hydra import compose, initialize_config_dir

from examples.translation.train import CONF_DIR, ROOT, train
from tests.examples.recorder import read_records
from tests.launch import launch

SMALL = [
    "data.num_pairs=1500",
    "data.valid=40",
    "data.test=0",
    "data.vocab_size=400",
    "data.max_length=32",
    "data.max_tokens=1024",
    "model.d_model=32",
    "model.nhead=2",
    "model.dim_feedforward=64",
    "model.num_encoder_layers=1",
    "model.num_decoder_layers=1",
    "model.max_decode_length=12",
    "model.decode_batches=1",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.log_every_n_steps=1",
]


def test_single_process_reports_bleu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # restored after the test
    torch.set_num_threads(2)  # (the conftest fixture restores its own setting)
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *SMALL,
                "trainer.max_steps=4",
                "trainer.val_check_interval=4",
                "callbacks.checkpoint.every_n_train_steps=4",
                "cpu_threads=1",
                f"output_dir={tmp_path}",
            ],
        )
    metrics = train(cfg)
    assert torch.get_num_threads() == 1
    assert os.environ["OMP_NUM_THREADS"] == "1"  # for processes Lightning would launch
    assert metrics["global_step"] == 4
    assert metrics["bleu"] is not None and 0.0 <= metrics["bleu"] <= 100.0
    assert 0.0 <= metrics["val/chrf"] <= 100.0 and metrics["val/loss"] > 0
    assert (tmp_path / "checkpoints" / "last.ckpt").exists()
    assert (tmp_path / "tokenizer.json").exists()
    assert list((tmp_path / "logs").rglob("metrics.csv"))


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    ("strategy", "options"),
    [
        ("ddp", []),
        ("fsdp", []),
        ("deepspeed", []),  # ZeRO stage 2
        ("deepspeed", ["strategy.stage=3", "strategy.offload_optimizer=true"]),
    ],
    ids=["ddp", "fsdp", "deepspeed", "deepspeed-stage3-offload"],
)
def test_two_processes(strategy: str, options: list[str], tmp_path: Path) -> None:
    records = launch(
        "translation_train.py",
        2,
        tmp_path,
        *SMALL,
        f"strategy={strategy}",
        *options,
        "trainer.accumulate_grad_batches=2",
        "trainer.max_steps=2",
        "trainer.val_check_interval=4",
        "callbacks.checkpoint.enabled=false",
        timeout=150,
    )
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        metrics = record["metrics"]
        assert metrics["global_step"] == 2 and metrics["world_size"] == 2
        assert metrics["bleu"] is not None
    assert records[0]["metrics"]["tokenizer_sha"] == records[1]["metrics"]["tokenizer_sha"]
    # Both ranks evaluated the same (all-reduced) validation metrics.
    assert records[0]["metrics"]["val/bleu"] == pytest.approx(records[1]["metrics"]["val/bleu"])
    assert records[0]["metrics"]["val/loss"] == pytest.approx(records[1]["metrics"]["val/loss"])


def _params(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
def test_resume_mid_epoch_is_exact(tmp_path: Path) -> None:
    """12 steps straight == 5 steps, stop, resume from the checkpoint to 12: same weights.

    With 6 micro-batches an epoch, the checkpoint (step 5) is mid-epoch 0 and the resumed run
    crosses into epoch 1. Dropout is on (0.1): its masks follow (seed, step, micro-batch, rank).
    """

    def run(out: Path, *overrides: str) -> dict[str, Any]:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose(
                "config",
                overrides=[
                    *SMALL,
                    "data.num_pairs=400",
                    "data.max_tokens=2048",
                    "trainer.val_check_interval=1000",
                    "callbacks.checkpoint.every_n_train_steps=5",
                    "~logger",
                    "+callbacks.record._target_=tests.examples.recorder.RecordBatches",
                    f"+callbacks.record.path={out / 'batches.jsonl'}",
                    f"output_dir={out}",
                    *overrides,
                ],
            )
        return train(cfg)

    steps, stop = 12, 5
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert run(straight, f"trainer.max_steps={steps}")["global_step"] == steps
    first = run(resumed, f"trainer.max_steps={stop}")
    assert first["global_step"] == stop
    second = run(
        resumed, f"trainer.max_steps={steps}", f"ckpt_path={resumed / 'checkpoints' / 'last.ckpt'}"
    )
    assert second["global_step"] == steps

    expected, got = (
        read_records(straight / "batches.jsonl"),
        read_records(resumed / "batches.jsonl"),
    )
    assert [r["batch_idx"] for r in expected].count(0) == 2, "the run should cross an epoch"
    assert 0 < expected[stop]["batch_idx"], "the checkpoint should be mid-epoch"
    assert got == expected  # the same examples, in the same micro-batches, at the same steps
    a, b = (
        _params(straight / "checkpoints" / "last.ckpt"),
        _params(resumed / "checkpoints" / "last.ckpt"),
    )
    assert a.keys() == b.keys()
    different = [name for name in a if not torch.equal(a[name], b[name])]
    assert not different, f"parameters differ after resuming: {different}"


def _planned_cost(record: dict[str, Any]) -> int:
    """Padded cost of a recorded micro-batch: examples x its widest field (source, target)."""
    longest = max(max(len(s) for s in record["sources"]), max(record["target_lengths"]))
    return len(record["sources"]) * longest


@pytest.mark.slow
def test_multirun_jobs_get_their_own_folders(tmp_path: Path) -> None:
    """``-m data.max_tokens=A,B``: two jobs, each trains with its budget in <sweep dir>/<n>."""
    sweep, cwd = tmp_path / "sweep", tmp_path / "cwd"
    cwd.mkdir()
    budgets = (384, 1024)
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "translation" / "train.py"),
            "-m",
            *SMALL,
            f"data.max_tokens={budgets[0]},{budgets[1]}",  # after SMALL's data.max_tokens
            f"hydra.sweep.dir={sweep}",
            "trainer.max_steps=3",
            "trainer.val_check_interval=1000",
            "+callbacks.record._target_=tests.examples.recorder.RecordBatches",
            "+callbacks.record.path=${output_dir}/batches.jsonl",
        ],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert list(cwd.iterdir()) == [], "the multirun wrote outside hydra.sweep.dir"
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1"]
    costs = []
    for job, budget in enumerate(budgets):
        job_dir = sweep / str(job)
        metrics = json.loads((job_dir / "metrics.json").read_text())
        assert metrics["global_step"] == 3 and metrics["output_dir"] == str(job_dir)
        assert (job_dir / "checkpoints" / "last.ckpt").exists()
        assert (job_dir / "tokenizer.json").exists()
        config = yaml.safe_load((job_dir / ".hydra" / "config.yaml").read_text())
        assert config["data"]["max_tokens"] == budget
        records = read_records(job_dir / "batches.jsonl")
        assert len(records) == 3
        costs.append(max(_planned_cost(r) for r in records))
        assert costs[-1] <= budget
    assert costs[1] > budgets[0], "the second job should have used its larger budget"
