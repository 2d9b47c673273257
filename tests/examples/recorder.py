"""A callback for tests: appends what every training micro-batch holds to a JSON-lines file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override


class RecordBatches(Callback):
    """Append ``{"step", "batch_idx", "dataset", "sources", "target_lengths"}`` per micro-batch.

    ``dataset`` is the batch's dataset index (``batch["dataset"]``, 0 without a mixture);
    ``sources`` are the real (unpadded) source ids of each example, in batch order: the trained
    examples, in the order they were trained; ``target_lengths`` count BOS and EOS. Appending
    lets a resumed run continue the record.

    Args:
        path: the JSON-lines file.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path)

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        sources = [
            row[mask].tolist()
            for row, mask in zip(batch["source"], batch["source_mask"], strict=True)
        ]
        record = {
            "step": trainer.global_step,
            "batch_idx": batch_idx,
            "dataset": int(batch["dataset"]),
            "sources": sources,
            "target_lengths": batch["target_mask"].sum(1).tolist(),
        }
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")


def read_records(path: Path) -> list[dict[str, Any]]:
    """The records :class:`RecordBatches` wrote to ``path``."""
    return [json.loads(line) for line in path.read_text().splitlines()]


class SlowBatches(Callback):
    """Sleep ``seconds`` after every training micro-batch (gives a test time to send a signal).

    Args:
        seconds: the pause per micro-batch.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = float(seconds)

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, idx: int
    ) -> None:
        import time

        time.sleep(self.seconds)
