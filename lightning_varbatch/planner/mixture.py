"""Several datasets in one run: per-step or per-micro-batch mixing, weighted, resumable.

Each dataset gets its own :class:`~lightning_varbatch.EpochPlanner` (its own lengths and,
optionally, its own ``max_tokens`` / ``max_examples``), so every micro-batch comes from one
dataset and keeps homogeneous shapes. The datasets' plans are then interleaved:

* ``mixing="per_step"``: every optimizer step, all its micro-batches on all ranks, comes from
  one dataset (a dataset's plan is made with the run's ``world_size`` and accumulation, so each
  of its steps is already dealt to the ranks with balanced loads);
* ``mixing="per_batch"``: micro-batches of different datasets share a step; a step's
  micro-batches are dealt to the ranks largest first to the least-loaded rank.

How much of each dataset an epoch holds:

* ``steps_per_epoch=None`` (default): one pass over everything, every example exactly once
  (up to the tail policy, counted); each dataset's share is its size. Explicit ``weights``
  need a fixed epoch length, since one pass fixes the shares.
* ``steps_per_epoch=N``: N optimizer steps, split between the datasets by ``weights``
  (``"size"``, explicit, and/or ``temperature``-scaled) with largest-remainder rounding: a
  dataset's realised share of steps (per_step) or micro-batches (per_batch) is within one
  unit of its weight. Each dataset is read as an endless stream of passes (pass ``k`` is its
  planner's epoch ``k``): a small dataset is upsampled (several passes in one epoch), a large
  one continues next epoch where this one stopped. Repeats within the epoch are counted in
  ``plan.num_duplicated``.

Within the epoch each dataset's units (steps or micro-batches) are spread evenly (stratified
random interleaving), so the shares hold along the whole epoch, not only at its end. Every
rank computes the same plan: equal micro-batch counts by construction.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch import PlanConfig
    >>> from lightning_varbatch.planner.mixture import MixturePlanner
    >>> from lightning_varbatch.planner.sources import DataSource
    >>> short = DataSource(np.full(64, 2048), name="2k")
    >>> long = DataSource(np.full(32, 4096), name="4k")
    >>> planner = MixturePlanner([short, long], PlanConfig(max_tokens=16384))
    >>> plan = planner.plan(epoch=0, world_size=2, accumulate_grad_batches=2)
    >>> [sorted(set(plan.step_dataset[s].ravel().tolist())) for s in range(plan.num_steps)]
    [[1], [0], [0], [1]]
    >>> sorted(set(plan.tile_size[plan.assign].ravel().tolist()))  # 8 x 2k or 4 x 4k
    [4, 8]
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np
import numpy.typing as npt

from lightning_varbatch.planner.epoch_planner import (
    EpochPlan,
    EpochPlanner,
    _check_count,
    _deal,
    check_history,
)
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sources import (
    MIXING_POLICIES,
    DataSource,
    MixingPolicy,
    Weights,
    apportion,
    mixture_probabilities,
)

__all__ = ["DataSource", "MixturePlanner"]

_MIX_TAG = 0x6D6978  # separates the interleaving's random stream from the datasets' own


@dataclass(frozen=True)
class _Part:
    """One dataset plan (a pass, or a re-planned remainder) and the units taken from it.

    ``ids`` maps the plan's example ids to global ids; ``units`` are the plan's steps
    (``(u, world, acc)`` tile ids) under per-step mixing, or its tiles (``(u,)``) under
    per-batch mixing, in run order.
    """

    dataset: int
    plan: EpochPlan
    ids: np.ndarray | int
    units: np.ndarray


class MixturePlanner:
    """Plans epochs over several datasets (see the module docstring for the policies).

    Global example ids number the datasets one after another (dataset 1's first example is
    ``len(dataset 0)``), as :class:`torch.utils.data.ConcatDataset` does.

    Args:
        sources: the datasets (:class:`DataSource`, or plain lengths arrays).
        config: the common planner settings; a source's ``max_tokens`` / ``max_examples``
            override them for that dataset. Each dataset's shuffle uses its own stream derived
            from ``config.seed``.
        mixing: ``"per_step"`` (default) or ``"per_batch"``.
        weights: ``"size"`` (default: each dataset's micro-batches in one pass) or one
            non-negative weight per dataset; anything but ``"size"`` needs ``steps_per_epoch``.
        temperature: shares ``∝ weight ** (1 / temperature)``; not 1 needs ``steps_per_epoch``.
        steps_per_epoch: ``None`` for one pass over everything, else the optimizer steps of
            an epoch, sampled by weight.

    Raises:
        ValueError: for no datasets, an empty or invalid dataset (the message names it), bad
            weights, or weights without ``steps_per_epoch``.

    Example:
        >>> import numpy as np
        >>> planner = MixturePlanner(
        ...     [np.full(90, 8), np.full(4, 8)], PlanConfig(max_tokens=16),
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
        if not isinstance(config, PlanConfig):
            raise TypeError(
                f"config must be a PlanConfig, got {type(config).__name__}; pass "
                "config=PlanConfig(max_tokens=...)."
            )
        if not isinstance(mixing, str) or mixing not in MIXING_POLICIES:
            raise ValueError(
                f"Unknown mixing={mixing!r}; choose one of {', '.join(MIXING_POLICIES)}."
            )
        mixture_probabilities(np.ones(1), "size", temperature)  # validates the temperature
        if steps_per_epoch is not None:
            steps_per_epoch = _check_count("steps_per_epoch", steps_per_epoch)
        elif not (isinstance(weights, str) and weights == "size" and temperature == 1):
            raise ValueError(
                "weights and temperature set the datasets' shares of an epoch of a fixed "
                "length: set steps_per_epoch (optimizer steps per epoch). With "
                "steps_per_epoch=None an epoch is one pass over every dataset, so each "
                "dataset's share is its size."
            )
        self.sources = _as_sources(sources)
        self.config = config
        self.mixing: MixingPolicy = mixing
        self.steps_per_epoch = steps_per_epoch
        self.names = [str(i) if s.name is None else s.name for i, s in enumerate(self.sources)]
        if len(set(self.names)) != len(self.names):
            twice = sorted({n for n in self.names if self.names.count(n) > 1})
            raise ValueError(
                f"Dataset names must be unique, got {self.names} ({', '.join(twice)} more than "
                "once; an unnamed dataset is named by its index): give each DataSource its "
                "own name."
            )
        self.planners = [self._source_planner(i, s) for i, s in enumerate(self.sources)]
        sizes = np.array([p.num_examples for p in self.planners], dtype=np.int64)
        self.offsets = np.concatenate(([0], np.cumsum(sizes)))
        self.probabilities = mixture_probabilities(
            np.array([p.num_micro_batches for p in self.planners]), weights, temperature
        )
        self.weights = weights if isinstance(weights, str) else [float(w) for w in weights]
        self.temperature = float(temperature)

    def _which(self, index: int) -> str:
        """How error messages name a dataset."""
        return f"Dataset {self.names[index]!r} (index {index})"

    def _source_planner(self, index: int, source: DataSource) -> EpochPlanner:
        seed = int(np.random.SeedSequence([self.config.seed, index]).generate_state(1)[0])
        common = self.config
        try:
            config = replace(
                common,
                seed=seed,
                max_tokens=common.max_tokens if source.max_tokens is None else source.max_tokens,
                max_examples=(
                    common.max_examples if source.max_examples is None else source.max_examples
                ),
            )
            planner = EpochPlanner(source.lengths, config, source.loss_lengths)
            items = _item_count(source.dataset)
            if items is not None and items != planner.num_examples:
                raise ValueError(
                    f"its dataset has {items} items but its lengths describe "
                    f"{planner.num_examples} examples: pass one length per item (lengths of "
                    "the same dataset, in the same order)."
                )
            return planner
        except ValueError as error:
            raise ValueError(f"{self._which(index)}: {error}") from error
        except TypeError as error:
            raise TypeError(f"{self._which(index)}: {error}") from error

    # -- the planner interface the sampler uses -------------------------------------------

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
        n = len(self.planners)
        if (
            isinstance(dataset, (bool, np.bool_))
            or not isinstance(dataset, (int, np.integer))
            or not 0 <= dataset < n
        ):
            raise ValueError(
                f"dataset must be a dataset index in [0, {n}) ({', '.join(self.names)}), got "
                f"{dataset!r}."
            )
        return int(dataset)

    def fingerprint(self) -> str:
        """A short hash of every setting that changes the plan (for checkpoint checks)."""
        blob = json.dumps(
            {
                "datasets": [p.fingerprint() for p in self.planners],
                "sizes": self.offsets.tolist(),
                "mixing": self.mixing,
                "weights": self.weights,
                "temperature": self.temperature,
                "steps_per_epoch": self.steps_per_epoch,
            },
            sort_keys=True,
        ).encode()
        return hashlib.sha1(blob).hexdigest()[:16]

    @cached_property
    def prepared(self) -> PreparedLengths:
        """All datasets' planning and loss lengths, concatenated in global id order."""
        preps = [p.prepared for p in self.planners]
        kept = None
        if any(p.kept is not None for p in preps):
            kept = np.concatenate(
                [
                    (np.arange(p.num_examples) if p.kept is None else p.kept) + off
                    for p, off in zip(preps, self.offsets.tolist(), strict=False)
                ]
            )
        wide = any(p.key.dtype != np.uint16 for p in preps)
        return PreparedLengths(
            key=np.concatenate([p.key.astype(np.int32 if wide else np.uint16) for p in preps]),
            loss=np.concatenate([p.loss.astype(np.int32) for p in preps]),
            kept=kept,
            num_skipped=sum(p.num_skipped for p in preps),
            num_truncated=sum(p.num_truncated for p in preps),
            truncate_to=self.truncate_to,
            pairs=all(p.pairs for p in preps),
        )

    # -- planning ------------------------------------------------------------------------

    def plan(self, epoch: int, world_size: int = 1, accumulate_grad_batches: int = 1) -> EpochPlan:
        """Plan one epoch of the mixture.

        Args:
            epoch: the epoch (the plan depends only on ``config.seed`` and ``epoch``).
            world_size: number of ranks.
            accumulate_grad_batches: micro-batches per rank per optimizer step.

        Returns:
            The plan; ``plan.tile_dataset`` says which dataset each micro-batch is from.

        Raises:
            ValueError: when a dataset cannot give every rank a micro-batch (the message
                names the dataset).
        """
        epoch = _check_count("epoch", epoch, 0)
        world = _check_count("world_size", world_size)
        acc = _check_count("accumulate_grad_batches", accumulate_grad_batches)
        if self.steps_per_epoch is None:
            parts = [
                self._part(i, self._pass(i, epoch, world, acc), int(self.offsets[i]))
                for i in range(self.num_datasets)
            ]
            return self._compose(parts, epoch, world, acc, salt=0)
        per_unit = 1 if self.mixing == "per_step" else world * acc
        counts = apportion(self.steps_per_epoch * per_unit, self.probabilities)
        parts = []
        dropped = 0
        for i, count in enumerate(counts.tolist()):
            if count:
                taken, lost = self._stream(i, epoch, int(count), world, acc)
                parts += taken
                dropped += lost
        plan = self._compose(parts, epoch, world, acc, salt=0, dropped=dropped)
        run = plan.ids_of_tiles(plan.assign.reshape(-1))
        unique = int(np.count_nonzero(np.bincount(run, minlength=self.num_examples)))
        return replace(plan, num_duplicated=int(run.size) - unique)

    def plan_resumed(
        self,
        epoch: int,
        world_size: int,
        accumulate_grad_batches: int,
        history: Sequence[tuple[int, int, int]] = (),
    ) -> EpochPlan:
        """Plan what is left of ``epoch`` after topology changes.

        As :meth:`EpochPlanner.plan_resumed`: the micro-batches the earlier topologies did
        not run are re-planned per dataset for the new one (repeats included, so upsampling
        survives the change); the shares of the rest of the epoch stay what they were.
        """
        history = check_history(history)
        if not history:
            return self.plan(epoch, world_size, accumulate_grad_batches)
        world, acc, consumed = history[0]
        plan = self.plan(epoch, world, acc)
        later = [*history[1:], (world_size, accumulate_grad_batches, 0)]
        for depth, (world, acc, next_consumed) in enumerate(later, start=1):
            left = plan.consumed_tiles(consumed)[1]
            plan = self._plan_remainder(plan, left, epoch, world, acc, salt=depth)
            consumed = next_consumed
        return plan

    def _pass(self, dataset: int, k: int, world: int, acc: int, salt: int = 0) -> EpochPlan:
        try:
            return self.planners[dataset].plan(k, world, acc, salt=salt)
        except ValueError as error:
            raise ValueError(f"{self._which(dataset)}: {error}") from error

    def _part(self, dataset: int, plan: EpochPlan, ids: np.ndarray | int) -> _Part:
        units = plan.assign if self.mixing == "per_step" else plan.assign.reshape(-1)
        return _Part(dataset, plan, ids, units)

    def _stream(
        self, dataset: int, epoch: int, count: int, world: int, acc: int
    ) -> tuple[list[_Part], int]:
        """Units ``[epoch * count, (epoch + 1) * count)`` of the dataset's stream of passes.

        Returns the parts and the examples dropped (``tail="drop"``) by passes that end in
        this window.
        """
        first = self._pass(dataset, 0, world, acc)
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
            plan = first if k == 0 else self._pass(dataset, k, world, acc)
            part = self._part(dataset, plan, int(self.offsets[dataset]))
            lo, hi = max(start - k * length, 0), min(stop - k * length, length)
            parts.append(replace(part, units=part.units[lo:hi]))
            if hi == length:
                dropped += plan.num_dropped
        return parts, dropped

    def _plan_remainder(
        self, plan: EpochPlan, tiles: np.ndarray, epoch: int, world: int, acc: int, salt: int
    ) -> EpochPlan:
        """Re-plan the examples of ``plan``'s ``tiles`` (repeats kept) for a new topology."""
        ids = plan.ids_of_tiles(tiles).astype(np.int64)
        owner = np.searchsorted(self.offsets, ids, side="right") - 1
        parts = []
        for i in np.unique(owner).tolist():
            occ = ids[owner == i]
            local = occ - int(self.offsets[i])
            prep, cfg = self.planners[i].prepared, self.planners[i].config
            available, wa = occ.size, world * acc
            if cfg.tail != "pad" and (available < wa or cfg.tail == "drop"):
                cfg = replace(cfg, tail="pad")  # a remainder is never dropped; pad if too small
            sub = EpochPlanner(prep.key[local], cfg, loss_lengths=prep.loss[local])
            parts.append(self._part(i, sub.plan(epoch, world, acc, salt=salt), occ))
        return self._compose(parts, epoch, world, acc, salt=salt)

    def _compose(
        self,
        parts: list[_Part],
        epoch: int,
        world: int,
        acc: int,
        *,
        salt: int,
        dropped: int | None = None,
    ) -> EpochPlan:
        """One plan from the parts: global tiles, units interleaved evenly by dataset."""
        orders, starts, tile_ds, units, unit_ds = [], [], [], [], []
        order_base = tile_base = 0
        for part in parts:
            p = part.plan
            ids = p.order.astype(np.int64)
            orders.append(ids + part.ids if isinstance(part.ids, int) else part.ids[ids])
            starts.append(p.tile_start + order_base)
            tile_ds.append(np.full(p.tile_start.size, part.dataset, dtype=np.int64))
            units.append(part.units + tile_base)
            unit_ds.append(np.full(part.units.shape[0], part.dataset, dtype=np.int64))
            order_base += p.order.size
            tile_base += p.tile_start.size
        cat = np.concatenate
        plans = [part.plan for part in parts]
        cost = cat([p.tile_cost for p in plans]) if plans else np.zeros(0)
        all_units = cat(units) if units else np.zeros((0, world, acc), dtype=np.int64)
        rng = np.random.default_rng([self.config.seed, epoch, salt, _MIX_TAG])
        picked = all_units[_interleave(cat(unit_ds) if unit_ds else np.zeros(0, int), rng)]
        if self.mixing == "per_step":
            assign = picked.reshape(-1, world, acc)
        else:
            assign = _deal(picked.reshape(-1, world * acc), cost, world, acc)
        order = cat(orders) if orders else np.zeros(0, dtype=np.int64)
        return EpochPlan(
            epoch=epoch,
            world_size=world,
            accumulate_grad_batches=acc,
            order=order.astype(np.int32) if self.num_examples < 2**31 else order,
            tile_start=cat(starts) if starts else np.zeros(0, dtype=np.int64),
            tile_size=cat([p.tile_size for p in plans]) if plans else np.zeros(0, np.int64),
            tile_cost=cost,
            assign=assign,
            num_dropped=sum(p.num_dropped for p in plans) if dropped is None else dropped,
            num_duplicated=sum(p.num_duplicated for p in plans),
            num_skipped=sum(p.prepared.num_skipped for p in self.planners),
            num_truncated=sum(p.prepared.num_truncated for p in self.planners),
            tile_dataset=cat(tile_ds) if tile_ds else np.zeros(0, dtype=np.int64),
            _exact_tokens=cat([p.tile_tokens for p in plans]) if plans else np.zeros(0, int),
        )


def _item_count(dataset: object) -> int | None:
    """Items of a map-style dataset, ``None`` when there is none or it has no length."""
    if dataset is None:
        return None
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None


def _as_sources(sources: object) -> list[DataSource]:
    """The datasets as :class:`DataSource` objects, or an error that says what to pass."""
    if isinstance(sources, (DataSource, np.ndarray, str, bytes, Mapping)) or not isinstance(
        sources, Iterable
    ):
        raise TypeError(
            f"sources must be a list of datasets (DataSource objects or lengths arrays), got "
            f"{type(sources).__name__}; pass e.g. [DataSource(lengths_a), DataSource(lengths_b)]"
            " (a single lengths array is one dataset: wrap it in a list, or use EpochPlanner)."
        )
    sources = list(sources)
    if not sources:
        raise ValueError("sources is empty: pass at least one dataset.")
    return [s if isinstance(s, DataSource) else DataSource(s) for s in sources]


def _interleave(labels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """An order of ``labels``' positions spreading every label evenly.

    Each label keeps its own order: the ``j``-th of its ``c`` units sits at ``(j + u) / c``,
    ``u ~ U(0, 1)`` (stratified random interleaving).
    """
    if labels.size == 0:
        return np.zeros(0, dtype=np.int64)
    counts = np.bincount(labels)
    first = np.concatenate(([0], np.cumsum(counts)))[labels]
    by_label = np.argsort(labels, kind="stable")
    rank_in_label = np.empty(labels.size, dtype=np.int64)
    rank_in_label[by_label] = np.arange(labels.size) - first[by_label]
    position = (rank_in_label + rng.random(labels.size)) / counts[labels]
    return np.argsort(position, kind="stable")
