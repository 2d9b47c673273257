"""A user's own DataLoader with our sampler: Lightning's re-wrapping is caught with a clear error,
and ``token_budget_dataloader`` is the fix it points to."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lightning_varbatch import TokenBudgetBatchSampler, token_budget_dataloader
from tests.launch import SCRIPTS, launch
from tests.scripts.datamodule_common import (
    MAX_TOKENS,
    NUM_TRAIN,
    Model,
    make_pairs,
    pair_lengths,
    quiet_trainer,
)

_RANK_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "NODE_RANK",
    "GROUP_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
}


@pytest.mark.multiprocess
def test_plain_dataloader_that_lightning_would_rewrap_fails_clearly(tmp_path: Path) -> None:
    records = launch("plain_loader.py", 2, tmp_path, "plain", timeout=120)
    for r in records:
        assert "error" in r, f"rank {r['rank']} trained with a re-wrapped sampler"
        assert "use_distributed_sampler" in r["error"] or "token_budget_dataloader" in r["error"]


@pytest.mark.multiprocess
def test_token_budget_dataloader_is_left_alone(tmp_path: Path) -> None:
    records = launch("plain_loader.py", 2, tmp_path, "helper", timeout=120)
    steps = {r.get("global_step") for r in records}
    assert len(steps) == 1 and steps.pop() > 0, records


@pytest.mark.multiprocess
def test_sampler_built_before_lightning_launches_the_ranks(tmp_path: Path) -> None:
    """The sampler is built at import time, before Lightning's launcher starts rank 1 (which
    sees WORLD_SIZE but no RANK); every rank must still plan for rank r of 2 and finish."""
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARIABLES}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / "lightning_launcher.py"), str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    records = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["sampler"] for r in records] == [[0, 2], [1, 2]]
    assert records[0]["global_step"] == records[1]["global_step"] > 0
    trained = records[0]["ids"] + records[1]["ids"]
    assert sorted(trained) == list(range(NUM_TRAIN)), "an example was lost or repeated"


def test_sampler_planned_for_another_accumulation_is_refused() -> None:
    items = make_pairs(NUM_TRAIN, 1)
    sampler = TokenBudgetBatchSampler(pair_lengths(items), MAX_TOKENS, rank=0, world_size=1)
    trainer = quiet_trainer(accumulate_grad_batches=2, max_steps=1)
    with pytest.raises(
        RuntimeError, match="planned for world_size=1 and accumulate_grad_batches=1"
    ):
        trainer.fit(Model(), train_dataloaders=token_budget_dataloader(items, sampler))


def test_explicit_rank_that_contradicts_the_process_group_is_refused(tmp_path: Path) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        sampler = TokenBudgetBatchSampler([3, 4, 5, 6], 8, rank=1, world_size=2)
        with pytest.raises(RuntimeError, match="built for rank 1 of world_size 2"):
            len(sampler)
        inferred = TokenBudgetBatchSampler([3, 4, 5, 6], 8, world_size=2)  # rank from env
        assert len(inferred) > 0 and (inferred.rank, inferred.world_size) == (0, 1)
    finally:
        dist.destroy_process_group()
