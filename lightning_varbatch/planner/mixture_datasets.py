"""The datasets of a mixture: each one's lengths, name and settings, and their shares.

Example:
    >>> long = DataSource(np.full(4, 4096), name="long", max_examples=4)
    >>> long.name, long.max_examples
    ('long', 4)
    >>> mixture_probabilities(np.array([100, 25]), "size").tolist()
    [0.8, 0.2]
    >>> mixture_probabilities(np.array([100, 25]), "size", temperature=2.0).round(3).tolist()
    [0.667, 0.333]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt

from lightning_varbatch.checks import check_count, check_real
from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.length_warmup import WARMUP_DEFAULTS
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.shape_budget import ShapeBudget
from lightning_varbatch.planner.shapes import choose_shape_lengths

MixingPolicy: TypeAlias = Literal["per_step", "per_batch"]
MIXING_POLICIES: tuple[str, ...] = ("per_step", "per_batch")
Weights: TypeAlias = Literal["size"] | Sequence[float]

__all__ = [
    "MIXING_POLICIES",
    "DataSource",
    "MixingPolicy",
    "Weights",
    "as_sources",
    "check_dataset_index",
    "dataset_errors",
    "fit_units",
    "item_count",
    "mixture_probabilities",
    "share_shape_lengths",
    "source_config",
    "source_names",
]


@dataclass(frozen=True, eq=False)
class DataSource:
    """One dataset of a mixture: its lengths, optionally its items and its own budget.

    Args:
        lengths: ``(n,)`` lengths or ``(n, 2)`` (source, target) lengths, one per item.
        dataset: the map-style dataset (needed by the datamodule, not by the planner).
        max_tokens: this dataset's budget of one micro-batch (default: the common one).
        max_examples: this dataset's cap on examples per micro-batch (default: the common one).
        loss_lengths: loss tokens per item when they are not the lengths / target column.
        name: a label for logs and reports (default: the dataset's index).
        length_warmup_min: this dataset's length warm-up cap at the first step (default: common).
        length_warmup_max: its cap at the warm-up's end (default: common, else its longest example).

    Example:
        >>> DataSource(np.array([[3, 4], [5, 2]]), max_tokens=4096).max_tokens
        4096
    """

    lengths: npt.ArrayLike
    dataset: Any = None
    max_tokens: int | None = None
    max_examples: int | None = None
    loss_lengths: npt.ArrayLike | None = None
    name: str | None = None
    length_warmup_min: int | None = None
    length_warmup_max: int | None = None

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name):
            raise SettingTypeError(
                f"DataSource name must be a non-empty string or None, got {self.name!r} "
                f"({type(self.name).__name__}); pass e.g. name='wmt' (None: the index).",
                setting="name",
                value=self.name,
            )
        label = "DataSource" if self.name is None else f"DataSource {self.name!r}"
        for setting in ("max_tokens", "max_examples", "length_warmup_min", "length_warmup_max"):
            value = check_count(
                setting,
                getattr(self, setting),
                allow_none=True,
                what=f" for {label} (None: use the common setting)",
            )
            object.__setattr__(self, setting, value)


def mixture_probabilities(
    sizes: np.ndarray, weights: Weights = "size", temperature: float = 1.0
) -> np.ndarray:
    """Each dataset's share: ``p_i ∝ w_i ** (1 / temperature)``.

    Args:
        sizes: every dataset's size (micro-batches of one pass: its tokens in budgets).
        weights: ``"size"`` (``w_i = sizes[i]``) or one non-negative weight per dataset.
        temperature: ``T > 0``; ``T > 1`` flattens the shares towards uniform (upsamples small).

    Returns:
        Probabilities summing to 1.

    Raises:
        ValueError: weights not one per dataset, negative, non-finite or all 0, or temperature ≤ 0.

    Example:
        >>> mixture_probabilities(np.array([10, 10]), [3, 1]).tolist()
        [0.75, 0.25]
    """
    n = len(sizes)
    temperature = check_real(
        "temperature",
        temperature,
        what="; pass e.g. temperature=2.0 to flatten the shares, 1 to keep them",
    )
    if isinstance(weights, str):
        if weights != "size":
            raise SettingValueError(
                f"Unknown weights={weights!r}; pass 'size' or one number per dataset.",
                setting="weights",
                value=weights,
            )
        raw = np.asarray(sizes, dtype=np.float64)
    else:
        raw = _weights_array(weights, n)
        if raw.shape != (n,):
            raise SettingValueError(
                f"weights has {raw.size} entries but there are {n} datasets: pass one weight "
                "per dataset, or weights='size'.",
                setting="weights",
                value=weights,
            )
        if not np.isfinite(raw).all() or (raw < 0).any():
            raise SettingValueError(
                f"weights must be finite and >= 0, got {raw.tolist()}; a weight of 0 leaves "
                "that dataset out.",
                setting="weights",
                value=weights,
            )
    if not (raw > 0).any():
        raise SettingValueError(
            f"weights are all zero ({raw.tolist()}): give at least one dataset a positive weight.",
            setting="weights",
            value=weights,
        )
    scaled = np.where(raw > 0, raw / raw.max(), 0.0) ** (1.0 / temperature)
    return scaled / scaled.sum()


def _weights_array(weights: object, n: int) -> np.ndarray:
    """``weights`` as floats, or a ValueError that names the bad entry."""
    if isinstance(weights, (Mapping, bytes)) or not isinstance(weights, Iterable):
        raise SettingTypeError(
            f"weights must be 'size' or a sequence of {n} numbers (one per dataset), got "
            f"{type(weights).__name__} {weights!r:.60}.",
            setting="weights",
            value=weights,
        )
    listed = list(weights)
    for i, w in enumerate(listed):
        if isinstance(w, (bool, np.bool_)) or not isinstance(
            w, (int, float, np.integer, np.floating)
        ):
            raise SettingTypeError(
                f"weights[{i}] is {w!r} ({type(w).__name__}); weights must be numbers >= 0, "
                f"one per dataset ({n} datasets).",
                setting="weights",
                value=weights,
            )
    return np.asarray(listed, dtype=np.float64).reshape(-1)


def item_count(dataset: object) -> int | None:
    """Items of a map-style dataset, ``None`` when there is none or it has no length."""
    if dataset is None:
        return None
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None


def as_sources(sources: object) -> list[DataSource]:
    """The datasets as :class:`DataSource` objects, or an error that says what to pass.

    Raises:
        TypeError: for a single dataset, a mapping or anything that is not a list of datasets.
        ValueError: for an empty list.
    """
    if isinstance(sources, (DataSource, np.ndarray, str, bytes, Mapping)) or not isinstance(
        sources, Iterable
    ):
        raise SettingTypeError(
            f"sources must be a list of datasets (DataSource objects or lengths arrays), got "
            f"{type(sources).__name__}; pass e.g. [DataSource(lengths_a), DataSource(lengths_b)]"
            " (a single lengths array is one dataset: wrap it in a list, or use EpochPlanner).",
            setting="sources",
            value=sources,
        )
    sources = list(sources)
    if not sources:
        raise SettingValueError(
            "sources is empty: pass at least one dataset.",
            setting="sources",
            value=sources,
        )
    return [s if isinstance(s, DataSource) else DataSource(s) for s in sources]


def source_names(sources: Sequence[DataSource]) -> list[str]:
    """Each dataset's name (an unnamed one is named by its index); names must be unique.

    Raises:
        ValueError: naming the names given more than once.
    """
    names = [str(i) if s.name is None else s.name for i, s in enumerate(sources)]
    if len(set(names)) != len(names):
        twice = sorted({n for n in names if names.count(n) > 1})
        raise SettingValueError(
            f"Dataset names must be unique, got {names} ({', '.join(twice)} more than "
            "once; an unnamed dataset is named by its index): give each DataSource its "
            "own name.",
            setting="name",
            value=names,
        )
    return names


def source_config(common: PlanConfig, source: DataSource, index: int) -> PlanConfig:
    """The settings of dataset ``index``: ``common`` with the source's own budget, if any.

    Each dataset shuffles with a stream of its own; its plans are made without the length
    warm-up and the ranks' budgets, which are the mixture's.

    Raises:
        ValueError: for a source budget :class:`PlanConfig` refuses.
    """
    seed = int(np.random.SeedSequence([common.seed, index]).generate_state(1)[0])
    if common.length_warmup is not None:
        common = replace(common, **WARMUP_DEFAULTS)
    return replace(
        common,
        seed=seed,
        max_tokens=common.max_tokens if source.max_tokens is None else source.max_tokens,
        max_examples=common.max_examples if source.max_examples is None else source.max_examples,
        # the ranks' budgets are the mixture's, scaled to the dataset's budget when it plans
        rank_shares=None,
        rank_max_tokens=None,
    )


def share_shape_lengths(
    planners: Sequence[ShapeBudget],
    sources: Sequence[DataSource],
    names: list[str],
    config: PlanConfig,
) -> None:
    """Give every dataset's planner one set of shape lengths, chosen over all datasets.

    A mixture under ``max_shapes`` has at most ``max_shapes`` lengths in all, and one budget.

    Raises:
        SettingValueError: for a dataset of its own ``max_tokens`` or ``max_examples``.
    """
    assert config.max_shapes is not None
    own = [
        n
        for n, src in zip(names, sources, strict=True)
        if src.max_tokens is not None or src.max_examples is not None
    ]
    if own:
        raise SettingValueError(
            f"max_shapes={config.max_shapes} with a budget of its own for dataset(s) "
            f"{own}: a shape's rows follow from the budget, so per-dataset max_tokens "
            "or max_examples would multiply the shapes. Give every dataset the common "
            "budget (drop the DataSource max_tokens/max_examples) or unset max_shapes.",
            setting="max_shapes",
            value=config.max_shapes,
        )
    keys = [p.prepared.planned_key for p in planners]
    lengths = choose_shape_lengths(
        np.concatenate(keys), config.max_shapes, config.pad_to_multiple_of
    )
    for planner in planners:
        planner.use_shape_lengths(lengths)


def fit_units(units: np.ndarray, length: int) -> tuple[np.ndarray, np.ndarray]:
    """A pass's units made ``length`` long (pass 0's), and the micro-batches left out.

    Packed rows over wide buckets are cut anew each pass (:mod:`~.packed_rows`): a shorter pass
    repeats its first units, a longer one drops its last (both counted): fixed positions.
    """
    if units.shape[0] >= length or units.shape[0] == 0:
        return units[:length], units[length:].reshape(-1)
    return units[np.arange(length) % units.shape[0]], np.zeros(0, dtype=np.int64)


@contextmanager
def dataset_errors(which: str, *, type_errors: bool = False) -> Iterator[None]:
    """Prefix the message of a dataset's setting or value error (type error) with ``which``."""
    try:
        yield
    except SettingError as error:
        raise error.renamed(error.setting, f"{which}: {error}") from error
    except ValueError as error:
        raise ValueError(f"{which}: {error}") from error
    except TypeError as error:
        if not type_errors:
            raise
        raise TypeError(f"{which}: {error}") from error


def check_dataset_index(dataset: object, names: Sequence[str]) -> int:
    """``dataset`` as the index of one of the datasets called ``names``.

    Raises:
        SettingValueError: for anything but an integer in ``[0, len(names))``.
    """
    n = len(names)
    if (
        isinstance(dataset, (bool, np.bool_))
        or not isinstance(dataset, (int, np.integer))
        or not 0 <= dataset < n
    ):
        raise SettingValueError(
            f"dataset must be a dataset index in [0, {n}) ({', '.join(names)}), got {dataset!r}.",
            setting="dataset",
            value=dataset,
        )
    return int(dataset)
