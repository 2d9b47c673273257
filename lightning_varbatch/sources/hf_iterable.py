"""Shards of a Hugging Face streaming dataset (``datasets.IterableDataset``).

Each of the dataset's ``num_shards`` data sources becomes a shard. Without random access, the
lengths take one pass over each shard's ``columns`` (cached on disk when its files are known and the
dataset is not transformed), and ``read(rows)`` iterates the shard from its start: a resume in the
middle of a shard decodes its earlier rows again. ``datasets`` is imported only when used.

Example:
    >>> import tempfile, datasets, pyarrow as pa, pyarrow.parquet as pq
    >>> path = tempfile.mkdtemp() + "/a.parquet"
    >>> pq.write_table(pa.table({"ids": [[1, 2], [3], [4, 5, 6]]}), path)
    >>> ds = datasets.load_dataset("parquet", data_files=path, split="train", streaming=True)
    >>> source = shards_from_hf_iterable(ds, "ids", cache_dir=None)
    >>> source.lengths().tolist(), [it["ids"].tolist() for it in source.read(0, [1, 2])]
    ([2, 1, 3], [[3], [4, 5, 6]])
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.sources.arrow_lengths import Columns
from lightning_varbatch.sources.shard_base import CachedShard
from lightning_varbatch.sources.shard_index import CacheDir, column_names, text_key
from lightning_varbatch.sources.shard_items import lengths_array, numpy_fields, row_lengths
from lightning_varbatch.sources.shards import ShardedSource

__all__ = ["HFIterableShard", "shards_from_hf_iterable"]


def _files_and_transforms(ds: Any) -> tuple[list[str] | None, list[str]]:
    """The data files behind ``ds`` (``None``: unknown) and its transform steps' class names."""
    transforms = []
    ex = getattr(ds, "_ex_iterable", None)
    while ex is not None and hasattr(ex, "ex_iterable"):
        transforms.append(type(ex).__name__)
        ex = ex.ex_iterable
    kwargs = getattr(ex, "kwargs", None) or {}
    for key in ("files", "original_files", "base_files"):
        files = kwargs.get(key)
        if isinstance(files, list) and files and all(isinstance(f, str) for f in files):
            return files, transforms
    return None, transforms


class HFIterableShard(CachedShard):
    """One shard of a ``datasets.IterableDataset``, iterated from its start on each read.

    Args:
        dataset: the shard (a ``datasets.IterableDataset``, e.g. ``ds.shard(n, i)``).
        columns: a length field, a token-id field, or a (source, target) pair of them.
        name: the shard's stable id.
        cache_key: the on-disk cache key (``None``: lengths are not cached on disk).
        cache_dir: where the lengths are cached (``True``: the default folder).

    Example:
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"n": [3, 1]}).to_iterable_dataset()
        >>> shard = HFIterableShard(ds, "n", name="demo")
        >>> shard.num_rows, list(shard.read([1])), shard.stats.backward_seeks
        (2, [{'n': 1}], 0)
    """

    def __init__(
        self,
        dataset: Any,
        columns: Columns,
        *,
        name: str,
        cache_key: str | None = None,
        cache_dir: CacheDir = True,
    ) -> None:
        super().__init__(columns, cache_dir=cache_dir if cache_key else None)
        self.dataset = dataset
        self._name = name
        self._key = cache_key

    @property
    def name(self) -> str:
        """The shard's stable id (its data files, or a hash of the dataset's info and index)."""
        return self._name

    @property
    def content_name(self) -> str:
        """The shard's name without folders (its files' names): part of its content identity."""
        return ",".join(part.rsplit("/", 1)[-1] for part in self._name.split(","))

    def _cache_key(self) -> str:
        return self._key or ""

    def _build_index(self) -> dict[str, np.ndarray]:
        """One pass over the shard's ``columns``."""
        where = self._where()
        features = getattr(self.dataset, "features", None)
        missing = [c for c in self.columns if features is not None and c not in features]
        if missing:
            raise SettingValueError(
                f"{where}: the dataset has no column {missing[0]!r}; its columns are "
                f"{list(features or [])}: change columns to name one of them.",
                setting="columns",
                value=list(self.columns),
            )
        data = (
            self.dataset.select_columns(list(self.columns))
            if features is not None
            else (self.dataset)
        )
        self.stats.opens += 1
        per_row: list[tuple[int, ...]] = []
        batches = data.iter(batch_size=1000)
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except (OSError, ValueError, RuntimeError) as error:  # a damaged file
                raise ValueError(
                    f"{where}: reading the shard failed after {len(per_row)} rows "
                    f"({type(error).__name__}: {error}); a file of it is damaged or not in "
                    "its format: re-write or re-copy it, or leave it out of data_files."
                ) from None
            items = [
                dict(zip(batch, row, strict=True)) for row in zip(*batch.values(), strict=True)
            ]
            self.stats.rows_decoded += len(items)
            per_row.extend(row_lengths(items, self.columns, where))
        return {"lengths": lengths_array(per_row, self.columns, where)}

    def _read(self, rows: np.ndarray) -> Iterator[dict[str, Any]]:
        """The items of ``rows``, iterating the shard from its start."""
        if not rows.size:
            return
        self.stats.opens += 1
        wanted = iter(rows.tolist())
        target = next(wanted)
        i = 0
        # .iter(), not iter(): in a DataLoader worker, IterableDataset.__iter__ splits the shard's
        # files between workers (datasets' _iter_pytorch); ours already split the micro-batches.
        for batch in self.dataset.iter(batch_size=_READ_BATCH):
            names = list(batch)
            for values in zip(*batch.values(), strict=True):
                self.stats.rows_decoded += 1
                if i == target:
                    self.stats.rows_read += 1
                    yield numpy_fields(dict(zip(names, values, strict=True)))
                    target = next(wanted, -1)
                    if target < 0:
                        return
                i += 1

    def __repr__(self) -> str:
        return f"HFIterableShard({self.name!r})"


#: Rows per batch when a shard is read (the dataset is iterated in batches of this size).
_READ_BATCH = 256


def shards_from_hf_iterable(
    ds: Any, columns: Columns, *, cache_dir: CacheDir = True
) -> ShardedSource:
    """A :class:`~lightning_varbatch.sources.shards.ShardedSource` over a streaming HF dataset.

    Args:
        ds: a streaming ``datasets.IterableDataset``; one shard per data source (``ds.num_shards``).
        columns: a length field, a token-id field, or a (source, target) pair of them.
        cache_dir: lengths' cache (``True``: default; ``None``: none); untransformed files only.

    Raises:
        TypeError: for a map-style ``datasets.Dataset`` (use column lengths) or other types.

    Example:
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"n": [1]})
        >>> shards_from_hf_iterable(ds, "n")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: ds is a map-style datasets.Dataset: ... plan it with column_lengths(ds, ...
    """
    import datasets

    names = column_names(columns)
    if isinstance(ds, datasets.Dataset):
        raise TypeError(
            "ds is a map-style datasets.Dataset: it has random access, so plan it with "
            "column_lengths(ds, columns) (or TokenBudgetDataModule with the column names), "
            "not as a stream; or pass ds.to_iterable_dataset() to stream it."
        )
    if not isinstance(ds, datasets.IterableDataset):
        raise TypeError(
            f"ds must be a datasets.IterableDataset (load_dataset(..., streaming=True)), got "
            f"{type(ds).__name__}; for a dict of splits pass one split, e.g. ds['train']."
        )
    count = int(ds.num_shards)
    info = repr(getattr(ds, "info", None))
    shards = []
    for index in range(count):
        part = ds.shard(num_shards=count, index=index)
        files, transforms = _files_and_transforms(part)
        key = None
        if files is not None:
            name = ",".join(os.path.abspath(f) for f in files)
            if transforms:
                name += "|" + ">".join(transforms)
            else:
                try:
                    stats = [(os.path.getsize(f), os.stat(f).st_mtime_ns) for f in files]
                except OSError:  # remote files: no cache
                    stats = None
                if stats is not None:
                    key = text_key(["hf-iterable", name, stats, list(names)])
        else:
            name = f"hf:{text_key([info, getattr(ds, 'config_name', None)])[:16]}:{index}/{count}"
        shards.append(HFIterableShard(part, columns, name=name, cache_key=key, cache_dir=cache_dir))
    return ShardedSource(shards, columns)
