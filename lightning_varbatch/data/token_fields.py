"""Token fields of a micro-batch's items, read and checked: ragged rows and other entries.

Both collates read their items through these: :func:`ragged_field` reads one field as flat values
plus lengths (every row checked) and :func:`other_entries` gathers the rest.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from lightning_varbatch.data.columnar import ColumnarItems
from lightning_varbatch.data.plan_items import item_label
from lightning_varbatch.data.ragged import Ragged, arrow_list_problem
from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = ["HF_TOKENS_KEY", "TOKENS_KEY", "as_tokens", "check_key", "other_entries", "ragged_field"]

TOKENS_KEY = "tokens"
#: The token field of Hugging Face tokenizers' output, found when ``tokens_key`` is the default.
HF_TOKENS_KEY = "input_ids"


def check_key(name: str, key: object) -> str:
    """Validate a collate's field-name setting: a non-empty string.

    Example:
        >>> check_key("tokens_key", "input_ids")
        'input_ids'
    """
    if not isinstance(key, str):
        raise SettingTypeError(
            f"{name} must be a non-empty string (an item key), got {key!r} ({type(key).__name__}).",
            setting=name,
            value=key,
        )
    if not key:
        raise SettingValueError(
            f"{name} must be a non-empty string (an item key), got ''.", setting=name, value=key
        )
    return key


_INTEGER_DTYPES = frozenset(
    {torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8}
    | {getattr(torch, name) for name in ("uint16", "uint32", "uint64") if hasattr(torch, name)}
)


def as_tokens(value: Any, field: str, where: str) -> torch.Tensor:
    """``value`` as a 1-D long tensor of token ids, or a clear error naming the item."""
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (str, bytes)):
        raise TypeError(
            f"Field {field!r} of {where} is a {type(value).__name__} ({value[:40]!r}); "
            "expected a 1-D sequence of integer token ids: tokenize the text in the dataset."
        )
    else:
        if isinstance(value, np.ndarray) and not value.flags.writeable:
            value = value.copy()  # zero-copy Arrow reads are read-only; torch warns on those
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as error:
            raise TypeError(
                f"Field {field!r} of {where} is not a sequence of integer token ids "
                f"({type(value).__name__}: {str(value)[:60]}): {error}. Expected a 1-D list, "
                "numpy array or LongTensor of ints; tokenize the text in the dataset."
            ) from None
    if tensor.dim() != 1:
        raise ValueError(
            f"Field {field!r} of {where} must be a 1-D sequence of token ids, got shape "
            f"{tuple(tensor.shape)}."
        )
    if tensor.dtype is torch.long:
        return tensor
    if tensor.dtype not in _INTEGER_DTYPES and tensor.numel():
        raise TypeError(
            f"Field {field!r} of {where} holds {tensor.dtype} values "
            f"({tensor[:5].tolist()}...); expected integer token ids (a float or bool would be "
            "silently cut to an id). Store the ids as ints."
        )
    return tensor.long()


def _row(value: Any, field: str, items: Sequence[Any], position: int) -> torch.Tensor:
    """One item's token field as a 1-D long tensor (a long tensor passes without a check)."""
    if isinstance(value, torch.Tensor) and value.dtype is torch.long and value.dim() == 1:
        return value  # the common case, checked cheaply
    return as_tokens(value, field, item_label(items, position))


def _arrow_field(items: ColumnarItems, field: str) -> Ragged:
    """A token column of a micro-batch read as Arrow, checked, as flat values and lengths."""
    column = items.table.column(field)
    problem = arrow_list_problem(column)
    if problem is None:
        return Ragged.from_arrow(column)
    position, what, error = problem
    raise error(f"Field {field!r} of {item_label(items, position)} {what}.")


def ragged_field(items: Sequence[Any], field: str) -> Ragged:
    """One token field of a micro-batch as flat values plus lengths, every row checked.

    ``items``: a list of mappings or :class:`~.columnar.ColumnarItems`; each row must be a 1-D
    sequence of integer token ids (errors name the field and the item).

    Example:
        >>> ragged_field([{"tokens": [1, 2]}, {"tokens": [3]}], "tokens").lengths.tolist()
        [2, 1]
    """
    if isinstance(items, ColumnarItems):
        return _arrow_field(items, field)
    return Ragged.from_rows([_row(item[field], field, items, i) for i, item in enumerate(items)])


def other_entries(items: Sequence[Any], fields: Sequence[str]) -> dict[str, Any]:
    """The items' non-token entries: ints as a ``(batch,)`` long tensor, others as a list.

    Example:
        >>> other_entries([{"tokens": [1], "id": 4}, {"tokens": [2], "id": 7}], ["tokens"])
        {'id': tensor([4, 7])}
    """
    out: dict[str, Any] = {}
    if isinstance(items, ColumnarItems):
        import pyarrow as pa

        for name in items.column_names:
            if name in fields:
                continue
            column = items.table.column(name)
            if pa.types.is_integer(column.type) and not column.null_count:
                out[name] = torch.from_numpy(column.to_numpy().astype(np.int64))
            else:
                out[name] = column.to_pylist()
        return out
    for name in items[0]:
        if name in fields:
            continue
        values = [item.get(name) for item in items]
        if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
            out[name] = torch.tensor(values, dtype=torch.long)
        else:
            out[name] = values
    return out
