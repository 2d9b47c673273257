"""The ``python -m lightning_varbatch.plan`` command: report, JSON, PNG and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from lightning_varbatch.plan import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def lengths_file(tmp_path: Path) -> Path:
    path = tmp_path / "lengths.npy"
    np.save(path, np.random.default_rng(0).integers(1, 200, size=3000))
    return path


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG_MAGIC


def test_report_and_png_from_a_lengths_file(
    lengths_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "report.png"
    args = ["--lengths", str(lengths_file), "--max-tokens", "2048", "--world-size", "4"]
    code = main([*args, "--accumulate-grad-batches", "2", "--png", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert "plan: 3,000 examples (3,000 planned)" in out
    assert "world_size=4 accumulate_grad_batches=2 max_tokens=2,048 cost=padded" in out
    for line in ("padding efficiency", "budget fill", "examples per batch", "rank imbalance"):
        assert line in out
    assert "equal counts        yes" in out
    assert f"wrote {png}" in out
    assert _is_png(png)


def test_pairs_file_and_every_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "pairs.npy"
    rng = np.random.default_rng(1)
    np.save(path, rng.integers(1, 300, size=(2000, 2)).astype(np.int32))
    png = tmp_path / "pairs.png"
    args = ["--lengths", str(path), "--max-tokens", "1024", "--world-size", "16", "--png", str(png)]
    args += ["--cost", "quadratic", "--max-examples", "64", "--batch-size-multiple", "8"]
    args += ["--pad-to-multiple-of", "8", "--bucket-width", "4", "--tail", "drop"]
    args += ["--oversize", "skip", "--seed", "3", "--epoch", "2", "--json"]
    assert main(args) == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert d["cost"] == "quadratic"
    assert d["world_size"] == 16
    assert d["examples_per_batch_max"] <= 64
    assert d["num_skipped"] > 0  # pairs over 1024 quadratic cost on their own
    assert d["num_planned"] + d["num_skipped"] == 2000
    assert d["num_micro_batches"] == 16 * d["micro_batches_per_rank"]
    assert f"wrote {png}" in captured.err  # notes go to stderr so stdout stays JSON
    assert _is_png(png)  # > 8 ranks: drawn as a band


def test_synthetic_wmt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    png = tmp_path / "wmt.png"
    args = ["--synthetic", "wmt", "--num-examples", "20000", "--max-tokens", "16384"]
    assert main([*args, "--world-size", "8", "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("synthetic wmt lengths: planned and diagnosed in ")
    assert "plan: 20,000 examples (20,000 planned)" in out
    assert _is_png(png)


def test_json_parses_and_matches_the_dataclass(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--synthetic", "wmt", "--num-examples", "5000", "--max-tokens", "4096"]
    assert main([*args, "--world-size", "2", "--json", "--no-png"]) == 0
    captured = capsys.readouterr()
    d = json.loads(captured.out)
    assert d["num_examples"] == 5000
    assert d["equal_counts"] is True
    assert 0 < d["padding_efficiency"] <= 1
    assert d["imbalance_linear_max"] >= 1
    assert captured.err == ""


def test_default_png_lands_in_cwd_and_no_png_skips_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lengths_file: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    args = ["--lengths", str(lengths_file), "--max-tokens", "2048"]
    assert main([*args, "--no-png"]) == 0
    assert not (tmp_path / "plan_report.png").exists()
    assert main(args) == 0
    assert _is_png(tmp_path / "plan_report.png")


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--max-tokens", "0"], "max_tokens must be > 0"),
        (["--max-tokens", "100"], "oversize='skip'"),  # lengths up to 199 do not fit
        (["--max-tokens", "2048", "--world-size", "0"], "world_size must be a positive integer"),
        (["--max-tokens", "2048", "--world-size", "100000"], "More ranks than batches"),
        (["--max-tokens", "2048", "--bucket-width", "0"], "bucket_width must be a positive"),
    ],
)
def test_bad_settings_exit_2_with_one_line(
    lengths_file: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    extra: list[str],
    needle: str,
) -> None:
    code = main(["--lengths", str(lengths_file), "--png", str(tmp_path / "x.png"), *extra])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.out == ""
    assert captured.err.startswith("error: ")
    assert needle in captured.err
    assert captured.err.count("\n") == 1
    assert not (tmp_path / "x.png").exists()


def test_unreadable_lengths_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--lengths", str(tmp_path / "missing.npy"), "--max-tokens", "10"]) == 2
    assert "cannot read --lengths" in capsys.readouterr().err
    bad = tmp_path / "text.npy"
    bad.write_text("not an array")
    assert main(["--lengths", str(bad), "--max-tokens", "10"]) == 2
    assert capsys.readouterr().err.startswith("error: cannot read --lengths")


def test_unwritable_png_exits_2(
    lengths_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "no" / "such" / "dir.png"
    args = ["--lengths", str(lengths_file), "--max-tokens", "2048", "--png", str(png)]
    assert main(args) == 2
    assert capsys.readouterr().err.startswith("error: ")


def test_module_entry_point_exit_code() -> None:
    cmd = [sys.executable, "-m", "lightning_varbatch.plan", "--synthetic", "wmt"]
    cmd += ["--num-examples", "1000", "--max-tokens", "0", "--no-png"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: max_tokens must be > 0")
    assert "Traceback" not in proc.stderr


def test_mixture_report_breaks_down_by_dataset(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    short, long = tmp_path / "short.npy", tmp_path / "long.npy"
    np.save(short, np.full(4000, 16))  # 8 per micro-batch at 128 tokens
    np.save(long, np.full(96, 64))  # 4 per micro-batch at its own 256: 12 whole steps
    args = ["--lengths", str(short), "--lengths", str(long), "--max-tokens", "128"]
    more = ["--world-size", "2", "--weights", "3", "1", "--steps-per-epoch", "40"]
    code = main([*args, *more, "--dataset-max-tokens", "128", "256", "--json", "--no-png"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["equal_counts"]
    rows = {row["name"]: row for row in report["datasets"]}
    assert (rows["short"]["steps"], rows["long"]["steps"]) == (30, 10)
    assert rows["long"]["max_tokens"] == 256 and rows["long"]["budget_fill"] == 1.0
    assert rows["long"]["examples"] == 10 * 2 * 4  # 10 steps x 2 ranks x 4 examples
    assert rows["long"]["repeats"] == 0 and rows["long"]["passes"] == pytest.approx(80 / 96)
    assert rows["short"]["token_share"] == pytest.approx(30 * 128 / (30 * 128 + 10 * 256))
    assert report["budget_fill"] == 1.0  # each micro-batch over its own dataset's budget

    code = main([*args, "--weights", "3", "1", "--no-png"])
    assert code == 2
    assert "set steps_per_epoch" in capsys.readouterr().err
    code = main([*args, "--dataset-max-tokens", "128", "--no-png"])
    assert code == 2
    assert "--dataset-max-tokens has 1 values for 2 --lengths" in capsys.readouterr().err


def test_every_plan_setting_has_a_flag_with_its_help_and_default() -> None:
    import argparse
    import dataclasses

    from lightning_varbatch.plan import _parser
    from lightning_varbatch.planner.settings import PlanConfig

    actions = {a.dest: a for a in _parser()._actions}
    for setting in dataclasses.fields(PlanConfig):
        action = actions.get(setting.name)
        assert action is not None, f"no --{setting.name.replace('_', '-')} flag"
        assert action.option_strings[0] == "--" + setting.name.replace("_", "-")
        words = setting.metadata["help"].replace("``", "").split()
        assert action.help and action.help.split()[:2] == words[:2]
        if setting.default is dataclasses.MISSING:
            assert action.required
        else:
            assert action.default == setting.default
    assert actions["cost"].choices == ["padded", "sum", "quadratic"]
    assert actions["tail"].choices == ["spread", "drop", "pad"]
    assert actions["oversize"].choices == ["error", "skip", "truncate"]
    assert isinstance(actions["shuffle"], argparse.BooleanOptionalAction)
    assert actions["max_examples"].type is int and actions["quadratic_coef"].type is float
    doc = " ".join((PlanConfig.__doc__ or "").split())  # the docstring's Args, from the same text
    for setting in dataclasses.fields(PlanConfig):
        assert f"{setting.name}: {setting.metadata['help']}." in doc, setting.name


def test_new_setting_flags_reach_the_plan(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--synthetic", "wmt", "--num-examples", "3000", "--max-tokens", "4096", "--json"]
    assert main([*args, "--no-png", "--no-shuffle", "--cost", "quadratic"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert main([*args, "--no-png", "--no-shuffle", "--cost", "quadratic",
                 "--quadratic-coef", "0.05", "--oversize", "skip"]) == 0  # fmt: skip
    second = json.loads(capsys.readouterr().out)
    assert first["num_micro_batches"] < second["num_micro_batches"]  # costlier: more batches
