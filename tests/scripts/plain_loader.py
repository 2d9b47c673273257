"""A user's own DataLoader around our sampler, handed to a DDP Trainer with its defaults.

``OUT plain|helper``: ``plain`` is ``DataLoader(batch_sampler=sampler)``, which Lightning would
re-wrap with a DistributedSampler; ``helper`` is ``token_budget_dataloader(...)``, which it
leaves alone. Each rank records the error it got (or its step count).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from datamodule_common import MAX_TOKENS, NUM_TRAIN, Model, make_pairs, pair_lengths, quiet_trainer
from teardown import shutdown
from torch.utils.data import DataLoader

from lightning_varbatch import PaddingCollate, TokenBudgetBatchSampler, token_budget_dataloader
from lightning_varbatch.data.loader import _BatchInfoDataset


def main() -> None:
    out, mode = Path(sys.argv[1]), sys.argv[2]
    items = make_pairs(NUM_TRAIN, 1)
    sampler = TokenBudgetBatchSampler(pair_lengths(items), MAX_TOKENS)  # rank from the env
    if mode == "plain":
        loader = DataLoader(
            _BatchInfoDataset(items), batch_sampler=sampler, collate_fn=PaddingCollate()
        )
    else:
        loader = token_budget_dataloader(items, sampler)
    trainer = quiet_trainer(devices=2, strategy="ddp", max_epochs=1)
    record: dict[str, object] = {"rank": sampler.rank}
    try:
        trainer.fit(Model(), train_dataloaders=loader)
        record["global_step"] = trainer.global_step
    except (TypeError, ValueError) as error:
        record["error"] = f"{type(error).__name__}: {error}"
    (out / f"rank{sampler.rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
