"""One rank of the epoch-length scenarios: ``epoch_length_ddp.py OUT SCENARIO [SCENARIO ...]``.

Each scenario is a short ``Trainer.fit`` (gloo, 2 ranks, a one-parameter model) over data whose
number of micro-batches per rank changes from one epoch to the next, with no call of ours
beyond building the loader: shares set by hand (on the DataModule at an epoch's end, on a user's
own loader's sampler in ``on_train_epoch_start``), shares from :class:`RankShareBalancer` (rank 1
twice as slow), packed rows over wide buckets, a length warm-up, a packed mixture, and a stream
(no length). Every item carries its ``id``;
``training_step`` records the ids it trains per epoch, ``on_train_epoch_end`` the loader's
length. The scenarios run one after the other in the same process group.
Writes ``OUT/rank<r>.json``: ``{scenario: {"trained": {epoch: ids}, "lengths": [...], "counted":
[...], "at_start": [...]}}`` (the lists: one entry per epoch).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from teardown import shutdown

from lightning_varbatch import (
    DataSource,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataLoader,
    TokenBudgetDataModule,
    keys,
    token_budget_dataloader,
)
from lightning_varbatch.callbacks import RankShareBalancer
from lightning_varbatch.sources import ShardedSource

MAX_TOKENS = 48
NUM_EXAMPLES = 120
EPOCHS = 3
#: the shares set by hand after epoch 0 (rank 1's budget shrinks: more micro-batches per rank)
SHARES = (1.0, 0.4)
#: injected compute per padded token slot (s) in the balancer scenario; rank 1 twice as slow
PER_SLOT = 0.1e-3
#: read once: Lightning's teardown removes the variables it set
RANK, WORLD_SIZE = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def lengths_of(seed: int, n: int = NUM_EXAMPLES, low: int = 2, high: int = 17) -> list[int]:
    return np.random.default_rng(seed).integers(low, high, n).tolist()


def items_of(lengths: list[int], first: int = 0) -> list[dict[str, Any]]:
    return [{"tokens": [1] * n, "id": first + i} for i, n in enumerate(lengths)]


def counted(trainer: Trainer) -> int | None:
    """The epoch's micro-batches as Lightning counts them (``None``: no length, a stream)."""
    n = trainer.num_training_batches
    return None if n == math.inf else int(n)


class Counter(LightningModule):
    """One parameter; records the ids each epoch trains, the loader's length, Lightning's count.

    ``counted``: Lightning's count at the epoch's first batch (what the loop runs);
    ``at_start``: in ``on_train_epoch_start`` (what a progress bar shows), after the callbacks'.
    """

    def __init__(self, slow: float = 0.0) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(()))
        self.slow = slow
        self.trained: dict[int, list[int]] = {}
        self.lengths: list[int | None] = []
        self.counted: list[int | None] = []
        self.at_start: list[int | None] = []

    def on_train_epoch_start(self) -> None:
        self.at_start.append(counted(self.trainer))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        if batch_idx == 0:
            self.counted.append(counted(self.trainer))
        self.trained.setdefault(self.current_epoch, []).extend(batch["id"].tolist())
        if self.slow:
            time.sleep(self.slow * int(batch[keys.PADDED_TOKENS]))
        share = batch[keys.NTOKENS].float() / batch[keys.STEP_NTOKENS].float()
        return (self.w - 1.0) ** 2 * share

    def on_train_epoch_end(self) -> None:
        loader = self.trainer.train_dataloader
        self.lengths.append(len(loader) if isinstance(loader, TokenBudgetDataLoader) else None)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class OwnLoader(Counter):
    """A user's module that builds its own loader with ``token_budget_dataloader``."""

    def __init__(self, lengths: list[int]) -> None:
        super().__init__()
        self.items = items_of(lengths)

    def train_dataloader(self) -> TokenBudgetDataLoader:
        lengths = [len(item["tokens"]) for item in self.items]
        sampler = TokenBudgetBatchSampler(
            lengths,
            MAX_TOKENS,
            rank=self.trainer.global_rank,
            world_size=self.trainer.world_size,
            seed=0,
        )
        return token_budget_dataloader(self.items, sampler)


class SharesByHand(Callback):
    """Sets :data:`SHARES` for epoch 1 and equal shares again for epoch 2.

    ``at="end"``: in ``on_train_epoch_end`` of the epoch before; ``at="start"``: in
    ``on_train_epoch_start`` of the epoch itself (the sampler applies them at once: the epoch
    has not started), after Lightning has set the epoch.
    """

    def __init__(self, target: Callable[[Trainer], Any], at: str) -> None:
        self.target, self.at = target, at

    def _set(self, trainer: Trainer, epoch: int) -> None:
        if epoch in (1, 2):
            self.target(trainer).set_rank_shares(SHARES if epoch == 1 else None)

    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at == "end":
            self._set(trainer, trainer.current_epoch + 1)

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if self.at == "start":
            self._set(trainer, trainer.current_epoch)


def fit(
    model: Counter,
    datamodule: LightningDataModule | None = None,
    callbacks: list[Callback] | None = None,
    epochs: int = EPOCHS,
) -> dict[str, Any]:
    trainer = Trainer(
        accelerator="cpu",
        devices=WORLD_SIZE,
        strategy="ddp",
        max_epochs=epochs,
        callbacks=callbacks or [],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(model, datamodule=datamodule)
    return {
        "trained": {str(e): ids for e, ids in model.trained.items()},
        "lengths": model.lengths,
        "counted": model.counted,
        "at_start": model.at_start,
    }


def datamodule(lengths: list[int], **settings: Any) -> TokenBudgetDataModule:
    return TokenBudgetDataModule(items_of(lengths), lengths, MAX_TOKENS, seed=0, **settings)


def hand_shares() -> dict[str, Any]:
    dm = datamodule(lengths_of(0))
    return fit(Counter(), dm, [SharesByHand(lambda trainer: dm, at="end")])


def own_loader_shares() -> dict[str, Any]:
    def sampler(trainer: Trainer) -> Any:
        return trainer.train_dataloader.batch_sampler  # type: ignore[union-attr]

    return fit(OwnLoader(lengths_of(0)), None, [SharesByHand(sampler, at="start")])


def balancer() -> dict[str, Any]:
    slow = PER_SLOT * (2.0 if RANK == 1 else 1.0)
    return fit(Counter(slow), datamodule(lengths_of(0)), [RankShareBalancer(tolerance=0.0)])


def packed() -> dict[str, Any]:
    dm = datamodule(lengths_of(5), layout="packed", bucket_width=16, loss_offset=1)
    return fit(Counter(), dm, epochs=4)


def warmup() -> dict[str, Any]:
    dm = datamodule(lengths_of(2), length_warmup=20, length_warmup_min=3)
    return fit(Counter(), dm)


def mixture() -> dict[str, Any]:
    rng = np.random.default_rng(0)
    short, long = rng.integers(2, 12, 80).tolist(), rng.integers(6, 24, 40).tolist()
    sources = [
        DataSource(lengths=short, dataset=items_of(short)),
        DataSource(lengths=long, dataset=items_of(long, first=len(short))),
    ]
    dm = TokenBudgetDataModule(
        sources, max_tokens=MAX_TOKENS, seed=0, layout="packed", bucket_width=16, loss_offset=1
    )
    return fit(Counter(), dm, epochs=4)


class Shard:
    """A shard of python rows: ``(id, tokens)``."""

    def __init__(self, name: str, first: int, lengths: list[int]) -> None:
        self.name, self.first, self.rows = name, first, lengths

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return np.array(self.rows)

    def read(self, rows: Any) -> Any:
        return ({"tokens": [1] * self.rows[i], "id": self.first + int(i)} for i in rows)


def stream() -> dict[str, Any]:
    lengths = lengths_of(4)
    shards = [Shard(f"s{k}", 40 * k, lengths[40 * k : 40 * (k + 1)]) for k in range(3)]
    dm = StreamingDataModule(ShardedSource(shards), MAX_TOKENS, window=50, seed=4)
    return fit(Counter(), dm, epochs=2)


SCENARIOS: dict[str, Callable[[], dict[str, Any]]] = {
    "hand_shares": hand_shares,
    "own_loader_shares": own_loader_shares,
    "balancer": balancer,
    "packed": packed,
    "warmup": warmup,
    "mixture": mixture,
    "stream": stream,
}


def main() -> None:
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    records = {name: SCENARIOS[name]() for name in sys.argv[2:]}
    shutdown()
    (out / f"rank{RANK}.json").write_text(json.dumps(records))


if __name__ == "__main__":
    main()
