"""Token counts of text columns, computed once with your tokenizer, in batches, and cached.

For a Hugging Face dataset of text, :func:`tokenized_lengths` tokenizes the named column(s) in
batches through ``Dataset.map`` (``batched=True``, optionally ``num_proc`` processes, with its
progress bar), keeps only the counts and caches them as ``.npy``, keyed by the dataset's
fingerprint, the columns and the tokenizer: the next such run reads them in milliseconds. As a
column: ``ds = ds.add_column("num_tokens", tokenized_lengths(ds, tok, "text"))``.

Counts include the tokenizer's special tokens, as the collate pads them (:mod:`~.token_counts`).
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.sources.arrow_lengths import Columns, column_lengths
from lightning_varbatch.sources.token_counts import token_counter

__all__ = ["LengthCacheWarning", "cache_folder", "default_cache_dir", "tokenized_lengths"]

_CACHE_VERSION = "1"


class LengthCacheWarning(UserWarning):
    """A lengths cache could not be written (the run goes on uncached) or was damaged (rebuilt).

    Example:
        >>> issubclass(LengthCacheWarning, UserWarning)
        True
    """


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


def warn_unwritable(path: Path, error: OSError, what: str = "the lengths") -> None:
    """Warn that a cache file could not be written: the run goes on without caching it.

    Example:
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_unwritable(Path("/ro/x.npy"), PermissionError(13, "Permission denied"))
        >>> "cache_dir" in str(caught[0].message)
        True
    """
    warnings.warn(
        f"could not write the cache of {what} to {str(path)!r} ({type(error).__name__}: "
        f"{error.strerror or error}); they are not cached and will be computed again next "
        "run. Pass cache_dir= a writable folder (or set $LIGHTNING_VARBATCH_CACHE), or "
        "cache_dir=None to turn the cache off and silence this.",
        LengthCacheWarning,
        stacklevel=3,
    )


def warn_damaged(path: Path, problem: str, what: str = "lengths") -> None:
    """Warn that a cache file was unreadable or inconsistent and is rebuilt.

    Example:
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter("always")
        ...     warn_damaged(Path("/c/x.npy"), "truncated")
        >>> "rebuilding" in str(caught[0].message)
        True
    """
    warnings.warn(
        f"the cached {what} {str(path)!r} is damaged ({problem}); rebuilding it from the "
        "data (delete the file, or pass another cache_dir, if this repeats).",
        LengthCacheWarning,
        stacklevel=3,
    )


def _cache_key(dataset: Any, names: list[str], tokenizer: Any) -> str | None:
    fingerprint = getattr(dataset, "_fingerprint", None)
    if not fingerprint:
        return None
    from datasets.fingerprint import Hasher

    return Hasher.hash([_CACHE_VERSION, fingerprint, names, tokenizer])


def cache_folder(cache_dir: object, sub: str = "") -> Path | None:
    """The folder of a ``cache_dir`` setting (``True``: :func:`default_cache_dir` / ``sub``).

    Example:
        >>> cache_folder(True, "shards").name, cache_folder(None), cache_folder("/tmp/x")
        ('shards', None, PosixPath('/tmp/x'))
    """
    if cache_dir is True:
        return default_cache_dir() / sub
    if cache_dir is None or cache_dir is False:
        return None
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise SettingTypeError(
            f"cache_dir must be a folder (str or Path), True (the default folder) or None "
            f"(no cache), got {cache_dir!r} ({type(cache_dir).__name__}).",
            setting="cache_dir",
            value=cache_dir,
        )
    return Path(cache_dir)


def _read_cache(path: Path, rows: int, pairs: bool) -> np.ndarray | None:
    """The cached lengths at ``path``, or ``None`` (missing; damaged: warned and rebuilt)."""
    if not path.exists():
        return None
    try:
        cached = np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError) as error:
        warn_damaged(path, f"unreadable: {error}")
        return None
    shape = (rows, 2) if pairs else (rows,)
    if cached.shape != shape or cached.dtype.kind not in "iu" or (cached.size and cached.min() < 1):
        warn_damaged(path, f"it holds {cached.dtype} of shape {cached.shape}, expected {shape}")
        return None
    return cached


def _write_cache(path: Path, lengths: np.ndarray) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npy")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp, lengths)
        tmp.replace(path)
    except OSError as error:
        warn_unwritable(path, error, "the token counts")
        with contextlib.suppress(OSError):
            tmp.unlink(missing_ok=True)


def _check_text_columns(dataset: Any, names: list[str], columns: Columns) -> None:
    """Each of ``names`` is a text column of ``dataset`` (else the error says what to pass)."""
    for column in names:
        if column not in dataset.column_names:
            raise SettingValueError(
                f"tokenized_lengths: columns names {column!r}, but the dataset has no such "
                f"column; its columns are {dataset.column_names}: pass one of them (a text "
                "column).",
                setting="columns",
                value=columns,
            )
        feature = dataset.features[column]
        if getattr(feature, "dtype", None) not in ("string", "large_string"):
            raise TypeError(
                f"tokenized_lengths: column {column!r} is {feature}, not text; for token ids or "
                "lengths use column_lengths(ds, column) (no tokenizer needed)."
            )


def _count_with_map(
    dataset: Any,
    names: list[str],
    count: Callable[[list[Any], str, Sequence[int]], list[int]],
    batch_size: int,
    num_proc: int | None,
    progress: bool,
) -> Any:
    """``dataset`` with each of ``names`` replaced by its token counts (``Dataset.map``)."""
    import datasets

    def batch_counts(batch: Mapping[str, list[Any]], rows: list[int]) -> dict[str, list[int]]:
        out = {}
        for c in names:
            texts = list(batch[c])
            if None in texts:
                row = rows[texts.index(None)]
                nulls = sum(t is None for t in texts)
                raise ValueError(
                    f"tokenized_lengths: row {row} of column {c!r} is null (None), not text "
                    f"({nulls} null(s) in rows {rows[0]}..{rows[-1]}); every example needs a "
                    f"text to count: filter them out first (ds.filter(lambda r: r[{c!r}] is "
                    "not None)) or fill them."
                )
            out[c] = count(texts, c, rows)  # the counts replace the texts
        return out

    was_enabled = datasets.utils.logging.is_progress_bar_enabled()
    if not progress:
        datasets.utils.logging.disable_progress_bar()
    try:
        return dataset.select_columns(names).map(
            batch_counts,
            batched=True,
            with_indices=True,
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
        tokenizer: a ``tokenizers.Tokenizer``, a ``transformers`` tokenizer, or a callable from a
            list of strings to one result each (read by :func:`~.token_counts.token_counter`).
        columns: a text column, or a (source, target) pair for ``(n, 2)`` lengths.
        batch_size: strings per tokenizer call.
        num_proc: ``Dataset.map`` workers (``None``: this process; Rust tokenizers have threads).
        cache_dir: the cache (``True``: :func:`default_cache_dir`; ``None``/``False``: none);
            an unwritable or damaged cache gives a :class:`LengthCacheWarning`.
        progress: show ``Dataset.map``'s progress bar.

    Returns:
        ``(n,)`` or ``(n, 2)`` lengths, checked with the planner's rules.

    Raises:
        SettingTypeError: for a tokenizer that is not callable, a ``cache_dir`` of another
            type, or a non-integer ``batch_size``/``num_proc``.
        SettingValueError: for an unknown column or ``batch_size``/``num_proc`` below 1.
        TypeError: a non-``datasets.Dataset``, a non-text column, a bad tokenizer result (named).
        ValueError: a null text, a ``None`` result, a wrong result count, a count of 0 (row named).

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
    _check_text_columns(dataset, names, columns)
    count = token_counter(tokenizer)
    folder = cache_folder(cache_dir)
    key = _cache_key(dataset, names, tokenizer) if folder else None
    path = Path(folder) / f"{key}.npy" if folder and key else None
    if path is not None:
        cached = _read_cache(path, len(dataset), len(names) == 2)
        if cached is not None:
            return cached
    counted = _count_with_map(dataset, names, count, batch_size, num_proc, progress)
    spec: Columns = names[0] if len(names) == 1 else (names[0], names[1])
    try:
        lengths = column_lengths(counted, spec, "tokenized_lengths")
    except ValueError as error:
        raise ValueError(
            f"{error} (a text with no tokens: filter empty texts out, or use a tokenizer that "
            "adds BOS/EOS)"
        ) from None
    if path is not None:
        _write_cache(path, lengths)
    return lengths
