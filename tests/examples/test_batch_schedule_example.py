"""Both examples take the planner's batch-size schedule as ``data.batch_schedule``.

The key is null by default; a Hydra override with spaces and colons arrives intact (composed
as ``tests/examples`` compose, and through the command line's own pre-check) and reaches the
DataModule's planner, whose epoch-0 plan starts below the full step; bad values and settings the
schedule cannot go with are refused naming ``data.batch_schedule``; a short LM run logs the
schedule's budgets through the configured ``TokenThroughputMonitor``.
"""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from examples.common.cli import check_overrides
from examples.common.config_checks import ConfigError
from examples.lm.checks import check_config as check_lm
from examples.lm.datamodule import build_datamodule as build_lm
from examples.lm.train import CONF_DIR as LM_CONF
from examples.lm.train import train as train_lm
from examples.translation.checks import check_config as check_translation
from examples.translation.datamodule import build_datamodule as build_translation
from examples.translation.train import CONF_DIR as TRANSLATION_CONF

TRANSLATION = ["data.num_pairs=600", "data.valid=40", "data.test=0", "data.vocab_size=300"]
LM = ["data.num_docs=300", "data.valid=30", "data.vocab_size=300", "data.max_length=64"]
LM += ["data.max_tokens=256"]
EXAMPLES = {"translation": (TRANSLATION_CONF, check_translation), "lm": (LM_CONF, check_lm)}
#: (override as typed after the shell removed its quotes, the value the config must hold)
INTACT = [
    ("data.batch_schedule=0:0.25 2M:0.5 8M:1", "0:0.25 2M:0.5 8M:1"),
    ('data.batch_schedule="0:0.25 2M:0.5 8M:1"', "0:0.25 2M:0.5 8M:1"),
    ("data.batch_schedule='0:0.5 1.5K:0.75 3K:1'", "0:0.5 1.5K:0.75 3K:1"),
    ("data.batch_schedule=ramp:0.25:8M", "ramp:0.25:8M"),
]


def make(conf: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("example", EXAMPLES)
@pytest.mark.parametrize(("override", "value"), INTACT, ids=[i[0] for i in INTACT])
def test_an_override_with_spaces_and_colons_arrives_intact(
    example: str, override: str, value: str
) -> None:
    conf, check = EXAMPLES[example]
    assert make(conf).data.batch_schedule is None  # off by default
    cfg = make(conf, override)
    assert cfg.data.batch_schedule == value
    check(cfg)
    check_overrides(["train.py", override], conf)  # the command line's pre-check composes it


def _starts_below_full(planner: object, schedule: str) -> None:
    config = planner.config  # type: ignore[attr-defined]
    assert config.batch_schedule == schedule  # the canonical text
    plan = planner.plan(0, 1, 1)  # type: ignore[attr-defined]
    fractions = plan.step_fraction.tolist()
    assert fractions[0] < 1.0 and fractions == sorted(fractions) and fractions[-1] == 1.0


def test_translation_override_reaches_the_planner(tmp_path: Path) -> None:
    override = "data.batch_schedule=0:0.5 1.5K:0.75 3K:1"
    cfg = make(TRANSLATION_CONF, *TRANSLATION, override, f"output_dir={tmp_path}")
    check_translation(cfg)
    dm, _, _ = build_translation(cfg, tmp_path)
    _starts_below_full(dm.planner("train"), "0:0.5 1500:0.75 3000:1.0")


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_lm_override_reaches_the_planner(layout: str) -> None:
    cfg = make(LM_CONF, *LM, f"layout={layout}", "data.batch_schedule=[[0,0.5],[2K,1]]")
    check_lm(cfg)
    dm, _, _ = build_lm(cfg)
    _starts_below_full(dm.planner("train"), "0:0.5 2000:1.0")


BAD = [
    ("data.batch_schedule=0:0.5 1M:0.9", "the last fraction must be 1"),
    ("data.batch_schedule=0:2 1M:1", "every fraction of the full step must be in (0, 1]"),
    ("data.batch_schedule=1K:0.5 2K:1", "the first threshold must be 0 tokens"),
    ("data.batch_schedule=0:0.5 1M:0.25 2M:1", "the schedule decreases at 1000000 tokens"),
    ("data.batch_schedule=0:0.5 two:1", "'two' is not a token count"),
    ("data.batch_schedule=ramp:0.5", "write a ramp as 'ramp:START_FRACTION:TOKENS'"),
    ("data.batch_schedule=0:0.0001 1M:1", "its first fraction leaves no token of max_tokens"),
    ("data.batch_schedule=7", "must be a string such as"),
    ("data.batch_schedule=0:0.5 1M:1 data.length_warmup=5", "with data.length_warmup=5"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("example", EXAMPLES)
def test_a_bad_schedule_names_its_key(example: str, overrides: str, message: str) -> None:
    conf, check = EXAMPLES[example]
    parts = re.split(r" (?=data\.)", overrides)  # one override may hold spaces
    with pytest.raises(ConfigError, match=r"^data\.batch_schedule=") as info:
        check(make(conf, *parts))
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.stream=true"], "cannot be used with data.stream=true"),
        (["data=mixture"], "cannot be used with data.corpora=['expressions', 'sentences']"),
        (["compile=true"], "data.max_shapes=16 (set by compile=true)"),
    ],
)
def test_translation_refuses_what_the_schedule_cannot_go_with(
    overrides: list[str], message: str
) -> None:
    cfg = make(TRANSLATION_CONF, *overrides, "data.batch_schedule=0:0.5 1M:1")
    with pytest.raises(ConfigError, match=r"^data\.batch_schedule=") as info:
        check_translation(cfg)
    assert message in str(info.value)


def test_a_first_fraction_below_the_longest_document_names_its_key() -> None:
    # Found when the DataModule plans (the longest document is known then): 0.1 x 256 = 25
    # tokens cannot hold a 64-token document.
    cfg = make(LM_CONF, *LM, "layout=padded", "data.batch_schedule=0:0.1 2K:1")
    check_lm(cfg)
    with pytest.raises(ConfigError, match=r"^data\.batch_schedule=0:0\.1 2K:1: ") as info:
        build_lm(cfg)
    assert "start the schedule at a fraction of at least" in str(info.value)


def test_a_short_lm_run_logs_the_schedule(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # train() sets it (cpu_threads=1)
    steps = 8
    cfg = make(
        LM_CONF,
        *LM,
        "layout=padded",
        "data.batch_schedule=0:0.5 2K:0.75 3K:1",
        "model.d_model=32",
        "model.nhead=2",
        "model.num_layers=1",
        "model.dim_feedforward=64",
        "trainer.enable_progress_bar=false",
        "trainer.enable_model_summary=false",
        "trainer.log_every_n_steps=1",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        "callbacks.checkpoint.enabled=false",
        f"output_dir={tmp_path}",
    )
    metrics = train_lm(cfg)
    assert metrics["global_step"] == steps
    with open(Path(metrics["log_dir"]) / "metrics.csv", newline="") as f:
        rows = [r for r in csv.DictReader(f) if r.get("train/schedule/budget_tokens")]
    budgets = [float(r["train/schedule/budget_tokens"]) for r in rows]
    assert len(budgets) == steps and budgets == sorted(budgets)
    assert budgets[0] == int(0.5 * 256) and budgets[-1] <= 256  # one rank, no accumulation
    for r in rows:
        fill = float(r["train/schedule/cost_tokens"]) / float(r["train/schedule/budget_tokens"])
        assert float(r["train/schedule/fill"]) == pytest.approx(fill) and 0 < fill <= 1
