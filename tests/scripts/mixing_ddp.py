"""One rank of a 2-process DDP run over two datasets mixed per step: ``OUT [--source S]``.

Dataset 0 holds sequences of 16 tokens (8 per micro-batch under a 128-token budget), dataset 1
sequences of 32 tokens (4 per micro-batch). Each rank records, for every micro-batch it trains,
the optimizer step, the dataset, the batch shape and the token counts, and writes
``OUT/rank<r>.json``. ``--source hf``: each dataset is a Hugging Face dataset of the same items,
given as ``DataSource("tokens", dataset=ds)`` (lengths read from its ``tokens`` column).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import torch
from hf_source import as_dataset, is_hf, loader_evidence, pop_source
from lightning.pytorch import LightningModule, Trainer
from teardown import shutdown
from torch import nn

from lightning_varbatch import DataSource, TokenBudgetDataModule, TokenThroughputMonitor
from lightning_varbatch.loss import step_token_mean

VOCAB = 16


def items(n: int, length: int, seed: int) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    return [{"tokens": rng.integers(1, VOCAB, size=length).tolist()} for _ in range(n)]


class Model(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(VOCAB, 8)
        self.out = nn.Linear(8, VOCAB)
        self.trained: list[dict[str, int]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        tokens, mask = batch["tokens"], batch["tokens_mask"]
        self.trained.append(
            {
                "global_step": int(self.trainer.global_step),
                "epoch": int(self.current_epoch),
                "dataset": int(batch["dataset"]),
                "rows": int(tokens.shape[0]),
                "width": int(tokens.shape[1]),
                "ntokens": int(batch["ntokens"]),
                "step_ntokens": int(batch["step_ntokens"]),
            }
        )
        logits = self.out(self.embed(tokens))
        loss = nn.functional.cross_entropy(logits[mask], tokens[mask], reduction="sum")
        return step_token_mean(loss, batch, self.trainer)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


def source_of(data: list[dict[str, Any]], length: int, name: str, source: str) -> DataSource:
    if not is_hf(source):
        return DataSource(np.full(len(data), length), dataset=data, name=name)
    columns = {"tokens": [x["tokens"] for x in data]}
    return DataSource("tokens", dataset=as_dataset(columns, source, split=name), name=name)


def main() -> None:
    argv = sys.argv[1:]
    source = pop_source(argv)
    out = Path(argv[0])
    short, long = items(96, 16, 0), items(48, 32, 1)  # whole steps: no tail re-cut
    dm = TokenBudgetDataModule(
        [source_of(short, 16, "short", source), source_of(long, 32, "long", source)],
        max_tokens=128,
        mixing="per_step",
        weights=[1, 1],
        steps_per_epoch=6,
    )
    model = Model()
    monitor = TokenThroughputMonitor(log_every_n_steps=3, prog_bar=False)
    trainer = Trainer(
        callbacks=[monitor],
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        accumulate_grad_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, dm)
    record = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "trained": model.trained,
        "weights": [float(p.detach().sum()) for p in model.parameters()],
        "monitor_dataset_tokens": monitor.dataset_tokens,
        "source": source,
        "loader": loader_evidence(trainer.train_dataloader),
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
