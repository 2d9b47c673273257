"""The contract between the sampler and its planners: what a planner must offer.

The sampler, DataModules, loader checks, diagnostics and plan CLI use only what :class:`Planner`
names; every rank's planner must give the same plan for the same epoch, topology and history.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, MixturePlanner, PlanConfig
    >>> config = PlanConfig(max_tokens=16)
    >>> planners: list[Planner] = [EpochPlanner([3, 5], config), MixturePlanner([[3], [5]], config)]
    >>> all(isinstance(p, Planner) for p in planners)
    True
    >>> [p.names for p in planners], [p.offsets.tolist() for p in planners]
    ([['0'], ['0', '1']], [[0, 2], [0, 1, 2]])
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["Planner"]


@runtime_checkable
class Planner(Protocol):
    """What a planner must offer; ``isinstance(obj, Planner)`` checks the members are present."""

    @property
    def config(self) -> PlanConfig:
        """The settings (a mixture's common settings; a dataset may override its budget)."""
        ...

    @property
    def prepared(self) -> PreparedLengths:
        """Every example's planning (``key``) and loss lengths, in global id order."""
        ...

    @property
    def num_examples(self) -> int:
        """Examples of all datasets, skipped ones included (the sampler's id space)."""
        ...

    @property
    def num_planned(self) -> int:
        """Examples that take part in every epoch (all but the skipped ones)."""
        ...

    @property
    def num_skipped(self) -> int:
        """Examples left out of every epoch by ``oversize="skip"``."""
        ...

    @property
    def num_truncated(self) -> int:
        """Examples cut by ``oversize="truncate"``."""
        ...

    @property
    def truncate_to(self) -> int | None:
        """The length over-budget examples are cut to, when one length holds for all."""
        ...

    @property
    def names(self) -> Sequence[str]:
        """The datasets' names, in id order (a single dataset is ``"0"``)."""
        ...

    @property
    def offsets(self) -> np.ndarray:
        """``(num_datasets + 1,)`` first global id of each dataset, then ``num_examples``."""
        ...

    def dataset_truncate_to(self, dataset: int) -> int | None:
        """The truncation length of dataset ``dataset`` (an index into :attr:`names`)."""
        ...

    def fingerprint(self) -> str:
        """A short hash of every setting that changes the plan (checked on resume)."""
        ...

    def plan(self, epoch: int, world_size: int = 1, accumulate_grad_batches: int = 1) -> EpochPlan:
        """The plan of ``epoch`` for ``world_size`` ranks and this accumulation."""
        ...

    def plan_resumed(
        self,
        epoch: int,
        world_size: int,
        accumulate_grad_batches: int,
        history: Sequence[tuple[int, int, int]] = (),
    ) -> EpochPlan:
        """What is left of ``epoch`` after the earlier topologies of ``history``.

        ``history`` holds ``(world_size, accumulate_grad_batches, consumed micro-batches per
        rank)`` of each earlier topology of the epoch, oldest first.
        """
        ...
