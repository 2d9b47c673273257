"""SIGTERM/SIGINT during the example: checkpoint, summary, non-zero exit, exact resume.

A real signal is sent to a ``python examples/translation/train.py`` subprocess once it has
trained a few micro-batches; the run must save ``last.ckpt`` at the next optimizer step, write
``metrics.json`` saying it was interrupted, and exit with 128 + the signal. Resuming from that
checkpoint must train the same remaining batches and end with the same weights as a run that
was never interrupted.

A signal during a long validation (inside training) stops it after the micro-batch in
progress, with a checkpoint that resumes exactly; a signal during the test after training
stops it too, and ``metrics.json`` then names the complete ``last.ckpt`` of the finished
training, from which a requeued job resumes without training again. The language-model
example shares the callback and is checked the same way.
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
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

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


class SlowEvaluation(Callback):
    """Append ``"<stage> <global_step> <batch_idx>"`` to ``path`` after every validation and
    test micro-batch (not the sanity check), then sleep ``seconds``: a long evaluation whose
    progress a test can watch.

    Args:
        path: the text file.
        seconds: the pause per micro-batch.
    """

    def __init__(self, path: str, seconds: float) -> None:
        self.path, self.seconds = Path(path), float(seconds)

    def _done(self, trainer: Trainer, stage: str, batch_idx: int) -> None:
        if trainer.sanity_checking:
            return
        with self.path.open("a") as f:
            f.write(f"{stage} {trainer.global_step} {batch_idx}\n")
        time.sleep(self.seconds)

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._done(trainer, "val", batch_idx)

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._done(trainer, "test", batch_idx)


def _run(out: Path, *overrides: str, common: tuple[str, ...] = tuple(COMMON)) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *common,
                f"+callbacks.record.path={out / 'batches.jsonl'}",
                f"output_dir={out}",
                *overrides,
            ],
        )
    return train(cfg)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def _signalled(
    argv: list[str], signum: int, watched: Path, after: int
) -> subprocess.CompletedProcess[str]:
    """Run ``argv``; send ``signum`` once ``watched`` has ``after`` lines; wait for the exit."""
    proc = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if len(_lines(watched)) >= after:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before the signal: " + proc.communicate()[1][-2000:]
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def _signalled_run(out: Path, signum: int) -> subprocess.CompletedProcess[str]:
    """The example in a subprocess, sent ``signum`` after its third micro-batch."""
    record = out / "batches.jsonl"
    argv = [
        sys.executable,
        str(ROOT / "examples" / "translation" / "train.py"),
        *COMMON,
        f"+callbacks.record.path={record}",
        "+callbacks.slow._target_=tests.examples.recorder.SlowBatches",
        "+callbacks.slow.seconds=0.3",
        f"output_dir={out}",
    ]
    return _signalled(argv, signum, record, 3)


def _params(ckpt: Path) -> dict[str, torch.Tensor]:
    return torch.load(ckpt, map_location="cpu", weights_only=True)["state_dict"]


@pytest.mark.slow
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


@pytest.mark.multiprocess
@pytest.mark.parametrize("signum", [signal.SIGINT])
def test_sigint_saves_and_exits_130(signum: int, tmp_path: Path) -> None:
    proc = _signalled_run(tmp_path, signum)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert (tmp_path / "checkpoints" / "last.ckpt").is_file()
    assert json.loads((tmp_path / "metrics.json").read_text())["interrupted"] == "SIGINT"


#: A long evaluation: micro-batches of 0.5 s each (about 20 of them with val_max_tokens=64).
SLOW_EVAL = [
    "+callbacks.slow_eval._target_=tests.examples.test_preemption.SlowEvaluation",
    "+callbacks.slow_eval.seconds=0.5",
]


def _translation(out: Path, common: list[str], *extra: str) -> list[str]:
    return [
        sys.executable,
        str(ROOT / "examples" / "translation" / "train.py"),
        *common,
        f"+callbacks.record.path={out / 'batches.jsonl'}",
        *SLOW_EVAL,
        f"+callbacks.slow_eval.path={out / 'eval.txt'}",
        f"output_dir={out}",
        *extra,
    ]


VALIDATING = [
    *SMALL,
    "data.num_pairs=400",
    "data.max_tokens=1024",
    "data.val_max_tokens=64",
    "trainer.accumulate_grad_batches=2",
    "trainer.val_check_interval=4",  # after optimizer steps 2, 4, 6
    "callbacks.checkpoint.every_n_train_steps=6",
    "trainer.max_steps=6",
    "cpu_threads=1",
    "+callbacks.record._target_=tests.examples.recorder.RecordBatches",
]


@pytest.mark.slow
def test_sigterm_during_validation_stops_it_and_resumes_exactly(tmp_path: Path) -> None:
    straight, stopped = tmp_path / "straight", tmp_path / "stopped"
    proc = _signalled(_translation(stopped, VALIDATING), signal.SIGTERM, stopped / "eval.txt", 1)
    assert proc.returncode == 143, proc.stderr[-3000:]
    ran = _lines(stopped / "eval.txt")
    # stopped after the validation micro-batch in progress, not at the end of the validation
    assert 1 <= len(ran) <= 3 and all(line.startswith("val 2 ") for line in ran), ran
    ckpt = stopped / "checkpoints" / "last.ckpt"
    summary = json.loads((stopped / "metrics.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["checkpoint"] == str(ckpt)
    assert summary["global_step"] == 2
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 2
    assert len(read_records(stopped / "batches.jsonl")) == 4  # two whole optimizer steps

    plain = _run(straight, common=tuple(VALIDATING))
    assert plain["global_step"] == 6 and plain.get("val/loss") is not None
    resumed = _run(stopped, f"ckpt_path={ckpt}", common=tuple(VALIDATING))
    assert resumed["global_step"] == 6 and resumed.get("val/loss") is not None
    assert read_records(stopped / "batches.jsonl") == read_records(straight / "batches.jsonl")
    a = _params(straight / "checkpoints" / "last.ckpt")
    b = _params(stopped / "checkpoints" / "last.ckpt")
    assert not [k for k in a if not torch.equal(a[k], b[k])], "weights differ after resuming"
    # a finished run names its complete last.ckpt
    for run, metrics in ((straight, plain), (stopped, resumed)):
        last = run / "checkpoints" / "last.ckpt"
        assert metrics["checkpoint"] == str(last) and metrics["trained"] is True
        assert json.loads((run / "metrics.json").read_text())["checkpoint"] == str(last)
        assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == 6


TESTING = [
    *SMALL,
    "data.num_pairs=400",
    "data.test=40",
    "test=true",
    "data.max_tokens=1024",
    "data.val_max_tokens=64",
    "trainer.val_check_interval=1000",
    # ModelCheckpoint's last.ckpt alone would hold step 4: the final step must be saved too
    "callbacks.checkpoint.every_n_train_steps=4",
    "trainer.max_steps=5",
    "cpu_threads=1",
    "+callbacks.record._target_=tests.examples.recorder.RecordBatches",
]


@pytest.mark.slow
def test_sigterm_during_the_test_points_a_requeue_at_the_finished_training(
    tmp_path: Path,
) -> None:
    proc = _signalled(_translation(tmp_path, TESTING), signal.SIGTERM, tmp_path / "eval.txt", 1)
    assert proc.returncode == 143, proc.stderr[-3000:]
    ran = _lines(tmp_path / "eval.txt")
    assert 1 <= len(ran) <= 3 and all(line.startswith("test 5 ") for line in ran), ran
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["checkpoint"] == str(ckpt)
    assert summary["trained"] is True and summary["global_step"] == 5
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 5
    assert "training had finished" in proc.stderr and f"ckpt_path={ckpt}" in proc.stderr
    trained = read_records(tmp_path / "batches.jsonl")
    assert len(trained) == 5

    # what a requeue script does: resume from metrics.json's checkpoint, same overrides
    metrics = _run(tmp_path, f"ckpt_path={summary['checkpoint']}", common=tuple(TESTING))
    assert metrics["global_step"] == 5 and "test/bleu" in metrics
    assert read_records(tmp_path / "batches.jsonl") == trained, "the requeued job trained again"
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert "interrupted" not in saved and saved["checkpoint"] == str(ckpt)


@pytest.mark.slow
def test_lm_sigterm_during_validation_and_a_finished_runs_checkpoint(tmp_path: Path) -> None:
    from tests.examples.test_lm import TINY

    common = [
        *TINY,
        "layout=packed",
        "data.val_max_tokens=64",  # one document per validation micro-batch
        "trainer.val_check_interval=2",
        "trainer.max_steps=4",
        "cpu_threads=1",
    ]
    argv = [
        sys.executable,
        str(ROOT / "examples" / "lm" / "train.py"),
        *common,
        "+callbacks.slow_eval._target_=tests.examples.test_preemption.SlowEvaluation",
        "+callbacks.slow_eval.seconds=0.5",
        f"+callbacks.slow_eval.path={tmp_path / 'eval.txt'}",
        f"output_dir={tmp_path}",
    ]
    proc = _signalled(argv, signal.SIGTERM, tmp_path / "eval.txt", 1)
    assert proc.returncode == 143, proc.stderr[-3000:]
    ran = _lines(tmp_path / "eval.txt")
    assert 1 <= len(ran) <= 3 and all(line.startswith("val 2 ") for line in ran), ran
    ckpt = tmp_path / "checkpoints" / "last.ckpt"
    summary = json.loads((tmp_path / "metrics.json").read_text())
    assert summary["interrupted"] == "SIGTERM" and summary["checkpoint"] == str(ckpt)
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 2

    from examples.lm.train import train as train_lm
    from tests.examples.test_lm import make

    metrics = train_lm(make(*common, f"output_dir={tmp_path}", f"ckpt_path={ckpt}"))
    assert metrics["global_step"] == 4 and metrics["checkpoint"] == str(ckpt)
    assert torch.load(ckpt, map_location="cpu", weights_only=True)["global_step"] == 4
    assert json.loads((tmp_path / "metrics.json").read_text())["checkpoint"] == str(ckpt)
