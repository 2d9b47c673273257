"""The ``python -m lightning_varbatch.plan`` command: report, JSON, PNG and clean errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

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
        (
            ["--max-tokens", "0"],
            "max_tokens must be a positive integer, got 0. (flag --max-tokens)",
        ),
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
    assert proc.stderr.startswith("error: max_tokens must be a positive integer, got 0")
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


def test_batch_schedule_adds_its_stage_table_and_json(
    lengths_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lightning_varbatch.planner import EpochPlanner, PlanConfig
    from lightning_varbatch.planner.schedule_report import schedule_report

    args = ["--lengths", str(lengths_file), "--max-tokens", "2048", "--world-size", "2"]
    args += ["--accumulate-grad-batches", "2", "--batch-schedule", "0:0.25 50K:0.5 150K:1"]
    assert main([*args, "--json", "--no-png"]) == 0
    got = json.loads(capsys.readouterr().out)["batch_schedule"]
    config = PlanConfig(max_tokens=2048, batch_schedule="0:0.25 50K:0.5 150K:1")
    planner = EpochPlanner(np.load(lengths_file), config)
    expected = schedule_report(planner, planner.plan(0, 2, 2))
    assert expected is not None and got == json.loads(json.dumps(expected.to_dict()))
    assert [s["label"] for s in got["stages"]] == ["0.25", "0.5", "1 (full)"]
    assert main([*args, "--no-png"]) == 0
    out = capsys.readouterr().out
    assert "batch schedule   0:0.25 50000:0.5 150000:1.0" in out
    assert out.rstrip().endswith(expected.format().splitlines()[-1])
    assert main([*args[:4], "--no-png"]) == 0  # no schedule, no table
    assert "batch schedule" not in capsys.readouterr().out


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
    assert actions["cost"].choices == ["padded", "sum", "quadratic", "packed"]
    assert actions["layout"].choices == ["padded", "packed"]
    assert actions["flop_attention"].type is float
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


# -- --dataset / --column: a Hugging Face dataset on disk ---------------------------------


def _token_ids(rng: np.random.Generator, n: int, high: int) -> list[list[int]]:
    return [rng.integers(0, 32000, size=k).tolist() for k in rng.integers(1, high, size=n)]


@pytest.fixture
def hf_rows() -> dict[str, list[Any]]:
    rng = np.random.default_rng(7)
    src, tgt = _token_ids(rng, 1500, 180), _token_ids(rng, 1500, 180)
    return {"src_ids": src, "tgt_ids": tgt, "n": [len(s) for s in src], "text": ["x y"] * 1500}


def _report(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    capsys.readouterr()  # drop what building the fixtures printed (progress bars)
    code = main([*argv, "--json", "--no-png"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report: dict[str, Any] = json.loads(captured.out)
    return report


def _npy(tmp_path: Path, name: str, lengths: Any) -> str:
    path = tmp_path / name
    np.save(path, np.asarray(lengths))
    return str(path)


def _list_lengths(rows: list[list[int]]) -> list[int]:
    return [len(r) for r in rows]  # the independent route: Python's len of each row


SETTINGS = ["--max-tokens", "1024", "--world-size", "4", "--accumulate-grad-batches", "2"]


@pytest.mark.parametrize("shards", [1, 3])
def test_dataset_report_equals_the_lengths_report(
    hf_rows: dict[str, list[Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    shards: int,
) -> None:
    import datasets

    folder = tmp_path / "wmt"
    datasets.Dataset.from_dict(hf_rows).save_to_disk(str(folder), num_shards=shards)
    src, tgt = _list_lengths(hf_rows["src_ids"]), _list_lengths(hf_rows["tgt_ids"])
    one = _npy(tmp_path, "src.npy", src)
    pairs = _npy(tmp_path, "pairs.npy", np.stack([src, tgt], axis=1))
    by_ids = _report(["--dataset", str(folder), "--column", "src_ids", *SETTINGS], capsys)
    by_count = _report(["--dataset", str(folder), "--column", "n", *SETTINGS], capsys)
    assert by_ids == by_count == _report(["--lengths", one, *SETTINGS], capsys)
    assert by_ids["num_examples"] == 1500 and by_ids["real_tokens"] == sum(src)
    pair = ["--dataset", str(folder), "--column", "src_ids", "--column", "tgt_ids"]
    assert _report([*pair, *SETTINGS], capsys) == _report(["--lengths", pairs, *SETTINGS], capsys)


def test_dataset_rows_follow_a_shuffled_or_selected_dataset(
    hf_rows: dict[str, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import datasets

    from lightning_varbatch.plan import _load_lengths, _parser

    ds = datasets.Dataset.from_dict(hf_rows)
    shuffled = ds.shuffle(seed=3).flatten_indices()
    picked = ds.select(range(1400, 200, -3))  # an indices mapping; save_to_disk applies it
    for name, part in (("shuffled", shuffled), ("picked", picked)):
        folder = tmp_path / name
        part.save_to_disk(str(folder))
        src, tgt = _list_lengths(part["src_ids"]), _list_lengths(part["tgt_ids"])
        argv = ["--dataset", str(folder), "--column", "src_ids", "--column", "tgt_ids"]
        (loaded,), label = _load_lengths(_parser().parse_args([*argv, "--max-tokens", "1"]))
        assert loaded.tolist() == [[s, t] for s, t in zip(src, tgt, strict=True)]
        assert label == f"{folder} (columns 'src_ids', 'tgt_ids')"
        pairs = _npy(tmp_path, f"{name}.npy", np.stack([src, tgt], axis=1))
        assert _report([*argv, *SETTINGS], capsys) == _report(
            ["--lengths", pairs, *SETTINGS], capsys
        )
    assert len(picked) == 400


def test_parquet_file_folder_and_a_mixture_of_datasets(
    hf_rows: dict[str, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(hf_rows)
    pq.write_table(table.slice(0, 600), tmp_path / "news.parquet")
    (tmp_path / "wmt").mkdir()
    pq.write_table(table.slice(0, 900), tmp_path / "wmt" / "part-0.parquet")
    pq.write_table(table.slice(900), tmp_path / "wmt" / "part-1.parquet")
    src = _list_lengths(hf_rows["src_ids"])
    news, wmt = _npy(tmp_path, "news.npy", src[:600]), _npy(tmp_path, "wmt.npy", src)
    flags = ["--column", "src_ids", *SETTINGS]
    whole = ["--dataset", str(tmp_path / "wmt"), *flags]
    assert _report(whole, capsys) == _report(["--lengths", wmt, *SETTINGS], capsys)
    mix = ["--weights", "3", "1", "--steps-per-epoch", "12", "--dataset-max-tokens", "1024", "512"]
    both = ["--dataset", str(tmp_path / "wmt"), "--dataset", str(tmp_path / "news.parquet")]
    report = _report([*both, *flags, *mix], capsys)
    assert report == _report(["--lengths", wmt, "--lengths", news, *SETTINGS, *mix], capsys)
    assert [row["name"] for row in report["datasets"]] == ["wmt", "news"]
    assert [row["steps"] for row in report["datasets"]] == [9, 3]


def test_dataset_text_report_names_the_columns(
    hf_rows: dict[str, list[Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "train.parquet"
    pq.write_table(pa.table(hf_rows), path)
    png = tmp_path / "plan.png"
    code = main(["--dataset", str(path), "--column", "n", *SETTINGS, "--png", str(png)])
    out = capsys.readouterr().out
    assert code == 0
    assert out.startswith(f"{path} (column 'n'): planned and diagnosed in ")
    assert "plan: 1,500 examples (1,500 planned)" in out
    assert _is_png(png)


@pytest.mark.parametrize(
    ("argv", "needles"),
    [
        (["--dataset", "{tmp}/missing", "--column", "n"], ["--dataset", "missing"]),
        (["--dataset", "{tmp}/dd", "--column", "n"], ["--dataset", "DatasetDict", "train"]),
        (["--dataset", "{tmp}/ds", "--column", "nn"], ["--column 'nn'", "'src_ids'", "'n'"]),
        (["--dataset", "{tmp}/ds", "--column", "text"], ["--dataset", "'text'", "tokenized"]),
        (["--dataset", "{tmp}/ds/state.json", "--column", "n"], ["--dataset", "state.json"]),
        (["--dataset", "{tmp}/ds"], ["--dataset needs --column"]),
        (["--synthetic", "wmt", "--column", "n"], ["--column", "--dataset PATH"]),
        (["--dataset", "{tmp}/ds", *["--column", "n"] * 2], ["--column 'n' given twice"]),
        (["--dataset", "{tmp}/ds", "--column", "a", "--column", "b", "--column", "c"],
         ["--column given 3 times"]),
        (["--lengths", "{tmp}/x.npy", "--dataset", "{tmp}/ds", "--column", "n"],
         ["--dataset", "not allowed with argument --lengths"]),
    ],
)  # fmt: skip
def test_bad_dataset_flags_exit_2_with_an_error_line(
    hf_rows: dict[str, list[Any]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    needles: list[str],
) -> None:
    import datasets

    ds = datasets.Dataset.from_dict({k: v[:50] for k, v in hf_rows.items()})
    ds.save_to_disk(str(tmp_path / "ds"))
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp_path / "dd"))
    capsys.readouterr()
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    code: int | str | None
    try:
        code = main([*args, "--max-tokens", "4096", "--no-png"])
    except SystemExit as exit_:  # flags argparse (or the flag checks) refuse
        code = exit_.code
    err = capsys.readouterr().err
    assert code == 2
    last = err.strip().splitlines()[-1]
    assert "error: " in last and "Traceback" not in err
    for needle in needles:
        assert needle in last
