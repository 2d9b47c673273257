"""One rank of a balancing run: ``rank_balance_train.py OUT``.

Two gloo ranks train 3 short epochs on token-budgeted batches (``TokenBudgetBatchSampler``
through ``token_budget_dataloader``, whose batches carry the plan's counts). Every rank's
forward sleeps in proportion to its micro-batch's padded size (the plan's ``"padded"`` cost),
rank 1 ``SLOW`` times as long: a rank half as fast. ``RankShareBalancer`` measures and sets
the shares at each epoch's end; ``TokenThroughputMonitor`` logs the per-rank figures. Writes
``OUT/rank<r>.json``: the ids trained per epoch, the shares and budgets each epoch was planned
with, the balancer's history, its state (as saved in a Lightning checkpoint, and after a round
trip) and rank 0's logs.
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
from strategy_common import MAX_TOKENS, loss_sum, make_model, make_sequences
from teardown import shutdown

from lightning_varbatch import (
    TokenBudgetBatchSampler,
    TokenBudgetDataLoader,
    keys,
    token_budget_dataloader,
)
from lightning_varbatch.callbacks import RankShareBalancer, TokenThroughputMonitor
from lightning_varbatch.loss import token_mean_loss

EPOCHS = 3
SLOW = 2.0
#: injected compute per padded token slot (s): rank 0 ~10 ms per micro-batch of 48 slots
PER_SLOT = 0.2e-3


class Model(LightningModule):
    def __init__(self, slow: float) -> None:
        super().__init__()
        self.net = make_model()
        self.sequences = make_sequences()
        self.delay = PER_SLOT * slow
        self.trained: dict[int, list[int]] = {}
        self.work: dict[int, int] = {}

    def train_dataloader(self) -> TokenBudgetDataLoader:
        sampler = TokenBudgetBatchSampler(
            [len(s) for s in self.sequences],
            MAX_TOKENS,
            rank=self.trainer.global_rank,
            world_size=self.trainer.world_size,
            seed=0,
        )
        items = [{"tokens": s, "id": i} for i, s in enumerate(self.sequences)]
        return token_budget_dataloader(items, sampler)

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        epoch = self.current_epoch
        self.trained.setdefault(epoch, []).extend(batch["id"].tolist())
        slots = int(batch[keys.PADDED_TOKENS])  # the "padded" cost the plan budgets
        self.work[epoch] = self.work.get(epoch, 0) + slots
        time.sleep(self.delay * slots)  # the injected, per-token compute
        return token_mean_loss(
            loss_sum(self.net, batch["tokens"]),
            batch[keys.STEP_NTOKENS],
            self.trainer.world_size,
            1,
        )

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)


class PlanRecorder(Callback):
    """The shares and budgets every epoch's plan was made with."""

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        sampler = trainer.train_dataloader.batch_sampler  # type: ignore[union-attr]
        shares = sampler.rank_shares
        self.epochs.append(
            {
                "shares": None if shares is None else list(shares),
                "budgets": list(sampler.rank_budgets),
            }
        )


def main() -> None:
    out = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    seed_everything(0, verbose=False)
    balancer = RankShareBalancer()
    plans = PlanRecorder()
    logger = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy="ddp",
        use_distributed_sampler=False,
        max_epochs=EPOCHS,
        callbacks=[plans, balancer, TokenThroughputMonitor(log_every_n_steps=4)],
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model(SLOW if rank == 1 else 1.0)
    trainer.fit(model)
    checkpoint = out / "last.ckpt"
    trainer.save_checkpoint(checkpoint)  # every rank calls it; rank 0 writes
    trainer.strategy.barrier()
    saved = torch.load(checkpoint, weights_only=False)["callbacks"]
    in_checkpoint = [v for k, v in saved.items() if k.startswith("RankShareBalancer")]
    restored = RankShareBalancer()
    restored.load_state_dict(json.loads(json.dumps(balancer.state_dict())))
    record = {
        "rank": rank,
        "trained": {str(e): ids for e, ids in model.trained.items()},
        "work": {str(e): w for e, w in model.work.items()},
        "plans": plans.epochs,
        "history": balancer.history,
        "shares": balancer.shares,
        "state": balancer.state_dict(),
        "in_checkpoint": in_checkpoint,
        "round_trip": restored.state_dict(),
        "logged": logger.calls,
        "num_examples": len(model.sequences),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
