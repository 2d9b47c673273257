"""What a map-style DataModule is given for its splits: datasets, data sources and lengths.

Each split (``train``, ``val``, ``test``) is a dataset with one length per item (an array, a
callable or Arrow column names) and optional loss lengths, or a list of ``DataSource``; these read
and check them, naming the DataModule argument (``val_lengths``, ``train_dataset[1] (news)``).

Example:
    >>> read_lengths("val", [{"tokens": [1, 2]}, {"tokens": [3]}], lambda d: [2, 1]).tolist()
    [2, 1]
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch.utils.data import ConcatDataset

from lightning_varbatch.data.datamodule_settings import changed
from lightning_varbatch.data.plan_items import check_map_style
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.mixture_datasets import DataSource
from lightning_varbatch.sources.arrow_lengths import (
    column_lengths,
    is_column_spec,
    source_with_column_lengths,
)

__all__ = [
    "as_sources",
    "check_loss_inputs",
    "check_no_mixing",
    "read_lengths",
    "read_loss_lengths",
    "read_split",
    "read_stream_split",
]


def as_sources(stage: str, data: Any, lengths: Any) -> list[DataSource] | None:
    """``data`` as a list of data sources, or ``None`` when it is one plain dataset."""
    if not isinstance(data, (list, tuple)) or not any(isinstance(d, DataSource) for d in data):
        return None
    if not all(isinstance(d, DataSource) for d in data):
        raise TypeError(
            f"{stage}_dataset mixes DataSource and other items: pass a list of DataSource "
            "(one per dataset) or a single dataset."
        )
    if lengths is not None:
        raise ValueError(
            f"{stage}_lengths must be None when {stage}_dataset is a list of DataSource: each "
            "DataSource carries its own lengths."
        )
    resolved = []
    for i, source in enumerate(data):
        if source.dataset is None:
            raise ValueError(
                f"{stage}_dataset[{i}] ({source.name or i!s}) has no dataset: set "
                "DataSource(dataset=...) so that the loader can fetch its items."
            )
        label = f"{stage}_dataset[{i}] ({source.name or i!s})"
        check_map_style(source.dataset, label)
        source = source_with_column_lengths(source, label)
        resolved.append(source)
        if len(source.dataset) != len(np.asarray(source.lengths)):
            raise ValueError(
                f"{stage}_dataset[{i}] ({source.name or i!s}) has {len(source.dataset)} items "
                f"but {len(np.asarray(source.lengths))} lengths: pass one length per item."
            )
    return resolved


def dataset_size(stage: str, dataset: Any) -> int:
    try:
        return len(dataset)
    except TypeError:
        raise TypeError(
            f"{stage}_dataset ({type(dataset).__name__}) has no len(): a map-style dataset "
            "needs __len__ and __getitem__ so that its lengths can be checked against it."
        ) from None


def check_no_mixing(
    train_dataset: Any, mixing: Any, weights: Any, temperature: Any, steps_per_epoch: Any
) -> None:
    """Refuse mixture settings for a single training dataset (they would be ignored).

    Raises:
        SettingValueError: naming the first such setting.
    """
    if not isinstance(train_dataset, (list, tuple)) or not any(
        isinstance(d, DataSource) for d in train_dataset
    ):
        given = dict(
            mixing=mixing, weights=weights, temperature=temperature, steps_per_epoch=steps_per_epoch
        )
        ignored = changed(given)
        if ignored:
            raise SettingValueError(
                f"{', '.join(f'{n}={given[n]!r}' for n in ignored)} set how several training "
                "datasets are mixed, but train_dataset is a single dataset, so they would "
                "be ignored: pass a list of DataSource (one per dataset) as train_dataset, "
                "or leave them unset.",
                setting=ignored[0],
                value=given[ignored[0]],
            )


def read_lengths(
    stage: str, dataset: Any, given: Any, what: str = "lengths", *, counted: bool = True
) -> np.ndarray:
    """One length (``what``: or loss length) per item of a split: an array, columns or callable.

    Raises:
        SettingValueError: for ragged lengths or (``counted``) a count other than the dataset's
            size (a callable's own error is re-raised as its type, naming the argument).
    """
    name = f"{stage}_{what}"
    if is_column_spec(given):
        given = column_lengths(dataset, given, name)
    elif callable(given):
        try:
            given = given(dataset)
        except Exception as error:
            raise type(error)(
                f"{name} (a callable) raised {type(error).__name__}: {error} while computing "
                f"the {what.replace('_', ' ')} of {stage}_dataset; it must return one per item "
                "(shape (n,) or (n, 2)) from items as the dataset returns them."
            ) from error
    try:
        lengths = np.asarray(given)
    except ValueError as error:
        raise SettingValueError(
            f"{name} is ragged or not numeric ({error}): pass one integer length per "
            "item, shape (n,), or one (source, target) pair per item, shape (n, 2).",
            setting=name,
            value=given,
            stage=stage,
        ) from None
    n = dataset_size(stage, dataset) if counted else 0
    count = lengths.shape[0] if lengths.ndim else 0
    if counted and count != n:
        raise SettingValueError(
            f"{name} has {count} entries but {stage}_dataset has {n} items: pass one "
            "length per item.",
            setting=name,
            value=given,
            stage=stage,
        )
    return lengths


def read_loss_lengths(stage: str, dataset: Any, given: Any) -> np.ndarray | None:
    """A split's loss lengths (``None``: not given), read like :func:`read_lengths`."""
    if given is None:
        return None
    return read_lengths(stage, dataset, given, "loss_lengths", counted=False)


def read_split(name: str, data: Any, lengths: Any) -> tuple[list[DataSource] | None, Any]:
    """A map-style DataModule's split: its data sources (or ``None``) and its dataset.

    Several data sources are served as one ``ConcatDataset`` of their datasets.

    Raises:
        SettingValueError: for a dataset without lengths or lengths without a dataset.
        TypeError: for an iterable-style dataset (a map-style one is needed).

    Example:
        >>> read_split("val", None, None)
        (None, None)
    """
    sources = as_sources(name, data, lengths)
    if sources is None and data is not None and lengths is None:
        raise SettingValueError(
            f"{name}_dataset was given without {name}_lengths: pass {name}_lengths= "
            "(one length per item, (n, 2) source/target lengths for pairs, or a "
            "callable dataset -> lengths).",
            setting=f"{name}_lengths",
            value=None,
            stage=name,
        )
    if data is None and lengths is not None:
        raise SettingValueError(
            f"{name}_lengths was given without {name}_dataset: pass both or neither.",
            setting=f"{name}_dataset",
            value=None,
            stage=name,
        )
    if sources is None:
        if data is not None:
            check_map_style(data, f"{name}_dataset")
        return None, data
    return sources, ConcatDataset([s.dataset for s in sources])


def check_loss_inputs(name: str, loss: Any, data: Any, sources: Any) -> None:
    """Refuse ``{name}_loss_lengths`` without a dataset, or for a list of data sources.

    Example:
        >>> check_loss_inputs("val", None, None, None)
    """
    if loss is None:
        return
    if data is None:
        raise ValueError(
            f"{name}_loss_lengths was given without {name}_dataset: pass both or neither."
        )
    if sources is not None:
        raise ValueError(
            f"{name}_loss_lengths describes the items of one plain dataset, but "
            f"{name}_dataset is a list of DataSource: give each DataSource its own "
            "loss_lengths (DataSource(lengths, dataset=..., loss_lengths=...)) instead."
        )


def read_stream_split(
    stage: str, dataset: Any, lengths: Any, loss: Any
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """A StreamingDataModule evaluation split's lengths and loss lengths (``None``: no split).

    Raises:
        SettingValueError: a dataset without lengths or the reverse, lone loss lengths, bad lengths.
        SettingTypeError: for a list of DataSource (a stream evaluates one dataset a split).

    Example:
        >>> read_stream_split("val", [{"tokens": [1, 2]}], [2], None)
        (array([2]), None)
    """
    if (dataset is None) != (lengths is None):
        raise SettingValueError(
            f"{stage}_dataset and {stage}_lengths go together: pass both or neither.",
            setting=f"{stage}_lengths" if dataset is not None else f"{stage}_dataset",
            value=None,
            stage=stage,
        )
    if dataset is None:
        if loss is not None:
            raise SettingValueError(
                f"{stage}_loss_lengths was given without {stage}_dataset: pass both or neither.",
                setting=f"{stage}_loss_lengths",
                value=loss,
                stage=stage,
            )
        return None
    if isinstance(dataset, (list, tuple)) and any(isinstance(d, DataSource) for d in dataset):
        raise SettingTypeError(
            f"{stage}_dataset is a list of DataSource: StreamingDataModule evaluates one "
            "map-style dataset per split; concatenate them (and their lengths), or use "
            "TokenBudgetDataModule for a mixture.",
            setting=f"{stage}_dataset",
            value=dataset,
            stage=stage,
        )
    check_map_style(dataset, f"{stage}_dataset")
    array = read_lengths(stage, dataset, lengths)
    if loss is not None:
        loss = read_lengths(stage, dataset, loss, "loss_lengths")
    return array, loss
