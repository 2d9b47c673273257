"""``<output_dir>/metrics.json``: what a run writes about itself, and when.

Rank 0 writes it (:func:`write_summary`) as soon as training has finished
(:func:`record_trained`: ``trained`` and the complete ``checkpoint``), when a signal stops the
run (:func:`stop_on_signal`: ``interrupted``, ``checkpoint``, ``exit_code``), and at the end
with the final metrics (:func:`finish_metrics` adds what every run reports).

Example:
    >>> summary_of({"val/loss": 1.5, "output_dir": "out", "tensor": object()})
    {'val/loss': 1.5, 'output_dir': 'out'}
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from lightning.pytorch import Callback, Trainer

from examples.common.preemption import PreemptionCheckpoint

__all__ = [
    "finish_metrics",
    "rank",
    "record_trained",
    "save_tokenizer",
    "scalar_metrics",
    "stop_on_signal",
    "summary_of",
    "world_size",
    "write_summary",
]


def rank() -> int:
    """This process's global rank from the environment (0 before any launch).

    Example:
        >>> rank() >= 0
        True
    """
    return int(os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0")))


def world_size() -> int:
    """The number of processes from the environment (1 before any launch).

    Example:
        >>> world_size() >= 1
        True
    """
    return int(os.environ.get("WORLD_SIZE", "1"))


def scalar_metrics(trainer: Trainer) -> dict[str, float]:
    """The Trainer's one-number callback metrics, as floats.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> scalar_metrics(Trainer(logger=False, enable_progress_bar=False))
        {}
    """
    return {k: float(v) for k, v in trainer.callback_metrics.items() if v.numel() == 1}


def summary_of(metrics: dict[str, Any]) -> dict[str, Any]:
    """What of ``metrics`` goes into ``metrics.json``: numbers, strings and mappings.

    Example:
        >>> summary_of({"global_step": 3, "trainer": object()})
        {'global_step': 3}
    """
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str, dict))}


def write_summary(metrics: dict[str, Any]) -> None:
    """``<output_dir>/metrics.json`` (rank 0): the final metrics, or how the run stopped.

    Example:
        >>> import tempfile
        >>> folder = tempfile.mkdtemp()
        >>> write_summary({"output_dir": folder, "global_step": 3})
        >>> json.loads((Path(folder) / "metrics.json").read_text())["global_step"]
        3
    """
    if rank() == 0 and metrics.get("output_dir"):
        path = Path(metrics["output_dir"]) / "metrics.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(summary_of(metrics), indent=2))


def record_trained(trainer: Trainer, metrics: dict[str, Any], callbacks: list[Callback]) -> None:
    """Training has finished: name its complete checkpoint in ``metrics.json`` at once.

    ``callbacks.preemption`` saved the final state to ``last.ckpt`` when training ended
    (:attr:`PreemptionCheckpoint.final`); ``metrics.json`` names it as ``checkpoint`` before a
    test begins, so a requeue script that resumes from it does not train again, whatever
    stops the job later. Without that callback ``checkpoint`` is null.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> metrics = {}
        >>> record_trained(Trainer(logger=False, enable_progress_bar=False), metrics, [])
        >>> metrics
        {'checkpoint': None, 'global_step': 0, 'trained': True}
    """
    finals = [c.final for c in callbacks if isinstance(c, PreemptionCheckpoint)]
    metrics.update(
        checkpoint=next((f for f in finals if f is not None), None),
        global_step=int(trainer.global_step),
        trained=True,
    )
    write_summary(metrics)


def _resume_hint(metrics: dict[str, Any], ckpt: str | None) -> str:
    """How to go on from an interrupted run."""
    if ckpt and metrics.get("trained"):
        return (
            f"training had finished; resume with the same overrides plus ckpt_path={ckpt} "
            "to run what followed it"
        )
    if ckpt:
        return f"resume with the same overrides plus ckpt_path={ckpt}"
    return "no checkpoint was written (the signal came before training started)"


def stop_on_signal(
    trainer: Trainer, metrics: dict[str, Any], signum: int, ckpt: str | None
) -> None:
    """Write what the interrupted run has, say how to resume, exit with ``128 + signum``.

    Raises:
        SystemExit: always, with status ``128 + signum`` (143 for SIGTERM, 130 for SIGINT).

    Example:
        >>> from lightning.pytorch import Trainer
        >>> import signal
        >>> trainer = Trainer(logger=False, enable_progress_bar=False)
        >>> stop_on_signal(trainer, {"output_dir": None}, signal.SIGTERM, None)  # doctest: +SKIP
        Traceback (most recent call last):
        SystemExit: 143
    """
    name = signal.Signals(signum).name
    metrics.update(scalar_metrics(trainer))
    metrics.update(
        interrupted=name,
        checkpoint=ckpt,
        global_step=int(trainer.global_step),
        exit_code=128 + signum,
    )
    write_summary(metrics)
    if trainer.global_rank == 0:
        print(
            f"Interrupted by {name} after {metrics['global_step']} optimizer steps: "
            f"{_resume_hint(metrics, ckpt)}. Summary: "
            f"{Path(metrics['output_dir']) / 'metrics.json'}; exit status {128 + signum}.",
            file=sys.stderr,
        )
    raise SystemExit(128 + signum)


def save_tokenizer(trainer: Trainer, output_dir: Path, tokenizer: Any) -> None:
    """Create ``output_dir`` and save the run's tokenizer there as ``tokenizer.json`` (rank 0).

    Example:
        >>> import tempfile
        >>> from lightning.pytorch import Trainer
        >>> class Tokenizer:
        ...     def save(self, path: str) -> None:
        ...         Path(path).write_text("{}")
        >>> out = Path(tempfile.mkdtemp()) / "run"
        >>> save_tokenizer(Trainer(logger=False), out, Tokenizer())
        >>> (out / "tokenizer.json").read_text()
        '{}'
    """
    if trainer.global_rank == 0:
        output_dir.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(output_dir / "tokenizer.json"))


def finish_metrics(trainer: Trainer, metrics: dict[str, Any], start: float, tokenizer: Any) -> None:
    """Add what every run reports at its end to ``metrics``.

    ``global_step``, ``log_dir`` (None without a logger), ``ckpt_dir`` (the
    ``ModelCheckpoint``'s folder), ``seconds`` since ``start`` (a ``time.perf_counter()``),
    ``world_size`` and ``tokenizer_sha`` (the SHA-256 of the tokenizer's JSON).

    Example:
        >>> import time
        >>> from lightning.pytorch import Trainer
        >>> class Tokenizer:
        ...     def to_str(self) -> str:
        ...         return "{}"
        >>> metrics = {}
        >>> finish_metrics(Trainer(logger=False), metrics, time.perf_counter(), Tokenizer())
        >>> sorted(metrics)
        ['ckpt_dir', 'global_step', 'log_dir', 'seconds', 'tokenizer_sha', 'world_size']
    """
    checkpoint = trainer.checkpoint_callback
    metrics.update(
        global_step=int(trainer.global_step),
        log_dir=trainer.log_dir if trainer.loggers else None,
        ckpt_dir=getattr(checkpoint, "dirpath", None),
        seconds=time.perf_counter() - start,
        world_size=int(trainer.world_size),
        tokenizer_sha=hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
    )
