"""Lengths from files, for the plan report: ``--lengths`` (``.npy``) and ``--dataset``.

``python -m lightning_varbatch.plan`` reads its lengths here; errors name the flag, path and fix.

Example:
    >>> import tempfile
    >>> path = Path(tempfile.mkdtemp()) / "lengths.npy"
    >>> np.save(path, np.array([3, 5, 2]))
    >>> npy_lengths(path).tolist()
    [3, 5, 2]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from lightning_varbatch.planner.lengths import as_int_lengths
from lightning_varbatch.sources.arrow_lengths import column_lengths
from lightning_varbatch.sources.saved_arrow import open_arrow_table

__all__ = ["dataset_lengths", "npy_lengths"]


def dataset_lengths(path: Path, columns: list[str]) -> np.ndarray:
    """The lengths of ``columns`` of the dataset at ``path`` (``--dataset``, ``--column``).

    Raises:
        ValueError: an unreadable dataset (missing, a ``DatasetDict``, not Arrow/parquet) or column.
        TypeError: for a column of text, floats or another type that holds no lengths.
    """
    shown = f"--dataset {str(path)!r}"
    kinds = (
        "a folder written by Dataset.save_to_disk (one split), an .arrow file, a .parquet file "
        "or a folder of parquet files"
    )
    if not path.exists():
        raise ValueError(
            f"cannot read {shown}: no such file or folder (looked in "
            f"{str(path.resolve().parent)!r}); pass {kinds}."
        )
    try:
        table = open_arrow_table(path)
    except (OSError, ValueError, KeyError) as err:
        if type(err) is ValueError:  # the reader's own: a DatasetDict, a folder of neither
            split = (path / "dataset_dict.json").exists()
            hint = " Pass that split's folder to --dataset." if split else ""
            raise ValueError(f"cannot read {shown}: {err}{hint}") from None
        raise ValueError(
            f"cannot read {shown} as a dataset ({type(err).__name__}: {err}); pass {kinds}."
        ) from None
    for column in columns:
        if column not in table.column_names:
            raise ValueError(
                f"--column {column!r}: {shown} has no such column; its columns are "
                f"{table.column_names}: pass --column with a column of lengths or of token ids."
            )
    return column_lengths(table, columns, shown)


def npy_lengths(path: Path) -> np.ndarray:
    """The lengths in the ``.npy`` file at ``path`` (``--lengths``), checked.

    Raises:
        ValueError: a missing file, a directory, an unreadable file, ``.npz``, or refused lengths.
    """
    shown = f"--lengths {str(path)!r}"
    if not path.exists():
        raise ValueError(
            f"cannot read {shown}: no such file (looked in "
            f"{str(path.resolve().parent)!r}); pass the path of a .npy file written with "
            "np.save(path, lengths)."
        )
    if path.is_dir():
        raise ValueError(
            f"cannot read {shown}: it is a directory; pass the path of one .npy file written with "
            "np.save(path, lengths)."
        )
    try:
        lengths = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as err:
        raise ValueError(
            f"cannot read {shown} as a .npy array ({type(err).__name__}: {err}); write the "
            "lengths with np.save(path, np.asarray(lengths)) (numbers, not pickled objects)."
        ) from None
    if not isinstance(lengths, np.ndarray):
        lengths.close()
        raise ValueError(
            f"cannot read {shown}: it is an .npz archive of several arrays; save the one "
            "lengths array with np.save(path, lengths)."
        )
    try:
        as_int_lengths(lengths, "lengths")
    except (ValueError, TypeError) as err:
        raise ValueError(f"{shown}: {err}") from None
    return lengths
