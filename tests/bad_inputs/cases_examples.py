"""The examples' Hydra overrides whose errors come from the library, named by the key typed.

A per-rank budget the data cannot meet (``data.rank_shares``, ``data.rank_max_tokens``), found
when the splits are planned, names that key, not ``data.max_tokens``; a warm-up maximum below
the default minimum names ``data.length_warmup_min`` as left null; a stream takes fixed shares
and refuses the balancer that would change them. The examples' own checks of each override
are tested in ``tests/examples/``.

Example:
    >>> len(CASES) >= 5
    True
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.lm.checks import check_config as check_lm
from examples.lm.datamodule import build_datamodule as build_lm
from examples.lm.train import CONF_DIR as LM_CONF
from examples.translation.checks import check_config as check_translation
from examples.translation.datamodule import build_datamodule as build_translation
from examples.translation.train import CONF_DIR as TRANSLATION_CONF
from tests.bad_inputs.case import Case, accepted, error

AREA = "examples"
KEYS = "examples/common/config_checks.py"
SMALL = {
    "translation": ["data.num_pairs=600", "data.valid=40", "data.test=0", "data.vocab_size=300"],
    "lm": ["data.num_docs=300", "data.valid=30", "data.vocab_size=300", "data.max_length=64"],
}


def _config(example: str, tmp: Path, overrides: tuple[str, ...]) -> DictConfig:
    conf = TRANSLATION_CONF if example == "translation" else LM_CONF
    with initialize_config_dir(config_dir=str(conf), version_base="1.3"):
        given = [*SMALL[example], "data.max_tokens=256", f"output_dir={tmp}", *overrides]
        return compose("config", overrides=given)


def _built(example: str, *overrides: str) -> Callable[[Path], Any]:
    """Check the config and build the DataModule (its splits planned), as train.py does."""

    def run(tmp: Path) -> Any:
        cfg = _config(example, tmp, overrides)
        if example == "lm":
            check_lm(cfg)
            return build_lm(cfg)[0]
        check_translation(cfg)
        return build_translation(cfg, tmp)[0]

    return run


def _stream_with_shares(tmp: Path) -> None:
    shares = ("trainer.devices=2", "data.stream=true", "data.rank_shares=[1.0,0.5]")
    dm = _built("translation", *shares)(tmp)
    assert tuple(dm.planner("train").config.rank_shares) == (1.0, 0.5)


CASES: list[Case] = [
    *(
        error(
            f"examples-batch_schedule-{name}-{example}",
            AREA,
            f"{example}: data.batch_schedule='{value}' (data.max_tokens=256, longest 64)",
            _built(example, f'data.batch_schedule="{value}"'),
            "data.batch_schedule",
            *words,
            raises=ConfigError,
            fix_in=KEYS,
        )
        for example in ("translation", "lm")
        for name, value, words in (
            ("from-zero", "0:0 1K:1", ("got 0", "start above 0")),
            ("first-fraction-too-small", "0:0.01 1K:1", ("at least 0.25",)),
        )
    ),
    error(
        "examples-pair_order-unknown",
        AREA,
        "translation: data.pair_order=min",
        _built("translation", "data.pair_order=min"),
        "data.pair_order",
        "min",
        "two_sided",
        raises=ConfigError,
        fix_in=KEYS,
    ),
    error(
        "examples-rank_shares-too-small",
        AREA,
        "translation: trainer.devices=2 data.rank_shares=[1.0,0.01] (rank 1: 2 tokens)",
        _built("translation", "trainer.devices=2", "data.rank_shares=[1.0,0.01]"),
        "data.rank_shares=[1.0, 0.01]",
        "rank 1",
        raises=ConfigError,
        fix_in=KEYS,
        not_blame=("data.max_tokens",),
    ),
    error(
        "examples-stream-rank_max_tokens-too-small",
        AREA,
        "translation: data.stream=true trainer.devices=2 data.rank_max_tokens=[256,30]",
        _built(
            "translation", "data.stream=true", "trainer.devices=2", "data.rank_max_tokens=[256,30]"
        ),
        "data.rank_max_tokens=[256, 30]",
        "rank 1",
        raises=ConfigError,
        fix_in=KEYS,
        not_blame=("data.max_tokens",),
    ),
    error(
        "examples-lm-rank_shares-too-small",
        AREA,
        "lm: trainer.devices=2 data.rank_shares=[1.0,0.01]",
        _built("lm", "trainer.devices=2", "data.rank_shares=[1.0,0.01]"),
        "data.rank_shares=[1.0, 0.01]",
        "rank 1",
        raises=ConfigError,
        fix_in=KEYS,
        not_blame=("data.max_tokens",),
    ),
    error(
        "examples-length_warmup_max-below-default-min",
        AREA,
        "translation: data.length_warmup=10 data.length_warmup_max=4 (the minimum left null: 8)",
        _built("translation", "data.length_warmup=10", "data.length_warmup_max=4"),
        "data.length_warmup_min (null: the default, 8)",
        "data.length_warmup_max=4",
        raises=ConfigError,
        fix_in="examples/common/length_warmup.py",
        not_blame=("Lower length_warmup_min",),
    ),
    error(
        "examples-stream-rank-balance",
        AREA,
        "translation: data.stream=true callbacks.rank_balance.enabled=true",
        _built("translation", "data.stream=true", "callbacks.rank_balance.enabled=true"),
        "callbacks.rank_balance.enabled=true",
        "data.stream=true",
        "data.rank_shares",
        raises=ConfigError,
        fix_in="examples/translation/streaming.py",
    ),
    accepted(
        "examples-stream-fixed-rank-shares",
        AREA,
        "translation: data.stream=true trainer.devices=2 data.rank_shares=[1.0,0.5]",
        _stream_with_shares,
        note="accepted: the stream plans every window with the shares",
        fix_in="examples/translation/streaming.py",
    ),
]
