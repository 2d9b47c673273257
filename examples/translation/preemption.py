"""Save a resumable checkpoint on SIGTERM/SIGINT and stop with a non-zero exit status.

Lightning 2.6 turns SIGTERM into ``SIGTERMException``, a ``SystemExit`` *without* a code: a
script that does not catch it exits 0 without saving, and a scheduler sees success. Lightning
also raises it after any micro-batch, in the middle of gradient accumulation, where no exact
checkpoint exists. :class:`PreemptionCheckpoint` instead, while training runs:

1. replaces the SIGTERM and SIGINT handlers with one that only records the signal (a second
   SIGINT interrupts at once, as Ctrl+C usually does);
2. at the end of the next *optimizer step* (never mid-accumulation) agrees across ranks whether
   any of them was signalled (one all-reduce of one number per step, several processes only),
   saves ``<dirpath>/last.ckpt`` (the sampler position included: the DataModule saves it) on
   every rank's behalf, and raises :class:`Interrupted`.

Lightning then calls the ``on_exception`` hooks and finalises the loggers (the CSV logger
flushes its metrics); :func:`~examples.translation.train.train` writes ``metrics.json`` with
``"interrupted"`` and the checkpoint's path, and exits with ``128 + signal``: 143 for SIGTERM,
130 for SIGINT (the shell's convention; SLURM and Kubernetes report such a job as failed or
preempted, not completed). ``python train.py ckpt_path=<that checkpoint>`` continues exactly.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from typing_extensions import override

__all__ = ["Interrupted", "PreemptionCheckpoint"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
    """Training stopped on a signal after saving ``checkpoint`` (``None``: nothing trained).

    Attributes:
        signum: the signal number.
        checkpoint: the saved checkpoint's path.
        exit_code: ``128 + signum`` (143 for SIGTERM, 130 for SIGINT).
    """

    def __init__(self, signum: int, checkpoint: str | None, global_step: int) -> None:
        self.signum = int(signum)
        self.checkpoint = checkpoint
        self.global_step = global_step
        self.exit_code = 128 + self.signum
        name = signal.Signals(self.signum).name
        super().__init__(
            f"{name} received: stopped after optimizer step {global_step}"
            + (f", checkpoint {checkpoint}" if checkpoint else "")
        )


class PreemptionCheckpoint(Callback):
    """On SIGTERM/SIGINT save ``dirpath/filename`` at the next optimizer step and stop.

    Args:
        dirpath: the checkpoint folder.
        filename: the checkpoint's name (``last.ckpt``: the newest state, as ModelCheckpoint's).
    """

    def __init__(self, dirpath: str | Path, filename: str = "last.ckpt") -> None:
        self.path = Path(dirpath) / filename
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl+C: stop now, without a checkpoint
        self.signum = signum

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Lightning registers its SIGTERM handler just before this hook; ours replaces it
        # for the time of training (Lightning restores the original handlers at teardown).
        self.signum = None
        self._install()

    @override
    def on_train_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._restore()

    @override
    def on_exception(
        self, trainer: Trainer, pl_module: LightningModule, exception: BaseException
    ) -> None:
        self._restore()

    def _any_rank_signalled(self, trainer: Trainer) -> int:
        mine = self.signum or 0
        if trainer.world_size < 2:
            return mine
        flag = torch.tensor(mine, dtype=torch.int64, device=trainer.strategy.root_device)
        return int(trainer.strategy.reduce(flag, reduce_op="max"))

    @override
    def on_train_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        loop = trainer.fit_loop.epoch_loop
        stepped = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or bool(
            loop.batch_progress.is_last_batch
        )
        if not stepped:
            return  # mid-accumulation: no exact checkpoint exists here
        signum = self._any_rank_signalled(trainer)
        if not signum:
            return
        trainer.save_checkpoint(self.path)  # collective: every rank calls it, rank 0 writes
        raise Interrupted(signum, str(self.path), int(trainer.global_step))
