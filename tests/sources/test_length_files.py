"""The plan report's lengths files: ``--lengths`` (.npy) and ``--dataset`` (Arrow, parquet)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lightning_varbatch.sources.length_files import dataset_lengths, npy_lengths
from lightning_varbatch.sources.saved_arrow import open_arrow_table


def test_npy_lengths_reads_and_checks_a_saved_array(tmp_path: Path) -> None:
    path = tmp_path / "lengths.npy"
    np.save(path, np.array([[3, 4], [5, 1]]))
    assert npy_lengths(path).tolist() == [[3, 4], [5, 1]]


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: None, r"cannot read --lengths '.*x.npy': no such file"),
        (lambda p: p.mkdir(), r"it is a directory"),
        (lambda p: p.write_bytes(b"junk"), r"as a .npy array \(ValueError"),
        (lambda p: np.savez(open(p, "wb"), a=[1], b=[2]), r"an .npz archive of several arrays"),
        (lambda p: np.save(open(p, "wb"), np.array([3, 0])), r"^--lengths '.*x.npy': "),
    ],
)
def test_npy_lengths_names_the_flag_for_what_it_cannot_use(
    tmp_path: Path, make: object, match: str
) -> None:
    path = tmp_path / "x.npy"
    make(path)  # type: ignore[operator]
    with pytest.raises(ValueError, match=match):
        npy_lengths(path)


def test_dataset_lengths_reads_a_parquet_folder_and_a_saved_dataset(tmp_path: Path) -> None:
    folder = tmp_path / "parts"
    folder.mkdir()
    for i, ids in enumerate(([[1, 2, 3], [4]], [[5, 6]])):
        pq.write_table(pa.table({"ids": ids, "n": [7] * len(ids)}), folder / f"p{i}.parquet")
    assert dataset_lengths(folder, ["ids"]).tolist() == [3, 1, 2]
    assert dataset_lengths(folder, ["ids", "n"]).tolist() == [[3, 7], [1, 7], [2, 7]]
    datasets = pytest.importorskip("datasets")
    saved = tmp_path / "saved"
    datasets.Dataset.from_dict({"ids": [[1], [2, 3]]}).save_to_disk(str(saved))
    assert dataset_lengths(saved, ["ids"]).tolist() == [1, 2]
    assert open_arrow_table(saved).num_rows == 2


def test_dataset_lengths_names_the_flag_the_path_and_the_columns(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"cannot read --dataset '.*nowhere': no such file"):
        dataset_lengths(tmp_path / "nowhere", ["ids"])
    pq.write_table(pa.table({"ids": [[1]]}), tmp_path / "a.parquet")
    with pytest.raises(ValueError, match=r"--column 'n': .* its columns are \['ids'\]"):
        dataset_lengths(tmp_path / "a.parquet", ["n"])
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(ValueError, match=r"neither a state.json .* nor parquet files"):
        dataset_lengths(empty, ["ids"])


def test_a_saved_dataset_dict_asks_for_one_split(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    splits = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"ids": [[1]]})})
    splits.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match=r"DatasetDict with splits \['train'\].*Pass that split"):
        dataset_lengths(tmp_path / "dd", ["ids"])
    with pytest.raises(ValueError, match=r"name one split's folder, e.g. .*dd/train"):
        open_arrow_table(tmp_path / "dd")


def test_an_arrow_file_opens_as_a_table_in_file_or_stream_format(tmp_path: Path) -> None:
    table = pa.table({"n": [3, 1, 2]})
    with pa.ipc.new_file(str(tmp_path / "f.arrow"), table.schema) as writer:
        writer.write_table(table)
    with pa.ipc.new_stream(str(tmp_path / "s.arrow"), table.schema) as writer:
        writer.write_table(table)
    for name in ("f.arrow", "s.arrow"):
        assert open_arrow_table(tmp_path / name).column("n").to_pylist() == [3, 1, 2]
    with pytest.raises(FileNotFoundError, match="No dataset at"):
        open_arrow_table(tmp_path / "missing.arrow")
