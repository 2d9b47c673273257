"""Callbacks for token-budgeted batches: LR scaling, global throughput, the worst-batch check.

The LR rule and the throughput meter are plain objects (:class:`BatchSizeLRRule`,
:class:`TokenThroughputMeter`) that any loop calls; the callbacks are their Trainer adapters.
:func:`check_names` lists what :class:`WorstBatchCheck` runs for a sampler (its kinds, then one
micro-batch per static shape). The callbacks need Lightning; they are imported on first use, so
the pure maths (:mod:`~lightning_varbatch.callbacks.throughput_window`) needs neither it nor torch.

Example:
    >>> from lightning_varbatch.callbacks import BatchSizeLRScaler, TokenThroughputMonitor
    >>> callbacks = [BatchSizeLRScaler(rule="sqrt", reference=8192), TokenThroughputMonitor()]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning_varbatch.callbacks.lr_scaling import BatchSizeLRRule
    from lightning_varbatch.callbacks.rank_balancer import RankShareBalancer
    from lightning_varbatch.callbacks.throughput import TokenThroughputMeter
    from lightning_varbatch.callbacks.trainer_adapters import (
        BatchSizeLRScaler,
        TokenThroughputMonitor,
    )
    from lightning_varbatch.callbacks.worst_batch import WorstBatchCheck
    from lightning_varbatch.callbacks.worst_micro_batches import check_names
    from lightning_varbatch.data.lightning_loop import follow_epoch_length

_WHERE = {
    "BatchSizeLRRule": "lightning_varbatch.callbacks.lr_scaling",
    "BatchSizeLRScaler": "lightning_varbatch.callbacks.trainer_adapters",
    "RankShareBalancer": "lightning_varbatch.callbacks.rank_balancer",
    "TokenThroughputMeter": "lightning_varbatch.callbacks.throughput",
    "TokenThroughputMonitor": "lightning_varbatch.callbacks.trainer_adapters",
    "WorstBatchCheck": "lightning_varbatch.callbacks.worst_batch",
    "check_names": "lightning_varbatch.callbacks.worst_micro_batches",
    "follow_epoch_length": "lightning_varbatch.data.lightning_loop",
}

__all__ = [
    "BatchSizeLRRule",
    "BatchSizeLRScaler",
    "RankShareBalancer",
    "TokenThroughputMeter",
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
