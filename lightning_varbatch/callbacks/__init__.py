"""Callbacks for token-budgeted batches: LR scaling, global throughput, the worst-batch check.

:func:`check_names` lists what :class:`WorstBatchCheck` runs for a sampler (its kinds, then
one micro-batch per static shape).

The callbacks need Lightning; they are imported on first use, so the pure maths of this package
(:mod:`~lightning_varbatch.callbacks.throughput_window`) imports without torch or Lightning.

Example:
    >>> from lightning_varbatch.callbacks import BatchSizeLRScaler, TokenThroughputMonitor
    >>> callbacks = [BatchSizeLRScaler(rule="sqrt", reference=8192), TokenThroughputMonitor()]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_varbatch.callbacks.lr_scaling import BatchSizeLRScaler
    from lightning_varbatch.callbacks.rank_balancer import RankShareBalancer
    from lightning_varbatch.callbacks.throughput import TokenThroughputMonitor
    from lightning_varbatch.callbacks.worst_batch import WorstBatchCheck
    from lightning_varbatch.callbacks.worst_micro_batches import check_names
    from lightning_varbatch.data.lightning_loop import follow_epoch_length

_WHERE = {
    "BatchSizeLRScaler": "lightning_varbatch.callbacks.lr_scaling",
    "RankShareBalancer": "lightning_varbatch.callbacks.rank_balancer",
    "TokenThroughputMonitor": "lightning_varbatch.callbacks.throughput",
    "WorstBatchCheck": "lightning_varbatch.callbacks.worst_batch",
    "check_names": "lightning_varbatch.callbacks.worst_micro_batches",
    "follow_epoch_length": "lightning_varbatch.data.lightning_loop",
}

__all__ = [
    "BatchSizeLRScaler",
    "RankShareBalancer",
    "TokenThroughputMonitor",
    "WorstBatchCheck",
    "check_names",
    "follow_epoch_length",
]


def __getattr__(name: str) -> Any:
    """Import a callback from its module on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_varbatch.callbacks' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})
