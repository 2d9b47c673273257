"""Every option of every group of conf/ composes and instantiates; bad configs fail clearly."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import MissingConfigException
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from examples.common.building import build_callbacks, build_logger, build_strategy
from examples.common.config_checks import ConfigError
from examples.translation.checks import check_config
from examples.translation.train import CONF_DIR, train

GROUPS = ("strategy", "data", "model", "trainer", "callbacks", "logger")
OPTIONS = [(g, p.stem) for g in GROUPS for p in sorted((CONF_DIR / g).glob("*.yaml"))]


def make(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_defaults_compose() -> None:
    cfg = make()
    assert cfg.strategy._target_.endswith("DDPStrategy")
    assert cfg.model.d_model == 128 and cfg.data.max_tokens == 2048
    assert cfg.trainer.devices == 1 and cfg.ckpt_path is None
    check_config(cfg)


@pytest.mark.parametrize(("group", "option"), OPTIONS)
def test_every_option_composes(group: str, option: str, tmp_path: Path) -> None:
    cfg = make(f"{group}={option}", f"output_dir={tmp_path}")
    check_config(cfg)
    if group == "strategy":
        assert build_strategy(cfg) is not None
        with open_dict(cfg):
            cfg.trainer.devices = 2
        strategy = build_strategy(cfg)
        assert (
            type(strategy).__name__
            == {
                "ddp": "DDPStrategy",
                "fsdp": "VarBatchFSDPStrategy",
                "deepspeed": "VarBatchDeepSpeedStrategy",
            }[option]
        )
    elif group == "logger":
        if option == "tensorboard":
            import tensorboard  # noqa: F401  (installed by the example extra)
        assert build_logger(cfg)
    elif group == "callbacks":
        names = [type(c).__name__ for c in build_callbacks(cfg)]
        assert names == [
            "BatchSizeLRScaler",
            "TokenThroughputMonitor",
            "ModelCheckpoint",
            "LearningRateMonitor",
            "PreemptionCheckpoint",
            "OversizeReport",
        ]
    elif group == "model":
        model = instantiate(cfg.model, vocab_size=300)
        assert model.flops_per_token > 0


def test_deepspeed_stage_and_offload_override() -> None:
    cfg = make("strategy=deepspeed", "strategy.stage=3", "strategy.offload_optimizer=true")
    strategy = build_strategy(cfg)
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == 3 and zero["offload_optimizer"]["device"] == "cpu"
    assert strategy.config["zero_force_ds_cpu_optimizer"] is False


def test_callbacks_can_be_switched_off() -> None:
    cfg = make(
        "callbacks.lr_scaler.enabled=false",
        "callbacks.checkpoint.enabled=false",
        "callbacks.preemption.enabled=false",
    )
    names = [type(c).__name__ for c in build_callbacks(cfg)]
    assert names == ["TokenThroughputMonitor", "LearningRateMonitor", "OversizeReport"]


def test_unknown_strategy_lists_choices() -> None:
    with pytest.raises(MissingConfigException) as info:
        make("strategy=horovod")
    assert all(name in str(info.value) for name in ("ddp", "fsdp", "deepspeed"))


@pytest.mark.parametrize("value", [0, -5])
def test_non_positive_max_tokens(value: int, tmp_path: Path) -> None:
    cfg = make(f"data.max_tokens={value}", f"output_dir={tmp_path / 'run'}")
    with pytest.raises(ConfigError, match=r"data\.max_tokens"):
        train(cfg)
    assert not (tmp_path / "run").exists()


def test_budget_below_longest_example(tmp_path: Path) -> None:
    cfg = make(
        "data.max_tokens=16",
        "data.num_pairs=300",
        "data.valid=20",
        "data.test=0",
        "data.vocab_size=300",
        f"output_dir={tmp_path / 'run'}",
    )
    with pytest.raises(ConfigError, match=r"data\.oversize=skip\|truncate"):
        train(cfg)
    assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_cli_errors_exit_nonzero_and_write_nothing(tmp_path: Path) -> None:
    script = CONF_DIR.parent / "examples" / "translation" / "train.py"
    run = tmp_path / "run"
    cases = (
        ("strategy=horovod", "Available options in 'strategy'"),
        ("data.max_tokens=0", "data.max_tokens must be a positive integer"),
    )
    # Both at once: each run is mostly its imports, and there are two cores. A child blocked
    # on a full pipe only waits for its turn to be read; neither depends on the other.
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), override, f"output_dir={run}"],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for override, _ in cases
    ]
    try:
        for proc, (_, expected) in zip(procs, cases, strict=True):
            stdout, stderr = proc.communicate(timeout=120)
            assert proc.returncode != 0, stdout
            assert expected in stderr, stderr[-2000:]
    finally:
        for proc in procs:
            proc.kill()  # nothing once it has exited
            proc.communicate()
    assert not run.exists()


def test_no_logger_leaves_out_the_lr_monitor() -> None:
    """Lightning refuses a LearningRateMonitor without a logger; ``~logger`` must still train."""
    names = [type(c).__name__ for c in build_callbacks(make("~logger"))]
    assert "LearningRateMonitor" not in names
    assert names[:3] == ["BatchSizeLRScaler", "TokenThroughputMonitor", "ModelCheckpoint"]


@pytest.mark.parametrize("value", [0, "two", True])
def test_bad_cpu_threads(value: object) -> None:
    with pytest.raises(ConfigError, match="cpu_threads must be a positive integer or null"):
        check_config(make(f"cpu_threads={value}"))
