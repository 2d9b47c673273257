"""Peak memory of one piece of work, on a CUDA device or as the process's resident set.

:func:`measure_peak` is what :class:`~lightning_varbatch.callbacks.WorstBatchCheck` reports and
:func:`~lightning_varbatch.find_max_tokens` probes compare with a limit: the peak of everything in
use while ``fn`` ran. :func:`measure_peak_rise` is that less what was in use just before ``fn``
(what a benchmark reports as the memory a step adds on top of the model and data). torch is
imported only for a non-CPU device, so numpy-only code (the planner benchmarks) need not load it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import torch

__all__ = ["measure_peak", "measure_peak_rise", "process_status_bytes", "reset_rss_peak"]

T = TypeVar("T")


def process_status_bytes(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``"VmRSS"``, ``"VmHWM"``) in bytes, else ``None``.

    Example:
        >>> value = process_status_bytes("VmRSS")
        >>> value is None or value > 0
        True
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def reset_rss_peak() -> bool:
    """Reset the process's ``VmHWM`` to its RSS (Linux ``/proc/self/clear_refs``): whether it could.

    Example:
        >>> isinstance(reset_rss_peak(), bool)
        True
    """
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def _cuda_device(device: torch.device | str | None) -> Any:
    """A CUDA ``device`` as a ``torch.device``, else ``None`` (None/"cpu" import no torch)."""
    if device is None or (isinstance(device, str) and device == "cpu"):
        return None
    import torch

    dev = torch.device(device)
    return dev if dev.type == "cuda" else None


def _cpu_peak() -> int:
    peak = process_status_bytes("VmHWM")
    if peak is not None:
        return peak
    import resource  # not on Windows; there /proc is missing too

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def measure_peak(
    fn: Callable[[], T], device: torch.device | str | None = None
) -> tuple[T, int, str]:
    """Run ``fn()`` and measure the peak memory it needed.

    On a CUDA device: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats``
    (everything allocated on the device, weights and optimizer state included), source
    ``"cuda_max_allocated"``. Elsewhere: the process's peak resident set (Linux ``VmHWM``, reset to
    the current RSS first: :func:`reset_rss_peak`), source ``"cpu_vmhwm"``; where it cannot be
    reset, the peak since the process started (``"cpu_vmhwm_unreset"``, or ``"cpu_ru_maxrss"``
    without ``/proc``). CPU figures include everything the process holds (the Python runtime, the
    dataset), and memory ``malloc`` keeps after one probe is counted by the next too.

    Args:
        fn: what to measure.
        device: the device ``fn`` computes on (default: CPU).

    Returns:
        ``(fn's result, peak bytes, source)``.

    Example:
        >>> import torch
        >>> _, peak, source = measure_peak(lambda: torch.ones(1 << 20).sum())
        >>> peak > 0, source.startswith("cpu")
        (True, True)
    """
    dev = _cuda_device(device)
    if dev is not None:
        import torch

        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        result = fn()
        torch.cuda.synchronize(dev)
        return result, int(torch.cuda.max_memory_allocated(dev)), "cuda_max_allocated"
    reset = reset_rss_peak()
    result = fn()
    peak = _cpu_peak()
    has_proc = process_status_bytes("VmHWM") is not None
    if not has_proc:
        source = "cpu_ru_maxrss"
    else:
        source = "cpu_vmhwm" if reset else "cpu_vmhwm_unreset"
    return result, peak, source


def measure_peak_rise(
    fn: Callable[[], T], device: torch.device | str | None = None
) -> tuple[T, int | None, str]:
    """Run ``fn()`` and measure how far its peak rose above what was in use before it.

    On a CUDA device: ``max_memory_allocated`` during ``fn`` less ``memory_allocated`` just before
    (source ``"cuda_max_allocated"``). Elsewhere: the process's ``VmHWM`` after ``fn`` less its
    ``VmRSS`` just after the reset (source ``"cpu_vmhwm"``); ``None`` where the peak cannot be reset
    (no ``/proc``), as a peak since the process started says nothing about ``fn``.

    Args:
        fn: what to measure.
        device: the device ``fn`` computes on (default: CPU).

    Returns:
        ``(fn's result, bytes above the start or None, source)``.

    Example:
        >>> import torch
        >>> _, rise, source = measure_peak_rise(lambda: torch.ones(1 << 22).add_(1).sum())
        >>> rise is None or rise >= 0, source
        (True, 'cpu_vmhwm')
    """
    dev = _cuda_device(device)
    if dev is not None:
        import torch

        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        before = int(torch.cuda.memory_allocated(dev))
        result = fn()
        torch.cuda.synchronize(dev)
        return result, int(torch.cuda.max_memory_allocated(dev)) - before, "cuda_max_allocated"
    if not reset_rss_peak():
        return fn(), None, "cpu_vmhwm"
    start = process_status_bytes("VmRSS")
    result = fn()
    after = process_status_bytes("VmHWM")
    if start is None or after is None:
        return result, None, "cpu_vmhwm"
    return result, after - start, "cpu_vmhwm"
