"""Callbacks for token-budgeted batches: LR scaling per optimizer step and global throughput.

Example:
    >>> from lightning_varbatch.callbacks import BatchSizeLRScaler, TokenThroughputMonitor
    >>> callbacks = [BatchSizeLRScaler(rule="sqrt", reference=8192), TokenThroughputMonitor()]
"""

from lightning_varbatch.callbacks.lr_scaling import BatchSizeLRScaler
from lightning_varbatch.callbacks.throughput import TokenThroughputMonitor

__all__ = ["BatchSizeLRScaler", "TokenThroughputMonitor"]
