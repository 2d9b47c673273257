"""Where the lengths come from: Arrow columns and tokenizers (numpy and pyarrow, no torch).

:mod:`~lightning_varbatch.sources.arrow_lengths` reads one length per row from a Hugging
Face dataset's (or a pyarrow table's) length or token-id columns, vectorised;
:mod:`~lightning_varbatch.sources.tokenized_lengths` counts the tokens of text columns with
your tokenizer once and caches them; :mod:`~lightning_varbatch.sources.saved_arrow` opens a
dataset saved to disk or parquet files as an Arrow table without the ``datasets`` package (for
the plan report). ``pyarrow`` and ``datasets`` are optional (``pip install
"lightning_varbatch[hf]"``) and imported only when used.

Example:
    >>> import pyarrow as pa
    >>> from lightning_varbatch.sources import column_lengths
    >>> column_lengths(pa.table({"input_ids": [[1, 2, 3], [4]]}), "input_ids").tolist()
    [3, 1]
"""

from lightning_varbatch.sources.arrow_lengths import Columns, column_lengths
from lightning_varbatch.sources.tokenized_lengths import LengthCacheWarning, tokenized_lengths

__all__ = ["Columns", "LengthCacheWarning", "column_lengths", "tokenized_lengths"]
