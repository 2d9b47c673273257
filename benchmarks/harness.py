"""Plumbing shared by the benchmark scripts: timing, memory, tables, the machine line, JSON.

Nothing here knows what is benchmarked. :mod:`benchmarks.planning`,
:mod:`benchmarks.training_throughput`, :mod:`benchmarks.straggler`,
:mod:`benchmarks.gpu_throughput` and :mod:`benchmarks.run_all` import from it; it imports no
other module of ``benchmarks``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import platform
import re
import subprocess
import time
import tracemalloc
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, TypeVar

T = TypeVar("T")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
"""The repository root (the benchmarks run as ``python -m benchmarks.<name>`` from there)."""


# -- time and memory -----------------------------------------------------------------------------


def timed(fn: Callable[[], T]) -> tuple[float, T]:
    """(seconds, result) of ``fn()``, after a full (untimed) garbage collection."""
    gc.collect()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def traced(fn: Callable[[], T]) -> tuple[int, int, T]:
    """Run ``fn`` under tracemalloc: (peak bytes, bytes still held with the result alive)."""
    gc.collect()
    tracemalloc.start()
    tracemalloc.reset_peak()
    out = fn()
    current, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak, current, out


def proc_kib(field: str) -> int | None:
    """A ``kB`` field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``), ``None`` if unsupported."""
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def reset_hwm() -> bool:
    """Reset the resident-set high-water mark (``VmHWM``) to the current RSS (Linux only)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


def rss_peak(fn: Callable[[], T]) -> tuple[int | None, T]:
    """Rise of the resident-set high-water mark over ``fn`` (bytes), ``None`` if unsupported."""
    gc.collect()
    if not reset_hwm():
        return None, fn()
    before = proc_kib("VmRSS")
    out = fn()
    after = proc_kib("VmHWM")
    if before is None or after is None:
        return None, out
    return (after - before) * 1024, out


# -- tables --------------------------------------------------------------------------------------


def fmt(x: object, spec: str = ".3f") -> str:
    """A table cell: ``-`` for None/NaN, strings as they are, ``.3f`` floats >= 1e4 as ``.3g``."""
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    if isinstance(x, str):
        return x
    if spec == ".3f" and isinstance(x, float) and abs(x) >= 1e4:
        return format(x, ".3g")
    return format(x, spec)


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
    """Print a plain-text table: the first column left-aligned, the others right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True)]
        return "  ".join([first, *rest])

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for r in rows:
        print(line(r))


# -- the machine and the run ---------------------------------------------------------------------


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def git_revision() -> str:
    """The short hash of ``HEAD`` (``?`` when git cannot run)."""
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return "?"


def git_dirty(path: str) -> bool:
    """Whether ``path`` has uncommitted changes (``False`` when git cannot run)."""
    try:
        return bool(
            subprocess.run(
                ["git", "status", "--porcelain", path], capture_output=True, text=True, check=False
            ).stdout.strip()
        )
    except OSError:
        return False


def load_average() -> str:
    try:
        return "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        return "load average ?"


def uptime() -> str:
    """The output of ``uptime`` (the load average alone where it cannot run)."""
    try:
        return subprocess.run(
            ["uptime"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return load_average()


def machine_line(versions: str, *, with_load: bool = False) -> str:
    """``<UTC time>; <arch>, <n> CPUs[, load average ...]; Python <v>, <versions>; git <rev>``."""
    load = f", {load_average()}" if with_load else ""
    return (
        f"{utc_now()}; {platform.machine()}, {os.cpu_count()} CPUs{load}; "
        f"Python {platform.python_version()}, {versions}; git {git_revision()}"
    )


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository root on ``PYTHONPATH`` (for children)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def write_json(path: str | None, data: Any) -> None:
    """Write ``data`` to ``path`` (the ``--json`` option of every script); nothing if ``None``."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)
