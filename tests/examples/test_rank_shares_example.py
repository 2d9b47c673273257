"""Both examples take a mixed cluster as ``data.rank_shares`` / ``data.rank_max_tokens`` overrides.

Config-level checks (no training): the keys are null and the balancing callback is off by
default; the overrides reach the DataModule and its planner as plain tuples (Hydra hands lists
as ``ListConfig``), ``callbacks.rank_balance.enabled=true`` builds ``RankShareBalancer`` with
the configured arguments, and bad values are refused by the examples' config checks, naming
the setting and the rank, before anything is built.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig, ListConfig

from examples.common.building import build_callbacks
from examples.common.config_checks import ConfigError
from examples.common.rank_shares import rank_settings
from examples.lm.checks import check_config as check_lm
from examples.lm.datamodule import build_datamodule as build_lm
from examples.lm.train import CONF_DIR as LM_CONF
from examples.translation.checks import check_config as check_translation
from examples.translation.datamodule import build_datamodule as build_translation
from examples.translation.train import CONF_DIR as TRANSLATION_CONF
from lightning_varbatch import SettingValueError

TRANSLATION = ["data.num_pairs=600", "data.valid=40", "data.test=0", "data.vocab_size=300"]
LM = ["data.num_docs=300", "data.valid=30", "data.vocab_size=300", "data.max_length=64"]
LM += ["data.max_tokens=256"]
MIXED = ["trainer.devices=2", "data.rank_shares=[1.0,0.5]", "data.rank_max_tokens=[4096,3000]"]
MIXED += ["data.max_tokens=4096"]  # every rank's memory budget is at most data.max_tokens
BALANCE = [
    "callbacks.rank_balance.enabled=true",
    "callbacks.rank_balance.every_n_epochs=2",
    "callbacks.rank_balance.smoothing=0.3",
]
EXAMPLES = {
    "translation": (TRANSLATION_CONF, TRANSLATION, check_translation),
    "lm": (LM_CONF, LM, check_lm),
}


def make(conf: Path, *overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        return compose("config", overrides=list(overrides))


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_defaults_are_off(example: str) -> None:
    conf, small, check = EXAMPLES[example]
    cfg = make(conf, *small)
    assert cfg.data.rank_shares is None and cfg.data.rank_max_tokens is None
    assert rank_settings(cfg.data) == {}
    assert cfg.callbacks.rank_balance.enabled is False
    names = [type(c).__name__ for c in build_callbacks(cfg)]
    assert "RankShareBalancer" not in names
    check(cfg)


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_overrides_become_plain_tuples_one_per_rank(example: str) -> None:
    conf, small, check = EXAMPLES[example]
    cfg = make(conf, *small, *MIXED)
    check(cfg)
    assert isinstance(cfg.data.rank_shares, ListConfig)  # what Hydra hands over
    settings = rank_settings(cfg.data)
    assert settings == {"rank_shares": (1.0, 0.5), "rank_max_tokens": (4096, 3000)}
    assert [type(v) for v in settings["rank_shares"]] == [float, float]
    assert [type(v) for v in settings["rank_max_tokens"]] == [int, int]


def _check_datamodule(dm: object) -> None:
    config = dm.planner("train").config  # type: ignore[attr-defined]
    assert tuple(config.rank_shares) == (1.0, 0.5)
    assert tuple(config.rank_max_tokens) == (4096, 3000)
    assert tuple(dm.rank_shares) == (1.0, 0.5)  # type: ignore[attr-defined]


def test_translation_datamodule_gets_the_shares(tmp_path: Path) -> None:
    cfg = make(TRANSLATION_CONF, *TRANSLATION, *MIXED, f"output_dir={tmp_path}")
    check_translation(cfg)
    dm, _, _ = build_translation(cfg, tmp_path)
    _check_datamodule(dm)


def test_lm_datamodule_gets_the_shares() -> None:
    cfg = make(LM_CONF, *LM, *MIXED)
    check_lm(cfg)
    dm, _, _ = build_lm(cfg)
    _check_datamodule(dm)


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_balancing_callback_is_built_with_its_settings(example: str) -> None:
    conf, small, check = EXAMPLES[example]
    cfg = make(conf, *small, *MIXED, *BALANCE)
    check(cfg)
    (balancer,) = [c for c in build_callbacks(cfg) if type(c).__name__ == "RankShareBalancer"]
    assert type(balancer).__module__ == "lightning_varbatch.callbacks.rank_balancer"
    assert cfg.callbacks.rank_balance.tolerance == 0.05  # the default of the conf
    for key, value in (("every_n_epochs", 2), ("smoothing", 0.3), ("tolerance", 0.05)):
        held = getattr(balancer, key, getattr(balancer, f"_{key}", value))
        assert held == value, key


BAD = [
    ("data.rank_shares=[1.0,0]", "rank_shares[1] (the share of rank 1)"),
    ("data.rank_shares=[-1.0,0.5]", "rank_shares[0] (the share of rank 0)"),
    ("data.rank_shares=[1.0,nan]", "rank_shares[1] (the share of rank 1)"),
    ("data.rank_shares=[1.0,0.5,0.5]", "data.rank_shares has 3 entries but the run has 2 rank"),
    ("data.rank_shares=0.5", "rank_shares must be a list with one entry per rank"),
    ("data.rank_shares=[]", "rank_shares must have one entry per rank"),
    ("data.rank_max_tokens=[200,0]", "rank_max_tokens[1]"),
    ("data.rank_max_tokens=[200]", "data.rank_max_tokens has 1 entries but the run has 2 rank"),
    (
        "data.rank_max_tokens=[8192,200]",
        "rank_max_tokens[0]=8192 exceeds max_tokens",
    ),
]


@pytest.mark.parametrize(("override", "message"), BAD, ids=[b[0] for b in BAD])
@pytest.mark.parametrize("example", list(EXAMPLES))
def test_bad_rank_settings_name_themselves(example: str, override: str, message: str) -> None:
    conf, small, check = EXAMPLES[example]
    with pytest.raises(ConfigError, match=re.escape(message)) as info:
        check(make(conf, *small, "trainer.devices=2", override))
    assert f"data.{override.split('=')[0].split('.')[1]}" in str(info.value)


@pytest.mark.parametrize("example", list(EXAMPLES))
def test_shares_on_one_device_are_refused(example: str) -> None:
    conf, small, check = EXAMPLES[example]
    with pytest.raises(ConfigError, match=re.escape("trainer.devices=1 x trainer.num_nodes=1")):
        check(make(conf, *small, "data.rank_shares=[1.0,0.5]"))
    check(make(conf, *small, "trainer.devices=2", "trainer.num_nodes=1", "data.rank_shares=[1,2]"))
    check(make(conf, *small, "trainer.devices=1", "trainer.num_nodes=2", "data.rank_shares=[1,2]"))


def test_translation_streams_with_fixed_shares_and_refuses_the_balancer(tmp_path: Path) -> None:
    """Fixed shares work in a stream (docs/mixed-clusters.md); shares changed at run time do not."""
    cfg = make(TRANSLATION_CONF, *TRANSLATION, *MIXED, "data.stream=true", f"output_dir={tmp_path}")
    check_translation(cfg)
    dm, _, _ = build_translation(cfg, tmp_path)
    config = dm.planner("train").config
    assert (tuple(config.rank_shares), tuple(config.rank_max_tokens)) == ((1.0, 0.5), (4096, 3000))
    with pytest.raises(SettingValueError, match="cannot change rank shares") as refused:
        dm.set_rank_shares([1.0, 1.0])
    assert refused.value.setting == "rank_shares"
    with pytest.raises(ConfigError, match=re.escape("rank_balance.enabled=true cannot balance")):
        check_translation(make(TRANSLATION_CONF, *MIXED, *BALANCE, "data.stream=true"))


#: Per-rank budgets the data cannot meet, found when the splits are planned: named by their key.
PLANNED = [
    ("data.rank_shares=[1.0,0.01]", "data.rank_shares=[1.0, 0.01]: Rank 1's micro-batch budget"),
    ("data.rank_max_tokens=[256,30]", "data.rank_max_tokens=[256, 30]: "),
]


@pytest.mark.parametrize(("override", "message"), PLANNED, ids=[p[0] for p in PLANNED])
@pytest.mark.parametrize("example", ["translation", "translation-stream", "lm"])
def test_a_rank_budget_the_data_cannot_meet_names_its_key(
    example: str, override: str, message: str, tmp_path: Path
) -> None:
    conf, small, check = EXAMPLES[example.split("-")[0]]
    extra = ["data.stream=true"] if example.endswith("stream") else []
    cfg = make(conf, *small, *extra, "data.max_tokens=256", "trainer.devices=2", override)
    check(cfg)
    with pytest.raises(ConfigError) as info:
        build_lm(cfg) if example == "lm" else build_translation(cfg, tmp_path)
    assert str(info.value).startswith(message), str(info.value)
    assert "Raise data.max_tokens" not in str(info.value)  # the budget is not at fault
