"""SIGTERM/SIGINT during the example: checkpoint, summary, non-zero exit, exact resume.

A real signal is sent to a ``python examples/translation/train.py`` subprocess once it has
trained a few micro-batches; the run must save ``last.ckpt`` at the next optimizer step, write
``metrics.json`` saying it was interrupted, and exit with 128 + the signal. Resuming from that
checkpoint must train the same remaining batches and end with the same weights as a run that
was never interrupted.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from examples.translation.train import CONF_DIR, ROOT, train
from tests.examples.recorder import read_records
from tests.examples.test_train import SMALL

STEPS = 12
COMMON = [
    *SMALL,
    "data.num_pairs=400",
    "data.max_tokens=1024",
    "trainer.accumulate_grad_batches=2",
    "trainer.val_check_interval=1000",
    f"callbacks.checkpoint.every_n_train_steps={STEPS}",
    f"trainer.max_steps={STEPS}",
    "cpu_threads=1",
    "+callbacks.record._target_=tests.examples.recorder.RecordBatches",
]


def _run(out: Path, *overrides: str) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *COMMON,
                f"+callbacks.record.path={out / 'batches.jsonl'}",
                f"output_dir={out}",
                *overrides,
            ],
        )
    return train(cfg)


def _signalled_run(out: Path, signum: int) -> subprocess.CompletedProcess[str]:
    """The example in a subprocess, sent ``signum`` after its third micro-batch."""
    record = out / "batches.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "examples" / "translation" / "train.py"),
            *COMMON,
            f"+callbacks.record.path={record}",
            "+callbacks.slow._target_=tests.examples.recorder.SlowBatches",
            "+callbacks.slow.seconds=0.3",
            f"output_dir={out}",
        ],
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if record.exists() and len(record.read_text().splitlines()) >= 3:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal: " + proc.communicate()[1][-2000:]
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=60)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _params(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


def test_sigterm_saves_exits_143_and_resumes_exactly(tmp_path: Path) -> None:
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    proc = _signalled_run(stopped, signal.SIGTERM)
    assert proc.returncode == 143, proc.stderr[-3000:]
    ckpt = stopped / "checkpoints" / "last.ckpt"
    assert ckpt.is_file()
    summary = json.loads((stopped / "metrics.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["checkpoint"] == str(ckpt)
    assert 0 < summary["global_step"] < STEPS
    assert f"ckpt_path={ckpt}" in proc.stderr
    assert (stopped / "logs" / "version_0" / "metrics.csv").is_file()  # the logger flushed
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    assert saved["global_step"] == summary["global_step"]
    trained = len(read_records(stopped / "batches.jsonl"))
    assert trained == 2 * summary["global_step"], "stopped mid-accumulation"

    assert _run(straight)["global_step"] == STEPS
    assert _run(stopped, f"ckpt_path={ckpt}")["global_step"] == STEPS
    assert read_records(stopped / "batches.jsonl") == read_records(straight / "batches.jsonl")
    a = _params(straight / "checkpoints" / "last.ckpt")
    b = _params(stopped / "checkpoints" / "last.ckpt")
    assert a.keys() == b.keys()
    assert not [k for k in a if not torch.equal(a[k], b[k])], "weights differ after resuming"


@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_sigint_saves_and_exits_130(signum: int, tmp_path: Path) -> None:
    proc = _signalled_run(tmp_path, signum)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((tmp_path / "metrics.json").read_text())["interrupted"] == "SIGINT"
