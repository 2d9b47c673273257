"""The corpora of a translation run, read from the ``data`` config, and their mixing settings.

Without ``data.corpora`` (the default) the run has one corpus, set by ``data.*``: the embedded
corpus (``data.num_pairs``, ``data.seed``), parallel files (``data.src_path`` +
``data.tgt_path``), a TSV file (``data.tsv_path``) or a local Hugging Face dataset or parquet
files (``data.hf_path`` + ``data.source_column`` + ``data.target_column``, optionally
``data.hf_split``/``data.hf_valid_split``/``data.hf_test_split`` for a ``DatasetDict``). With
``data.corpora``, a mapping from a name to an entry, the run mixes several corpora (see
``conf/data/mixture.yaml``)::

    data:
      corpora:
        news: {kind: tsv, tsv_path: news.tsv, weight: 3}
        synthetic: {kind: synthetic, num_pairs: 20000, weight: 1}
      mixing: per_step         # per_step | per_batch
      temperature: 1.0
      steps_per_epoch: 500     # null: an epoch is one pass over every corpus

Every check here raises :class:`~examples.common.config_checks.ConfigError` naming the setting
to change.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from examples.common.config_checks import ConfigError, check_int
from examples.translation import data as corpus_io
from lightning_varbatch.planner import MIXING_POLICIES

__all__ = ["KINDS", "Corpus", "mixture_settings", "read_corpora"]

#: The settings of the single corpus of ``data.*`` that only apply to a Hugging Face dataset
#: (a ``DatasetDict``'s splits: ``hf_split`` to train on, null ``hf_valid_split``/
#: ``hf_test_split`` hold ``data.valid``/``data.test`` pairs out of it). Not a kind of
#: ``data.corpora`` entry: a mixture reads text files or the embedded corpus.
_HF_KEYS = (
    "hf_path",
    "source_column",
    "target_column",
    "hf_split",
    "hf_valid_split",
    "hf_test_split",
)
#: The kinds of corpus a ``data.corpora`` entry can be, and the settings each one reads.
KINDS: dict[str, tuple[str, ...]] = {
    "synthetic": ("num_pairs", "seed", "domain"),
    "parallel": ("src_path", "tgt_path"),
    "tsv": ("tsv_path",),
}
_COMMON = ("kind", "weight", "max_tokens", "max_examples", "valid", "test")
_ENTRY_KEYS = (*_COMMON, *(key for keys in KINDS.values() for key in keys))


@dataclass(frozen=True)
class Corpus:
    """One parallel corpus of the run, with its own split sizes and optional budget.

    Attributes:
        name: the name under ``data.corpora`` (``None`` for the single corpus of ``data.*``).
        setting: where its settings live, for messages: ``data`` or ``data.corpora.<name>``.
        kind: ``synthetic``, ``parallel``, ``tsv`` or ``hf``.
        source: the kind's settings (``num_pairs``/``seed``/``domain``, ``src_path`` and
            ``tgt_path``, ``tsv_path``, or ``hf_path``/``source_column``/``target_column`` and
            the ``hf_split``/``hf_valid_split``/``hf_test_split`` of a ``DatasetDict``).
        valid: validation pairs split off this corpus (not used for an ``hf`` corpus with its
            own ``hf_valid_split``).
        test: test pairs split off this corpus (likewise with ``hf_test_split``).
        weight: its mixing weight (``None``: shares by size).
        max_tokens: its own micro-batch budget (``None``: ``data.max_tokens``).
        max_examples: its own cap on examples per micro-batch.
    """

    name: str | None
    setting: str
    kind: str
    source: dict[str, Any]
    valid: int
    test: int
    weight: float | None = None
    max_tokens: int | None = None
    max_examples: int | None = None

    @property
    def has_test(self) -> bool:
        """Whether the corpus has a test split (held out, or a DatasetDict's own)."""
        return self.test > 0 or bool(self.source.get("hf_test_split"))

    def describe(self) -> str:
        """Its source settings as ``key=value`` (e.g. ``data.corpora.news.tsv_path=news.tsv``)."""
        return " / ".join(
            f"{self.setting}.{k}={v}" for k, v in self.source.items() if v is not None
        )

    def load(self, cache_dir: str | None = None) -> list[tuple[str, str]] | dict[str, Any]:
        """Its ``(source, target)`` pairs; for an ``hf`` corpus its ``datasets.Dataset`` splits.

        An ``hf`` corpus gives ``{"train": ds}`` plus ``"valid"``/``"test"`` for the splits
        named by ``hf_valid_split``/``hf_test_split``: Arrow-backed, memory-mapped, never
        turned into a list (see :func:`examples.translation.data.load_hf_dataset`).

        Raises:
            ConfigError: for a missing or unreadable file, a TSV line without exactly one
                tab, parallel files of different lengths, non-UTF-8 text or no pairs at all;
                for a Hugging Face dataset, no dataset at the path, an unknown split, or a
                column that is missing or not text; the message names the setting, the file
                and the line (or the columns there are).
        """
        src = self.source
        if self.kind == "hf":
            return self._load_hf(cache_dir)
        if self.kind == "synthetic":
            return corpus_io.build_corpus(
                src["num_pairs"], seed=src["seed"], cache_dir=cache_dir, domain=src["domain"]
            )
        if self.kind == "tsv":
            read = partial(corpus_io.load_tsv, src["tsv_path"])
        else:
            read = partial(corpus_io.load_parallel_text, src["src_path"], src["tgt_path"])
        try:
            pairs = read()
        except (OSError, ValueError) as error:
            raise ConfigError(f"Cannot read the corpus of {self.describe()}: {error}") from error
        if not pairs:
            raise ConfigError(f"The corpus of {self.describe()} is empty: it holds no pairs.")
        return pairs

    def _load_hf(self, cache_dir: str | None) -> dict[str, Any]:
        """The ``train`` split and the ``valid``/``test`` splits the settings name."""
        src = self.source
        out: dict[str, Any] = {}
        splits = (("train", "hf_split"), ("valid", "hf_valid_split"), ("test", "hf_test_split"))
        for split, key in splits:
            if not src.get(key):
                continue
            try:
                ds = corpus_io.load_hf_dataset(
                    src["hf_path"],
                    src[key],
                    src["source_column"],
                    src["target_column"],
                    cache_dir=None if cache_dir is None else Path(cache_dir) / "hf",
                )
            except corpus_io.DatasetSettingError as error:
                at_fault = {"path": "hf_path", "split": key}.get(error.argument, error.argument)
                raise ConfigError(f"{self.setting}.{at_fault}={src[at_fault]}: {error}") from error
            except (OSError, ValueError) as error:
                raise ConfigError(
                    f"Cannot read the dataset of {self.describe()}: {error}"
                ) from error
            if len(ds) == 0:
                raise ConfigError(
                    f"The {split} split of {self.describe()} is empty: it holds no rows."
                )
            out[split] = ds
        return out


def _hf_source(setting: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of a Hugging Face corpus, checked: the path and both columns together."""
    source = {key: given.get(key) for key in _HF_KEYS}
    if not source["hf_path"]:
        named = [f"{setting}.{k}" for k in _HF_KEYS if source[k] is not None and k != "hf_split"]
        verb, pronoun = ("apply", "them") if len(named) > 1 else ("applies", "it")
        raise ConfigError(
            f"{' and '.join(named)} {verb} to a Hugging Face dataset: set {setting}.hf_path "
            f"too (a save_to_disk folder or parquet files), or unset {pronoun}."
        )
    missing = [f"{setting}.{k}" for k in ("source_column", "target_column") if not source[k]]
    if missing:
        raise ConfigError(
            f"{setting}.hf_path={source['hf_path']} needs {' and '.join(missing)}: the names of "
            "its source and target text columns (e.g. en and de, or translation.en and "
            "translation.de)."
        )
    for key in _HF_KEYS:
        value = source[key]
        if value is not None and not (isinstance(value, str) and value.strip()):
            raise ConfigError(f"{setting}.{key} must be a non-empty string, got {value!r}.")
    source["hf_split"] = source["hf_split"] or "train"
    return source


def _single(data: DictConfig) -> Corpus:
    """The one corpus of ``data.*`` (no ``data.corpora``), as the example always read it."""
    hf_given = data.get("hf_path") or any(
        data.get(k) is not None for k in _HF_KEYS if k != "hf_split"
    )
    if hf_given:
        source = _hf_source("data", data)
        other = [f"data.{k}" for k in ("src_path", "tsv_path") if data.get(k) is not None]
        if other:
            raise ConfigError(
                f"Give either data.hf_path or {' / '.join(other)}, not both; got "
                f"data.hf_path={source['hf_path']} and {other[0]}={data.get(other[0][5:])}."
            )
        return Corpus(None, "data", "hf", source, valid=data.valid, test=data.test)
    if data.get("hf_split") not in (None, "train"):
        raise ConfigError(
            f"data.hf_split={data.hf_split} applies to a Hugging Face dataset: set data.hf_path "
            "too, or leave data.hf_split at train."
        )
    if (data.src_path is None) != (data.tgt_path is None):
        raise ConfigError("data.src_path and data.tgt_path must be given together.")
    if data.get("tsv_path") and data.src_path is not None:
        raise ConfigError(
            "Give either data.tsv_path or data.src_path/data.tgt_path, not both; got "
            f"data.tsv_path={data.tsv_path} and data.src_path={data.src_path}."
        )
    if data.get("tsv_path"):
        kind, source = "tsv", {"tsv_path": data.tsv_path}
    elif data.src_path is not None:
        kind, source = "parallel", {"src_path": data.src_path, "tgt_path": data.tgt_path}
    else:
        kind, source = "synthetic", {"num_pairs": data.num_pairs, "seed": data.seed}
        source["domain"] = "mixed"
    return Corpus(None, "data", kind, source, valid=data.valid, test=data.test)


def _entry(data: DictConfig, name: str, entry: Any) -> Corpus:
    """The corpus of ``data.corpora.<name>``, its settings checked."""
    setting = f"data.corpora.{name}"
    if not isinstance(entry, Mapping):
        raise ConfigError(
            f"{setting} must be a mapping of settings (kind, ...), got {entry!r}; e.g. "
            f"+{setting}={{kind: tsv, tsv_path: my.tsv}}."
        )
    unknown = sorted(set(entry) - set(_ENTRY_KEYS))
    if unknown:
        raise ConfigError(
            f"{setting} has unknown setting(s) {unknown}; valid: {', '.join(_ENTRY_KEYS)}."
        )
    kind = entry.get("kind")
    if kind not in KINDS:
        raise ConfigError(
            f"{setting}.kind must be one of {', '.join(KINDS)}; got {kind!r} "
            f"(synthetic: the embedded corpus; parallel: src_path + tgt_path; tsv: tsv_path)."
        )
    foreign = sorted(
        k for k, v in entry.items() if v is not None and k not in _COMMON + KINDS[kind]
    )
    if foreign:
        raise ConfigError(
            f"{setting}: {', '.join(foreign)} do(es) not apply to kind={kind}, whose settings "
            f"are {', '.join(KINDS[kind])}; remove them or change {setting}.kind."
        )
    source = {key: entry.get(key) for key in KINDS[kind]}
    if kind == "synthetic":
        source["num_pairs"] = data.num_pairs if source["num_pairs"] is None else source["num_pairs"]
        source["seed"] = data.seed if source["seed"] is None else source["seed"]
        source["domain"] = source["domain"] or "mixed"
        check_int(f"{setting}.num_pairs", source["num_pairs"], 1)
        if source["domain"] not in corpus_io.DOMAINS:
            raise ConfigError(
                f"{setting}.domain must be one of {', '.join(corpus_io.DOMAINS)}; got "
                f"{source['domain']!r}."
            )
    else:
        missing = [key for key, value in source.items() if not value]
        if missing:
            raise ConfigError(
                f"{setting} (kind={kind}) needs {' and '.join(f'{setting}.{k}' for k in missing)}."
            )
    weight = entry.get("weight")
    if weight is not None and (
        isinstance(weight, bool)
        or not isinstance(weight, (int, float))
        or not math.isfinite(weight)
        or weight < 0
    ):
        raise ConfigError(
            f"{setting}.weight must be a number >= 0 (0 leaves the corpus out of training) or "
            f"null, got {weight!r}."
        )
    for key in ("max_tokens", "max_examples"):
        check_int(f"{setting}.{key}", entry.get(key), 1, nullable=True)
    splits = {key: data[key] if entry.get(key) is None else entry[key] for key in ("valid", "test")}
    check_int(f"{setting}.valid", splits["valid"], 1)
    check_int(f"{setting}.test", splits["test"], 0)
    return Corpus(
        name,
        setting,
        kind,
        source,
        weight=None if weight is None else float(weight),
        max_tokens=entry.get("max_tokens"),
        max_examples=entry.get("max_examples"),
        **splits,
    )


def read_corpora(data: DictConfig) -> list[Corpus]:
    """The run's corpora: each entry of ``data.corpora``, else the one corpus of ``data.*``.

    Raises:
        ConfigError: for a ``data.corpora`` that is not a mapping, an entry with an unknown
            setting or kind, without its paths, or with a bad weight, budget or split size;
            or ``data.src_path``/``data.tgt_path``/``data.tsv_path`` given next to
            ``data.corpora``.
    """
    entries = data.get("corpora")
    if not entries:
        return [_single(data)]
    if not isinstance(entries, Mapping):
        raise ConfigError(
            "data.corpora must be a mapping from a corpus name to its settings, e.g. "
            "+data.corpora.news={kind: tsv, tsv_path: news.tsv}; got "
            f"{OmegaConf.to_container(entries) if OmegaConf.is_config(entries) else entries!r}."
        )
    given = [
        key
        for key in ("src_path", "tgt_path", "tsv_path", *_HF_KEYS)
        if data.get(key) is not None and not (key == "hf_split" and data.get(key) == "train")
    ]
    if given:
        raise ConfigError(
            f"data.{given[0]} is set next to data.corpora: with data.corpora every corpus is an "
            f"entry there (e.g. kind: tsv, tsv_path: ...); unset data.{given[0]}."
        )
    return [_entry(data, str(name), entry) for name, entry in entries.items()]


def mixture_settings(data: DictConfig, corpora: list[Corpus]) -> dict[str, Any]:
    """``mixing``, ``weights``, ``temperature`` and ``steps_per_epoch`` for the DataModule.

    Weights are ``"size"`` unless every corpus has one.

    Raises:
        ConfigError: for an unknown mixing, a bad temperature or ``steps_per_epoch``, weights
            on some corpora only or all zero, or weights/temperature without
            ``data.steps_per_epoch``.
    """
    mixing, temperature = data.get("mixing", "per_step"), data.get("temperature", 1.0)
    steps = data.get("steps_per_epoch")
    if mixing not in MIXING_POLICIES:
        raise ConfigError(
            f"data.mixing must be one of {', '.join(MIXING_POLICIES)}; got {mixing!r}."
        )
    if (
        isinstance(temperature, bool)
        or not isinstance(temperature, (int, float))
        or not (math.isfinite(temperature) and temperature > 0)
    ):
        raise ConfigError(f"data.temperature must be a positive number, got {temperature!r}.")
    check_int("data.steps_per_epoch", steps, 1, nullable=True)
    if corpora[0].name is None:
        if steps is not None:
            raise ConfigError(
                f"data.steps_per_epoch={steps} applies to a mixture of corpora (data.corpora, "
                "e.g. data=mixture); with one corpus an epoch is one pass: set it to null."
            )
        return {}
    weights: Any = [c.weight for c in corpora]
    unweighted = [c.setting for c in corpora if c.weight is None]
    if len(unweighted) == len(corpora):
        weights = "size"
    elif unweighted:
        raise ConfigError(
            f"{', '.join(f'{s}.weight' for s in unweighted)} missing: give every corpus a weight, "
            "or none (shares by size)."
        )
    elif not any(weights):
        raise ConfigError(
            "data.corpora.*.weight are all 0: give at least one corpus a positive weight."
        )
    if steps is None and (weights != "size" or temperature != 1):
        raise ConfigError(
            "Weights (data.corpora.<name>.weight) and data.temperature set each corpus's share "
            "of an epoch of a fixed length: set data.steps_per_epoch (optimizer steps per "
            "epoch). With data.steps_per_epoch=null an epoch is one pass over every corpus, "
            "whose shares are then their sizes."
        )
    return {
        "mixing": mixing,
        "weights": weights,
        "temperature": temperature,
        "steps_per_epoch": steps,
    }
