"""A dataset on disk as one Arrow table, memory-mapped, without the ``datasets`` package.

Reads what ``datasets.Dataset.save_to_disk`` writes (a folder with ``state.json`` and Arrow stream
files), single ``.arrow`` files, and parquet files or folders of them. Used by the plan report
(``python -m lightning_varbatch.plan --dataset PATH --column NAME``), which must not import torch.

Example:
    >>> import pyarrow as pa, pyarrow.parquet as pq, tempfile, os
    >>> folder = tempfile.mkdtemp()
    >>> pq.write_table(pa.table({"n": [3, 4]}), os.path.join(folder, "part-0.parquet"))
    >>> open_arrow_table(folder).column("n").to_pylist()
    [3, 4]
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["open_arrow_table"]


def _stream_table(path: Path) -> Any:
    import pyarrow as pa

    source = pa.memory_map(str(path))
    try:
        return pa.ipc.open_stream(source).read_all()
    except pa.ArrowInvalid:
        return pa.ipc.open_file(source).read_all()


def open_arrow_table(path: str | os.PathLike[str]) -> Any:
    """The rows stored at ``path`` as a ``pyarrow.Table`` (memory-mapped where possible).

    Args:
        path: a ``save_to_disk`` folder, ``.arrow``/``.parquet`` file, or folder of parquet files.

    Raises:
        FileNotFoundError: when nothing is at ``path``.
        ValueError: for a saved ``DatasetDict`` (splits listed) or a folder with no dataset/parquet.

    Example:
        >>> open_arrow_table("/no/such/dir")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        FileNotFoundError: No dataset at /no/such/dir: ...
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    where = Path(path)
    if not where.exists():
        raise FileNotFoundError(
            f"No dataset at {where}: pass a folder written by Dataset.save_to_disk, an .arrow "
            "file, a .parquet file or a folder of parquet files."
        )
    if where.is_file():
        if where.suffix == ".parquet":
            return pq.read_table(where, memory_map=True)
        return _stream_table(where)
    if (where / "dataset_dict.json").exists():
        splits = json.loads((where / "dataset_dict.json").read_text()).get("splits", [])
        raise ValueError(
            f"{where} holds a DatasetDict with splits {splits}: name one split's folder, e.g. "
            f"{where / (splits[0] if splits else 'train')}."
        )
    state = where / "state.json"
    if state.exists():
        files = [where / f["filename"] for f in json.loads(state.read_text())["_data_files"]]
        tables = [_stream_table(f) for f in files]
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)
    parquet = sorted(where.glob("*.parquet"))
    if parquet:
        return pa.concat_tables([pq.read_table(f, memory_map=True) for f in parquet])
    raise ValueError(
        f"{where} has neither a state.json (Dataset.save_to_disk) nor parquet files; pass "
        "the folder the dataset was saved to, or its files."
    )
