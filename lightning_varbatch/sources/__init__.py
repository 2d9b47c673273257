"""Where the lengths come from: Arrow columns, tokenizers and shards (numpy and pyarrow, no torch).

:mod:`~.arrow_lengths` reads one length per row from a Hugging Face dataset's (or a pyarrow table's)
length or token-id columns, vectorised; :mod:`~.tokenized_lengths` counts the tokens of text columns
with your tokenizer once and caches them; :mod:`~.shards` holds the :class:`Shard` protocol and
:class:`ShardedSource` for streaming (built by :func:`shards_from_files`,
:func:`shards_from_hf_iterable` or :func:`shards_from_litdata`); others: ``docs/architecture.md``.
Optional, imported when used: ``pyarrow``, ``datasets``, ``litdata`` (extra ``[hf]``).

Example:
    >>> import pyarrow as pa
    >>> from lightning_varbatch.sources import column_lengths
    >>> column_lengths(pa.table({"input_ids": [[1, 2, 3], [4]]}), "input_ids").tolist()
    [3, 1]
"""

from lightning_varbatch.sources.arrow_lengths import Columns, column_lengths
from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable
from lightning_varbatch.sources.litdata_shards import shards_from_litdata
from lightning_varbatch.sources.shard_base import CachedShard, FileBackedShard
from lightning_varbatch.sources.shards import (
    SHARD_SUFFIXES,
    ReadStats,
    Shard,
    ShardedSource,
    shards_from_files,
)
from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning, tokenized_lengths

__all__ = [
    "SHARD_SUFFIXES",
    "CachedShard",
    "Columns",
    "FileBackedShard",
    "LengthCacheWarning",
    "ReadStats",
    "Shard",
    "ShardedSource",
    "column_lengths",
    "shards_from_files",
    "shards_from_hf_iterable",
    "shards_from_litdata",
    "tokenized_lengths",
]
