"""``Trainer.fit`` (and ``Trainer.test``) with the ways a run can stop turned into outcomes.

:func:`fit` trains, records the finished training in ``metrics.json`` at once
(:func:`~examples.common.summary.record_trained`), runs the test when asked, and turns

- a signal caught by ``callbacks.preemption``
  (:class:`~examples.common.preemption.Interrupted`) or Lightning's own ``SIGTERMException``
  into ``metrics.json`` with ``interrupted`` and exit status ``128 + signal``
  (:func:`~examples.common.summary.stop_on_signal`);
- a DeepSpeed checkpoint folder saved for other data (read only by ``fit``) into a
  :class:`~examples.common.config_checks.ConfigError` naming ``on_resume_mismatch``.

Example:
    >>> from examples.common.fitting import fit
    >>> fit.__name__
    'fit'
"""

from __future__ import annotations

import signal
from typing import Any

from lightning.pytorch import Callback, LightningDataModule, LightningModule, Trainer
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.common.preemption import Interrupted
from examples.common.summary import record_trained, scalar_metrics, stop_on_signal
from lightning_varbatch import ResumeMismatchError

__all__ = ["fit"]


def fit(
    trainer: Trainer,
    model: LightningModule,
    dm: LightningDataModule,
    cfg: DictConfig,
    metrics: dict[str, Any],
    callbacks: list[Callback],
    *,
    test: bool = False,
) -> None:
    """Fit ``model`` on ``dm`` from ``cfg.ckpt_path``; with ``test``, test it afterwards.

    ``metrics`` gets the Trainer's final callback metrics (after the test, the test's too:
    ``test()`` replaces them), and ``trained``/``checkpoint``/``global_step`` once training
    has finished.

    Raises:
        SystemExit: with status 143 (SIGTERM) or 130 (SIGINT) when the run was interrupted,
            after writing ``metrics.json`` with ``interrupted`` and ``checkpoint``.
        ConfigError: for a DeepSpeed checkpoint folder saved for other data.

    Example:
        >>> fit(trainer, model, dm, cfg, metrics, callbacks, test=True)  # doctest: +SKIP
    """
    try:
        trainer.fit(model, dm, ckpt_path=cfg.get("ckpt_path"))
        metrics.update(scalar_metrics(trainer))
        record_trained(trainer, metrics, callbacks)  # metrics.json names the complete last.ckpt
        if test:
            trainer.test(model, dm)
            metrics.update(scalar_metrics(trainer))  # test() replaced the callback metrics
    except Interrupted as stop:
        stop_on_signal(trainer, metrics, stop.signum, stop.checkpoint)
    except SIGTERMException:  # Lightning's own, outside our hooks: the finished training's
        stop_on_signal(trainer, metrics, int(signal.SIGTERM), metrics.get("checkpoint"))
    except ResumeMismatchError as error:  # a DeepSpeed checkpoint folder is only read by fit()
        raise ConfigError(
            f"ckpt_path={cfg.ckpt_path} cannot resume on this data: {error} -- add "
            "on_resume_mismatch=restart_epoch to start the checkpoint's epoch afresh."
        ) from error
