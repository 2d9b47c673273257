"""One rank of a 2-process DDP run in which rank 1 loaded one example fewer: ``OUT``.

Without a check the ranks would plan different epochs and hang at its end; each rank records
the error it got instead.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from datamodule_common import MAX_TOKENS, NUM_TRAIN, Model, make_pairs, pair_lengths, quiet_trainer
from teardown import shutdown

from lightning_varbatch import TokenBudgetDataModule


def main() -> None:
    out, rank = Path(sys.argv[1]), int(os.environ["RANK"])
    items = make_pairs(NUM_TRAIN - rank, 1)  # rank 1 lost the last example
    dm = TokenBudgetDataModule(items, pair_lengths, MAX_TOKENS)
    trainer = quiet_trainer(devices=2, strategy="ddp", max_epochs=1)
    record: dict[str, object] = {"rank": rank}
    try:
        trainer.fit(Model(), dm)
        record["global_step"] = trainer.global_step
    except RuntimeError as error:
        record["error"] = str(error)
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
