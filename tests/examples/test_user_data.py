"""Training on user corpora (TSV, fairseq-style parallel files) with ``test=true``; bad inputs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

from examples.common.config_checks import ConfigError
from examples.translation.data import build_corpus
from examples.translation.train import CONF_DIR, train
from tests.examples.test_train import SMALL

PAIRS = build_corpus(num_pairs=300, seed=7)


def run(tmp_path: Path, *overrides: str) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *SMALL,
                "data.num_pairs=999999",  # ignored: the corpus comes from the files
                "data.valid=20",
                "data.test=20",
                "trainer.max_steps=2",
                "trainer.val_check_interval=2",
                "callbacks.checkpoint.enabled=false",
                f"output_dir={tmp_path / 'run'}",
                *overrides,
            ],
        )
    return train(cfg)


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def write_parallel(tmp_path: Path, pairs: list[tuple[str, str]]) -> tuple[Path, Path]:
    src, tgt = tmp_path / "train.en", tmp_path / "train.de"
    src.write_text("".join(s + "\n" for s, _ in pairs), encoding="utf-8")
    tgt.write_text("".join(t + "\n" for _, t in pairs), encoding="utf-8")
    return src, tgt


def check_test_metrics(metrics: dict[str, Any]) -> None:
    assert metrics["global_step"] == 2
    assert metrics["sizes"] == {"train": 260, "valid": 20, "test": 20}
    for stage in ("val", "test"):
        assert 0.0 <= metrics[f"{stage}/bleu"] <= 100.0
        assert 0.0 <= metrics[f"{stage}/chrf"] <= 100.0
        assert metrics[f"{stage}/loss"] > 0 and metrics[f"{stage}/nll"] > 0
    assert metrics["test/loss"] != metrics["val/loss"]  # the test split, not the valid one


def test_tsv_corpus_with_test(tmp_path: Path) -> None:
    tsv = write_tsv(tmp_path / "corpus.tsv", PAIRS)
    check_test_metrics(run(tmp_path, f"data.tsv_path={tsv}", "test=true"))


def test_parallel_text_corpus_with_test(tmp_path: Path) -> None:
    src, tgt = write_parallel(tmp_path, PAIRS)
    metrics = run(tmp_path, f"data.src_path={src}", f"data.tgt_path={tgt}", "test=true")
    check_test_metrics(metrics)


def bad_inputs(tmp_path: Path) -> list[tuple[list[str], str]]:
    """(overrides, expected message regex) for each bad input, files written to tmp_path."""
    src, tgt = write_parallel(tmp_path, PAIRS)
    short_tgt = tmp_path / "short.de"
    short_tgt.write_text("".join(t + "\n" for _, t in PAIRS[:-1]), encoding="utf-8")
    no_tab = write_tsv(tmp_path / "no_tab.tsv", PAIRS[:5])
    with no_tab.open("a", encoding="utf-8") as f:
        f.write("a line without a tab\n")
    latin1 = tmp_path / "latin1.tsv"
    latin1.write_bytes(b"Haus\thouse\nM\xe4dchen\tgirl\n")
    tsv = write_tsv(tmp_path / "ok.tsv", PAIRS)
    return [
        (
            [f"data.src_path={src}", f"data.tgt_path={short_tgt}"],
            rf"data\.src_path=.*data\.tgt_path=.*{src}:300 is the first line without a "
            rf"counterpart in {short_tgt}",
        ),
        ([f"data.tsv_path={no_tab}"], rf"data\.tsv_path=.*{no_tab}:6: expected 2 tab-separated"),
        ([f"data.tsv_path={latin1}"], rf"data\.tsv_path=.*{latin1}:2: not UTF-8"),
        ([f"data.tsv_path={tmp_path / 'missing.tsv'}"], r"data\.tsv_path=.*No such file"),
        ([f"data.src_path={src}", f"data.tgt_path={tmp_path}/none"], r"data\.src_path=.*No such"),
        ([f"data.src_path={src}"], r"data\.src_path and data\.tgt_path must be given together"),
        (
            [f"data.tsv_path={tsv}", f"data.src_path={src}", f"data.tgt_path={tgt}"],
            r"either data\.tsv_path or data\.src_path/data\.tgt_path",
        ),
        ([f"data.tsv_path={tsv}", "data.valid=200", "data.test=100"], r"data\.valid=200"),
        (["test=true", "data.test=0"], r"test=true needs a test split: set data\.test"),
    ]


def test_bad_inputs_name_the_setting_file_and_line(tmp_path: Path) -> None:
    for overrides, message in bad_inputs(tmp_path):
        with pytest.raises(ConfigError, match=message):
            run(tmp_path, *overrides)
        assert not (tmp_path / "run").exists(), overrides  # nothing half-written
