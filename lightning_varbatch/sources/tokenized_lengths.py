"""Token counts of text columns, computed once with your tokenizer, in batches, and cached.

When a Hugging Face dataset holds text, not token ids, the plan still needs one length per
example. :func:`tokenized_lengths` tokenizes the named column(s) in batches through
``Dataset.map`` (``batched=True``, optionally ``num_proc`` processes, with its progress bar),
keeps only the counts, and saves them as a ``.npy`` file keyed by the dataset's fingerprint,
the columns and the tokenizer, so the next run with the same data and tokenizer reads them in
milliseconds. To keep them as a column instead:
``ds = ds.add_column("num_tokens", tokenized_lengths(ds, tok, "text"))``.

The tokenizer may be a Hugging Face ``tokenizers.Tokenizer`` (``encode_batch``), a
``transformers`` tokenizer (called on the batch, ``input_ids``), or any callable taking a list
of strings and returning one token sequence (or one count) per string. Counts include whatever
special tokens the tokenizer adds, which is what the collate will pad.

Example:
    >>> import datasets
    >>> ds = datasets.Dataset.from_dict({"text": ["a b c", "d e", "f"]})
    >>> def words(texts):  # any callable: a batch of strings -> one token list per string
    ...     return [t.split() for t in texts]
    >>> tokenized_lengths(ds, words, "text", cache_dir=None, progress=False).tolist()
    [3, 2, 1]
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.planner.settings import check_count, check_flag
from lightning_varbatch.sources.arrow_lengths import Columns, column_lengths

__all__ = ["default_cache_dir", "tokenized_lengths"]

_CACHE_VERSION = "1"


def default_cache_dir() -> Path:
    """``$LIGHTNING_VARBATCH_CACHE``, else ``$XDG_CACHE_HOME/lightning_varbatch/lengths``.

    Example:
        >>> default_cache_dir().name
        'lengths'
    """
    given = os.environ.get("LIGHTNING_VARBATCH_CACHE")
    if given:
        return Path(given) / "lengths"
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lightning_varbatch" / "lengths"


def _counter(tokenizer: Any) -> Callable[[list[str]], list[int]]:
    """A function from a batch of strings to their token counts."""
    encode_batch = getattr(tokenizer, "encode_batch", None)
    if callable(encode_batch) and type(tokenizer).__module__.startswith("tokenizers"):
        return lambda texts: [len(e.ids) for e in encode_batch(texts)]
    if not callable(tokenizer):
        raise TypeError(
            f"tokenizer must be a tokenizers.Tokenizer, a transformers tokenizer or a callable "
            f"list[str] -> token sequences, got {type(tokenizer).__name__}."
        )

    def count(texts: list[str]) -> list[int]:
        out = tokenizer(texts)
        if isinstance(out, Mapping):  # transformers BatchEncoding
            out = out["input_ids"]
        if not isinstance(out, Sequence) and not isinstance(out, np.ndarray):
            raise TypeError(
                f"the tokenizer returned {type(out).__name__} for a batch of {len(texts)} "
                "strings; it must return one token sequence (or one count) per string."
            )
        if len(out) != len(texts):
            raise ValueError(
                f"the tokenizer returned {len(out)} results for a batch of {len(texts)} "
                "strings; it must return one per string (is it tokenizing one string at a "
                "time? wrap it: lambda texts: [tok(t) for t in texts])."
            )
        return [int(x) if isinstance(x, (int, np.integer)) else len(x) for x in out]

    return count


def _cache_key(dataset: Any, names: list[str], tokenizer: Any) -> str | None:
    fingerprint = getattr(dataset, "_fingerprint", None)
    if not fingerprint:
        return None
    from datasets.fingerprint import Hasher

    return Hasher.hash([_CACHE_VERSION, fingerprint, names, tokenizer])


def tokenized_lengths(
    dataset: Any,
    tokenizer: Any,
    columns: Columns,
    *,
    batch_size: int = 1000,
    num_proc: int | None = None,
    cache_dir: str | os.PathLike[str] | bool | None = True,
    progress: bool = True,
) -> np.ndarray:
    """Token counts of text column(s) of a Hugging Face dataset, cached by fingerprint.

    Args:
        dataset: a ``datasets.Dataset``.
        tokenizer: a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or a callable
            ``list[str] -> list[token sequence | count]``.
        columns: a text column, or a (source, target) pair for ``(n, 2)`` lengths.
        batch_size: strings per tokenizer call.
        num_proc: worker processes for ``Dataset.map`` (``None``: this process; a Rust
            tokenizer already uses several threads).
        cache_dir: where the counts are cached (``True``: :func:`default_cache_dir`;
            ``None``/``False``: no cache). The key is the dataset's fingerprint, the columns
            and a hash of the tokenizer, so new data or another tokenizer recomputes.
        progress: show ``Dataset.map``'s progress bar.

    Returns:
        ``(n,)`` or ``(n, 2)`` lengths, checked with the planner's rules.

    Raises:
        TypeError: for a dataset that is not a ``datasets.Dataset``, a bad tokenizer, a
            column that is not text, or a non-integer ``batch_size``/``num_proc``.
        ValueError: for an unknown column, ``batch_size``/``num_proc`` below 1, or a text
            whose count is 0 (an empty string with a
            tokenizer that adds no special tokens); the row is named.

    Example:
        >>> import datasets
        >>> ds = datasets.Dataset.from_dict({"de": ["a b", "c"], "en": ["x", "y z w"]})
        >>> split = lambda texts: [t.split() for t in texts]
        >>> tokenized_lengths(ds, split, ("de", "en"), cache_dir=None, progress=False).tolist()
        [[2, 1], [1, 3]]
    """
    try:
        import datasets
    except ImportError as error:  # pragma: no cover - the hf extra is installed in CI
        raise ImportError(
            "tokenized_lengths needs the Hugging Face datasets package: "
            'pip install "lightning_varbatch[hf]".'
        ) from error
    batch_size = check_count("batch_size", batch_size, what=" (strings per tokenizer call)")
    num_proc = check_count(
        "num_proc", num_proc, allow_none=True, what=" (processes; None: this process)"
    )
    progress = check_flag("progress", progress)
    if not isinstance(dataset, datasets.Dataset):
        raise TypeError(
            f"tokenized_lengths needs a datasets.Dataset, got {type(dataset).__name__}; "
            "wrap a dict of columns with datasets.Dataset.from_dict."
        )
    names = [columns] if isinstance(columns, str) else list(columns)
    for column in names:
        if column not in dataset.column_names:
            raise ValueError(
                f"tokenized_lengths: the dataset has no column {column!r}; its columns are "
                f"{dataset.column_names}: pass one of them (a text column)."
            )
        feature = dataset.features[column]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise TypeError(
                f"tokenized_lengths: column {column!r} is {feature}, not text; for token ids or "
                "lengths use column_lengths(ds, column) (no tokenizer needed)."
            )
    count = _counter(tokenizer)
    folder = default_cache_dir() if cache_dir is True else (cache_dir or None)
    key = _cache_key(dataset, names, tokenizer) if folder else None
    path = Path(folder) / f"{key}.npy" if folder and key else None
    if path is not None and path.exists():
        cached = np.load(path)
        if cached.shape[0] == len(dataset):
            return cached

    def batch_counts(batch: Mapping[str, list[str]]) -> dict[str, list[int]]:
        return {c: count(list(batch[c])) for c in names}  # the counts replace the texts

    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    if not progress:
        datasets.utils.logging.disable_progress_bar()
    try:
        counted = dataset.select_columns(names).map(
            batch_counts,
            batched=True,
            batch_size=batch_size,
            num_proc=num_proc,
            remove_columns=names,
            desc="Counting tokens",
            keep_in_memory=True,
            load_from_cache_file=False,
        )
    finally:
        if was_enabled and not progress:
            datasets.utils.logging.enable_progress_bar()
    spec: Columns = names[0] if len(names) == 1 else (names[0], names[1])
    try:
        lengths = column_lengths(counted, spec, "tokenized_lengths")
    except ValueError as error:
        raise ValueError(
            f"{error} (a text with no tokens: filter empty texts out, or use a tokenizer that "
            "adds BOS/EOS)"
        ) from None
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
        np.save(tmp, lengths)
        tmp.replace(path)
    return lengths
