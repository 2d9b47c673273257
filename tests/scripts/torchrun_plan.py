"""One worker of a torchrun-launched DDP fit through TokenBudgetDataModule: ``OUT`` argument.

The topology comes from torchrun's environment (``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``): devices
per node is the local world size, nodes the quotient. Writes ``OUT/rank<global rank>.json``
with the node rank, local rank and the ids of every micro-batch trained in one epoch.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from datamodule_common import Model, make_datamodule
from lightning.pytorch import Trainer
from teardown import shutdown


def main() -> None:
    out = Path(sys.argv[1])
    world = int(os.environ["WORLD_SIZE"])
    devices = int(os.environ["LOCAL_WORLD_SIZE"])
    model = Model()
    trainer = Trainer(
        accelerator="cpu",
        devices=devices,
        num_nodes=world // devices,
        strategy="ddp",
        max_epochs=1,
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(model, datamodule=make_datamodule(with_val=False))
    record = {
        "rank": trainer.global_rank,
        "node_rank": trainer.node_rank,
        "local_rank": trainer.local_rank,
        "world_size": trainer.world_size,
        "env_rank": int(os.environ["RANK"]),
        "cluster": type(trainer.strategy.cluster_environment).__name__,
        "trained": [r["ids"] for r in model.trained],
        "global_step": trainer.global_step,
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
