"""Plumbing shared by the benchmark scripts: timing, memory, tables, the machine line, JSON,
child processes and the settings of a training run.

Nothing here knows what is benchmarked; every benchmark imports from it and it imports no other
module of ``benchmarks``.

**The child-process protocol.** A benchmark that measures in a fresh process runs itself as
``python -m benchmarks.<name> <child options>``: the child prints each result as one line
``RESULT <json>`` (:func:`emit_result`), anything else it prints is ignored; the parent runs it
with :func:`run_child` (or several at once, the ranks of a process group, with
:func:`run_children`) and gets the decoded results in order. A child that exits non-zero, prints
no result or outlives its timeout raises :class:`ChildFailed`, which names the command and ends
with the child's stderr.

**The settings of a training run.** :class:`TrainingSettings` holds what every training
benchmark's run depends on (budget, model size, optimizer, steps, seed, threads, device); a
benchmark subclasses it with the fields of its own workload and passes it to its children as
JSON (:meth:`TrainingSettings.to_json`, :meth:`TrainingSettings.from_json`).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import re
import subprocess
import sys
import time
import tracemalloc
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from typing import Any, TypeVar

T = TypeVar("T")
S = TypeVar("S", bound="TrainingSettings")

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
    return bool(git_changed([path]))


def git_changed(paths: Sequence[str]) -> list[str]:
    """The files under ``paths`` with uncommitted changes, from the root (none without git)."""
    try:
        out = subprocess.run(
            ["git", "status", "--porcelain", "--", *paths],
            capture_output=True,
            text=True,
            check=False,
            cwd=ROOT,
        ).stdout
    except OSError:
        return []
    return sorted(line[3:] for line in out.splitlines() if line.strip())


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


def torch_machine_line() -> str:
    """:func:`machine_line` of a training benchmark: torch's version and the load average."""
    import torch

    return machine_line(f"torch {torch.__version__}", with_load=True)


def child_env(**extra: str) -> dict[str, str]:
    """This process's environment with the repository root on ``PYTHONPATH`` (for children)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.update(extra)
    return env


def run_program(command: Sequence[str], log_path: str | os.PathLike[str]) -> None:
    """Run a whole program (an example's ``train.py``) from the repository root, output to a log.

    For benchmarks that measure a program by the files it writes (``metrics.json``), not by
    result lines (those go through :func:`run_child`).

    Raises:
        subprocess.CalledProcessError: when it exits with another code than 0 (see the log).

    Example:
        >>> import sys, tempfile, os
        >>> log = os.path.join(tempfile.mkdtemp(), "run.log")
        >>> run_program([sys.executable, "-c", "print('hi')"], log)
        >>> open(log).read()
        'hi\\n'
    """
    with open(log_path, "w") as log:
        subprocess.run(
            list(command),
            cwd=ROOT,
            env=child_env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            check=True,
        )


def write_json(path: str | None, data: Any) -> None:
    """Write ``data`` to ``path`` (the ``--json`` option of every script); nothing if ``None``."""
    if path:
        with open(path, "w") as f:
            json.dump(data, f, indent=1)


# -- child processes -----------------------------------------------------------------------------

RESULT_PREFIX = "RESULT "
"""What starts a result line on a child's stdout; the rest of the line is JSON."""

TAIL_CHARS = 3000
"""How much of a failed child's stderr (and stdout) :class:`ChildFailed` shows."""


def emit_result(value: Any) -> None:
    """Print ``value`` as one result line for the parent (the child's side of the protocol).

    Example:
        >>> emit_result({"steps": 3, "seconds": 0.5})
        RESULT {"steps": 3, "seconds": 0.5}
    """
    print(RESULT_PREFIX + json.dumps(value), flush=True)


def read_results(stdout: str) -> list[Any]:
    """The decoded values of the result lines in ``stdout``, in order; other lines are ignored.

    Example:
        >>> read_results('loading\\nRESULT {"a": 1}\\nRESULT [2, 3]\\n')
        [{'a': 1}, [2, 3]]
    """
    n = len(RESULT_PREFIX)
    return [json.loads(line[n:]) for line in stdout.splitlines() if line.startswith(RESULT_PREFIX)]


@dataclass(frozen=True)
class ChildFailure:
    """One child that did not report: its command, why, and the end of what it printed."""

    command: tuple[str, ...]
    returncode: int | None
    """The exit code; ``None`` when it was killed after the timeout."""
    reason: str
    """``exited with code N``, ``printed no RESULT line`` or ``timed out after N s``."""
    stderr: str
    """The last :data:`TAIL_CHARS` characters of its stderr."""
    stdout: str
    """The last :data:`TAIL_CHARS` characters of its stdout (the result lines included)."""

    def describe(self) -> str:
        shown = " ".join(self.command[1:]) if self.command[:1] == (sys.executable,) else ""
        command = f"python {shown}" if shown else " ".join(self.command)
        text = f"benchmark child `{command}` {self.reason}"
        if self.stdout.strip():
            text += f"; its stdout ends:\n{self.stdout.rstrip()}"
        return text + f"\nits stderr ends:\n{self.stderr.rstrip() or '(nothing)'}"


class ChildFailed(RuntimeError):
    """A benchmark child exited non-zero, printed no result line, or outlived its timeout.

    ``failures`` holds one :class:`ChildFailure` per child that did not report (every rank of
    a group that failed together).
    """

    def __init__(self, failures: Sequence[ChildFailure]) -> None:
        self.failures = tuple(failures)
        super().__init__("\n\n".join(f.describe() for f in self.failures))


def child_command(module: str, *args: str) -> list[str]:
    """``[python, -m, module, *args]``: a benchmark module run as a child of this interpreter.

    Example:
        >>> child_command("benchmarks.training.packing", "--child", "packed")[1:]
        ['-m', 'benchmarks.training.packing', '--child', 'packed']
    """
    return [sys.executable, "-m", module, *args]


def run_child(
    command: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> list[Any]:
    """Run ``command`` (see :func:`child_command`) from the repository root; its results.

    Args:
        command: the child's argv.
        env: its whole environment; default :func:`child_env` (the repository on
            ``PYTHONPATH``).
        timeout: seconds before it is killed; ``None``: no limit.

    Returns:
        The values the child passed to :func:`emit_result`, in order (at least one).

    Raises:
        ChildFailed: it exited non-zero, printed no result line or ran past ``timeout``.

    Example:
        >>> code = "from benchmarks.harness import emit_result; emit_result({'x': 1})"
        >>> run_child([sys.executable, "-c", code])
        [{'x': 1}]
    """
    return run_children([command], env=env, timeout=timeout)[0]


def run_children(
    commands: Sequence[Sequence[str]],
    *,
    env: Mapping[str, str] | None = None,
    timeout: float | None = None,
) -> list[list[Any]]:
    """Run ``commands`` at the same time (the ranks of a process group); each one's results.

    Every child must exit with code 0 and print at least one result line before ``timeout``
    (one deadline for all); when one runs past it, all are killed.

    Raises:
        ChildFailed: naming every child that did not report.

    Example:
        >>> code = "import sys, benchmarks.harness as h; h.emit_result(sys.argv[1])"
        >>> run_children([[sys.executable, "-c", code, str(r)] for r in range(2)])
        [['0'], ['1']]
    """
    procs = [
        subprocess.Popen(
            list(cmd),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=dict(child_env() if env is None else env),
            cwd=ROOT,
        )
        for cmd in commands
    ]
    deadline = None if timeout is None else time.monotonic() + timeout
    results: list[list[Any]] = []
    failures: list[ChildFailure] = []
    for cmd, proc in zip(commands, procs, strict=True):
        reason = ""
        try:
            left = None if deadline is None else max(1.0, deadline - time.monotonic())
            stdout, stderr = proc.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            stdout, stderr = proc.communicate()
            reason = f"timed out after {timeout:.0f} s"
        found = read_results(stdout)
        if not reason and proc.returncode != 0:
            reason = f"exited with code {proc.returncode}"
        if not reason and not found:
            reason = "printed no RESULT line"
        if reason:
            code = None if reason.startswith("timed out") else proc.returncode
            tail = TAIL_CHARS
            failures.append(ChildFailure(tuple(cmd), code, reason, stderr[-tail:], stdout[-tail:]))
        results.append(found)
    if failures:
        raise ChildFailed(failures)
    return results


def run_training_child(
    module: str, kind: str, settings: TrainingSettings, **extra_env: str
) -> dict[str, Any]:
    """One training run in a fresh ``python -m <module> --child <kind> --settings <json>``.

    The child's environment is :func:`child_env` with ``extra_env``, and ``OMP_NUM_THREADS``
    set to ``settings.threads`` unless this process's environment sets it.

    Returns:
        The child's one result (its run's figures).

    Raises:
        ChildFailed: as :func:`run_child`.
    """
    env = child_env(**extra_env)
    env.setdefault("OMP_NUM_THREADS", str(settings.threads))
    command = child_command(module, "--child", kind, "--settings", settings.to_json())
    result: dict[str, Any] = run_child(command, env=env)[0]
    return result


def add_child_options(parser: argparse.ArgumentParser, kinds: Sequence[str]) -> None:
    """The hidden options of a training benchmark's child: ``--child KIND --settings JSON``."""
    parser.add_argument("--child", choices=kinds, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--settings", default=None, help=argparse.SUPPRESS)


def command_line(module: str, argv: Sequence[str] | None) -> str:
    """``python -m <module> <arguments>``: how this run was started (``argv`` or the real one).

    Example:
        >>> command_line("benchmarks.training.packing", ["--quick"])
        'python -m benchmarks.training.packing --quick'
    """
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    return f"python -m {module} {shown}".rstrip()


# -- GPU benchmarks ------------------------------------------------------------------------------


def refuse_device(module: str, device: str, tiny: bool, what: str, cpu_module: str) -> bool:
    """Whether a GPU benchmark must refuse this device (it says why on stderr, exit code 2).

    It refuses ``cuda`` without a CUDA device, and a CPU without ``--tiny`` (``what``, its
    sizes, would take hours there; ``cpu_module`` measures on CPU).
    """
    import torch

    name = module.rsplit(".", 1)[-1]
    if device.startswith("cuda") and not torch.cuda.is_available():
        print(
            f"{name}: no CUDA device (torch.cuda.is_available() is False; torch "
            f"{torch.__version__}). This benchmark needs one CUDA GPU and a CUDA build of torch. "
            f"To check the code path on CPU: python -m {module} --device cpu --tiny",
            file=sys.stderr,
        )
        return True
    if not device.startswith("cuda") and not tiny:
        print(
            f"{name}: {what} on a CPU would take hours; use --tiny with --device cpu (smoke "
            f"test), or {cpu_module} for CPU numbers.",
            file=sys.stderr,
        )
        return True
    return False


def gpu_line() -> str:
    """``<name>, <memory> GiB, CUDA <version>`` of the first CUDA device."""
    import torch

    props = torch.cuda.get_device_properties(0)
    return f"{props.name}, {props.total_memory / 2**30:.0f} GiB, CUDA {torch.version.cuda}"


# -- the settings of a training run --------------------------------------------------------------


@dataclass(kw_only=True)
class TrainingSettings:
    """What every training benchmark's run depends on; a benchmark subclasses it with the
    settings of its own workload (documents, lengths) and gives its defaults as an instance.

    The budget, the model's size and the learning rate have no default: each workload states
    its own, once (``benchmarks.workload.DEFAULTS``, ``benchmarks.training.packing.DEFAULTS``,
    ``benchmarks.training.compile_shapes.DEFAULTS``).

    Example:
        >>> s = TrainingSettings(max_tokens=1024, vocab=500, d_model=32, nhead=2, layers=1,
        ...                      ffn=64, lr=1e-3)
        >>> TrainingSettings.from_json(s.to_json()) == s
        True
    """

    max_tokens: int
    """Tokens per micro-batch (the planner's ``max_tokens``)."""
    vocab: int
    d_model: int
    nhead: int
    layers: int
    ffn: int
    lr: float
    warmup: int = 2
    """Steps at the start of each run left out of the timing."""
    threads: int = 1
    """``torch.set_num_threads`` of each run."""
    seed: int = 0
    device: str = "cpu"
    bf16: bool = False
    """bf16 autocast (the loss in fp32)."""
    max_steps: int | None = None
    """Stop each run after this many steps (smoke tests); ``None``: the whole epoch."""

    def to_json(self) -> str:
        """These settings as JSON (a child's ``--settings`` argument)."""
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls: type[S], text: str) -> S:
        """The settings :meth:`to_json` wrote."""
        return cls(**json.loads(text))
