"""One rank of a DDP run whose rank 1 computes twice as long: ``compute_imbalance.py OUT``.

Two gloo ranks train ``STEPS`` optimizer steps on the same micro-batches; every forward sleeps
``DELAY`` seconds per micro-batch, rank 1's twice as long (a rank half as fast).
``TokenThroughputMonitor`` logs every ``WINDOW`` steps. A second callback times each rank's
whole micro-batch (``on_train_batch_start`` to ``on_train_batch_end``, the backward's gradient
all-reduce included), the window the monitor timed before issue 31. Writes ``OUT/rank<r>.json``:
rank 0's logged metrics and this rank's whole-micro-batch seconds.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch
from callbacks_train import Recorder
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from teardown import shutdown
from torch.utils.data import DataLoader

from lightning_varbatch import keys
from lightning_varbatch.callbacks import TokenThroughputMonitor

STEPS = 8
WINDOW = 4
DELAY = 0.05  # rank 0's forward, seconds per micro-batch; rank 1's is twice as long


class WholeMicroBatch(Callback):
    """Seconds from ``on_train_batch_start`` to ``on_train_batch_end``, summed."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def on_train_batch_start(self, *args: Any) -> None:
        self._start = time.perf_counter()

    def on_train_batch_end(self, *args: Any) -> None:
        self.seconds += time.perf_counter() - self._start


class Model(LightningModule):
    def __init__(self, delay: float) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.delay = delay

    def train_dataloader(self) -> DataLoader[Any]:
        batch = {"x": torch.ones(2, 4), keys.NTOKENS: 10, keys.NEXAMPLES: 2}
        return DataLoader([batch] * STEPS, batch_size=None)  # type: ignore[arg-type]

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        time.sleep(self.delay)  # this rank's own compute
        return self.layer(batch["x"]).sum()

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    seed_everything(0, verbose=False)
    whole = WholeMicroBatch()
    logger = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy="ddp",
        use_distributed_sampler=False,
        max_steps=STEPS,
        callbacks=[whole, TokenThroughputMonitor(log_every_n_steps=WINDOW, prog_bar=False)],
        logger=logger,
        log_every_n_steps=WINDOW,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Model(DELAY * (2.0 if rank == 1 else 1.0)))
    record = {"rank": rank, "whole_seconds": whole.seconds, "logged": logger.calls}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
