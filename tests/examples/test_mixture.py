"""The translation example on several corpora (``data.corpora``): build, train, DDP, bad configs."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from itertools import groupby
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.translation.data import build_corpus
from examples.translation.datamodule import build_datamodule
from examples.translation.train import CONF_DIR, ROOT, train
from tests.examples.recorder import read_records
from tests.examples.test_train import SMALL
from tests.launch import launch

DATA_OPTIONS = sorted(p.stem for p in (CONF_DIR / "data").glob("*.yaml"))
RECORD = "+callbacks.record._target_=tests.examples.recorder.RecordBatches"


def make(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def write_tsv(path: Path, pairs: list[tuple[str, str]]) -> Path:
    path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def two_corpora(tsv: Path) -> list[str]:
    """The embedded corpus (400 pairs) and a TSV of short expressions, weighted 1 : 3."""
    return [
        "+data.corpora.embedded={kind: synthetic, num_pairs: 400, weight: 1}",
        f"+data.corpora.tsv={{kind: tsv, tsv_path: '{tsv}', weight: 3}}",
        "data.valid=20",
        "data.mixing=per_step",
        "data.steps_per_epoch=8",
        "trainer.accumulate_grad_batches=2",
        "trainer.max_steps=8",
    ]


@pytest.fixture
def tsv(tmp_path: Path) -> Path:
    return write_tsv(tmp_path / "short.tsv", build_corpus(200, seed=7, domain="expressions"))


@pytest.mark.parametrize("option", DATA_OPTIONS)
def test_every_data_option_builds_its_datamodule(option: str, tmp_path: Path) -> None:
    """Each ``conf/data`` option, its corpora scaled down, builds batches of every corpus."""
    cfg = make(f"data={option}")
    names = list(cfg.data.corpora)
    small = [f"data.corpora.{n}.num_pairs=120" for n in names]  # keeps their kind and settings
    cfg = make(
        f"data={option}", *SMALL, "data.num_pairs=120", "data.valid=10", *small, "data.test=5"
    )
    dm, tokenizer, sizes = build_datamodule(cfg, tmp_path)
    assert tokenizer.get_vocab_size() <= 400
    batches = list(dm.train_dataloader())
    datasets = {int(b["dataset"]) for b in batches}
    if not names:
        # one corpus: one plain dataset per split, with its own loss lengths (target - BOS)
        assert dm.sources["train"] is None and datasets == {0}
        assert sum(int(b["step_ntokens"]) for b in batches) == sum(
            len(item["target"]) - 1 for item in dm.datasets["train"]
        )
        assert sum(len(b["source"]) for b in dm.val_dataloader()) == 10
        assert {k: sizes[k] for k in ("train", "valid", "test")} == {
            "train": 105,
            "valid": 10,
            "test": 5,
        }
        return
    sources = dm.sources["train"]
    assert sources is not None and [s.name for s in sources] == names
    assert sizes["corpora"] == {n: {"train": 105, "valid": 10, "test": 5} for n in names}
    assert datasets == set(range(len(names)))  # every corpus trains
    assert sum(len(b["source"]) for b in dm.val_dataloader()) == 10 * len(names)
    assert sum(len(b["source"]) for b in dm.test_dataloader()) == 5 * len(names)
    if option == "mixture":
        assert names == ["expressions", "sentences"]
        assert dm.mixing["weights"] == [1.0, 3.0] and dm.mixing["steps_per_epoch"] == 250
        source_lengths = [b["source_mask"].sum(1).float().mean() for b in dm.val_dataloader()]
        assert min(source_lengths) < max(source_lengths) / 2  # short expressions, long sentences


def test_train_on_two_corpora_logs_per_corpus_and_follows_the_weights(
    tsv: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    cfg = make(
        *SMALL,
        *two_corpora(tsv),
        "trainer.val_check_interval=16",  # micro-batches: once, after the 8 steps
        "callbacks.checkpoint.enabled=false",
        RECORD,
        f"+callbacks.record.path={out / 'batches.jsonl'}",
        f"output_dir={out}",
    )
    metrics = train(cfg)
    assert metrics["global_step"] == 8
    assert list(metrics["sizes"]["corpora"]) == ["embedded", "tsv"]
    names = ["embedded", "tsv"]
    for name in names:
        assert metrics[f"train/{name}/loss"] > 0
        assert metrics[f"val/{name}/loss"] > 0
    low, high = sorted(metrics[f"val/{name}/loss"] for name in names)
    assert low < high  # each corpus's own loss, not the global one twice
    assert low < metrics["val/loss"] < high  # the global loss is their token-weighted mean

    records = read_records(out / "batches.jsonl")
    assert len(records) == 16  # 8 steps x 2 micro-batches
    steps = [{r["dataset"] for r in group} for _, group in groupby(records, lambda r: r["step"])]
    assert all(len(datasets) == 1 for datasets in steps), "per_step: one corpus per step"
    # weights 1 : 3 over 8 steps (by size the embedded corpus would take most steps)
    assert Counter(names[d] for (d,) in steps) == {"embedded": 2, "tsv": 6}


@pytest.mark.multiprocess
def test_two_processes_train_the_mixture(tsv: Path, tmp_path: Path) -> None:
    records = launch(
        "translation_train.py",
        2,
        tmp_path,
        *SMALL,
        *two_corpora(tsv),
        "trainer.val_check_interval=16",
        "callbacks.checkpoint.enabled=false",
        RECORD,
        "+callbacks.record.path=${output_dir}/batches-${oc.env:RANK}.jsonl",
        timeout=150,
    )
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        metrics = record["metrics"]
        assert metrics["global_step"] == 8 and metrics["world_size"] == 2
        assert {"val/embedded/loss", "val/tsv/loss"} <= set(metrics)
    # the per-corpus validation losses are all-reduced: the same on both ranks
    for key in ("val/embedded/loss", "val/tsv/loss"):
        assert records[0]["metrics"][key] == pytest.approx(records[1]["metrics"][key])
    steps = [
        [r["dataset"] for r in read_records(tmp_path / "run" / f"batches-{rank}.jsonl")]
        for rank in (0, 1)
    ]
    assert len(steps[0]) == 16 and steps[0] == steps[1]  # every step: one corpus on both ranks
    assert Counter(steps[0]) == {0: 4, 1: 12}


def bad_configs(tmp_path: Path) -> list[tuple[list[str], str]]:
    """(overrides, expected message regex) of each bad mixture config."""
    empty = tmp_path / "empty.tsv"
    empty.write_text("", encoding="utf-8")
    mine = "+data.corpora.mine"
    return [
        (["data.steps_per_epoch=null"], r"set data\.steps_per_epoch"),
        (["data.steps_per_epoch=null", "data.temperature=2"], r"set data\.steps_per_epoch"),
        (["data.corpora.expressions.weight=-1"], r"data\.corpora\.expressions\.weight must be"),
        (
            ["data.corpora.expressions.weight=0", "data.corpora.sentences.weight=0"],
            r"data\.corpora\.\*\.weight are all 0",
        ),
        ([f"{mine}.kind=tsv", f"{mine}.tsv_path={empty}"], r"data\.corpora\.mine\.weight missing"),
        (
            ["data.corpora.expressions.kind=hf"],
            r"data\.corpora\.expressions\.kind must be one of synthetic, parallel, tsv; got 'hf'",
        ),
        ([f"{mine}.weight=1"], r"data\.corpora\.mine\.kind must be one of synthetic, parallel"),
        (
            [f"{mine}.kind=parallel", f"{mine}.src_path=a.en", f"{mine}.weight=1"],
            r"data\.corpora\.mine \(kind=parallel\) needs data\.corpora\.mine\.tgt_path",
        ),
        (
            [f"{mine}.kind=tsv", f"{mine}.weight=1"],
            r"needs data\.corpora\.mine\.tsv_path",
        ),
        (
            [f"{mine}.kind=tsv", f"{mine}.tsv_path={empty}", f"{mine}.weight=1"],
            rf"data\.corpora\.mine\.tsv_path={empty} is empty",
        ),
        (
            ["data.corpora.expressions.kind=tsv"],
            r"domain, num_pairs, seed do\(es\) not apply to kind=tsv",
        ),
        (["+data.corpora.sentences.wieght=3"], r"unknown setting\(s\) \['wieght'\]; valid: kind"),
        (["data.corpora.sentences.domain=news"], r"domain must be one of mixed, expressions"),
        (["data.mixing=per_epoch"], r"data\.mixing must be one of per_step, per_batch"),
        ([f"data.tsv_path={empty}"], r"data\.tsv_path is set next to data\.corpora"),
        (
            ["data.test=5", "data.corpora.sentences.test=0", "test=true"],
            r"test=true needs a test split: set data\.corpora\.sentences\.test > 0",
        ),
        (
            ["data.corpora.sentences.max_tokens=16"],
            r"data\.max_tokens=1024 / data\.corpora\.sentences\.max_tokens=16 cannot batch the "
            r"train split.*Dataset 'sentences'.*data\.corpora\.<name>\.max_tokens",
        ),
    ]


@pytest.mark.slow
def test_bad_mixture_configs_name_the_setting(tmp_path: Path) -> None:
    out = tmp_path / "run"
    small = ["data.corpora.expressions.num_pairs=200", "data.corpora.sentences.num_pairs=200"]
    for overrides, message in bad_configs(tmp_path):
        cfg = make(*SMALL, "data=mixture", *small, f"output_dir={out}", *overrides)
        with pytest.raises(ConfigError, match=message):
            train(cfg)
        assert not out.exists(), overrides  # nothing written
    single = make(*SMALL, "data.steps_per_epoch=10", f"output_dir={out}")
    with pytest.raises(ConfigError, match=r"data\.steps_per_epoch=10 applies to a mixture"):
        train(single)
    assert not out.exists()


@pytest.mark.slow
def test_cli_mixture_error_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = subprocess.run(
        [
            sys.executable,
            str(ROOT / "examples" / "translation" / "train.py"),
            "data=mixture",
            "data.steps_per_epoch=null",
            f"output_dir={run}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "set data.steps_per_epoch" in proc.stderr, proc.stderr[-2000:]
    assert not run.exists()
