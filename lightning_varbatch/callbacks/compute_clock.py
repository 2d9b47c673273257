"""A rank's own compute time: the host clock on CPU, CUDA events on a GPU.

A GPU runs kernels after the host queued them: host time from ``on_train_batch_start`` to
``on_before_backward`` is not the forward's; current-stream events are (read once a window).

Example:
    >>> clock = ComputeClock(torch.device("cpu"))
    >>> clock.interval(clock.mark(), clock.mark()) >= 0.0, clock.collect()
    (True, 0.0)
"""

from __future__ import annotations

from time import perf_counter
from typing import Any

import torch

__all__ = ["ComputeClock"]


class ComputeClock:
    """Seconds between two marks on ``device``: ``perf_counter``, or CUDA events on a GPU.

    Args:
        device: the rank's device (``trainer.strategy.root_device``).

    Example:
        >>> ComputeClock(torch.device("cpu")).interval(1.0, 3.5)
        2.5
    """

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.device = device
        self.pending: list[tuple[Any, Any]] = []

    def mark(self) -> Any:
        """Now: a ``perf_counter`` reading, or a CUDA event recorded on the current stream."""
        if not self.cuda:
            return perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def interval(self, start: Any, end: Any) -> float:
        """Seconds from ``start`` to ``end`` (CUDA: 0 now, counted by :meth:`collect`)."""
        if not self.cuda:
            return float(end - start)
        self.pending.append((start, end))
        return 0.0

    def collect(self) -> float:
        """Seconds of the CUDA intervals not read yet (0 on CPU); synchronizes the device."""
        if not self.pending:
            return 0.0
        torch.cuda.synchronize(self.device)
        seconds = sum(start.elapsed_time(end) for start, end in self.pending) / 1000.0
        self.pending = []
        return seconds
