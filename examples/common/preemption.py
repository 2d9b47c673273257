"""Save a resumable checkpoint on SIGTERM/SIGINT and stop with a non-zero exit status.

Lightning 2.6 turns SIGTERM into ``SIGTERMException``, a ``SystemExit`` *without* a code: a
script that does not catch it exits 0 without saving, and a scheduler sees success. Lightning
also raises it after any micro-batch, in the middle of gradient accumulation, where no exact
checkpoint exists. :class:`PreemptionCheckpoint` instead, while training, validation or test
runs:

1. replaces the SIGTERM and SIGINT handlers with one that only records the signal (a second
   SIGINT interrupts at once, as Ctrl+C usually does);
2. agrees across ranks whether any of them was signalled (one all-reduce of one number, several
   processes only) at the end of every *optimizer step* (never mid-accumulation) and of every
   validation or test micro-batch, and then:

   - during training, or a validation inside training that began at a step boundary (the
     usual case: ``val_check_interval`` a multiple of ``accumulate_grad_batches``): saves
     ``<dirpath>/last.ckpt`` (the sampler position included: the DataModule saves it) on
     every rank's behalf, and raises :class:`Interrupted`. A validation is not waited for:
     it stops after the micro-batch in progress, and is not repeated on resume (Lightning
     resumes such a checkpoint after the validation, as one saved at ``on_validation_end``);
   - during a validation that began mid-accumulation: no exact state exists before the next
     optimizer step, so the validation runs to its end and training stops at that step;
   - during a test or a validation after training has ended: raises :class:`Interrupted` with
     the complete checkpoint of the finished training (see 3), or none without one.
3. Saves the final state to ``<dirpath>/last.ckpt`` (:attr:`final`) at the last optimizer
   step of a ``max_steps`` run (where the loops are still inside the epoch, so a resume with
   more steps continues it exactly), or else when ``fit`` ends: a
   ``ModelCheckpoint`` with ``save_last=True`` writes ``last.ckpt`` only at its own steps, so
   it would hold an earlier step whenever ``max_steps`` is not one of them, and a requeued job
   resuming from it would train the last steps again.

Lightning then calls the ``on_exception`` hooks and finalises the loggers (the CSV logger
flushes its metrics); :func:`~examples.common.fitting.fit` writes ``metrics.json`` with
``"interrupted"`` and the checkpoint's path, and exits with ``128 + signal``: 143 for SIGTERM,
130 for SIGINT (the shell's convention; SLURM and Kubernetes report such a job as failed or
preempted, not completed). ``python train.py ckpt_path=<that checkpoint>`` continues exactly.
After training has finished, ``metrics.json`` names the complete ``last.ckpt`` as
``"checkpoint"`` before any test begins, so a requeue script that resumes from it never trains
again.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

__all__ = ["Interrupted", "PreemptionCheckpoint"]

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Interrupted(Exception):
    """A run stopped on a signal; ``checkpoint`` resumes it (``None``: nothing to resume from).

    Attributes:
        signum: the signal number.
        checkpoint: the checkpoint to resume from: the one just saved, or after training
            has finished (a signal during the test) its complete final checkpoint.
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
    """On SIGTERM/SIGINT save ``dirpath/filename`` at the next exact point and stop.

    See the module's docstring for when that is (the next optimizer step, or the next
    validation micro-batch); when training ends the final state is saved there too.

    Args:
        dirpath: the checkpoint folder.
        filename: the checkpoint's name (``last.ckpt``: the newest state, as ModelCheckpoint's).

    Attributes:
        path: ``dirpath / filename``.
        final: ``str(path)`` once ``fit`` has ended and its final state is saved there
            (``None`` before, and after an interruption).
    """

    def __init__(self, dirpath: str | Path, filename: str = "last.ckpt") -> None:
        self.path = Path(dirpath) / filename
        self.signum: int | None = None
        self.final: str | None = None
        self._previous: dict[int, Any] = {}
        self._at_step = True  # the last training micro-batch ended an optimizer step
        self._waiting = False  # a signal came mid-accumulation: said so once

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        del frame
        if self.signum == signal.SIGINT and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl+C: stop now, without a checkpoint
        self.signum = signum

    def _install(self) -> None:
        if self._previous or threading.current_thread() is not threading.main_thread():
            return  # installed already; signal handlers can only be set from the main thread
        self.signum = None
        for sig in SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._handle)

    def _restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    # Lightning registers its SIGTERM handler when fit/validate/test starts, before these
    # hooks; ours replaces it while the stage runs (Lightning restores the originals at
    # teardown).
    @override
    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.final, self.signum = None, None

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._at_step, self._waiting = True, False
        self._install()  # kept from the sanity check, if one ran

    @override
    def on_validation_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install()

    @override
    def on_test_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._install()

    @override
    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # Also when fit() had nothing left to train (resumed from a finished checkpoint,
        # where Lightning calls neither on_train_start nor on_train_end). Our handler stays
        # until the save is done, so that a signal during it is not lost.
        if self.final is None:  # not saved at the last optimizer step (max_steps) already
            trainer.save_checkpoint(self.path)  # collective: the complete, final state
            self.final = str(self.path)
        signum = self._any_rank_signalled(trainer)
        self._restore()
        if signum:
            raise Interrupted(signum, self.final, int(trainer.global_step))

    @override
    def on_validation_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not _fitting(trainer):
            self._restore()

    @override
    def on_test_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
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

    def _save_and_stop(self, trainer: Trainer, signum: int) -> None:
        trainer.save_checkpoint(self.path)  # collective: every rank calls it, rank 0 writes
        raise Interrupted(signum, str(self.path), int(trainer.global_step))

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
        self._at_step = (batch_idx + 1) % trainer.accumulate_grad_batches == 0 or bool(
            loop.batch_progress.is_last_batch
        )
        if not self._at_step:
            return  # mid-accumulation: no exact checkpoint exists here
        if 0 < trainer.max_steps <= trainer.global_step:
            # The last optimizer step: the final state is saved here, while the loops' state is
            # still inside the epoch. Saved when fit ends, a run stopped mid-epoch by max_steps
            # would record its epoch as finished and resume with the next one, skipping the
            # rest of this one.
            trainer.save_checkpoint(self.path)  # collective
            self.final = str(self.path)
        signum = self._any_rank_signalled(trainer)
        if signum:
            self._save_and_stop(trainer, signum)

    def _evaluation_batch_end(self, trainer: Trainer) -> None:
        signum = self._any_rank_signalled(trainer)
        if not signum:
            return
        if trainer.sanity_checking:
            raise Interrupted(signum, None, int(trainer.global_step))
        if not _fitting(trainer):  # a test or a validation after (or without) training
            raise Interrupted(signum, self.final, int(trainer.global_step))
        if self._at_step:
            self._save_and_stop(trainer, signum)
        if not self._waiting and trainer.is_global_zero:
            self._waiting = True
            print(
                f"{signal.Signals(signum).name} received during a validation that began "
                "mid-accumulation: finishing it, then stopping at the next optimizer step "
                "(make trainer.val_check_interval a multiple of "
                "trainer.accumulate_grad_batches to stop at once).",
                file=sys.stderr,
            )

    @override
    def on_validation_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._evaluation_batch_end(trainer)

    @override
    def on_test_batch_end(
        self,
        trainer: Trainer,
        pl_module: LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._evaluation_batch_end(trainer)


def _fitting(trainer: Trainer) -> bool:
    """Whether ``trainer`` is inside ``fit`` (training, or a validation within it)."""
    return trainer.state.fn == TrainerFn.FITTING
