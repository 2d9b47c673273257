"""Both examples take the planner's length warm-up as ``data.length_warmup*`` overrides.

Plan-level checks (no training): the keys are null by default (the plan has no warm-up), an
override reaches the DataModule's planner and its epoch-0 plan caps the first steps, and bad
values are refused by the examples' config checks, naming the setting. Both examples also plan
their loss tokens with ``loss_offset=1`` (the planner's, not their own loss lengths).
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.lm.checks import check_config as check_lm
from examples.lm.datamodule import build_datamodule as build_lm
from examples.lm.train import CONF_DIR as LM_CONF
from examples.translation.checks import check_config as check_translation
from examples.translation.datamodule import build_datamodule as build_translation
from examples.translation.train import CONF_DIR as TRANSLATION_CONF

TRANSLATION = ["data.num_pairs=600", "data.valid=40", "data.test=0", "data.vocab_size=300"]
LM = ["data.num_docs=300", "data.valid=30", "data.vocab_size=300", "data.max_length=64"]
LM += ["data.max_tokens=256"]
WARMUP = ["data.length_warmup=6", "data.length_warmup_schedule=root"]


def make(conf: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _check_warmup_plan(planner: object, steps: int) -> None:
    plan = planner.plan(0, 1, 1)  # type: ignore[attr-defined]
    trace = plan.length_warmup
    assert trace is not None and trace.num_steps == steps
    caps = [trace.cap_at(s) for s in range(steps)]
    assert all(c is not None for c in caps) and caps == sorted(caps)
    assert trace.cap_at(steps) is None  # after the warm-up: no cap
    assert (trace.step_longest[:steps] <= np.asarray(caps)).all()
    ids = np.sort(plan.example_ids())
    assert np.array_equal(ids, np.arange(planner.num_planned))  # type: ignore[attr-defined]


def test_translation_defaults_are_off_and_the_override_reaches_the_planner(
    tmp_path: Path,
) -> None:
    cfg = make(TRANSLATION_CONF, *TRANSLATION, f"output_dir={tmp_path}")
    assert cfg.data.length_warmup is None and cfg.data.length_warmup_schedule is None
    dm, _, _ = build_translation(cfg, tmp_path)
    assert dm.planner("train").config.length_warmup is None
    assert dm.loss_offset == 1 and dm.planner("val").config.loss_offset == 1
    assert dm.planner("train").plan(0, 1, 1).length_warmup is None

    cfg = make(TRANSLATION_CONF, *TRANSLATION, *WARMUP, f"output_dir={tmp_path}")
    check_translation(cfg)
    dm, _, _ = build_translation(cfg, tmp_path)
    config = dm.planner("train").config
    assert (config.length_warmup, config.length_warmup_schedule) == (6, "root")
    _check_warmup_plan(dm.planner("train"), 6)


@pytest.mark.parametrize("layout", ["packed", "padded"])
def test_lm_override_reaches_the_planner(layout: str) -> None:
    cfg = make(LM_CONF, *LM, f"layout={layout}", *WARMUP, "data.length_warmup_min=16")
    check_lm(cfg)
    dm, _, _ = build_lm(cfg)
    config = dm.planner("train").config
    assert (config.length_warmup, config.length_warmup_min) == (6, 16)
    assert dm.loss_offset == 1
    _check_warmup_plan(dm.planner("train"), 6)
    assert make(LM_CONF).data.length_warmup is None  # off by default


BAD = [
    ("data.length_warmup=0", "data.length_warmup must be a positive integer or null"),
    ("data.length_warmup=-5", "data.length_warmup must be a positive integer or null"),
    ("data.length_warmup=10 data.length_warmup_schedule=cubic", "data.length_warmup_schedule"),
    ("data.length_warmup=10 data.length_warmup_min=0", "data.length_warmup_min must be"),
    (
        "data.length_warmup=10 data.length_warmup_min=64 data.length_warmup_max=32",
        "data.length_warmup_min=64 is above data.length_warmup_max=32",
    ),
    (  # the minimum left null is the planner's default, named as the user wrote it
        "data.length_warmup=10 data.length_warmup_max=4",
        "data.length_warmup_min (null: the default, 8) is above data.length_warmup_max=4",
    ),
    ("data.length_warmup_schedule=root", "given without data.length_warmup"),
]


@pytest.mark.parametrize(("overrides", "message"), BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("example", ["translation", "lm"])
def test_bad_warmup_settings_name_themselves(example: str, overrides: str, message: str) -> None:
    conf, check = (
        (TRANSLATION_CONF, check_translation) if example == "translation" else (LM_CONF, check_lm)
    )
    with pytest.raises(ConfigError, match=re.escape(message)):
        check(make(conf, *overrides.split()))


def test_translation_refuses_warmup_with_a_stream_and_takes_it_with_a_mixture() -> None:
    cfg = make(TRANSLATION_CONF, "data.stream=true", "data.length_warmup=10")
    with pytest.raises(ConfigError, match=re.escape("cannot be used with data.stream=true")):
        check_translation(cfg)
    # several corpora: each corpus warms up from its own short examples (docs/length-warmup.md)
    check_translation(make(TRANSLATION_CONF, "data=mixture", "data.length_warmup=10"))
