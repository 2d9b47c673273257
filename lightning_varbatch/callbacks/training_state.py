"""Keep a module's training state through work that must leave no trace.

:class:`KeepTrainingState` snapshots a module's buffers (BatchNorm statistics), its parameters'
gradients and the torch / CUDA / numpy / Python RNG states, and restores them on exit (after
clearing the optimizers' gradients). :class:`~lightning_varbatch.callbacks.WorstBatchCheck` runs
its forward and backward passes inside it, so training after the check is the training without it.

Example:
    >>> layer = torch.nn.BatchNorm1d(2)
    >>> with KeepTrainingState(layer, []):
    ...     _ = layer(torch.randn(4, 2)).sum().backward()
    >>> layer.running_mean.tolist(), layer.weight.grad is None
    ([0.0, 0.0], True)
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

__all__ = ["KeepTrainingState"]


class KeepTrainingState:
    """Keep buffers, gradients and RNG states of a module as they were; restore on exit.

    Args:
        module: the module whose buffers and gradients to keep.
        optimizers: their ``zero_grad(set_to_none=True)`` runs first on exit.

    Example:
        >>> with KeepTrainingState(torch.nn.Linear(1, 1), []):
        ...     _ = torch.rand(3)  # the RNG advances inside ...
        >>> state = torch.get_rng_state()  # ... and is back as it was after
    """

    def __init__(self, module: torch.nn.Module, optimizers: Sequence[Any]) -> None:
        self.module, self.optimizers = module, optimizers

    def __enter__(self) -> KeepTrainingState:
        self.buffers = {n: b.detach().clone() for n, b in self.module.named_buffers()}
        self.grads = {
            n: None if p.grad is None else p.grad.detach().clone()
            for n, p in self.module.named_parameters()
        }
        self.rng: dict[str, Any] = {
            "torch": torch.get_rng_state(),
            "numpy": np.random.get_state(),  # noqa: NPY002  (the legacy global state)
            "python": random.getstate(),
        }
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            self.rng["cuda"] = torch.cuda.get_rng_state_all()
        return self

    def __exit__(self, *exc: object) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        with torch.no_grad():
            for n, p in self.module.named_parameters():
                saved = self.grads.get(n)
                p.grad = saved
            for n, b in self.module.named_buffers():
                if n in self.buffers:
                    b.copy_(self.buffers[n])
        torch.set_rng_state(self.rng["torch"])
        np.random.set_state(self.rng["numpy"])  # noqa: NPY002
        random.setstate(self.rng["python"])
        if "cuda" in self.rng:
            torch.cuda.set_rng_state_all(self.rng["cuda"])
