"""The data-source switch of the multi-process scripts: ``--source list|hf|hf:DIR``.

``list`` (the default) keeps a script's Python items. ``hf`` builds a Hugging Face
``datasets.Dataset`` with ``Dataset.from_dict`` from the same items (same rows, same order, so
the same single-process references apply) and hands the library column names as lengths.
``hf:DIR`` loads the split saved under ``DIR/<split>`` with ``datasets.load_from_disk`` (a
memory-mapped Arrow file, the way a prepared dataset is read in training) and checks that it
holds exactly the script's items. :func:`save_dataset` writes such a split (the test does it
once, before launching the ranks). This module imports nothing from its siblings, so the
scripts (``from hf_source import ...``) and the tests (``tests.scripts.hf_source``) share it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning_varbatch import PaddingCollate

SOURCES = ("list", "hf")


def is_stream(source: str) -> bool:
    """``stream:DIR``: the items as parquet shards in DIR, streamed by ``StreamingDataModule``."""
    return source.startswith("stream:")


def save_shards(columns: dict[str, list[Any]], directory: Path, shards: int = 3) -> None:
    """Write ``columns`` as ``shards`` parquet files in ``directory`` (rows in order)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    rows = len(next(iter(columns.values())))
    bounds = [rows * k // shards for k in range(shards + 1)]
    for k in range(shards):
        part = {name: values[bounds[k] : bounds[k + 1]] for name, values in columns.items()}
        pq.write_table(pa.table(part), directory / f"part-{k}.parquet", row_group_size=8)


def pop_source(argv: list[str]) -> str:
    """Remove ``--source VALUE`` from ``argv`` (in place) and return VALUE (default ``list``)."""
    if "--source" not in argv:
        return "list"
    at = argv.index("--source")
    if at + 1 >= len(argv):
        raise SystemExit("--source needs a value: list, hf or hf:DIR")
    source = argv[at + 1]
    del argv[at : at + 2]
    if source not in SOURCES and not source.startswith(("hf:", "stream:")):
        raise SystemExit(f"--source must be list, hf, hf:DIR or stream:DIR, got {source!r}")
    return source


def is_hf(source: str) -> bool:
    return source != "list" and not is_stream(source)


def as_dataset(columns: dict[str, list[Any]], source: str, split: str = "train") -> Any:
    """The items ``columns`` as a ``datasets.Dataset``: built in memory or loaded from disk."""
    import datasets

    if source == "hf":
        return datasets.Dataset.from_dict(columns)
    assert source.startswith("hf:"), source
    ds = datasets.load_from_disk(str(Path(source[3:]) / split))
    assert ds.cache_files, "a dataset loaded from disk is memory-mapped from its Arrow files"
    assert ds.to_dict() == columns, f"{source}/{split} does not hold the script's items"
    return ds


def save_dataset(columns: dict[str, list[Any]], directory: Path, split: str = "train") -> None:
    """Save ``columns`` as the split ``directory/split`` that ``hf:directory`` loads."""
    import datasets

    datasets.Dataset.from_dict(columns).save_to_disk(str(directory / split))


class RecordingCollate(PaddingCollate):
    """The library's collate, plus what the list scripts' collates put on the batch.

    ``ids`` (the ``id`` column as a list), the plan's ``step`` and ``micro`` (from the
    micro-batch's plan counts) and ``collated_from``, the type of the items the collate
    received: ``ColumnarItems`` when the micro-batch was read as one Arrow table.
    """

    def __call__(self, items: Sequence[Any]) -> dict[str, Any]:
        batch = super().__call__(items)
        info = getattr(items, "info", None) or {}
        batch["ids"] = batch.pop("id").tolist()
        batch["step"] = info.get("step")
        batch["micro"] = info.get("micro")
        batch["collated_from"] = type(items).__name__
        return batch


def loader_evidence(loader: Any) -> dict[str, Any]:
    """What a TokenBudgetDataLoader reads: the dataset types, Arrow path, memory mapping."""
    wrapper = loader.dataset  # the loader's plan-carrying wrapper around the user's dataset
    inner = wrapper.dataset
    parts = list(getattr(inner, "datasets", [inner]))  # a mixture: a ConcatDataset of sources
    return {
        "dataset_type": type(inner).__name__,
        "part_types": [f"{type(p).__module__.split('.')[0]}.{type(p).__name__}" for p in parts],
        "columnar": bool(getattr(wrapper, "columnar", False)),
        "memory_mapped": [bool(getattr(p, "cache_files", None)) for p in parts],
    }
