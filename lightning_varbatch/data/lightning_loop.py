"""Every Lightning internal the package reads or sets, in one place (Lightning 2.5.1 to 2.6).

``FitLoop.setup_data`` reads the train loader's ``len()`` once per ``fit`` into the combined
loader's ``limits``, ``fit_loop.max_batches`` (``trainer.num_training_batches``) and
``trainer.val_check_batch``: a longer epoch than the first would stop at the first's count.
Each epoch ``FitLoop.on_advance_start`` calls ``set_epoch`` on ``dataloader.sampler`` before the
``on_train_epoch_start`` hooks and ``TrainingEpochLoop.on_run_start`` calls ``iter()`` on the
loader after them; our training loader calls :func:`follow_epoch_length` at both, with the
Trainer of the loop on the call stack (:func:`calling_trainer`), so whatever changed the epoch's
number of micro-batches (rank shares, packed rows cut anew) is what Lightning runs. Lightning is
imported only when a Trainer exists: the loader imports without it.

Example:
    >>> calling_trainer() is None, fit_epoch(None), trained_this_epoch(None)
    (True, 0, 0)
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lightning.pytorch import Trainer

__all__ = [
    "calling_trainer",
    "fit_epoch",
    "follow_epoch_length",
    "resumed_mid_epoch",
    "trained_this_epoch",
]

_DEPTH = 12  # frames searched: the loader's iter() runs 8 calls below the loop


def calling_trainer() -> Trainer | None:
    """The Trainer of the Lightning loop (``_Loop.trainer``) that called us, else ``None``.

    Example:
        >>> calling_trainer() is None  # no loop on the call stack
        True
    """
    loops = sys.modules.get("lightning.pytorch.loops.loop")
    if loops is None:  # Lightning was never imported: no loop runs
        return None
    frame = sys._getframe(1)
    for _ in range(_DEPTH):
        owner = frame.f_locals.get("self")
        if isinstance(owner, loops._Loop):
            return owner.trainer
        if frame.f_back is None:
            return None
        frame = frame.f_back
    return None


def follow_epoch_length(trainer: Trainer | None) -> None:
    """Make Lightning run this epoch's length of the train loader, not the first epoch's.

    Sets what ``setup_data`` set from the loaders' lengths now: the limits (in place: the
    epoch's iterator holds the same list), ``max_batches`` and, for a fractional
    ``val_check_interval``, ``val_check_batch``. Our training loaders call it themselves; call
    it in ``on_train_epoch_start`` for a loader of another kind whose length changes. Nothing
    happens outside a running fit or for a loader without a length (Lightning runs it out).

    Args:
        trainer: the Trainer (``None``: nothing to do).

    Example:
        >>> follow_epoch_length(None)  # outside a Trainer: nothing to follow
    """
    if trainer is None or trainer.fit_loop._combined_loader is None:
        return  # outside a fit
    loop, combined = trainer.fit_loop, trainer.fit_loop._combined_loader
    if combined._iterator is None or combined.limits is None:
        return  # inside setup_data: it reads the lengths next
    from lightning.fabric.utilities.data import sized_len
    from lightning.pytorch.trainer.connectors.data_connector import _parse_num_batches
    from lightning.pytorch.trainer.states import RunningStage

    lengths = [sized_len(loader) for loader in combined.flattened]
    if None in lengths or loop.max_batches == math.inf:
        return  # a loader without a length: Lightning runs it out
    limit, stage = trainer.limit_train_batches, RunningStage.TRAINING
    combined.limits[:] = [_parse_num_batches(stage, n, limit) for n in lengths if n is not None]
    length = sized_len(combined)
    if length is None or length == loop.max_batches:
        return
    loop.max_batches = length
    check = trainer.val_check_batch
    if isinstance(trainer.val_check_interval, float) and check is not None and check != math.inf:
        trainer.val_check_batch = max(1, int(length * trainer.val_check_interval))


def fit_epoch(trainer: Any) -> int:
    """The epoch the fit loop is in (``epoch_progress.current.processed``; 0 without one).

    Example:
        >>> fit_epoch(None)
        0
    """
    if trainer is None:
        return 0
    return int(trainer.fit_loop.epoch_progress.current.processed)


def trained_this_epoch(trainer: Any) -> int:
    """Micro-batches the fit loop has trained this epoch (0 outside a Trainer).

    Counted before ``on_train_batch_end`` (a checkpoint there counts its batch), never prefetched.

    Example:
        >>> trained_this_epoch(None)
        0
    """
    if trainer is None:
        return 0
    return int(trainer.fit_loop.epoch_loop.batch_progress.current.processed)


def resumed_mid_epoch(trainer: Any) -> bool:
    """Whether the fit resumed from ``ckpt_path`` with micro-batches of its epoch trained.

    Lightning's own judgement (``FitLoop.restarting``, set when the loops' state is loaded); a
    checkpoint of a finished epoch is not inside one.

    Example:
        >>> resumed_mid_epoch(None)
        False
    """
    if trainer is None or getattr(trainer, "ckpt_path", None) is None:
        return False
    return trained_this_epoch(trainer) > 0 and bool(trainer.fit_loop.restarting)
