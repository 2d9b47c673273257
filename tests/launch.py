"""Run a script as real processes, one per rank, and collect every rank's completion record."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

SCRIPTS = Path(__file__).parent / "scripts"
#: The test running now when it is not marked ``multiprocess`` (set by ``tests/conftest.py``):
#: :func:`launch` refuses it, so that the inner loop (``-m "not slow"``) starts no process group.
UNMARKED: str | None = None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rank_env(rank: int, world_size: int, port: int) -> dict[str, str]:
    """The environment torch.distributed and Lightning read for one rank on this machine."""
    return {
        **os.environ,
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(world_size),
        "LOCAL_WORLD_SIZE": str(world_size),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }


def start_ranks(
    argv: list[str], world_size: int, *, env: dict[str, str] | None = None, cwd: Path | None = None
) -> list[subprocess.Popen[str]]:
    """Start ``argv`` once per rank with :func:`rank_env` (plus ``env``), output captured.

    Refuses a test not marked ``multiprocess`` (:data:`UNMARKED`).
    """
    if UNMARKED is not None:
        raise RuntimeError(
            f"{UNMARKED} starts {world_size} processes but is not marked multiprocess: add "
            "@pytest.mark.multiprocess (the inner loop never starts a process group)"
        )
    port = free_port()
    return [
        subprocess.Popen(
            argv,
            cwd=cwd,
            env={**rank_env(rank, world_size, port), **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(world_size)
    ]


def wait_ranks(procs: list[subprocess.Popen[str]], what: str, timeout: float) -> list[str]:
    """Every rank's output once it exits; a rank that hangs kills them all and fails."""
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"{what}: a rank hung for {timeout}s") from None
    return logs


def launch(
    script: str, world_size: int, out: Path, *args: str, timeout: float = 120.0
) -> list[dict[str, Any]]:
    """Start ``world_size`` processes of ``tests/scripts/<script>`` with torch env variables.

    Each rank must write ``out/rank<r>.json``; the call fails unless every rank exited 0 and
    wrote its record (a crashed or hung rank is reported with its output).
    """
    procs = start_ranks([sys.executable, str(SCRIPTS / script), str(out), *args], world_size)
    logs = wait_ranks(procs, script, timeout)
    records = []
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        record = out / f"rank{rank}.json"
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{log[-3000:]}"
        assert record.exists(), f"rank {rank} did not finish:\n{log[-3000:]}"
        records.append(json.loads(record.read_text()))
    return records
