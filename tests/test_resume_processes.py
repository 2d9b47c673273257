"""Resume and launch scenarios with real processes: SIGKILL mid-epoch, a smaller world, torchrun.

The killed run is shared by the first two tests (a module fixture): its rank processes first run
the uninterrupted reference epoch, then the checkpointed run that the test SIGKILLs. The elastic
resume (two ranks' checkpoint on one) also runs with the pairs as a Hugging Face dataset saved
to disk and memory-mapped by every rank (``--source hf:DIR``), lengths from its columns.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.launch import SCRIPTS, free_port, launch, rank_env
from tests.scripts.datamodule_common import NUM_TRAIN, make_pairs, pair_columns

WORLD = 2
EVERY = 2  # tests/scripts/resume_kill.py checkpoints every EVERY steps and blocks in step EVERY+1


def read_log(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    lines = path.read_text().split("\n")
    return [json.loads(line) for line in lines[:-1]]  # the last one may be partly written


def checkpoint_steps(ckpt_dir: Path) -> dict[int, Path]:
    found = {}
    for p in ckpt_dir.glob("*.ckpt") if ckpt_dir.exists() else []:
        m = re.fullmatch(r"epoch=0-step=(\d+)\.ckpt", p.name)
        if m:
            found[int(m.group(1))] = p
    return found


def kill_mid_epoch(out: Path, *extra: str) -> dict[str, Any]:
    """Run reference + checkpointed run on WORLD ranks; SIGKILL them mid-epoch."""
    port = free_port()
    start = time.monotonic()
    procs = []
    for rank in range(WORLD):
        env = rank_env(rank, WORLD, port)
        log = (out / f"stdout{rank}.txt").open("w")
        procs.append(
            subprocess.Popen(
                [sys.executable, str(SCRIPTS / "resume_kill.py"), str(out), "killed", *extra],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        )
    logs = [out / f"log_rank{r}.jsonl" for r in range(WORLD)]
    try:
        deadline = time.monotonic() + 120
        while True:
            crashed = [p.returncode for p in procs if p.poll() is not None]
            assert not crashed, f"a rank exited {crashed} before the kill"
            assert time.monotonic() < deadline, "no checkpoint and later step within 120s"
            steps = checkpoint_steps(out / "ckpt")
            if steps and all(
                any(r["global_step"] > max(steps) for r in read_log(log)) for log in logs
            ):
                break
            time.sleep(0.1)
    except AssertionError:
        texts = [(out / f"stdout{r}.txt").read_text()[-3000:] for r in range(WORLD)]
        raise AssertionError("\n".join(texts)) from None
    finally:
        for p in procs:
            if p.poll() is None:
                os.kill(p.pid, signal.SIGKILL)
        for p in procs:
            p.wait(timeout=30)
    assert all(p.returncode == -signal.SIGKILL for p in procs)
    print(f"reference + killed run: {time.monotonic() - start:.1f}s")
    steps = checkpoint_steps(out / "ckpt")
    last = max(steps)
    return {
        "out": out,
        "ckpt_step": last,
        "ckpt": steps[last],
        "reference": [
            json.loads((out / f"reference_rank{r}.json").read_text()) for r in range(WORLD)
        ],
        "logs": [read_log(log) for log in logs],
        "extra": extra,
    }


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The killed run on the pairs as Python lists."""
    return kill_mid_epoch(tmp_path_factory.mktemp("killed"))


@pytest.fixture(scope="module")
def killed_hf(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The killed run on the same pairs as a Hugging Face dataset saved to disk (memory-mapped)."""
    pytest.importorskip("datasets")
    from tests.scripts.hf_source import save_dataset

    out = tmp_path_factory.mktemp("killed_hf")
    save_dataset(pair_columns(make_pairs(NUM_TRAIN, 1)), out / "hf", "train")
    return kill_mid_epoch(out, "--source", f"hf:{out / 'hf'}")


def before_checkpoint(log: list[dict[str, Any]], step: int) -> list[list[int]]:
    """Ids of the micro-batches the checkpoint at ``step`` includes (steps 0 .. step-1)."""
    return [r["ids"] for r in log if r["global_step"] < step]


@pytest.mark.multiprocess
def test_sigkill_resume_matches_uninterrupted(killed: dict[str, Any], tmp_path: Path) -> None:
    step = killed["ckpt_step"]
    assert step == EVERY  # the only complete checkpoint: the run blocked in step EVERY + 1
    for log in killed["logs"]:
        assert any(r["global_step"] > step for r in log)  # killed after later steps were trained
    start = time.monotonic()
    records = launch("resume_kill.py", WORLD, tmp_path, "resume", str(killed["ckpt"]), timeout=90)
    print(f"resumed run: {time.monotonic() - start:.1f}s")
    for rank, (ref, log, resumed) in enumerate(
        zip(killed["reference"], killed["logs"], records, strict=True)
    ):
        assert ref["rank"] == resumed["rank"] == rank
        reference = [r["ids"] for r in ref["trained"]]
        assert len(reference) > step + 1  # the kill was mid-epoch
        assert sorted(i for ids in reference for i in ids) != list(range(NUM_TRAIN))  # sharded
        assert [r["ids"] for r in log] == reference[: len(log)]  # B replayed A until the kill
        got = before_checkpoint(log, step) + [r["ids"] for r in resumed["trained"]]
        assert got == reference, f"rank {rank}"
        assert resumed["trained"][0]["global_step"] == step
        assert resumed["global_step"] == ref["global_step"]
        for name, value in ref["weights"].items():
            torch.testing.assert_close(
                torch.tensor(resumed["weights"][name]),
                torch.tensor(value),
                rtol=0,
                atol=0,
                msg=lambda m, name=name, rank=rank: f"rank {rank} {name}: {m}",
            )
    union = [i for ref in killed["reference"] for r in ref["trained"] for i in r["ids"]]
    assert sorted(union) == list(range(NUM_TRAIN))


@pytest.mark.multiprocess
@pytest.mark.parametrize("source", ["list", "hf"])
def test_resume_two_process_checkpoint_on_one(
    source: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    killed = request.getfixturevalue("killed" if source == "list" else "killed_hf")
    step = killed["ckpt_step"]
    start = time.monotonic()
    (record,) = launch(
        "resume_kill.py", 1, tmp_path, "resume", str(killed["ckpt"]), *killed["extra"], timeout=90
    )
    print(f"resumed on one process: {time.monotonic() - start:.1f}s")
    assert record["world_size"] == 1
    if source == "hf":
        # Every rank of both runs read the memory-mapped Arrow dataset, and the killed run had
        # replayed the uninterrupted one until the kill.
        for r in [*killed["reference"], record]:
            assert r["loader"]["part_types"] == ["datasets.Dataset"], r["loader"]
            assert r["loader"]["memory_mapped"] == [True] and r["loader"]["columnar"] is True
        for ref, log in zip(killed["reference"], killed["logs"], strict=True):
            reference = [r["ids"] for r in ref["trained"]]
            assert len(reference) > step + 1  # the kill was mid-epoch
            assert [r["ids"] for r in log] == reference[: len(log)]
        union = [i for ref in killed["reference"] for r in ref["trained"] for i in r["ids"]]
        assert sorted(union) == list(range(NUM_TRAIN))
    done = [i for log in killed["logs"] for ids in before_checkpoint(log, step) for i in ids]
    after = [i for r in record["trained"] for i in r["ids"]]
    assert done and after
    print(f"before checkpoint: {len(done)} examples on {WORLD} ranks, after: {len(after)}")
    assert Counter(done + after) == Counter(range(NUM_TRAIN)), (
        f"repeated: {sorted(set(done) & set(after))}, "
        f"lost: {sorted(set(range(NUM_TRAIN)) - set(done) - set(after))}"
    )
    assert record["global_step"] == step + len(record["trained"])


def torchrun(out: Path, nnodes: int, nproc: int, timeout: float = 90) -> list[dict[str, Any]]:
    port = free_port()
    procs = []
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for node in range(nnodes):
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            str(nnodes),
            "--nproc-per-node",
            str(nproc),
            "--node-rank",
            str(node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            str(SCRIPTS / "torchrun_plan.py"),
            str(out),
        ]
        procs.append(
            subprocess.Popen(
                cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
            )
        )
    logs = []
    for proc in procs:
        try:
            logs.append(proc.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise AssertionError(f"torchrun {nnodes}x{nproc} hung for {timeout}s") from None
    for node, (proc, log) in enumerate(zip(procs, logs, strict=True)):
        assert proc.returncode == 0, f"node {node} exited {proc.returncode}:\n{log[-3000:]}"
    world = nnodes * nproc
    records = []
    for rank in range(world):
        path = out / f"rank{rank}.json"
        assert path.exists(), f"rank {rank} did not finish:\n" + "\n".join(x[-2000:] for x in logs)
        records.append(json.loads(path.read_text()))
    return records


@pytest.mark.multiprocess
def test_torchrun_two_nodes_matches_one_node(tmp_path: Path) -> None:
    start = time.monotonic()
    (tmp_path / "2x1").mkdir()
    (tmp_path / "1x2").mkdir()
    nodes = torchrun(tmp_path / "2x1", 2, 1)
    print(f"torchrun 2x1: {time.monotonic() - start:.1f}s")
    start = time.monotonic()
    single = torchrun(tmp_path / "1x2", 1, 2)
    print(f"torchrun 1x2: {time.monotonic() - start:.1f}s")
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in nodes] == [(0, 0, 0), (1, 1, 0)]
    assert [(r["rank"], r["node_rank"], r["local_rank"]) for r in single] == [(0, 0, 0), (1, 0, 1)]
    for a, b in zip(nodes, single, strict=True):
        assert a["world_size"] == b["world_size"] == 2
        assert a["env_rank"] == a["rank"] and b["env_rank"] == b["rank"]
        assert a["cluster"] == b["cluster"] == "TorchElasticEnvironment"
        assert a["trained"] == b["trained"], f"rank {a['rank']}"
        assert a["global_step"] == b["global_step"] > 0
    union = [i for r in nodes for ids in r["trained"] for i in ids]
    assert sorted(union) == list(range(NUM_TRAIN))
