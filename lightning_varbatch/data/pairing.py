"""One rule pairing a plan with its collate: the default, and the check of a user's collate.

A plan's ``layout`` decides which collate keeps its micro-batches within ``max_tokens``:

=========================  =====================================  ============================
plan                       default collate                        refused
=========================  =====================================  ============================
``layout="padded"``        :class:`PaddingCollate`                :class:`PackingCollate`
``layout="packed"``        :class:`PackingCollate`                :class:`PaddingCollate`
``max_shapes=k``           :class:`PaddingCollate` (pads every    :class:`PackingCollate`
                           micro-batch to its plan's shape)
=========================  =====================================  ============================

A library collate whose ``pad_to_multiple_of`` does not divide the plan's would pad wider than
planned and is refused too. A plain callable is accepted as it is (keeping the budget is its
own job). :func:`collate_for_plan` is that rule, used by every loader and DataModule;
:func:`column_keys` names the default collate's fields after the lengths' columns.

Example:
    >>> from lightning_varbatch import PlanConfig
    >>> type(collate_for_plan(PlanConfig(max_tokens=64, layout="packed"), None)).__name__
    'PackingCollate'
    >>> collate_for_plan(PlanConfig(max_tokens=64), PackingCollate())  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    lightning_varbatch.errors.SettingValueError: collate=PackingCollate(...) cannot collate ...
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from lightning_varbatch.data.collate import PaddingCollate
from lightning_varbatch.data.packed_collate import PackingCollate
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["collate_for_plan", "column_keys", "plan_layout", "source_column_keys"]

#: The collates that read the plan (truncation, Arrow micro-batches, the first-item check).
PLAN_COLLATES = (PaddingCollate, PackingCollate)

Keys = Mapping[str, str]


def plan_layout(config: PlanConfig) -> str:
    """The plan's layout as the pairing rule sees it: padded, packed or max_shapes.

    Example:
        >>> plan_layout(PlanConfig(max_tokens=64, max_shapes=2))
        'max_shapes'
    """
    if config.max_shapes is not None:
        return "max_shapes"
    return str(config.layout)


def _setting(config: PlanConfig) -> str:
    """The plan setting that makes its layout, as the user wrote it."""
    if config.max_shapes is not None:
        return f"max_shapes={config.max_shapes}"
    return f"layout={config.layout!r}"


def collate_for_plan(
    config: PlanConfig,
    collate: Callable[[Any], Any] | None,
    *,
    loss_offset: int | None = None,
    keys: Keys | Callable[[], Keys] | None = None,
    setting: str = "collate",
) -> Callable[[Any], Any]:
    """The collate of a plan: its default, or the user's once checked against the plan.

    Args:
        config: the plan's settings (``layout``, ``max_shapes``, ``pad_to_multiple_of``).
        collate: the user's collate, or ``None`` for the plan's default.
        loss_offset: the plan's ``loss_offset``: the default :class:`PaddingCollate` gets it,
            a given checking one must have it (when not 0); a packed row counts length - 1, so
            a packed plan with an offset needs ``loss_offset=1`` (``None``: counts unknown).
        keys: the default's field names (``source_key``/``target_key`` or ``tokens_key``;
            :func:`column_keys`), or a callable returning them (called only for the default).
        setting: the argument the collate was given as (``"collate"``, ``"collate_fn"``).

    Returns:
        ``collate`` unchanged when it fits the plan, else the default.

    Raises:
        SettingTypeError: for a ``collate`` that is not callable.
        SettingValueError: for a library collate unfit for the plan (naming setting and class).

    Example:
        >>> c = collate_for_plan(PlanConfig(max_tokens=64, pad_to_multiple_of=8), None,
        ...                      keys={"tokens_key": "input_ids"})
        >>> type(c).__name__, c.tokens_key, c.pad_to_multiple_of
        ('PaddingCollate', 'input_ids', 8)
    """
    layout = plan_layout(config)
    if collate is None:
        names: dict[str, Any] = dict(keys() if callable(keys) else (keys or {}))
        if layout == "packed":
            if "source_key" in names:
                raise SettingValueError(
                    f"{_setting(config)} packs one token field per example, but the lengths "
                    f"name a (source, target) pair of columns ({names['source_key']!r}, "
                    f"{names['target_key']!r}): pack one column (lengths naming it) or use "
                    "layout='padded'.",
                    setting="layout",
                    value=config.layout,
                )
            if loss_offset is not None and loss_offset != 1:
                raise SettingValueError(
                    f"{_setting(config)} is collated by PackingCollate, whose loss tokens are "
                    "each example's length minus one (its last token predicts nothing), but "
                    f"the plan counts length minus loss_offset={loss_offset}: pass "
                    "loss_offset=1 (or a collate of your own).",
                    setting="loss_offset",
                    value=loss_offset,
                )
            return PackingCollate(pad_to_multiple_of=config.pad_to_multiple_of, **names)
        return PaddingCollate(
            pad_to_multiple_of=config.pad_to_multiple_of, loss_offset=loss_offset or 0, **names
        )
    if not callable(collate):
        raise SettingTypeError(
            f"{setting} must be callable (e.g. PaddingCollate(...)) or None, got "
            f"{type(collate).__name__} {collate!r}.",
            setting=setting,
            value=collate,
        )
    kind = type(collate).__name__
    wanted = "PackingCollate" if layout == "packed" else "PaddingCollate"
    why = {
        "packed": "its micro-batches are budgeted as one packed row of their real tokens; "
        "padding each example to the longest would exceed max_tokens",
        "padded": "its micro-batches are budgeted as (examples x longest) padded slots, not "
        "as one packed row",
        "max_shapes": "every micro-batch must be padded to its plan's static shape, which a "
        "packed row is not",
    }[layout]
    if isinstance(collate, PLAN_COLLATES) and not isinstance(
        collate, PackingCollate if layout == "packed" else PaddingCollate
    ):
        raise SettingValueError(
            f"{setting}={kind}(...) cannot collate a plan made with {_setting(config)}: {why}. "
            f"Pass {setting}={wanted}(...) (or leave {setting} unset: the plan's default is "
            f"{wanted}), or plan with "
            + ("layout='padded'." if layout == "packed" else "layout='packed'.")
            + " A plain function of your own is accepted as it is (its budget is yours).",
            setting=setting,
            value=collate,
        )
    _check_loss_offset(collate, loss_offset, setting)
    if isinstance(collate, PLAN_COLLATES) and layout != "max_shapes":
        planned = config.pad_to_multiple_of
        if planned % collate.pad_to_multiple_of:
            raise SettingValueError(
                f"{setting}={kind}(pad_to_multiple_of={collate.pad_to_multiple_of}) pads wider "
                f"than the plan, made with pad_to_multiple_of={planned}: its micro-batches "
                "would exceed max_tokens. Give the sampler (or DataModule) the same "
                "pad_to_multiple_of as the collate.",
                setting=setting,
                value=collate,
            )
    return collate


def _check_loss_offset(collate: Any, loss_offset: int | None, setting: str) -> None:
    """Refuse a checking PaddingCollate whose ``loss_offset`` is not the plan's (if it has one)."""
    if not loss_offset or not isinstance(collate, PaddingCollate) or not collate.check_ntokens:
        return
    if collate.loss_offset != loss_offset:
        raise SettingValueError(
            f"{setting}=PaddingCollate(loss_offset={collate.loss_offset}) counts each "
            f"example's loss tokens as its length minus {collate.loss_offset}, but the plan "
            f"counts them with loss_offset={loss_offset}: every micro-batch's count would "
            f"disagree with the plan. Pass PaddingCollate(loss_offset={loss_offset}) (or leave "
            f"{setting} unset: the default collate takes the plan's loss_offset).",
            setting=setting,
            value=collate,
        )


def _is_token_type(kind: Any) -> bool:
    import pyarrow as pa

    checks = ("is_list", "is_large_list", "is_fixed_size_list", "is_list_view")
    return any(getattr(pa.types, name, lambda _: False)(kind) for name in checks)


def column_keys(columns: Any, token_columns: Callable[[str], bool | None]) -> dict[str, str]:
    """The default collate's field names for lengths read from ``columns``.

    A (source, target) pair of token-id columns names ``source_key``/``target_key``, one token-id
    column ``tokens_key``; a column of lengths names nothing (the collate keeps its defaults).

    Args:
        columns: the lengths' columns (``"ids"``, ``("src", "tgt")``), or anything else (no names).
        token_columns: whether a column holds token ids (``None``: unknown).

    Example:
        >>> column_keys(("src_ids", "tgt_ids"), lambda c: True)
        {'source_key': 'src_ids', 'target_key': 'tgt_ids'}
        >>> column_keys("input_ids", lambda c: True), column_keys("n", lambda c: False)
        ({'tokens_key': 'input_ids'}, {})
    """
    if isinstance(columns, str):
        names = [columns]
    elif isinstance(columns, (list, tuple)) and all(isinstance(c, str) for c in columns):
        names = list(columns)
    else:
        return {}
    if not names or not all(token_columns(c) for c in names):
        return {}
    if len(names) == 2:
        return {"source_key": names[0], "target_key": names[1]}
    if len(names) == 1:
        return {"tokens_key": names[0]}
    return {}


def dataset_column_keys(dataset: Any, columns: Any) -> dict[str, str]:
    """:func:`column_keys` for a Hugging Face dataset (or Arrow table): its schema decides.

    Example:
        >>> import pyarrow as pa
        >>> dataset_column_keys(pa.table({"ids": [[1]], "n": [1]}), "ids")
        {'tokens_key': 'ids'}
    """
    schema = getattr(getattr(dataset, "data", dataset), "schema", None)
    if schema is None:
        return {}

    def tokens(name: str) -> bool | None:
        if name not in schema.names:
            return None
        return _is_token_type(schema.field(name).type)

    return column_keys(columns, tokens)


def _shard_token_column(shard: Any, name: str) -> bool | None:
    """Whether ``name`` is a token-id column of ``shard``, read from its schema (no rows)."""
    path: Any = getattr(shard, "path", None)
    suffix = getattr(path, "suffix", "")
    try:
        if suffix == ".parquet":
            import pyarrow.parquet as pq

            schema = pq.read_schema(path)
        elif suffix in (".arrow", ".feather", ".ipc"):
            import pyarrow as pa

            with pa.memory_map(str(path)) as source:
                try:
                    schema = pa.ipc.open_file(source).schema
                except pa.ArrowInvalid:
                    schema = pa.ipc.open_stream(source).schema
        elif suffix == ".jsonl":
            with open(path, encoding="utf-8") as handle:
                for line in handle:
                    if line.strip():
                        value = json.loads(line).get(name)
                        return isinstance(value, list)
            return None
        else:
            features = getattr(getattr(shard, "dataset", None), "features", None)
            if features is None or name not in features:
                return None
            return not hasattr(features[name], "dtype") or features[name].dtype == "list"
    except (OSError, ValueError, AttributeError):
        return None
    if name not in schema.names:
        return None
    return _is_token_type(schema.field(name).type)


def source_column_keys(source: Any) -> dict[str, str]:
    """:func:`column_keys` for a ``ShardedSource``: its first shard's schema (no row is read)."""
    shards = getattr(source, "shards", None) or []
    if not shards:
        return {}
    return column_keys(
        getattr(source, "columns", None), lambda c: _shard_token_column(shards[0], c)
    )
