"""Smoke test: every benchmark script runs its quick mode and writes its numbers, so they don't rot.

The numbers themselves are measured by ``python -m benchmarks`` and recorded in
benchmarks/RESULTS.md; here only that each script runs end to end and reports every
configuration it compares.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
QUICK = {
    "planning": ["--quick", "--no-profile"],
    "training_throughput": ["--quick"],
    "straggler": ["--quick"],
    "gpu_throughput": ["--device", "cpu", "--tiny"],
}


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.parametrize("name", sorted(QUICK))
def test_benchmark_quick_mode(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{name}.json"
    proc = _run([f"benchmarks.{name}", *QUICK[name], "--json", str(out)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    if name == "planning":
        assert any(p["method"] == "ours: EpochPlanner" for p in data["performance"])
    elif name == "straggler":
        assert set(data["configs"]) == {"ours", "rr-shuffled", "rr-sorted"}
    else:
        assert set(data["configs"]) == {"a", "b", "c"} and data["predicted"] > 1.0
    plots = _run(["benchmarks.plots", "--results", str(tmp_path), "--out", str(tmp_path)])
    assert plots.returncode == 0, plots.stdout[-2000:] + plots.stderr[-2000:]
    assert list(tmp_path.glob("*.png"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
def test_gpu_benchmark_refuses_without_cuda() -> None:
    proc = _run(["benchmarks.gpu_throughput"], timeout=60)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
