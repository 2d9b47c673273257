"""Smoke test: every benchmark script runs its quick mode and writes its numbers, so they don't rot.

The numbers themselves are measured by ``python -m benchmarks`` and recorded in
benchmarks/RESULTS.md; here only that each script runs end to end and reports every
configuration it compares.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
QUICK = {
    "planning": ["--quick", "--no-profile"],
    "training_throughput": ["--quick"],
    "straggler": ["--quick"],
    "gpu_throughput": ["--device", "cpu", "--tiny"],
    "hf_datasets": ["--quick"],
    "packing": ["--quick"],
    "gpu_packing": ["--device", "cpu", "--tiny"],
    "streaming": ["--quick"],
    "compile_shapes": ["--quick"],
    "rank_shares": ["--quick"],
    "remainder_guard": ["--quick", "--repeats", "1"],
    "batch_schedule": ["--quick", "--repeats", "1"],
    "batch_schedule_training": ["--quick"],
    "pair_plan": ["--quick"],
}
MODULE = {
    "planning": "planning.epoch",
    "training_throughput": "training.throughput",
    "straggler": "training.straggler",
    "gpu_throughput": "gpu.throughput",
    "hf_datasets": "sources.hf_datasets",
    "packing": "training.packing",
    "gpu_packing": "gpu.packing",
    "streaming": "sources.streaming",
    "compile_shapes": "training.compile_shapes",
    "rank_shares": "training.rank_shares",
    "remainder_guard": "planning.remainder_guard",
    "batch_schedule": "planning.batch_schedule",
    "batch_schedule_training": "training.batch_schedule",
    "pair_plan": "planning.pair_plan",
}
"""The module (under ``benchmarks.``) of each quick-mode case."""
NO_PLOT = {
    "hf_datasets",
    "packing",
    "gpu_packing",
    "streaming",
    "compile_shapes",
    "rank_shares",
    "remainder_guard",
    "batch_schedule",
    "batch_schedule_training",
    "pair_plan",
}
HF_CONFIGS = {
    *(f"lengths/{case}/{m}" for case in "abc" for m in ("ours", "loop", "map")),
    "lengths/a/numpy",
    *(f"tokens/{m}" for m in ("loop", "encode_batch", "ours", "ours_np2", "ours_first")),
    "tokens/ours_cached",
    *(f"loader/{kind}/w{w}" for kind in ("list", "hf", "disk") for w in (0, 2)),
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


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(QUICK))
def test_benchmark_quick_mode(name: str, tmp_path: Path) -> None:
    out = tmp_path / f"{MODULE[name].replace('.', '_')}.json"  # as `python -m benchmarks`
    proc = _run([f"benchmarks.{MODULE[name]}", *QUICK[name], "--json", str(out)])
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    data = json.loads(out.read_text())
    if name == "planning":
        assert any(p["method"] == "ours: EpochPlanner" for p in data["performance"])
    elif name == "straggler":
        assert set(data["configs"]) == {"ours", "rr-shuffled", "rr-sorted"}
    elif name == "hf_datasets":
        assert set(data["configs"]) == HF_CONFIGS
        for key, config in data["configs"].items():  # lengths and counts equal, same batches
            assert config["seconds"] > 0, key
            assert config["identical_batches" if key.startswith("loader/") else "agrees"], key
    elif name == "packing":
        assert set(data["training"]["configs"]) == {"packed", "padded", "random"}
        assert {r["name"] for r in data["flops"]["rows"]} == {
            "ours, packed",
            "ours, packed, token-balanced",
            "naive packing",
            "ours, padded",
        }
        assert data["lengths"]["p99_over_median"] >= 8
    elif name == "gpu_packing":
        assert set(data["configs"]) == {"packed", "padded", "random"}
    elif name == "compile_shapes":
        assert set(data["training"]) == {
            "eager_free",
            "eager_k",
            "compiled_k",
            "dynamic_free",
            "static_free",
        }
        assert len(data["padding"]["rows"]) == 7 and data["masked_rows"]["ok"] is True
    elif name == "streaming":
        rows = {r["name"]: r for r in data["plans"]["rows"]}
        ours = [r for n, r in rows.items() if not n.startswith("lhotse")]
        assert len(ours) >= 2  # the lhotse row only with the bench extra installed
        assert all(r["over"] == 0 and r["coverage"] == 1.0 for r in ours)
        for workers in ("w0", "w2"):
            assert data["reads"][workers]["exact"]
            assert data["reads"][workers]["stats"]["backward_seeks"] == 0
        assert data["resume"]["round0"]["exact"]
    elif name == "remainder_guard":
        assert data["examples"] == 300_000
        assert all(v > 0 for v in data.values())
        assert data["guard, elastic"] < data["elastic re-plan"]  # included in it
    elif name == "batch_schedule":
        assert data["examples"] == 300_000
        assert set(data["seconds"]) == {"none", "thresholds", "ramp"}
        assert set(data["ratios"]) == set(data["stages"]) == {"thresholds", "ramp"}
        assert all(v > 0 for rows in data["seconds"].values() for v in rows.values())
        for stages in data["stages"].values():
            assert 0.25 <= stages[0]["fraction_min"] < 0.3 and stages[-1]["label"] == "1 (full)"
            assert all(0 < s["min_fill"] <= s["fill"] <= 1 for s in stages)
        assert data["steps"]["thresholds"] > data["steps"]["none"]  # smaller steps first
    elif name == "batch_schedule_training":
        runs = {(r["lr"], r["schedule"]): r for r in data["runs"]}
        assert set(runs) == {(lr, s) for lr in (3e-3, 9e-3) for s in ("none", "ramp")}
        for lr in (3e-3, 9e-3):  # equal tokens, more (smaller) steps under the ramp
            none, ramp = runs[lr, "none"], runs[lr, "ramp"]
            # both stop at the first step reaching the tokens: within a full step of each other
            assert min(none["tokens"], ramp["tokens"]) >= data["scale"]["tokens"]
            assert abs(none["tokens"] - ramp["tokens"]) <= data["scale"]["max_tokens"]
            assert ramp["steps"] > none["steps"] and ramp["smallest_step"] < none["smallest_step"]
        assert len(data["table"]) == 4
    elif name == "pair_plan":
        rows = {r["budget"]: r for r in data["by_budget"]["0"]}
        assert set(rows) == {512, 4096}
        assert rows[512]["two_sided"] < rows[512]["better_ref"] < rows[512]["max"]
        assert rows[4096]["two_sided"] <= rows[4096]["max"] + 1e-3  # few pairs per length
        for inputs in data["optimum"].values():  # the exact optimum bounds every plan
            assert 1.0 <= inputs["two_sided_mean"] <= inputs["two_sided_max"]
        assert all(v > 0 for v in data["planning_s"].values())
    else:  # training throughput (CPU, GPU: (a') is ours in the max order) and rank shares
        configs = {"a", "b", "c"} if name == "rank_shares" else {"a", "m", "b", "c"}
        assert set(data["configs"]) == configs and data["predicted"] > 1.0
    if name in NO_PLOT:
        return
    plots = _run(["benchmarks.plots", "--results", str(tmp_path), "--out", str(tmp_path)])
    assert plots.returncode == 0, plots.stdout[-2000:] + plots.stderr[-2000:]
    assert list(tmp_path.glob("*/*.png"))


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present")
@pytest.mark.parametrize("script", ["gpu.throughput", "gpu.packing"])
def test_gpu_benchmark_refuses_without_cuda(script: str) -> None:
    proc = _run([f"benchmarks.{script}"], timeout=60)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr


def test_benchmarks_have_no_import_cycles() -> None:
    """Every ``benchmarks.*`` import (module- or function-level) points down a DAG."""
    base = ROOT / "benchmarks"
    mods = {
        ".".join(p.relative_to(base).with_suffix("").parts): p
        for p in base.rglob("*.py")
        if p.name != "__init__.py"
    }
    graph: dict[str, set[str]] = {}
    for name, path in mods.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                parts = node.module.split(".")
                if parts[0] == "benchmarks":
                    inner = ".".join(parts[1:])
                    deps |= {inner} | {f"{inner}.{a.name}".strip(".") for a in node.names}
            elif isinstance(node, ast.Import):
                names = [a.name.split(".") for a in node.names]
                deps |= {".".join(n[1:]) for n in names if n[0] == "benchmarks" and len(n) > 1}
        graph[name] = {d for d in deps if d in mods and d != name}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, "import cycle: " + " -> ".join((*path, name))
        if name not in done:
            for dep in sorted(graph[name]):
                visit(dep, (*path, name))
            done.add(name)

    for name in sorted(graph):
        visit(name, ())


def test_plan_metrics_adapter_reproduces_the_library_diagnostics() -> None:
    """Our plan read back as index lists gives the same figures as the plan itself."""
    from benchmarks.planning.baselines import greedy_batches
    from benchmarks.planning.metrics import plan_batches, plan_quality, quality
    from lightning_varbatch.planner.epoch_planner import EpochPlanner, PlanConfig
    from lightning_varbatch.planner.synthetic import wmt_like_lengths

    lengths = wmt_like_lengths(20_000, seed=0)
    key = lengths.max(axis=1)
    planner = EpochPlanner(lengths, PlanConfig(max_tokens=4096))
    plan = planner.plan(0, 4)
    other = plan_batches(planner.plan(1, 4))
    direct = plan_quality(planner, plan, other_epoch=other)
    adapted = quality(plan_batches(plan), key, 4096, 4, other_epoch=other)
    assert adapted == direct
    # greedy sorted deals batches[rank::world]: unequal counts unless the count divides evenly;
    # a partial last step is left out of the imbalance only
    batches = greedy_batches(key, 4096, 4, 0, 0)
    greedy = quality(batches, key, 4096, 4)
    partial = batches.size.size % 4 != 0
    assert greedy.full_steps == greedy.steps - partial
    assert (greedy.count_min < greedy.count_max) == partial
    assert greedy.coverage == 1.0 and greedy.dup == 0 and np.isfinite(greedy.imb_quad)
