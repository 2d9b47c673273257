"""Parallel English→German data for the translation example.

The default corpus is *embedded*: it is generated on the fly from real English and
German renderings of numbers, years, dates, times and money amounts (``num2words``
and ``babel``), either as bare expressions or inside small templated sentences and
short multi-sentence paragraphs. Nothing is downloaded.

The mixture is chosen so that source lengths are long-tailed (a paragraph has
``1 + Geometric`` sentences): with the defaults the 99th percentile of the source
length is well above four times the median, measured in whitespace tokens of the
English side (see :func:`corpus_stats`). That is exactly the regime where
token-budgeted batches pay off.

Other loaders read real corpora: :func:`load_parallel_text` (fairseq-style
``train.src`` / ``train.tgt``), :func:`load_tsv` (``source<TAB>target`` per line) and
:func:`load_hf_dataset` (a local Hugging Face dataset or parquet files, kept as a memory-mapped
``datasets.Dataset``; optional, needs ``datasets``).
"""

from __future__ import annotations

import datetime as _dt
import functools
import glob
import hashlib
import json
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from babel.dates import format_date, format_time, get_day_names, get_month_names
from num2words import num2words

__all__ = [
    "CORPUS_VERSION",
    "DOMAINS",
    "DatasetSettingError",
    "Pair",
    "build_corpus",
    "corpus_stats",
    "load_hf_dataset",
    "load_parallel_text",
    "load_tsv",
    "split_corpus",
    "split_indices",
]

Pair = tuple[str, str]

#: Bumped whenever the generator changes, so on-disk caches are invalidated.
CORPUS_VERSION = 1


# ---------------------------------------------------------------------------
# cached renderers (num2words / babel are slow; the value space is kept small)
# ---------------------------------------------------------------------------


def _normalize_space(s: str) -> str:
    # CLDR uses narrow/no-break spaces ("5:15\u202fPM"); plain spaces keep it simple.
    return s.replace("\u202f", " ").replace("\xa0", " ")


@functools.cache
def _card(n: int, lang: str) -> str:
    return str(num2words(n, lang=lang))


@functools.cache
def _ordinal(n: int, lang: str) -> str:
    return str(num2words(n, lang=lang, to="ordinal"))


@functools.cache
def _year_words(y: int, lang: str) -> str:
    return str(num2words(y, lang=lang, to="year"))


@functools.cache
def _date(d: _dt.date, fmt: str, lang: str) -> str:
    return _normalize_space(str(format_date(d, fmt, locale=lang)))


@functools.cache
def _time(h: int, m: int, lang: str) -> str:
    return _normalize_space(str(format_time(_dt.time(h, m), "short", locale=lang)))


@functools.cache
def _month(m: int, lang: str) -> str:
    return str(get_month_names("wide", locale=lang)[m])


@functools.cache
def _weekday(wd: int, lang: str) -> str:
    return str(get_day_names("wide", locale=lang)[wd])


# A fixed pool of large numbers (independent of the seed) keeps num2words calls bounded.
_LARGE_NUMBERS: tuple[int, ...] = tuple(
    int(x) for x in np.random.default_rng(20240501).integers(1_000, 2_000_000, size=600)
)

_DATE_START = _dt.date(1900, 1, 1)
_DATE_SPAN_DAYS = (_dt.date(2039, 12, 31) - _DATE_START).days


# ---------------------------------------------------------------------------
# lexicon
# ---------------------------------------------------------------------------

# (english, german, german_is_plural)
_SUBJECTS: tuple[tuple[str, str, bool], ...] = (
    ("she", "sie", False),
    ("he", "er", False),
    ("we", "wir", True),
    ("they", "sie", True),
    ("my brother", "mein Bruder", False),
    ("my sister", "meine Schwester", False),
    ("our neighbours", "unsere Nachbarn", True),
    ("the teacher", "die Lehrerin", False),
    ("the company", "die Firma", False),
    ("the children", "die Kinder", True),
    ("the old man", "der alte Mann", False),
    ("my parents", "meine Eltern", True),
    ("the baker", "der Bäcker", False),
    ("the students", "die Studenten", True),
    ("the doctor", "die Ärztin", False),
)

# (english singular, english plural, german singular, german plural)
_NOUNS: tuple[tuple[str, str, str, str], ...] = (
    ("book", "books", "Buch", "Bücher"),
    ("apple", "apples", "Apfel", "Äpfel"),
    ("ticket", "tickets", "Fahrkarte", "Fahrkarten"),
    ("chair", "chairs", "Stuhl", "Stühle"),
    ("bottle", "bottles", "Flasche", "Flaschen"),
    ("house", "houses", "Haus", "Häuser"),
    ("tree", "trees", "Baum", "Bäume"),
    ("letter", "letters", "Brief", "Briefe"),
    ("bird", "birds", "Vogel", "Vögel"),
    ("glass", "glasses", "Glas", "Gläser"),
    ("car", "cars", "Auto", "Autos"),
    ("flower", "flowers", "Blume", "Blumen"),
    ("hat", "hats", "Hut", "Hüte"),
    ("chicken", "chickens", "Huhn", "Hühner"),
    ("stamp", "stamps", "Briefmarke", "Briefmarken"),
)

# (english past, german past singular, german past plural, object kind)
_VERBS: tuple[tuple[str, str, str, str], ...] = (
    ("paid", "bezahlte", "bezahlten", "money"),
    ("received", "erhielt", "erhielten", "money"),
    ("won", "gewann", "gewannen", "money"),
    ("spent", "gab", "gaben", "money_aus"),
    ("bought", "kaufte", "kauften", "count"),
    ("sold", "verkaufte", "verkauften", "count"),
    ("saw", "sah", "sahen", "count"),
    ("counted", "zählte", "zählten", "count"),
    ("found", "fand", "fanden", "count"),
    ("ordered", "bestellte", "bestellten", "count"),
)

# (english singular, english plural, german) — German currency names are invariant.
_CURRENCIES: tuple[tuple[str, str, str], ...] = (
    ("euro", "euros", "Euro"),
    ("dollar", "dollars", "Dollar"),
    ("pound", "pounds", "Pfund"),
    ("franc", "francs", "Franken"),
)

_SUBUNIT = {"euro": "cent", "dollar": "cent", "pound": "penny", "franc": "centime"}
_SUBUNIT_PL = {"cent": "cents", "penny": "pence", "centime": "centimes"}
_SUBUNIT_DE = {"euro": "Cent", "dollar": "Cent", "pound": "Pence", "franc": "Rappen"}


def _cap(s: str) -> str:
    return s[:1].upper() + s[1:]


# ---------------------------------------------------------------------------
# expression generators: each returns (english, german)
# ---------------------------------------------------------------------------


def _number(rng: random.Random) -> int:
    r = rng.random()
    if r < 0.55:
        return rng.randint(2, 99)
    if r < 0.92:
        return rng.randint(100, 999)
    return rng.choice(_LARGE_NUMBERS)


def _rand_date(rng: random.Random) -> _dt.date:
    return _DATE_START + _dt.timedelta(days=rng.randint(0, _DATE_SPAN_DAYS))


def _money(rng: random.Random) -> Pair:
    cur_en, cur_en_pl, cur_de = rng.choice(_CURRENCIES)
    amount = _number(rng) if rng.random() < 0.8 else rng.randint(2, 20)
    en = f"{_card(amount, 'en')} {cur_en_pl}"
    de = f"{_card(amount, 'de')} {cur_de}"
    if rng.random() < 0.35:
        cents = rng.randint(2, 99)
        sub = _SUBUNIT[cur_en]
        en += f" and {_card(cents, 'en')} {_SUBUNIT_PL[sub]}"
        de += f" und {_card(cents, 'de')} {_SUBUNIT_DE[cur_en]}"
    return en, de


def _count_phrase(rng: random.Random) -> Pair:
    _, en_pl, _, de_pl = rng.choice(_NOUNS)
    n = _number(rng)
    return f"{_card(n, 'en')} {en_pl}", f"{_card(n, 'de')} {de_pl}"


def _date_adverbial(rng: random.Random) -> Pair:
    """A temporal adverbial: 'on the third of May 1999' / 'am dritten Mai 1999'."""
    d = _rand_date(rng)
    r = rng.random()
    if r < 0.3:  # spoken date
        en = f"on the {_ordinal(d.day, 'en')} of {_month(d.month, 'en')} {d.year}"
        de = f"am {_ordinal(d.day, 'de')}n {_month(d.month, 'de')} {d.year}"
    elif r < 0.5:
        en, de = f"on {_date(d, 'long', 'en')}", f"am {_date(d, 'long', 'de')}"
    elif r < 0.65:
        en, de = f"on {_date(d, 'full', 'en')}", f"am {_date(d, 'full', 'de')}"
    elif r < 0.8:
        en, de = f"in {d.year}", f"im Jahr {d.year}"
    elif r < 0.9:
        en = f"in {_year_words(d.year, 'en')}"
        de = f"im Jahr {_year_words(d.year, 'de')}"
    else:
        en = f"in {_month(d.month, 'en')} {d.year}"
        de = f"im {_month(d.month, 'de')} {d.year}"
    if rng.random() < 0.25:
        h, m = rng.randint(0, 23), rng.choice((0, 5, 10, 15, 20, 30, 40, 45, 50, 55))
        t_en, t_de = f"at {_time(h, m, 'en')}", f"um {_time(h, m, 'de')} Uhr"
        if en.startswith("on "):
            en, de = f"{t_en} {en}", f"{de} {t_de}"
        else:
            en, de = t_en, t_de
    return en, de


def _sentence(rng: random.Random) -> Pair:
    subj_en, subj_de, plural = rng.choice(_SUBJECTS)
    verb_en, verb_de_sg, verb_de_pl, kind = rng.choice(_VERBS)
    verb_de = verb_de_pl if plural else verb_de_sg
    obj_en, obj_de = _money(rng) if kind.startswith("money") else _count_phrase(rng)
    particle = " aus" if kind == "money_aus" else ""
    r = rng.random()
    if r < 0.55:  # fronted adverbial → German verb-second inversion
        adv_en, adv_de = _date_adverbial(rng)
        en = f"{_cap(adv_en)} {subj_en} {verb_en} {obj_en}."
        de = f"{_cap(adv_de)} {verb_de} {subj_de} {obj_de}{particle}."
    elif r < 0.8:  # trailing adverbial
        adv_en, adv_de = _date_adverbial(rng)
        en = f"{_cap(subj_en)} {verb_en} {obj_en} {adv_en}."
        de = f"{_cap(subj_de)} {verb_de} {adv_de} {obj_de}{particle}."
    else:
        en = f"{_cap(subj_en)} {verb_en} {obj_en}."
        de = f"{_cap(subj_de)} {verb_de} {obj_de}{particle}."
    return en, de


def _bare_expression(rng: random.Random) -> Pair:
    r = rng.random()
    if r < 0.25:
        n = _number(rng)
        return _card(n, "en"), _card(n, "de")
    if r < 0.35:
        n = rng.randint(1, 120)
        return _ordinal(n, "en"), _ordinal(n, "de")
    if r < 0.5:
        y = rng.randint(1800, 2039)
        return _year_words(y, "en"), _year_words(y, "de")
    if r < 0.7:
        d = _rand_date(rng)
        fmt = rng.choice(("full", "long", "medium"))
        return _date(d, fmt, "en"), _date(d, fmt, "de")
    if r < 0.8:
        h, m = rng.randint(0, 23), rng.randint(0, 59)
        return _time(h, m, "en"), f"{_time(h, m, 'de')} Uhr"
    if r < 0.9:
        return _money(rng)
    d = _rand_date(rng)
    return (
        f"{_weekday(d.weekday(), 'en')}, the {_ordinal(d.day, 'en')} of {_month(d.month, 'en')}",
        f"{_weekday(d.weekday(), 'de')}, der {_ordinal(d.day, 'de')} {_month(d.month, 'de')}",
    )


def _paragraph(rng: random.Random) -> Pair:
    # 1 + Geometric(0.45) sentences, capped: the source of the long tail.
    k = 1
    while k < 14 and rng.random() < 0.55:
        k += 1
    parts = [_sentence(rng) for _ in range(k)]
    return " ".join(p[0] for p in parts), " ".join(p[1] for p in parts)


_Kinds = tuple[tuple[float, Callable[[random.Random], Pair]], ...]

# Cumulative probabilities of the generators of each domain. "sentences" keeps the 1 : 6 ratio
# of sentences to paragraphs of "mixed".
_DOMAINS: dict[str, _Kinds] = {
    "mixed": ((0.30, _bare_expression), (0.40, _sentence), (1.00, _paragraph)),
    "expressions": ((1.00, _bare_expression),),
    "sentences": ((1 / 7, _sentence), (1.00, _paragraph)),
}
#: The domains :func:`build_corpus` can generate.
DOMAINS: tuple[str, ...] = tuple(_DOMAINS)


def _generate(num_pairs: int, seed: int, domain: str = "mixed") -> list[Pair]:
    kinds = _DOMAINS[domain]
    rng = random.Random(seed)
    seen: set[Pair] = set()
    out: list[Pair] = []
    attempts, max_attempts = 0, 20 * num_pairs + 1000
    while len(out) < num_pairs:
        attempts += 1
        if attempts > max_attempts:
            raise RuntimeError(f"could not generate {num_pairs} unique pairs")
        r = rng.random()
        gen = next(g for threshold, g in kinds if r < threshold)
        pair = gen(rng)
        if pair not in seen:
            seen.add(pair)
            out.append(pair)
    return out


def build_corpus(
    num_pairs: int = 120_000,
    seed: int = 0,
    cache_dir: str | Path | None = None,
    domain: str = "mixed",
) -> list[Pair]:
    """Generate the embedded English→German corpus.

    Args:
        num_pairs: Number of (unique) pairs.
        seed: RNG seed; the same ``(num_pairs, seed, domain)`` always gives the same list.
        cache_dir: Optional directory; the corpus is stored there as JSON keyed by
            ``(CORPUS_VERSION, num_pairs, seed, domain)`` and reloaded on the next call.
        domain: ``"mixed"`` (bare expressions, sentences and paragraphs), ``"expressions"``
            (bare numbers, dates, times and money amounts: a few tokens each) or
            ``"sentences"`` (sentences and multi-sentence paragraphs: the long tail).

    Returns:
        A list of ``(english, german)`` pairs, no duplicates.

    Raises:
        ValueError: for a negative ``num_pairs`` or an unknown ``domain``.
    """
    if num_pairs < 0:
        raise ValueError(f"num_pairs must be >= 0, got {num_pairs}")
    if domain not in _DOMAINS:
        raise ValueError(f"Unknown domain {domain!r}; choose one of {', '.join(DOMAINS)}.")
    cache_file: Path | None = None
    if cache_dir is not None:
        suffix = "" if domain == "mixed" else f"-{domain}"
        name = f"corpus-v{CORPUS_VERSION}-n{num_pairs}-s{seed}{suffix}.json"
        cache_file = Path(cache_dir) / name
        if cache_file.exists():
            with cache_file.open(encoding="utf-8") as f:
                return [(s, t) for s, t in json.load(f)]
    pairs = _generate(num_pairs, seed, domain)
    if cache_file is not None:
        cache_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache_file.with_suffix(".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump(pairs, f, ensure_ascii=False)
        tmp.replace(cache_file)
    return pairs


def corpus_stats(pairs: list[Pair]) -> dict[str, float]:
    """Length statistics of the source side, in whitespace tokens and in characters."""
    tok = np.array([len(s.split()) for s, _ in pairs], dtype=np.int64)
    chars = np.array([len(s) for s, _ in pairs], dtype=np.int64)
    return {
        "num_pairs": float(len(pairs)),
        "src_tokens_median": float(np.median(tok)),
        "src_tokens_p99": float(np.percentile(tok, 99)),
        "src_tokens_max": float(tok.max()),
        "src_chars_median": float(np.median(chars)),
        "src_chars_p99": float(np.percentile(chars, 99)),
    }


def fingerprint(pairs: list[Pair]) -> str:
    """A short sha256 over the pairs (handy for cache keys and logs)."""
    h = hashlib.sha256()
    for s, t in pairs:
        h.update(s.encode())
        h.update(b"\t")
        h.update(t.encode())
        h.update(b"\n")
    return h.hexdigest()[:16]


def split_indices(n: int, valid: int, test: int, seed: int = 0) -> dict[str, list[int]]:
    """The row indices of a deterministic shuffled ``train``/``valid``/``test`` split of ``n``.

    The same ``(n, valid, test, seed)`` always gives the same split, whatever holds the rows
    (a list of pairs in :func:`split_corpus`, a ``datasets.Dataset`` through ``select``).

    Example:
        >>> {k: len(v) for k, v in split_indices(10, 2, 3).items()}
        {'train': 5, 'valid': 2, 'test': 3}
    """
    if valid < 0 or test < 0:
        raise ValueError("valid and test sizes must be >= 0")
    if valid + test > n:
        raise ValueError(f"valid ({valid}) + test ({test}) exceeds the corpus size ({n})")
    order = list(range(n))
    random.Random(seed).shuffle(order)
    return {
        "train": order[valid + test :],
        "valid": order[:valid],
        "test": order[valid : valid + test],
    }


def split_corpus(
    pairs: list[Pair], valid: int = 2000, test: int = 2000, seed: int = 0
) -> dict[str, list[Pair]]:
    """Shuffle deterministically and split into disjoint ``train``/``valid``/``test``."""
    rows = split_indices(len(pairs), valid, test, seed)
    return {split: [pairs[i] for i in rows[split]] for split in ("train", "valid", "test")}


def _read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file.

    Only ``\\n`` (or ``\\r\\n``) ends a line, as in fairseq: ``str.splitlines`` would also
    split at U+0085, U+2028, form feeds, ..., which occur inside sentences of crawled corpora
    and would misalign parallel files.

    Raises:
        ValueError: when the file is not UTF-8, naming the file and line.
    """
    raw = Path(path).read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        line = raw.count(b"\n", 0, error.start) + 1
        raise ValueError(f"{path}:{line}: not UTF-8 text ({error.reason}).") from None
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()  # the final line end (or an empty file)
    return [line.removesuffix("\r") for line in lines]


def load_parallel_text(src_path: str | Path, tgt_path: str | Path) -> list[Pair]:
    """Read fairseq-style parallel files (one sentence per line, aligned by line).

    Raises:
        ValueError: when the files differ in line count (naming the first unmatched line) or
            are not UTF-8.
    """
    src, tgt = _read_lines(src_path), _read_lines(tgt_path)
    if len(src) != len(tgt):
        longer, shorter = (src_path, tgt_path) if len(src) > len(tgt) else (tgt_path, src_path)
        raise ValueError(
            f"parallel files differ in line count: {src_path} has {len(src)} lines, "
            f"{tgt_path} has {len(tgt)}; {longer}:{min(len(src), len(tgt)) + 1} is the first "
            f"line without a counterpart in {shorter}. The files must be aligned line by line."
        )
    return list(zip(src, tgt, strict=True))


def load_tsv(path: str | Path) -> list[Pair]:
    """Read ``source<TAB>target`` lines; blank lines are skipped.

    Raises:
        ValueError: for a line without exactly one tab, or a file that is not UTF-8, naming
            the file and line.
    """
    out: list[Pair] = []
    for lineno, line in enumerate(_read_lines(path), start=1):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != 2:
            raise ValueError(
                f"{path}:{lineno}: expected 2 tab-separated fields (source, target), "
                f"got {len(fields)}: {line[:80]!r}"
            )
        out.append((fields[0], fields[1]))
    return out


class DatasetSettingError(ValueError):
    """A local Hugging Face dataset that cannot be used as given.

    Attributes:
        argument: the :func:`load_hf_dataset` argument at fault (``path``, ``split``,
            ``source_column`` or ``target_column``), so that a caller can name its own setting.
    """

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(message)
        self.argument = argument


def _is_text(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def load_hf_dataset(
    path: str | Path,
    split: str | None = None,
    source_column: str | None = None,
    target_column: str | None = None,
    cache_dir: str | Path | None = None,
) -> Any:
    """Open a local Hugging Face dataset, memory-mapped, with two text columns checked.

    Nothing is downloaded: ``path`` is a folder written by ``Dataset.save_to_disk`` or
    ``DatasetDict.save_to_disk`` (read with ``datasets.load_from_disk``), a ``.parquet`` file,
    a folder of parquet files, or a glob of them (``datasets.load_dataset("parquet", ...)``,
    which converts them once into Arrow files in its cache). A column of a struct column is
    named with a dot: ``translation.en`` for the ``{"translation": {"en": ..., "de": ...}}``
    layout of WMT/IWSLT/OPUS (the dataset is flattened).

    Args:
        path: the dataset on local disk.
        split: the split of a ``DatasetDict`` folder (``None``: ``train``). Parquet files and
            a single saved ``Dataset`` are one split: only ``None`` or ``train`` is accepted.
        source_column: the source text column (``None``: not checked).
        target_column: the target text column (``None``: not checked).
        cache_dir: where ``load_dataset`` keeps its Arrow copy of parquet files (``None``:
            the Hugging Face cache).

    Returns:
        The ``datasets.Dataset`` (every column kept; the named ones are text).

    Raises:
        ImportError: without the ``datasets`` package.
        DatasetSettingError: for a path with no dataset, an unknown split, or a column that is
            missing (the columns are listed) or not text; ``argument`` names the argument.
    """
    try:
        import datasets  # type: ignore[import-not-found]
    except ImportError as e:
        raise ImportError(
            "load_hf_dataset needs the `datasets` package: `pip install datasets` "
            "(the default embedded corpus does not)"
        ) from e
    where = Path(path)
    pattern = str(path)
    if where.is_dir() and (where / "dataset_dict.json").exists():
        loaded: Any = datasets.load_from_disk(str(where))
        name = split or "train"
        if name not in loaded:
            raise DatasetSettingError(
                "split",
                f"{where} holds the splits {sorted(loaded)}, not {name!r}: name one of them.",
            )
        ds = loaded[name]
    else:
        if split not in (None, "train"):
            raise DatasetSettingError(
                "split",
                f"{path} is a single split (a saved Dataset or parquet files), not a saved "
                f"DatasetDict: it has no split {split!r}, only its rows (validation and test "
                "pairs can be held out of them instead).",
            )
        if where.is_dir() and (where / "state.json").exists():
            ds = datasets.load_from_disk(str(where))
        else:
            if where.is_dir():
                files = sorted(str(f) for f in where.glob("*.parquet"))
            elif where.is_file() or any(c in pattern for c in "*?["):
                files = sorted(glob.glob(pattern)) if not where.is_file() else [str(where)]
            else:
                files = []
            if not files or not all(f.endswith(".parquet") for f in files):
                found = "nothing" if not where.exists() else "no state.json or parquet file"
                if files:
                    found = f"{files[:3]}, not all .parquet"
                raise DatasetSettingError(
                    "path",
                    f"no local dataset at {path} (found {found}): give a folder written by "
                    "Dataset.save_to_disk or DatasetDict.save_to_disk, a .parquet file, or a "
                    "folder or glob of parquet files. To use a dataset of the Hugging Face Hub, "
                    "download it once: datasets.load_dataset(NAME).save_to_disk(FOLDER).",
                )
            ds = datasets.load_dataset(
                "parquet",
                data_files=files,
                split="train",
                cache_dir=None if cache_dir is None else str(cache_dir),
            )
    for argument, column in (("source_column", source_column), ("target_column", target_column)):
        if column is None:
            continue
        if column not in ds.column_names and "." in column:
            ds = ds.flatten()
        if column not in ds.column_names:
            raise DatasetSettingError(
                argument,
                f"{path} has no column {column!r}; its columns are {ds.column_names}.",
            )
        feature = ds.features[column]
        if not _is_text(feature):
            raise DatasetSettingError(
                argument,
                f"column {column!r} of {path} holds {feature}, not text: name a text column "
                f"(the columns are {ds.column_names}).",
            )
        nulls = ds.data.column(column).null_count
        if nulls:
            raise DatasetSettingError(
                argument,
                f"column {column!r} of {path} has {nulls} empty (null) value(s): every pair "
                "needs both texts; drop those rows first (ds.filter(...)).",
            )
    return ds
