"""``data.oversize``: the example says how many examples it skips or cuts, and refuses most."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from examples.common.config_checks import ConfigError
from examples.translation.train import CONF_DIR, train
from tests.examples.test_train import SMALL


def _cfg(out: Path, *overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose(
            "config",
            overrides=[
                *SMALL,
                "data.num_pairs=600",
                "trainer.val_check_interval=1000",
                "cpu_threads=1",
                f"output_dir={out}",
                *overrides,
            ],
        )


def test_max_tokens_8_truncating_nearly_everything_is_refused(tmp_path: Path) -> None:
    """The issue's case: 569 of 580 pairs cut to 8 tokens, exit 0, nothing printed."""
    out = tmp_path / "run"
    cfg = _cfg(out, "data.max_tokens=8", "data.oversize=truncate", "data.max_length=64")
    with pytest.raises(ConfigError, match=r"data\.max_tokens=8") as info:
        train(cfg)
    assert "of 560 examples" in str(info.value) or "560" in str(info.value), str(info.value)
    assert not out.exists()


@pytest.mark.parametrize("policy", ["truncate", "skip"])
def test_a_few_oversize_examples_are_counted_every_epoch(
    policy: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    cfg = _cfg(
        tmp_path,
        "data.max_length=null",
        "data.max_tokens=128",
        "model.max_positions=2048",
        f"data.oversize={policy}",
        "trainer.max_steps=2",
    )
    with caplog.at_level(logging.INFO):
        metrics = train(cfg)
    counts = metrics["oversize"]["train"]
    lost = counts["truncated" if policy == "truncate" else "skipped"]
    assert 0 < lost < counts["examples"] // 2
    done = "truncated" if policy == "truncate" else "skipped"
    line = f"train: of {counts['examples']:,} examples, {done} {lost:,}"
    assert f"WARNING: data.oversize={policy}: {line}" in capsys.readouterr().err
    assert (
        f"Epoch 0: training split: of {counts['examples']:,} examples, {done} {lost:,}"
        in caplog.text
    )
    logged = (tmp_path / "logs" / "version_0" / "metrics.csv").read_text()
    assert f"train/examples_{done}" in logged
