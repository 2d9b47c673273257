"""``compile=true``: the training forward under ``torch.compile`` on a shape budget.

The config sets the shape budget (``data.max_shapes``, ``data.bucket_width``), an explicit
``data.max_shapes=null`` is refused, and a short CPU run compiles one graph per training shape
and no more. The run uses ``compile_backend=aot_eager`` (dynamo and AOTAutograd, no code
generation): inductor, the example's default, takes about a minute per shape on 2 CPU cores.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.common.summary import write_summary
from examples.translation.checks import check_config
from examples.translation.train import CONF_DIR, ROOT, train

SMALL = [
    "data.num_pairs=600",
    "data.valid=20",
    "data.test=0",
    "data.vocab_size=300",
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
    "callbacks.checkpoint.enabled=false",
    "~logger",
]


def make(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize(
    ("overrides", "max_shapes", "bucket_width"),
    [
        ([], None, 2),
        (["compile=false"], None, 2),
        (["compile=true"], 16, 1),
        (["compile=true", "data.max_shapes=8"], 8, 1),  # an explicit budget wins
        (["compile=true", "data=mixture"], 16, 1),
        (["data.max_shapes=4", "data.bucket_width=1"], 4, 1),  # a shape budget, no compile
    ],
)
def test_config_sets_the_shape_budget(
    overrides: list[str], max_shapes: int | None, bucket_width: int, tmp_path: Path
) -> None:
    cfg = make(*overrides, f"output_dir={tmp_path}")
    assert cfg.compile is ("compile=true" in overrides)
    assert cfg.compile_backend == "inductor"
    assert cfg.data.max_shapes == max_shapes and cfg.data.bucket_width == bucket_width
    check_config(cfg)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["compile=true", "data.max_shapes=null"], "compile=true needs a shape budget, but data"),
        (["compile=true", "data.bucket_width=2"], "needs data.bucket_width=1"),
        (["data.max_shapes=4"], "data.max_shapes=4 needs data.bucket_width=1"),
        (["data.max_shapes=0", "data.bucket_width=1"], "data.max_shapes must be a positive"),
        (["compile=true", "compile_backend=nope"], "compile_backend must be a torch.compile"),
        (["compile=yes"], "compile must be true or false, got 'yes'"),
    ],
)
def test_bad_compile_settings_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_config(make(*overrides))


@pytest.mark.slow
def test_command_line_refuses_compile_without_a_shape_budget(tmp_path: Path) -> None:
    """``compile=true`` parses as a value (not a group choice); ``max_shapes=null`` exits 2."""
    run = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "translation" / "train.py"),
            "compile=true",
            "data.max_shapes=null",
            f"output_dir={run}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Configuration error: compile=true needs a shape budget" in proc.stderr
    assert "data.max_shapes" in proc.stderr
    assert not run.exists()


@pytest.mark.slow
def test_compiled_run_compiles_once_per_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One epoch (every micro-batch of the plan) with 3 shapes: 3 graphs, finite losses."""
    cfg = make(
        *SMALL,
        "compile=true",
        "compile_backend=aot_eager",
        "data.max_shapes=3",
        "trainer.max_steps=-1",
        "trainer.max_epochs=1",
        "trainer.val_check_interval=1.0",
        "trainer.check_val_every_n_epoch=1",
        f"output_dir={tmp_path}",
    )
    metrics = train(cfg)
    compiled = metrics["compile"]
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["val/loss"])
    assert metrics["bleu"] is not None  # validation (eager, padded rows left out) ran
    planned = {tuple(s) for s in compiled["planned_shapes"]}
    ran = {tuple(s) for s in compiled["shape_list"]}
    assert 2 <= len(planned) <= 3
    assert ran == planned  # a whole epoch runs every shape of the plan ...
    assert compiled["graphs"] == compiled["shapes"] == len(ran)  # ... each compiled once
    assert compiled["graph_breaks"] == 0
    assert compiled["recompile_limit"] >= 3 and compiled["backend"] == "aot_eager"
    out = capsys.readouterr().out
    assert "compile=true: the training forward runs under torch.compile" in out
    assert f"compiled {len(ran)} graph(s) for {len(ran)} training shape(s)" in out
    write_summary(metrics)
    assert json.loads((tmp_path / "metrics.json").read_text())["compile"]["graphs"] == len(ran)
