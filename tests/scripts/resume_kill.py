"""One rank of the SIGKILL-resume scenarios: ``OUT MODE [CKPT] [--source S]`` arguments.

Modes (every rank writes ``OUT/<mode>_rank<r>.json`` when it finishes):

- ``killed``: first an uninterrupted one-epoch run (``reference``: the ids trained in order and
  the final weights), then the same run with a checkpoint every ``EVERY`` steps, appending each
  micro-batch's ids to ``OUT/log_rank<r>.jsonl`` (flushed at once). Once a micro-batch of step
  ``BLOCK_AT`` has been logged, the rank sleeps until the test SIGKILLs it: it never finishes.
- ``resume CKPT``: the same run resumed with ``trainer.fit(ckpt_path=CKPT)``; records the ids
  trained after the resume and the final weights. Also used with a different world size.

``--source hf`` / ``--source hf:DIR`` (``hf_source.py``): the same pairs as a Hugging Face
dataset (built in memory, or the split ``DIR/train`` saved by the test, memory-mapped), planned
from its ``("source", "target")`` columns; the records then also say what the loader read.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from datamodule_common import Model, make_datamodule
from hf_source import loader_evidence, pop_source
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from teardown import shutdown

EVERY = 2  # checkpoint every EVERY optimizer steps
BLOCK_AT = EVERY + 1  # stop (and wait to be killed) in the first micro-batch of this step


class LoggingModel(Model):
    def __init__(self, log: Path | None) -> None:
        super().__init__()
        self.log = None if log is None else log.open("a")

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        if self.log is not None:
            record = self.trained[-1]
            self.log.write(json.dumps(record) + "\n")
            self.log.flush()
            if record["global_step"] >= BLOCK_AT:
                while True:  # the test sends SIGKILL
                    time.sleep(1)
        return loss


def run(
    world: int,
    log: Path | None = None,
    ckpt_dir: Path | None = None,
    ckpt_path: str | None = None,
    source: str = "list",
) -> tuple[Trainer, LoggingModel]:
    torch.use_deterministic_algorithms(True)
    model = LoggingModel(log)
    callbacks: list[Any] = []
    if ckpt_dir is not None:
        callbacks.append(
            ModelCheckpoint(dirpath=ckpt_dir, every_n_train_steps=EVERY, save_top_k=-1)
        )
    trainer = Trainer(
        accelerator="cpu",
        devices=world,
        strategy="ddp" if world > 1 else "auto",
        max_epochs=1,
        callbacks=callbacks,
        enable_checkpointing=ckpt_dir is not None,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        limit_val_batches=0,
        deterministic=True,
    )
    datamodule = make_datamodule(with_val=False, source=source)
    trainer.fit(model, datamodule=datamodule, ckpt_path=ckpt_path)
    return trainer, model


def summary(trainer: Trainer, model: Model) -> dict[str, Any]:
    return {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "trained": model.trained,
        "weights": {k: v.double().tolist() for k, v in model.state_dict().items()},
        "loader": loader_evidence(trainer.train_dataloader),
    }


def main() -> None:
    argv = sys.argv[1:]
    source = pop_source(argv)
    out = Path(argv[0])
    mode = argv[1]
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    if mode == "killed":
        trainer, model = run(world, source=source)
        (out / f"reference_rank{rank}.json").write_text(json.dumps(summary(trainer, model)))
        run(world, log=out / f"log_rank{rank}.jsonl", ckpt_dir=out / "ckpt", source=source)
        raise AssertionError("the killed run was not stopped")
    assert mode == "resume", mode
    trainer, model = run(world, ckpt_path=argv[2], source=source)
    (out / f"rank{rank}.json").write_text(json.dumps(summary(trainer, model)))


if __name__ == "__main__":
    main()
    shutdown()
