"""Each rank builds its sampler from torch.distributed alone and iterates one epoch."""

import json
import sys
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from lightning_varbatch import TokenBudgetBatchSampler

out = Path(sys.argv[1])
dist.init_process_group("gloo")
lengths = np.random.default_rng(0).integers(1, 80, size=(4000, 2))
sampler = TokenBudgetBatchSampler(lengths, 1024, accumulate_grad_batches=2)  # rank from dist
sampler.set_epoch(1)
ids, steps = [], 0
for batch in sampler:
    ids.extend(batch)
    # A collective per micro-batch: a rank with fewer batches would hang or crash here.
    dist.all_reduce(torch.tensor([batch.ntokens]))
    steps += 1
counts = [None] * dist.get_world_size()
dist.all_gather_object(counts, steps)
dist.barrier()
record = {"rank": dist.get_rank(), "ids": ids, "steps": steps, "counts": counts}
(out / f"rank{dist.get_rank()}.json").write_text(json.dumps(record))
dist.destroy_process_group()
