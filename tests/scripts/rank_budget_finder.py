"""One rank of the per-rank budget finder: ``OUT`` argument, 2 gloo processes.

Each rank searches its own budget with ``find_max_tokens`` under its own memory limit (rank 1
has 60 % of rank 0's memory: a smaller card), the budgets are gathered into
``rank_max_tokens``, and every rank plans the same epoch with them. Writes
``OUT/rank<r>.json``: the gathered budgets, this rank's budget in the plan, the largest planned
cost and the largest modelled peak memory among its micro-batches, its micro-batch count and the
example ids it runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch.distributed as dist

from lightning_varbatch import TokenBudgetBatchSampler
from lightning_varbatch.memory import find_max_tokens, gather_rank_max_tokens


def peak(examples: int, length: int) -> int:
    """The modelled peak memory of a batch: fixed + per token + attention."""
    return 10_000 + 4 * examples * length + examples * length * length // 16


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    lengths = np.random.default_rng(0).integers(8, 120, 3000)
    limit = 200_000 if rank == 0 else 120_000
    result = find_max_tokens(peak, lengths, limit, bounds=(120, 20_000), step=8)
    budgets = gather_rank_max_tokens(result)
    sampler = TokenBudgetBatchSampler(
        lengths,
        max(budgets),
        rank=rank,
        world_size=world,
        rank_max_tokens=list(budgets),
    )
    batches = [list(b) for b in sampler]
    record = {
        "budgets": list(budgets),
        "own": sampler.rank_budgets[rank],
        "largest_cost": max(len(b) * int(lengths[b].max()) for b in batches),
        "largest_peak": max(peak(len(b), int(lengths[b].max())) for b in batches),
        "limit": limit,
        "micro_batches": len(batches),
        "ids": [i for b in batches for i in b],
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
