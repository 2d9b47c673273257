"""A user script that builds the sampler at import time and lets Lightning launch the ranks.

Started once, without any rank variables: Lightning's launcher re-executes this file for
rank 1 (with only some of the variables set). The sampler resolves its topology too early in
both processes; it must follow the process group once it exists. ``OUT`` gets one record per
rank with the example ids it trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch.distributed as dist
from datamodule_common import MAX_TOKENS, NUM_TRAIN, Model, make_pairs, pair_lengths, quiet_trainer

from lightning_varbatch import TokenBudgetBatchSampler, token_budget_dataloader


def main() -> None:
    out = Path(sys.argv[1])
    items = make_pairs(NUM_TRAIN, 1)
    sampler = TokenBudgetBatchSampler(pair_lengths(items), MAX_TOKENS)  # no rank yet
    model = Model()
    trainer = quiet_trainer(devices=2, strategy="ddp", max_epochs=1)
    trainer.fit(model, train_dataloaders=token_budget_dataloader(items, sampler))
    record = {
        "rank": trainer.global_rank,
        "sampler": [sampler.rank, sampler.world_size],
        "global_step": trainer.global_step,
        "ids": [i for row in model.trained for i in row["ids"]],
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    # No barrier here (unlike teardown.shutdown): Lightning's launcher watches its children and
    # SIGTERMs rank 0 as soon as rank 1 exits, so a last barrier would race that signal.
    dist.destroy_process_group()
