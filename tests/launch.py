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


def launch(
    script: str, world_size: int, out: Path, *args: str, timeout: float = 120.0
) -> list[dict[str, Any]]:
    """Start ``world_size`` processes of ``tests/scripts/<script>`` with torch env variables.

    Each rank must write ``out/rank<r>.json``; the call fails unless every rank exited 0 and
    wrote its record (a crashed or hung rank is reported with its output).
    """
    if UNMARKED is not None:
        raise RuntimeError(
            f"{UNMARKED} starts {world_size} processes but is not marked multiprocess: add "
            "@pytest.mark.multiprocess (the inner loop never starts a process group)"
        )
    port = free_port()
    procs = []
    for rank in range(world_size):
        env = rank_env(rank, world_size, port)
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / script), str(out), *args],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"{script}: a rank hung for {timeout}s") from None
    records = []
    for rank, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        record = out / f"rank{rank}.json"
        assert proc.returncode == 0, f"rank {rank} exited {proc.returncode}:\n{log[-3000:]}"
        assert record.exists(), f"rank {rank} did not finish:\n{log[-3000:]}"
        records.append(json.loads(record.read_text()))
    return records
