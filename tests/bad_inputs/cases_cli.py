"""The plan CLI: files, flags and figure paths. It must exit 2 with one ``error:`` line.

Most cases call ``main(argv)`` in-process; one runs ``python -m lightning_varbatch.plan``.
The ``--dataset``/``--column`` cases read a Hugging Face dataset on disk (``save_to_disk``
folders and parquet files) and must exit with code 2, the last stderr line an ``error:``.

Example:
    >>> len(CASES) > 25
    True
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.bad_inputs.case import Case, CliError, accepted, error, run_plan_cli

CLI = "lightning_varbatch/plan.py"
MAX_TOKENS = ("--max-tokens", "max_tokens")


def _save(tmp: Path, name: str, array: Any, **kwargs: Any) -> str:
    path = tmp / name
    np.save(path, array, **kwargs)
    return str(path)


def _with_file(name: str, array: Any, *flags: str, **kwargs: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        path = _save(tmp, name, array, **kwargs)
        return run_plan_cli(["--lengths", path, "--max-tokens", "16", "--no-png", *flags])

    return run


def _flags(*flags: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        path = _save(tmp, "lengths.npy", np.array([3, 5, 2, 7, 4, 6, 1, 8]))
        return run_plan_cli(["--lengths", path, "--no-png", *flags])

    return run


def _mixture(*flags: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        a = _save(tmp, "wmt.npy", np.array([3, 5, 2, 7, 4, 6, 1, 8]))
        b = _save(tmp, "news.npy", np.array([4, 4, 6, 2]))
        return run_plan_cli(
            ["--lengths", a, "--lengths", b, "--max-tokens", "16", "--no-png", *flags]
        )

    return run


def _missing(tmp: Path) -> None:
    run_plan_cli(["--lengths", str(tmp / "missing.npy"), "--max-tokens", "16", "--no-png"])


def _directory(tmp: Path) -> None:
    run_plan_cli(["--lengths", str(tmp), "--max-tokens", "16", "--no-png"])


def _text_file(tmp: Path) -> None:
    path = tmp / "lengths.txt"
    path.write_text("3\n5\n2\n")
    run_plan_cli(["--lengths", str(path), "--max-tokens", "16", "--no-png"])


def _npz(tmp: Path) -> None:
    path = tmp / "lengths.npz"
    np.savez(path, a=np.array([3, 5]), b=np.array([2]))
    run_plan_cli(["--lengths", str(path), "--max-tokens", "16", "--no-png"])


def _png_written_where_printed(png: Path | str, tmp: Path) -> None:
    """The figure path printed is where the figure is; or the CLI refuses, naming --png."""
    lengths = _save(tmp, "lengths.npy", np.array([3, 5, 2, 7, 4, 6, 1, 8]))
    try:
        out = run_plan_cli(["--lengths", lengths, "--max-tokens", "16", "--png", str(png)])
    except CliError as err:
        text = str(err)
        assert "--png" in text and str(png) in text, f"vague: {text}"
        return
    found = re.search(r"wrote (.+)", out)
    assert found, f"silent: no 'wrote PATH' line in {out!r}"
    written = Path(found.group(1).strip())
    if not written.is_absolute():
        written = Path.cwd() / written
    assert written.is_file(), f"silent: it printed 'wrote {written}' but no such file exists"
    if written.suffix in ("", ".png"):
        assert written.read_bytes()[:4] == b"\x89PNG", f"{written} is not a PNG"


def _png_dir(tmp: Path) -> None:
    (tmp / "figs").mkdir()
    _png_written_where_printed(tmp / "figs", tmp)


def _png_no_ext(tmp: Path) -> None:
    _png_written_where_printed(tmp / "report", tmp)


def _png_missing_parent(tmp: Path) -> None:
    _png_written_where_printed(tmp / "no" / "such" / "dir" / "plan.png", tmp)


def _png_other_ext(tmp: Path) -> None:
    _png_written_where_printed(tmp / "plan.jpg", tmp)


def _png_unwritable(tmp: Path) -> None:
    lengths = _save(tmp, "lengths.npy", np.array([3, 5, 2, 7]))
    run_plan_cli(["--lengths", lengths, "--max-tokens", "16", "--png", "/proc/plan.png"])


def _subprocess(tmp: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "lightning_varbatch.plan",
            "--lengths",
            str(tmp / "gone.npy"),
            "--max-tokens",
            "16",
            "--no-png",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, f"exit code {proc.returncode}, stderr {proc.stderr!r}"
    assert len(lines) == 1 and lines[0].startswith("error:"), f"vague: {proc.stderr!r}"
    raise CliError(f"exit code {proc.returncode}: {proc.stderr.strip()}")


def _huge(tmp: Path) -> None:
    path = _save(tmp, "huge.npy", np.array([3, 2**22 + 5, 5]))
    run_plan_cli(["--lengths", path, "--max-tokens", str(2**23), "--no-png", "--json"])


def _int32_pairs(tmp: Path) -> None:
    path = _save(tmp, "pairs.npy", np.array([[3, 4], [5, 2], [7, 7]], dtype=np.int32))
    out = run_plan_cli(["--lengths", path, "--max-tokens", "16", "--no-png", "--json"])
    assert '"equal_counts": true' in out


def _one_file(*flags: str) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        path = _save(tmp, "wmt.npy", np.array([3, 5, 2, 7, 4, 6, 1, 8]))
        return run_plan_cli(["--lengths", path, "--max-tokens", "16", "--no-png", *flags])

    return run


ARROW = "lightning_varbatch/sources/arrow_lengths.py"
ROWS: dict[str, list[Any]] = {
    "input_ids": [[5, 6, 7], [8, 9], [4], [1, 2, 3, 4]],
    "n": [3, 2, 1, 4],
    "text": ["a b c", "d e", "f", "g h i j"],
    "score": [0.5, 1.5, 2.0, 3.0],
}


def _parquet(tmp: Path, rows: dict[str, list[Any]] | None = None) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp / "train.parquet"
    pq.write_table(pa.table(ROWS if rows is None else rows), path)
    return str(path)


def _dataset_cli(*argv: str) -> str:
    """Run the CLI; a refusal must exit 2 with an ``error:`` last line (usage lines dropped)."""
    try:
        return run_plan_cli([*argv, "--max-tokens", "16", "--no-png"])
    except CliError as err:
        code, _, stderr = str(err).partition(": ")
        last = stderr.strip().splitlines()[-1] if stderr.strip() else ""
        assert code == "exit code 2", f"{code}, not exit code 2: {stderr!r}"
        assert "error: " in last and "Traceback" not in stderr, f"vague: {stderr!r}"
        raise CliError(f"{code}: {last}") from None


def _on_parquet(*flags: str, rows: dict[str, list[Any]] | None = None) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        return _dataset_cli("--dataset", _parquet(tmp, rows), *flags)

    return run


def _dataset_dict(tmp: Path) -> None:
    import datasets

    ds = datasets.Dataset.from_dict(ROWS)
    datasets.DatasetDict({"train": ds, "test": ds}).save_to_disk(str(tmp / "wmt"))
    _dataset_cli("--dataset", str(tmp / "wmt"), "--column", "n")


def _dataset_npy(tmp: Path) -> None:
    _dataset_cli("--dataset", _save(tmp, "lengths.npy", np.array([3, 5])), "--column", "n")


def _dataset_bare_folder(tmp: Path) -> None:
    (tmp / "wmt").mkdir()
    (tmp / "wmt" / "notes.txt").write_text("no data here")
    _dataset_cli("--dataset", str(tmp / "wmt"), "--column", "n")


def _dataset_selected(tmp: Path) -> None:
    """A saved ``select``/``shuffle`` keeps its rows in its own order; the report counts them."""
    import json

    import datasets

    ds = datasets.Dataset.from_dict(ROWS).shuffle(seed=0).select([3, 1, 0])
    ds.save_to_disk(str(tmp / "picked"))
    out = _dataset_cli("--dataset", str(tmp / "picked"), "--column", "input_ids", "--json")
    report = json.loads(out)
    assert report["num_examples"] == 3 and report["real_tokens"] == sum(
        len(ids) for ids in ds["input_ids"]
    ), report


PNG_NOTE = "the figure lands where the printed path says, or exit 2 naming `--png` and the path"

CASES: list[Case] = [
    *(
        error(
            f"cli-batch-schedule-{name}",
            "plan CLI",
            f"--batch-schedule '{value}' (lengths up to 8, --max-tokens 16)",
            _flags("--max-tokens", "16", "--batch-schedule", value),
            "--batch-schedule",
            *words,
            raises=CliError,
            fix_in="lightning_varbatch/planner/batch_schedule.py",
        )
        for name, value, words in (
            ("from-zero", "0:0 1K:1", ("got 0", "start above 0")),
            ("decreasing", "0:0.5 1K:0.25 2K:1", ("decreases",)),
            ("first-fraction-too-small", "0:0.1 1K:1", ("at least 0.5",)),
        )
    ),
    error(
        "cli-lengths-missing-file",
        "plan CLI",
        "--lengths missing.npy (no such file)",
        _missing,
        "--lengths",
        "missing.npy",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-directory",
        "plan CLI",
        "--lengths DIR (a directory)",
        _directory,
        "--lengths",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-text-file",
        "plan CLI",
        "--lengths lengths.txt (text, not .npy)",
        _text_file,
        "--lengths",
        "lengths.txt",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-npz",
        "plan CLI",
        "--lengths lengths.npz (several arrays)",
        _npz,
        "--lengths",
        "lengths.npz",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-pickled",
        "plan CLI",
        "--lengths of a pickled object array",
        _with_file("objects.npy", np.array([3, None], dtype=object), allow_pickle=True),
        "--lengths",
        "objects.npy",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-three-columns",
        "plan CLI",
        "--lengths of shape (5, 3)",
        _with_file("wide.npy", np.ones((5, 3), dtype=int)),
        "wide.npy",
        "(5, 3)",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-strings",
        "plan CLI",
        "--lengths of strings",
        _with_file("words.npy", np.array(["3", "5"])),
        "words.npy",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-negative",
        "plan CLI",
        "--lengths holding -1",
        _with_file("neg.npy", np.array([3, -1, 4])),
        "neg.npy",
        "-1",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-empty",
        "plan CLI",
        "--lengths of an empty array",
        _with_file("empty.npy", np.array([], dtype=int)),
        "empty.npy",
        "empty",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-0d",
        "plan CLI",
        "--lengths of a 0-d array",
        _with_file("scalar.npy", np.array(5)),
        "scalar.npy",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-over-budget",
        "plan CLI",
        "--lengths with an example of 99, --max-tokens 16",
        _with_file("long.npy", np.array([3, 99])),
        "99",
        MAX_TOKENS,
        ("--oversize", "oversize"),
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-max-tokens-zero",
        "plan CLI",
        "--max-tokens 0",
        _flags("--max-tokens", "0"),
        MAX_TOKENS,
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-max-tokens-negative",
        "plan CLI",
        "--max-tokens -8",
        _flags("--max-tokens", "-8"),
        MAX_TOKENS,
        "-8",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-max-tokens-str",
        "plan CLI",
        "--max-tokens 4k",
        _flags("--max-tokens", "4k"),
        "--max-tokens",
        "4k",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-max-tokens-missing",
        "plan CLI",
        "no --max-tokens",
        _flags(),
        "--max-tokens",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-no-source",
        "plan CLI",
        "neither --lengths nor --synthetic",
        lambda tmp: run_plan_cli(["--max-tokens", "16"]),
        "--lengths",
        "--synthetic",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-unknown-flag",
        "plan CLI",
        "--world-sise 2 (typo)",
        _flags("--max-tokens", "16", "--world-sise", "2"),
        "--world-sise",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-cost-unknown",
        "plan CLI",
        "--cost linear",
        _flags("--max-tokens", "16", "--cost", "linear"),
        "--cost",
        "linear",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-world-size-zero",
        "plan CLI",
        "--world-size 0",
        _flags("--max-tokens", "16", "--world-size", "0"),
        ("--world-size", "world_size"),
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-accumulate-zero",
        "plan CLI",
        "--accumulate-grad-batches 0",
        _flags("--max-tokens", "16", "--accumulate-grad-batches", "0"),
        ("--accumulate-grad-batches", "accumulate_grad_batches"),
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-bucket-width-zero",
        "plan CLI",
        "--bucket-width 0",
        _flags("--max-tokens", "16", "--bucket-width", "0"),
        ("--bucket-width", "bucket_width"),
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-max-examples-zero",
        "plan CLI",
        "--max-examples 0",
        _flags("--max-tokens", "16", "--max-examples", "0"),
        ("--max-examples", "max_examples"),
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-seed-negative",
        "plan CLI",
        "--seed -1",
        _flags("--max-tokens", "16", "--seed", "-1"),
        ("--seed", "seed"),
        "-1",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-epoch-negative",
        "plan CLI",
        "--epoch -1",
        _flags("--max-tokens", "16", "--epoch", "-1"),
        ("--epoch", "epoch"),
        "-1",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-more-ranks-than-examples",
        "plan CLI",
        "8 examples, --world-size 16",
        _flags("--max-tokens", "16", "--world-size", "16"),
        ("--world-size", "world_size"),
        "16",
        "8",
        raises=CliError,
        fix_in=CLI,
    ),
    # -- per-rank budgets and the warm-up: named by the flag typed (issue 31) --------------
    error(
        "cli-rank-shares-zero",
        "plan CLI",
        "--world-size 2 --rank-shares 1 0",
        _flags("--max-tokens", "16", "--world-size", "2", "--rank-shares", "1", "0"),
        "(flag --rank-shares)",
        "rank 1",
        raises=CliError,
        fix_in=CLI,
        not_blame=("--max-tokens",),
    ),
    error(
        "cli-rank-shares-too-small",
        "plan CLI",
        "--world-size 2 --rank-shares 1 0.2 (rank 1: 3 tokens, the longest example 8)",
        _flags("--max-tokens", "16", "--world-size", "2", "--rank-shares", "1", "0.2"),
        "(flag --rank-shares)",
        "rank 1",
        raises=CliError,
        fix_in=CLI,
        not_blame=("--max-tokens",),
    ),
    error(
        "cli-rank-max-tokens-over-budget",
        "plan CLI",
        "--max-tokens 16 --world-size 2 --rank-max-tokens 32 16",
        _flags("--max-tokens", "16", "--world-size", "2", "--rank-max-tokens", "32", "16"),
        "(flag --rank-max-tokens)",
        "32",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-rank-shares-per-batch-mixture",
        "plan CLI",
        "two --lengths, --mixing per_batch --world-size 2 --rank-shares 1 0.5",
        _mixture("--mixing", "per_batch", "--world-size", "2", "--rank-shares", "1", "0.5"),
        "(flag --mixing)",
        "per_step",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-length-warmup-max-below-default-min",
        "plan CLI",
        "--length-warmup 2 --length-warmup-max 4 (--length-warmup-min not given: 8)",
        _flags("--max-tokens", "16", "--length-warmup", "2", "--length-warmup-max", "4"),
        "length_warmup_min=8 (its default)",
        "flag --length-warmup-max",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-num-examples-zero",
        "plan CLI",
        "--synthetic wmt --num-examples 0",
        lambda tmp: run_plan_cli(
            ["--synthetic", "wmt", "--num-examples", "0", "--max-tokens", "4096", "--no-png"]
        ),
        "--num-examples",
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-weights-count",
        "plan CLI",
        "two --lengths, --weights 1 2 3",
        _mixture("--weights", "1", "2", "3", "--steps-per-epoch", "4"),
        ("--weights", "weights"),
        "3",
        "2",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-weights-negative",
        "plan CLI",
        "--weights 1 -1",
        _mixture("--weights", "1", "-1", "--steps-per-epoch", "4"),
        ("--weights", "weights"),
        "-1",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-weights-without-steps",
        "plan CLI",
        "--weights 1 3 without --steps-per-epoch",
        _mixture("--weights", "1", "3"),
        ("--steps-per-epoch", "steps_per_epoch"),
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-temperature-zero",
        "plan CLI",
        "--temperature 0",
        _mixture("--temperature", "0", "--steps-per-epoch", "4"),
        ("--temperature", "temperature"),
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-steps-per-epoch-zero",
        "plan CLI",
        "--steps-per-epoch 0",
        _mixture("--steps-per-epoch", "0"),
        ("--steps-per-epoch", "steps_per_epoch"),
        "0",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-max-tokens-count",
        "plan CLI",
        "two --lengths, --dataset-max-tokens 16",
        _mixture("--dataset-max-tokens", "16"),
        "--dataset-max-tokens",
        "1",
        "2",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-max-tokens-zero",
        "plan CLI",
        "--dataset-max-tokens 16 0",
        _mixture("--dataset-max-tokens", "16", "0"),
        "max_tokens",
        "0",
        "news",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-weights-one-file",
        "plan CLI",
        "one --lengths with --weights 1 2",
        _one_file("--weights", "1", "2", "--steps-per-epoch", "4"),
        ("--weights", "weights"),
        "2",
        "1",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-lengths-nan",
        "plan CLI",
        "--lengths of floats holding NaN",
        _with_file("nan.npy", np.array([3.0, np.nan])),
        "nan.npy",
        "nan",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-png-and-no-png",
        "plan CLI",
        "--png plan.png together with --no-png",
        _flags("--max-tokens", "16", "--png", "plan.png"),
        "--png",
        "--no-png",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-png-unwritable",
        "plan CLI",
        "--png /proc/plan.png (cannot be written)",
        _png_unwritable,
        "--png",
        "/proc/plan.png",
        raises=CliError,
        fix_in=CLI,
    ),
    accepted(
        "cli-png-directory",
        "plan CLI",
        "--png DIR (an existing directory)",
        _png_dir,
        note=PNG_NOTE,
        fix_in=CLI,
    ),
    accepted(
        "cli-png-no-extension",
        "plan CLI",
        "--png report (no extension)",
        _png_no_ext,
        note=PNG_NOTE,
        fix_in=CLI,
    ),
    accepted(
        "cli-png-missing-parent",
        "plan CLI",
        "--png no/such/dir/plan.png",
        _png_missing_parent,
        note=PNG_NOTE,
        fix_in=CLI,
    ),
    accepted(
        "cli-png-other-extension",
        "plan CLI",
        "--png plan.jpg",
        _png_other_ext,
        note=PNG_NOTE,
        fix_in=CLI,
    ),
    error(
        "cli-subprocess-missing-file",
        "plan CLI",
        "python -m lightning_varbatch.plan --lengths gone.npy (a real process)",
        _subprocess,
        "gone.npy",
        "--lengths",
        raises=CliError,
        fix_in=CLI,
    ),
    accepted(
        "cli-huge-lengths",
        "plan CLI",
        "a length of 2**22 + 5 with --max-tokens 2**23",
        _huge,
        fix_in=CLI,
    ),
    accepted("cli-int32-pairs", "plan CLI", "(n, 2) int32 lengths", _int32_pairs, fix_in=CLI),
    error(
        "cli-dataset-missing",
        "plan CLI",
        "--dataset missing (no such folder)",
        lambda tmp: _dataset_cli("--dataset", str(tmp / "missing"), "--column", "n"),
        "--dataset",
        "missing",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-dataset-dict",
        "plan CLI",
        "--dataset DIR of a saved DatasetDict (splits train, test)",
        _dataset_dict,
        "--dataset",
        "DatasetDict",
        "train",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-not-arrow",
        "plan CLI",
        "--dataset lengths.npy (neither Arrow nor parquet)",
        _dataset_npy,
        "--dataset",
        "lengths.npy",
        "parquet",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-bare-folder",
        "plan CLI",
        "--dataset DIR without state.json or parquet files",
        _dataset_bare_folder,
        "--dataset",
        "state.json",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-without-column",
        "plan CLI",
        "--dataset train.parquet without --column",
        _on_parquet(),
        "--dataset",
        "--column",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-column-without-dataset",
        "plan CLI",
        "--lengths lengths.npy --column n (--column needs --dataset)",
        _flags("--max-tokens", "16", "--column", "n"),
        "--column",
        "--dataset",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-dataset-and-lengths",
        "plan CLI",
        "--dataset train.parquet together with --lengths",
        lambda tmp: _dataset_cli(
            "--lengths",
            _save(tmp, "x.npy", np.array([3])),
            "--dataset",
            _parquet(tmp),
            "--column",
            "n",
        ),
        "--dataset",
        "--lengths",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-column-unknown",
        "plan CLI",
        "--column ids (the dataset has input_ids, n, text, score)",
        _on_parquet("--column", "ids"),
        "--column",
        "'ids'",
        "'input_ids'",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-column-three",
        "plan CLI",
        "--column input_ids --column n --column text (three columns)",
        _on_parquet("--column", "input_ids", "--column", "n", "--column", "text"),
        "--column",
        "3",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-column-twice",
        "plan CLI",
        "--column n --column n (the same column twice)",
        _on_parquet("--column", "n", "--column", "n"),
        "--column",
        "'n'",
        "twice",
        raises=CliError,
        fix_in=CLI,
    ),
    error(
        "cli-column-text",
        "plan CLI",
        "--column text (a string column, not token ids)",
        _on_parquet("--column", "text"),
        "--dataset",
        "'text'",
        "tokenized_lengths",
        raises=CliError,
        fix_in=ARROW,
    ),
    error(
        "cli-column-floats",
        "plan CLI",
        "--column score (float64 values)",
        _on_parquet("--column", "score"),
        "--dataset",
        "'score'",
        "double",
        raises=CliError,
        fix_in=ARROW,
    ),
    error(
        "cli-column-empty-row",
        "plan CLI",
        "--column input_ids with an empty token list in row 1",
        _on_parquet("--column", "input_ids", rows={"input_ids": [[5, 6], [], [7]]}),
        "--dataset",
        "'input_ids'",
        "[1] = 0",
        raises=CliError,
        fix_in=ARROW,
    ),
    error(
        "cli-column-nulls",
        "plan CLI",
        "--column n holding a null in row 2",
        _on_parquet("--column", "n", rows={"n": [3, 4, None]}),
        "'n'",
        "null",
        "row 2",
        raises=CliError,
        fix_in=ARROW,
    ),
    accepted(
        "cli-dataset-selected",
        "plan CLI",
        "--dataset of a saved ds.shuffle().select([3, 1, 0]) (an indices mapping)",
        _dataset_selected,
        note="planned: 3 examples with the selected rows' tokens",
        fix_in=CLI,
    ),
]
