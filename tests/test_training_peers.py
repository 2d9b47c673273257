"""Smoke test of ``benchmarks.peers.training --quick``: every peer's batches, 2 real ranks.

It runs the benchmark's quick mode in a subprocess (2 gloo ranks) and checks what it reports:
both comparisons, every peer either trained or reported ``not installed`` (the peers of the
``bench`` extra are absent in CI: ours and the in-house rows always run, DeepSpeed and
Hugging Face run where installed), our invariants (every example exactly once, nothing over
the budget, equal counts), counts that add up, and a memory comparison that fits its limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ALWAYS = {"ours", "fairseq_alg", "fixed_random", "fixed_sorted"}
"""Rows that need no peer package: they run everywhere."""


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("peers") / "peers.json"
    png = out.with_suffix(".png")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    args = ["--quick", "--json", str(out), "--png", str(png)]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.peers.training", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert png.stat().st_size > 0
    data: dict = json.loads(out.read_text())
    return data


@pytest.mark.slow
@pytest.mark.multiprocess
def test_every_peer_is_trained_or_reported_missing(report: dict) -> None:
    from benchmarks.peers.batches import PEERS

    status = report["status"]
    assert set(status) == {p.name for p in PEERS}
    for name, why in status.items():
        assert why == "ok" or why.startswith("not installed"), (name, why)
    assert all(status[n] == "ok" for n in ALWAYS)
    running = {n for n, why in status.items() if why == "ok"}
    for comparison in ("budget", "memory"):
        assert set(report["comparisons"][comparison]) == running
        for name, key in report["comparisons"][comparison].items():
            run = report["runs"][key]
            assert run["peer"] == name and run["trained"], key
            assert run["tps_median"] > 0 and len(run["rounds"]) == report["rounds"]
            assert len(run["wait_s"]) == report["world"]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_ours_trains_every_example_once_within_budget(report: dict) -> None:
    for comparison in ("budget", "memory"):
        ours = report["runs"][report["comparisons"][comparison]["ours"]]
        assert ours["setting"] == report["limit"]
        assert ours["trained"] == ours["examples"] == report["n"]
        assert ours["dropped"] == 0 and ours["repeated"] == 0
        assert ours["over_budget"] == 0 and ours["worst_cost"] <= report["limit"]
        assert not ours["unequal_counts"] and ours["dummy"] == 0
        assert len(set(ours["per_rank"])) == 1


@pytest.mark.slow
@pytest.mark.multiprocess
def test_counts_add_up_and_memory_settings_fit(report: dict) -> None:
    for key, run in report["runs"].items():
        # counted from the ids the ranks trained: every example trained or dropped
        assert run["trained"] + run["dropped"] == report["n"], key
        assert run["repeated"] >= 0 and run["micro_batches"] == sum(run["per_rank"]), key
        assert run["unequal_counts"] == (len(set(run["counts"])) > 1), key
        if run["unequal_counts"]:  # recorded, then run with the peer's named workaround
            counts = run["counts"]
            assert run["workaround"] and run["dummy"] == len(counts) * max(counts) - sum(counts)
        assert run["over_budget"] == 0 or run["worst_cost"] > report["limit"], key
    for key in report["comparisons"]["memory"].values():
        assert report["runs"][key]["worst_cost"] <= report["limit"], key
    budget = report["comparisons"]["budget"]
    fixed = report["runs"][budget["fixed_random"]]
    assert fixed["setting"] == report["b_mean"] and fixed["dropped"] == 0
    assert set(report["margins"]) == {"budget", "memory"}
    assert all("tps_cpu_median" in m for m in report["margins"].values())
