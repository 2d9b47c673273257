"""Several datasets in one run: per-step or per-micro-batch mixing, weighted, resumable.

Each dataset gets its own :class:`~lightning_varbatch.EpochPlanner`, so every micro-batch comes
from one dataset; their plans are interleaved evenly along the epoch (:mod:`~.interleave`).
``mixing="per_step"``: every optimizer step comes from one dataset; ``"per_batch"``: a step may
mix them. ``steps_per_epoch=None``: one pass over everything; ``N``: ``N`` steps shared by
``weights`` (and ``temperature``), each dataset an endless stream of passes (``docs/mixing.md``).

Example:
    >>> from lightning_varbatch import PlanConfig
    >>> short = DataSource(np.full(64, 2048), name="2k")
    >>> long = DataSource(np.full(32, 4096), name="4k")
    >>> planner = MixturePlanner([short, long], PlanConfig(max_tokens=16384))
    >>> plan = planner.plan(epoch=0, world_size=2, accumulate_grad_batches=2)
    >>> [sorted(set(plan.step_dataset[s].ravel().tolist())) for s in range(plan.num_steps)]
    [[1], [0], [0], [1]]
    >>> sorted(set(plan.micro_batch_size[plan.assign].ravel().tolist()))  # 8 x 2k or 4 x 4k
    [4, 8]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import replace
from functools import cached_property

import numpy as np
import numpy.typing as npt

from lightning_varbatch.checks import check_choice, check_count
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_planner import EpochPlan, EpochPlanner
from lightning_varbatch.planner.interleave import MIX_TAG, Part, compose_parts
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.mixture_datasets import (
    MIXING_POLICIES,
    DataSource,
    MixingPolicy,
    Weights,
    as_sources,
    check_dataset_index,
    dataset_errors,
    fit_units,
    item_count,
    mixture_probabilities,
    share_shape_lengths,
    source_config,
    source_names,
)
from lightning_varbatch.planner.mixture_topology import MixtureTopology
from lightning_varbatch.planner.mixture_warmup import mixture_warmup_caps, warm_mixture
from lightning_varbatch.planner.rank_shares import apportion
from lightning_varbatch.planner.settings import PlanConfig, check_config

__all__ = ["DataSource", "MixturePlanner"]


def dataset_planner(common: PlanConfig, source: DataSource, index: int, which: str) -> EpochPlanner:
    """The planner of dataset ``index`` of a mixture, with its own settings (:func:`source_config`).

    Raises:
        SettingError, ValueError, TypeError: bad lengths or settings, or an item count unlike its
            lengths; the message starts with ``which`` (the dataset's name and index).
    """
    with dataset_errors(which, type_errors=True):
        planner = EpochPlanner(
            source.lengths, source_config(common, source, index), source.loss_lengths
        )
        items = item_count(source.dataset)
        if items is not None and items != planner.num_examples:
            raise ValueError(
                f"its dataset has {items} items but its lengths describe "
                f"{planner.num_examples} examples: pass one length per item (lengths of "
                "the same dataset, in the same order)."
            )
    return planner


class MixturePlanner(MixtureTopology):
    """Plans epochs over several datasets (see the module docstring for the policies).

    Global example ids number the datasets one after another, as a ``ConcatDataset`` does.

    Args:
        sources: the datasets (:class:`DataSource`, or plain lengths arrays).
        config: the common settings; a source's ``max_tokens`` / ``max_examples`` override them.
        mixing: ``"per_step"`` (default) or ``"per_batch"``.
        weights: ``"size"`` (default) or one weight ≥ 0 per dataset (needs ``steps_per_epoch``).
        temperature: shares ``∝ weight ** (1 / temperature)`` (not 1: ``steps_per_epoch``).
        steps_per_epoch: ``None``: one pass over everything; else an epoch's steps, by weight.

    Raises:
        ValueError: no, empty or bad datasets (named), bad weights, weights without steps_per_epoch.

    Example:
        >>> planner = MixturePlanner([np.full(90, 8), np.full(4, 8)], PlanConfig(max_tokens=16),
        ...     weights=[1, 1], steps_per_epoch=10)
        >>> plan = planner.plan(epoch=0, world_size=1)  # 2 examples a micro-batch
        >>> np.bincount(plan.step_dataset.ravel()).tolist()  # 5 steps each
        [5, 5]
        >>> plan.num_duplicated  # 10 examples of the 4-example dataset: 6 repeats
        6
    """

    def __init__(
        self,
        sources: Sequence[DataSource | npt.ArrayLike],
        config: PlanConfig,
        *,
        mixing: MixingPolicy = "per_step",
        weights: Weights = "size",
        temperature: float = 1.0,
        steps_per_epoch: int | None = None,
    ) -> None:
        config = check_config(config)
        check_choice("mixing", mixing, MIXING_POLICIES)
        mixture_probabilities(np.ones(1), "size", temperature)  # validates the temperature
        if steps_per_epoch is not None:
            steps_per_epoch = check_count("steps_per_epoch", steps_per_epoch)
        elif not (isinstance(weights, str) and weights == "size" and temperature == 1):
            raise SettingValueError(
                "weights and temperature set the datasets' shares of an epoch of a fixed "
                "length: set steps_per_epoch (optimizer steps per epoch). With "
                "steps_per_epoch=None an epoch is one pass over every dataset, so each "
                "dataset's share is its size.",
                setting="steps_per_epoch",
                value=steps_per_epoch,
            )
        self.sources = as_sources(sources)
        self.config = config
        self.mixing: MixingPolicy = mixing
        self.steps_per_epoch = steps_per_epoch
        self.names = source_names(self.sources)
        self.planners = [
            dataset_planner(config, s, i, self._which(i)) for i, s in enumerate(self.sources)
        ]
        scheduled = [p.config.batch_schedule for p in self.planners if p.config.batch_schedule]
        if scheduled:
            raise SettingValueError(
                f"batch_schedule={scheduled[0]!r} cannot be used with a mixture yet: a "
                "mixture interleaves its datasets' steps, each cut to its own budgets, and a "
                "schedule would have to scale all of them on one clock of the mixture's "
                "tokens. Unset batch_schedule (a dataset's settings included), or train one "
                "dataset.",
                setting="batch_schedule",
                value=scheduled[0],
            )
        if config.max_shapes is not None:
            share_shape_lengths(self.planners, self.sources, self.names, config)
        sizes = np.array([p.num_examples for p in self.planners], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(sizes)))
        self.probabilities = mixture_probabilities(
            np.array([p.num_micro_batches for p in self.planners]), weights, temperature
        )
        self.weights = weights if isinstance(weights, str) else [float(w) for w in weights]
        self.temperature = float(temperature)
        #: ``(datasets, length_warmup + 1)`` caps of the length warm-up (``None``: none).
        self.warmup_caps = mixture_warmup_caps(config, self.sources, self.planners, self.names)
        self.refuse_lanes()

    def _which(self, index: int) -> str:
        """How error messages name a dataset."""
        return f"Dataset {self.names[index]!r} (index {index})"

    @property
    def shapes(self) -> np.ndarray | None:
        """``(k, 2)`` ``(rows, length)`` of the datasets' shared static shapes (``None``: free)."""
        return self.planners[0].shapes if self.planners else None

    @property
    def num_examples(self) -> int:
        """Examples of all datasets."""
        return int(self.offsets[-1])

    @property
    def num_planned(self) -> int:
        """Examples that can take part (all but the skipped ones)."""
        return sum(p.num_planned for p in self.planners)

    @property
    def num_datasets(self) -> int:
        """Number of datasets."""
        return len(self.planners)

    @property
    def num_skipped(self) -> int:
        """Examples of all datasets left out by ``oversize="skip"``."""
        return sum(p.num_skipped for p in self.planners)

    @property
    def num_truncated(self) -> int:
        """Examples of all datasets cut by ``oversize="truncate"``."""
        return sum(p.num_truncated for p in self.planners)

    @property
    def truncate_to(self) -> int | None:
        """The truncation length when every dataset has the same one, else ``None``."""
        found = {p.truncate_to for p in self.planners}
        return found.pop() if len(found) == 1 else None

    def dataset_truncate_to(self, dataset: int) -> int | None:
        """Length ``dataset``'s over-budget examples are cut to, else ``None``."""
        return self.planners[self._index(dataset)].truncate_to

    def budget(self, dataset: int) -> int:
        """``max_tokens`` of ``dataset``."""
        return self.planners[self._index(dataset)].config.max_tokens

    def _index(self, dataset: object) -> int:
        return check_dataset_index(dataset, self.names)

    def fingerprint(self) -> str:
        """A short hash of every setting that changes the plan (for checkpoint checks)."""
        settings: dict[str, object] = {
            "datasets": [p.fingerprint() for p in self.planners],
            "sizes": self.offsets.tolist(),
            "mixing": self.mixing,
            "weights": self.weights,
            "temperature": self.temperature,
            "steps_per_epoch": self.steps_per_epoch,
        }
        if self.warmup_caps is not None:  # absent without a warm-up: fingerprints unchanged
            # every dataset's caps at every step: the schedule, its bounds, a callable's values
            settings["length_warmup"] = hashlib.sha1(self.warmup_caps.tobytes()).hexdigest()
        blob = json.dumps(settings, sort_keys=True).encode()
        return hashlib.sha1(blob).hexdigest()[:16]

    @cached_property
    def prepared(self) -> PreparedLengths:
        """All datasets' planning and loss lengths, concatenated in global id order."""
        return PreparedLengths.concat([p.prepared for p in self.planners], self.truncate_to)

    def plan(
        self,
        epoch: int,
        world_size: int = 1,
        accumulate_grad_batches: int = 1,
        *,
        rank_budgets: Sequence[int] | None = None,
    ) -> EpochPlan:
        """Plan one epoch of the mixture.

        Args:
            epoch: the epoch (the plan depends only on ``config.seed`` and ``epoch``).
            world_size: number of ranks.
            accumulate_grad_batches: micro-batches per rank per optimizer step.
            rank_budgets: the ranks' budgets against the common ``max_tokens`` (``None``: the
                config's), scaled to each dataset's budget (:func:`~.rank_shares.scaled_budgets`).

        Returns:
            The plan; ``plan.micro_batch_dataset`` says which dataset each micro-batch is from.

        Raises:
            ValueError: when a dataset cannot give every rank a micro-batch (naming it).
        """
        epoch = check_count("epoch", epoch, minimum=0)
        world = check_count("world_size", world_size)
        acc = check_count("accumulate_grad_batches", accumulate_grad_batches)
        budgets = self._budgets(world, rank_budgets)
        if self.steps_per_epoch is None:
            parts = [
                self._part(
                    i, self._pass(i, epoch, world, acc, budgets=budgets), int(self.offsets[i])
                )
                for i in range(self.num_datasets)
            ]
            plan = self._compose(parts, epoch, world, acc, salt=0, budgets=budgets)
            return self._warm(plan, 0, 0)
        per_unit = 1 if self.mixing == "per_step" else world * acc
        counts = apportion(self.steps_per_epoch * per_unit, self.probabilities)
        parts = []
        dropped = 0
        for i, count in enumerate(counts.tolist()):
            if count:
                taken, lost = self._stream(i, epoch, int(count), world, acc, budgets)
                parts += taken
                dropped += lost
        plan = self._compose(parts, epoch, world, acc, salt=0, dropped=dropped, budgets=budgets)
        run = plan.ids_of_micro_batches(plan.assign.reshape(-1))
        unique = int(np.count_nonzero(np.bincount(run, minlength=self.num_examples)))
        return self._warm(replace(plan, num_duplicated=int(run.size) - unique), 0, 0)

    def _warm(self, plan: EpochPlan, first: int, floor: int) -> EpochPlan:
        """``plan`` with the length warm-up applied from the run's step ``first`` (epoch 0)."""
        if self.warmup_caps is None or plan.epoch != 0:
            return plan
        budgets = np.array([p.config.max_tokens for p in self.planners], dtype=np.int64)
        return warm_mixture(plan, self.prepared.key, budgets, self.warmup_caps, first, floor)

    def _pass(
        self,
        dataset: int,
        k: int,
        world: int,
        acc: int,
        salt: int = 0,
        budgets: tuple[int, ...] | None = None,
    ) -> EpochPlan:
        with dataset_errors(self._which(dataset)):
            plan = self.planners[dataset].plan(
                k, world, acc, salt=salt, rank_budgets=self._dataset_budgets(dataset, budgets)
            )
        return plan

    def _part(self, dataset: int, plan: EpochPlan, ids: np.ndarray | int) -> Part:
        units = plan.assign if self.mixing == "per_step" else plan.assign.reshape(-1)
        return Part(dataset, plan, ids, units)

    def _stream(
        self,
        dataset: int,
        epoch: int,
        count: int,
        world: int,
        acc: int,
        budgets: tuple[int, ...] | None = None,
    ) -> tuple[list[Part], int]:
        """Units ``[epoch * count, (epoch + 1) * count)`` of passes; examples ``"drop"`` dropped."""
        first = self._pass(dataset, 0, world, acc, budgets=budgets)
        length = self._part(dataset, first, 0).units.shape[0]
        if length == 0:
            raise ValueError(
                f"{self._which(dataset)} gives no micro-batch "
                f"for world_size={world} x accumulate_grad_batches={acc}: give it weight 0, "
                "more data, or lower max_tokens."
            )
        start, stop = epoch * count, (epoch + 1) * count
        parts, dropped = [], 0
        for k in range(start // length, (stop - 1) // length + 1):
            plan = first if k == 0 else self._pass(dataset, k, world, acc, budgets=budgets)
            part = self._part(dataset, plan, int(self.offsets[dataset]))
            units, extra = fit_units(part.units, length)
            lo, hi = max(start - k * length, 0), min(stop - k * length, length)
            parts.append(replace(part, units=units[lo:hi]))
            if hi == length:
                dropped += plan.num_dropped + int(plan.micro_batch_size[extra].sum())
        return parts, dropped

    def _compose(
        self,
        parts: list[Part],
        epoch: int,
        world: int,
        acc: int,
        *,
        salt: int,
        dropped: int | None = None,
        budgets: tuple[int, ...] | None = None,
    ) -> EpochPlan:
        """One plan of the parts, interleaved (``budgets``: the ranks' common-scale ones)."""
        return compose_parts(
            parts,
            epoch=epoch,
            world=world,
            acc=acc,
            mixing=self.mixing,
            rng=np.random.default_rng([self.config.seed, epoch, salt, MIX_TAG]),
            num_examples=self.num_examples,
            num_skipped=self.num_skipped,
            num_truncated=self.num_truncated,
            dropped=dropped,
            rank_budget=None if budgets is None else np.asarray(budgets, dtype=np.int64),
        )
