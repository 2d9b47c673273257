"""A user's own DataLoader with our sampler: Lightning's re-wrapping is caught with a clear error,
and ``token_budget_dataloader`` is the fix it points to."""

from __future__ import annotations

from pathlib import Path

from tests.launch import launch


def test_plain_dataloader_that_lightning_would_rewrap_fails_clearly(tmp_path: Path) -> None:
    records = launch("plain_loader.py", 2, tmp_path, "plain", timeout=120)
    for r in records:
        assert "error" in r, f"rank {r['rank']} trained with a re-wrapped sampler"
        assert "use_distributed_sampler" in r["error"] or "token_budget_dataloader" in r["error"]


def test_token_budget_dataloader_is_left_alone(tmp_path: Path) -> None:
    records = launch("plain_loader.py", 2, tmp_path, "helper", timeout=120)
    steps = {r.get("global_step") for r in records}
    assert len(steps) == 1 and steps.pop() > 0, records
