"""One rank of a run under a batch-size schedule: ``schedule_train.py OUT STRATEGY [OPTIONS]``.

The sequences, model and loss of ``strategy_train.py`` (``strategy_common``), through
``TokenBudgetDataModule(items, lengths, MAX_TOKENS, batch_schedule=SCHEDULE)`` and the library's
collate, for ``EPOCHS`` epochs with ``accumulate_grad_batches=ACCUMULATE``: with the default
schedule epoch 0 starts at fractions below 1 of the full step and changes stage within the
epoch, epoch 1 is all full steps (and so has fewer micro-batches than epoch 0). SGD at ``LR``
with ``ExponentialLR(gamma)`` (a chainable scheduler, where a leaked factor would compound),
``BatchSizeLRScaler("sqrt")`` and ``TokenThroughputMonitor(log_every_n_steps=1)``.

Options: ``--schedule TEXT`` (default ``SCHEDULE``), ``--gamma G`` (default ``GAMMA``);
``--checkpoint-every K`` saves a checkpoint every K optimizer steps to ``OUT/ckpt``;
``--resume CKPT`` resumes from it (on this launch's world size, which may differ).

Writes ``OUT/rank<r>.json``: initial parameters, the full parameters after every optimizer
step (``--resume``: none), every micro-batch (epoch, Lightning's step, the plan's step,
ids, counts, ``step_budget``, ``step_cost``), the learning rate of every real update (read in a
step post-hook registered before the scaler's, so it sees the scaled value the update used),
the scaler's reference and (rank 0) what the loggers received.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from callbacks_train import Recorder
from hf_source import RecordingCollate
from lightning.pytorch import Trainer, seed_everything
from lightning.pytorch.callbacks import ModelCheckpoint
from strategy_common import ACCUMULATE, LR, MAX_TOKENS, make_sequences
from strategy_train import Model, Snapshots, make_strategy
from teardown import shutdown

from lightning_varbatch import TokenBudgetDataModule, keys
from lightning_varbatch.callbacks import BatchSizeLRScaler, TokenThroughputMonitor

#: Fractions of the full step by planning tokens trained (an epoch holds 815): with 2 ranks,
#: epoch 0's 8 steps run at 0.375, 0.375, 0.5, 0.5, 0.75, 1, 1, 1.
SCHEDULE = "0:0.375 150:0.5 300:0.75 450:1"
EPOCHS = 2
GAMMA = 0.9


class ScheduledModel(Model):
    """``strategy_train.Model`` recording the schedule's counts and the LR of every update."""

    def __init__(self, gamma: float) -> None:
        super().__init__()
        self.gamma = gamma
        self.lrs: list[float] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.micro_batches[-1].update(
            epoch=self.trainer.current_epoch,
            step_budget=int(batch[keys.STEP_BUDGET]),
            step_cost=int(batch[keys.STEP_COST]),
        )
        return loss

    def configure_optimizers(self) -> Any:
        opt = torch.optim.SGD(self.parameters(), lr=LR)
        # Registered before BatchSizeLRScaler attaches (on_train_start): runs before the
        # scaler's post-hook puts the scheduler's value back, once per real update.
        opt.register_step_post_hook(lambda o, *_: self.lrs.append(o.param_groups[0]["lr"]))
        sched = torch.optim.lr_scheduler.ExponentialLR(opt, gamma=self.gamma)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def datamodule(schedule: str) -> TokenBudgetDataModule:
    sequences = make_sequences()
    return TokenBudgetDataModule(
        [{"id": i, "tokens": s} for i, s in enumerate(sequences)],
        [len(s) for s in sequences],
        MAX_TOKENS,
        collate=RecordingCollate(),
        seed=0,
        batch_schedule=schedule,
    )


def pop_option(argv: list[str], option: str) -> str | None:
    """Remove ``OPTION VALUE`` from ``argv`` (in place) and return VALUE (default ``None``)."""
    if option not in argv:
        return None
    at = argv.index(option)
    value = argv[at + 1]
    del argv[at : at + 2]
    return value


def train(out: Path, args: list[str]) -> dict[str, Any]:
    """One run on this rank; ``args``: the command line after OUT. Returns the rank's record."""
    argv = list(args)
    every, resume = pop_option(argv, "--checkpoint-every"), pop_option(argv, "--resume")
    schedule = pop_option(argv, "--schedule") or SCHEDULE
    gamma = float(pop_option(argv, "--gamma") or GAMMA)
    name = argv[0]
    world = int(os.environ["WORLD_SIZE"])
    seed_everything(0, verbose=False)
    model = ScheduledModel(gamma)
    init = {n: p.detach().double().tolist() for n, p in model.net.named_parameters()}
    scaler = BatchSizeLRScaler(rule="sqrt")
    snapshots = Snapshots()
    callbacks: list[Any] = [scaler, TokenThroughputMonitor(log_every_n_steps=1)]
    if resume is None:
        callbacks.append(snapshots)
    if every is not None:
        callbacks.append(
            ModelCheckpoint(dirpath=out / "ckpt", every_n_train_steps=int(every), save_top_k=-1)
        )
    logger = Recorder()
    trainer = Trainer(
        accelerator="cpu",
        devices=world,
        strategy=make_strategy(name, None) if world > 1 else "auto",
        accumulate_grad_batches=ACCUMULATE,
        max_epochs=EPOCHS,
        callbacks=callbacks,
        logger=logger,
        log_every_n_steps=1,
        enable_checkpointing=every is not None,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(model, datamodule=datamodule(schedule), ckpt_path=resume)
    return {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "strategy": type(trainer.strategy).__name__,
        "global_step": trainer.global_step,
        "init": init,
        "params": {str(k): v for k, v in snapshots.params.items()},
        "micro_batches": model.micro_batches,
        "lrs": model.lrs,
        "reference": scaler.reference,
        "logged": logger.calls,
    }


def main() -> None:
    out = Path(sys.argv[1])  # tests.launch.launch puts OUT first
    record = train(out, sys.argv[2:])
    (out / f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
