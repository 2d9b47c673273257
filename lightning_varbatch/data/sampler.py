"""One rank's view of the epoch plan, as a torch batch sampler that resumes mid-epoch.

The planner settings are one :class:`~lightning_varbatch.planner.settings.PlanConfig`, given as
``config=`` or as keywords of the same names (:mod:`lightning_varbatch.data.plan_settings`
builds it); the position in the epoch and its checkpoints are
:mod:`lightning_varbatch.data.sampler_state`'s.

Example:
    >>> import numpy as np
    >>> lengths = np.array([3, 5, 2, 7, 4, 6, 1, 8])
    >>> ranks = [TokenBudgetBatchSampler(lengths, 12, rank=r, world_size=2) for r in (0, 1)]
    >>> [len(s) for s in ranks]
    [3, 3]
    >>> sorted(i for s in ranks for batch in s for i in batch)
    [0, 1, 2, 3, 4, 5, 6, 7]
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy.typing as npt
from torch.utils.data import Sampler

from lightning_varbatch.checks import check_choice, check_count
from lightning_varbatch.data.micro_batch import (
    MicroBatch,
    check_loss_tokens,
    micro_batch_of,
    resolve_rank_world,
)
from lightning_varbatch.data.plan_settings import (
    PLAN_SETTINGS,
    check_accumulate,
    check_topology,
    plain,
    plain_settings,
    plan_config,
    reject_unknown,
)
from lightning_varbatch.data.rank_share_setting import LANE_PLANNERS, RankShareSetting
from lightning_varbatch.data.sampler_resume import ON_MISMATCH, OnMismatch, resume_position
from lightning_varbatch.data.sampler_state import (
    STATE_VERSION,
    EpochPosition,
    lengths_digest,
    read_state,
    save_state,
    state_differences,
)
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import DataSource, MixingPolicy, Weights
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.remainder_guard import consumed_ledger
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.sources.arrow_lengths import source_with_column_lengths

__all__ = [
    "ON_MISMATCH",
    "STATE_VERSION",
    "OnMismatch",
    "TokenBudgetBatchSampler",
    "lengths_digest",
    "plain_settings",
    "reject_unknown",
]


def _own_arguments() -> frozenset[str]:
    """The sampler's own keyword arguments (not planner settings, not private)."""
    names = inspect.signature(TokenBudgetBatchSampler.__init__).parameters
    return frozenset(n for n in names if n not in ("self", "settings") and n[0] != "_")


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Token-budgeted micro-batches of one rank; every rank gets the same number.

    All ranks build the same plan from the same lengths and settings (no collective needed)
    and each iterates its own slice: micro-batches of optimizer step ``s`` come in order
    ``(s, micro 0), (s, micro 1), ...``. Batches are :class:`MicroBatch` lists that also carry
    their token counts and the whole step's token count, for exact loss normalisation.

    The planner settings are one :class:`PlanConfig`: pass it as ``config=``, or pass its
    fields (``max_tokens``, ``max_examples``, ``cost``, ``tail``, ``oversize``, ``layout``,
    ``loss_offset``, ...) as keywords of the same names and defaults; their full descriptions
    are there. A setting added to :class:`PlanConfig` is a keyword here without an edit.

    Args:
        lengths: ``(n,)`` lengths or ``(n, 2)`` (source, target) lengths, one per dataset item.
        max_tokens: token budget of one micro-batch on one rank (see :class:`PlanConfig`);
            leave it unset with ``config``.
        config: every planner setting at once (then no planner setting as a keyword).
        rank: this rank; default: torch.distributed, else the ``RANK`` environment variable.
        world_size: number of ranks; default: torch.distributed, else ``WORLD_SIZE``.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        loss_lengths: loss tokens per example when they are not the lengths / target column
            (not with ``loss_offset``, which derives them: see :class:`PlanConfig`).
        epoch: the starting epoch.
        **settings: the other planner settings, the fields of :class:`PlanConfig` (``cost``,
            ``seed``, ``tail``, ``oversize``, ``layout``, ``max_shapes``, ``loss_offset``,
            ...). With ``max_shapes`` every :class:`MicroBatch` carries ``pad_rows`` and
            ``pad_length``; use :class:`~lightning_varbatch.data.packed_collate.PackingCollate`
            with ``layout="packed"``.

    Raises:
        SettingTypeError: for an unknown setting (the closest valid name is suggested).
        ValueError: for bad lengths or settings; the message names the setting to change.

    Example:
        >>> import numpy as np
        >>> sampler = TokenBudgetBatchSampler(np.array([[3, 4], [9, 2], [5, 5]]), 12,
        ...                                   rank=0, world_size=1)
        >>> [(list(b), b.ntokens, b.step_ntokens) for b in sampler]
        [([1], 2, 2), ([2, 0], 9, 9)]
        >>> same = TokenBudgetBatchSampler([[3, 4], [9, 2], [5, 5]], rank=0, world_size=1,
        ...                                config=sampler.config)
        >>> [list(b) for b in same] == [list(b) for b in sampler]
        True
    """

    def __init__(
        self,
        lengths: npt.ArrayLike,
        max_tokens: int | None = None,
        *,
        config: PlanConfig | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        loss_lengths: npt.ArrayLike | None = None,
        epoch: int = 0,
        _planner: Planner | None = None,
        **settings: Any,
    ) -> None:
        reject_unknown("TokenBudgetBatchSampler", settings, PLAN_SETTINGS | _own_arguments())
        planner: Planner
        if _planner is None:
            plan = plan_config({"max_tokens": max_tokens, **settings}, config)
            check_accumulate(accumulate_grad_batches)
            plan.check_loss_lengths(loss_lengths)
            planner = EpochPlanner(lengths, plan, loss_lengths)
        else:  # from_planner: the lengths and settings are the planner's
            check_accumulate(accumulate_grad_batches)
            planner = _planner
        self.planner = planner
        self._shares = RankShareSetting(planner)
        # Found in the environment (not given): re-read from the process group once it exists.
        self._inferred = rank is None or world_size is None
        self.rank, self.world_size = resolve_rank_world(*check_topology(rank, world_size))
        self.accumulate_grad_batches = 1
        self._position = EpochPosition()
        self._cache: tuple[tuple[Any, ...], EpochPlan] | None = None
        self._digest: str | None = None
        self.set_distributed(self.rank, self.world_size, plain(accumulate_grad_batches))
        self.set_epoch(plain(epoch))
        self._shares.budgets(self.world_size)  # rank lists of another length fail now

    @classmethod
    def from_sources(
        cls,
        sources: Sequence[DataSource | npt.ArrayLike],
        max_tokens: int,
        *,
        mixing: MixingPolicy = "per_step",
        weights: Weights = "size",
        temperature: float = 1.0,
        steps_per_epoch: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        epoch: int = 0,
        **settings: Any,
    ) -> TokenBudgetBatchSampler:
        """A sampler over several datasets (see :mod:`lightning_varbatch.planner.mixture`).

        Batch indices are global: dataset ``i``'s items follow those of datasets ``0..i-1``,
        as in a :class:`torch.utils.data.ConcatDataset` of them. Each :class:`MicroBatch`
        says which dataset it is from (``.dataset``).

        Args:
            sources: the datasets' lengths (:class:`~lightning_varbatch.DataSource`, which may
                set its own ``max_tokens`` / ``max_examples``, or plain arrays).
            max_tokens: the common budget of one micro-batch.
            mixing: ``"per_step"`` (a step's micro-batches on all ranks come from one
                dataset) or ``"per_batch"``.
            weights: ``"size"`` or one weight per dataset (needs ``steps_per_epoch``).
            temperature: shares ``∝ weight ** (1 / temperature)`` (needs ``steps_per_epoch``).
            steps_per_epoch: ``None`` for one pass over everything, else optimizer steps per
                epoch, sampled by weight.
            rank: this rank (default: from torch.distributed or the environment).
            world_size: number of ranks (default: as ``rank``).
            accumulate_grad_batches: micro-batches per rank per optimizer step.
            epoch: the starting epoch.
            **settings: other :class:`PlanConfig` settings (``cost``, ``seed``, ``tail``, ...).

        Raises:
            ValueError: for bad datasets, weights or settings; the message names them.

        Example:
            >>> import numpy as np
            >>> s = TokenBudgetBatchSampler.from_sources(
            ...     [np.full(16, 2048), np.full(8, 4096)], 16384, rank=0, world_size=2)
            >>> [(b.dataset, len(b)) for b in s]
            [(1, 4), (0, 8)]
        """
        if isinstance(sources, (list, tuple)):  # DataSource lengths may name Arrow columns
            sources = [
                source_with_column_lengths(s, f"sources[{i}]") if isinstance(s, DataSource) else s
                for i, s in enumerate(sources)
            ]
        config = PlanConfig(**plain_settings(max_tokens=max_tokens, **settings))
        for source in sources:
            if isinstance(source, DataSource):
                config.check_loss_lengths(source.loss_lengths)
        planner = MixturePlanner(
            sources,
            config,
            mixing=mixing,
            weights=weights,
            temperature=temperature,
            steps_per_epoch=steps_per_epoch,
        )
        return cls.from_planner(
            planner,
            rank=rank,
            world_size=world_size,
            accumulate_grad_batches=plain(accumulate_grad_batches),
            epoch=plain(epoch),
        )

    @classmethod
    def from_planner(
        cls,
        planner: Planner,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        epoch: int = 0,
    ) -> TokenBudgetBatchSampler:
        """A sampler sharing an existing planner (its sort is computed once for all ranks).

        It is built by ``__init__`` like any other sampler; the planner's lengths and settings
        (its :class:`PlanConfig`) replace the planner arguments.

        Example:
            >>> import numpy as np
            >>> planner = EpochPlanner(np.arange(1, 9), PlanConfig(max_tokens=16))
            >>> s = TokenBudgetBatchSampler.from_planner(planner, rank=1, world_size=2)
            >>> s.rank, len(s) > 0
            (1, True)
        """
        return cls(
            (),  # unused: the planner holds the lengths and the settings
            planner.config.max_tokens,
            rank=rank,
            world_size=world_size,
            accumulate_grad_batches=accumulate_grad_batches,
            epoch=epoch,
            _planner=planner,
        )

    # -- settings ------------------------------------------------------------------------

    @property
    def config(self) -> PlanConfig:
        """The planner settings."""
        return self.planner.config

    @property
    def max_tokens(self) -> int:
        """Token budget of one micro-batch."""
        return self.config.max_tokens

    @property
    def truncate_to(self) -> int | None:
        """Length oversize examples were cut to (``oversize="truncate"``), else ``None``."""
        return self.planner.truncate_to

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self._position.epoch

    @property
    def consumed(self) -> int:
        """Micro-batches of this epoch this rank has taken (yielded or restored).

        Counted from the epoch's start as a training loop counts them (also across a resume
        on another topology), as :attr:`epoch_length` and ``state_dict(consumed=...)`` are.
        """
        return self._position.counted_before + self._position.consumed

    @property
    def epoch_length(self) -> int:
        """Micro-batches of this epoch as a training loop counts them on this rank.

        Those consumed before a world-size change (under the old topology) plus the current
        plan's; equals ``len(self)`` for a fresh epoch. A DataLoader for Lightning should report
        this as its length, since Lightning restores its batch counter on resume. After an epoch
        restarted afresh (``load_state_dict(..., on_mismatch="restart_epoch")``) it also counts
        the micro-batches the loop had counted before the restart.
        """
        return self._position.counted_before + self.plan.num_micro_batches_per_rank

    def consumed_from_epoch_count(self, trained: int) -> int:
        """Convert an epoch-level count of trained micro-batches to the current plan's count.

        Example:
            >>> import numpy as np
            >>> TokenBudgetBatchSampler(np.arange(1, 9), 8, rank=0, world_size=1
            ...                         ).consumed_from_epoch_count(2)
            2
        """
        return trained - self._position.counted_before

    @property
    def lengths_digest(self) -> str:
        """Digest of the lengths this sampler plans from (see :func:`lengths_digest`)."""
        if self._digest is None:
            self._digest = lengths_digest(self.planner)
        return self._digest

    def set_epoch(self, epoch: int) -> None:
        """Move to ``epoch``; the same epoch keeps a restored mid-epoch position.

        Raises:
            ValueError: for a negative epoch.
        """
        epoch = check_count("epoch", epoch, minimum=0)
        if epoch != self._position.epoch:
            self._position.start(epoch)

    def set_distributed(
        self, rank: int, world_size: int, accumulate_grad_batches: int | None = None
    ) -> None:
        """Change rank, world size or accumulation (e.g. once the trainer is known).

        Mid-epoch, a different world size or accumulation re-plans what the epoch has not
        consumed yet, so that no example is repeated or lost.

        Raises:
            ValueError: for a rank outside ``[0, world_size)`` or a non-positive accumulation.
        """
        acc = (
            self.accumulate_grad_batches
            if accumulate_grad_batches is None
            else check_accumulate(accumulate_grad_batches)
        )
        rank, world_size = resolve_rank_world(*check_topology(rank, world_size))
        changed = (world_size, acc) != (self.world_size, self.accumulate_grad_batches)
        if changed:
            self._position.leave_topology(self.world_size, self.accumulate_grad_batches)
        self.rank, self.world_size, self.accumulate_grad_batches = rank, world_size, acc

    # -- the plan ------------------------------------------------------------------------

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan (re-planned remainder after a topology change)."""
        position = self._position
        if not position.budgets_set:  # a new plan takes the shares in force
            position.budgets = self._shares.budgets(self.world_size)
            position.budgets_set = True
        key = (
            position.epoch,
            tuple(position.history),
            self.world_size,
            self.accumulate_grad_batches,
            position.budgets,
        )
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        args = (position.epoch, self.world_size, self.accumulate_grad_batches, position.history)
        if isinstance(self.planner, LANE_PLANNERS):
            plan = self.planner.plan_resumed(*args, rank_budgets=position.budgets)
        else:
            plan = self.planner.plan_resumed(*args)
        check_loss_tokens(plan, self.config)
        self._cache = (key, plan)
        return plan

    # -- ranks of different speed ----------------------------------------------------------

    @property
    def rank_budgets(self) -> tuple[int, ...]:
        """Every rank's micro-batch budget in the current plan (``max_tokens`` when equal)."""
        budget = self.plan.rank_budget
        if budget is None:
            return (self.max_tokens,) * self.world_size
        return tuple(int(b) for b in budget)

    @property
    def rank_shares(self) -> tuple[float, ...] | None:
        """The ranks' shares in the current plan (largest 1), ``None`` when all are equal.

        They are the budgets' ratios: ``rank_shares`` as set, unless a rank's memory budget
        (``rank_max_tokens``) or the longest example moved them.

        Example:
            >>> s = TokenBudgetBatchSampler([5] * 40, 20, rank=0, world_size=2,
            ...                             rank_shares=[2, 1])
            >>> s.rank_budgets, s.rank_shares
            ((20, 10), (1.0, 0.5))
        """
        budget = self.plan.rank_budget
        if budget is None:
            return None
        return tuple(float(b) / float(budget.max()) for b in budget)

    def set_rank_shares(self, shares: Sequence[float] | None) -> None:
        """Plan the next epochs with these shares (relative speeds, one per rank).

        They take effect when the next epoch is first planned (at once if the current epoch
        has not started): the rest of an epoch keeps its plan, so no example is lost or
        repeated. A share too small for the longest example is raised to hold it. They are
        saved with :meth:`state_dict`. Every rank must set the same shares.

        Args:
            shares: one positive share per rank, or ``None`` for the config's
                (``rank_shares``).

        Raises:
            SettingValueError: for a bad share (the rank is named), the wrong number of
                shares, or a mixture of ``mixing="per_batch"``.

        Example:
            >>> s = TokenBudgetBatchSampler([5] * 40, 20, rank=0, world_size=2)
            >>> s.set_rank_shares([1.0, 0.5])
            >>> s.rank_budgets
            (20, 10)
        """
        self._shares.set(shares, self.world_size)
        position = self._position
        if not position.consumed and not position.history and not position.restored:
            position.budgets_set = False

    def _sync_with_process_group(self) -> None:
        """Follow torch.distributed's rank and world size, or refuse a contradiction.

        A sampler built before the launcher started the ranks (e.g. at the top of a script
        that Lightning re-executes per rank) resolved its topology too early: left as it was,
        ranks would plan for different world sizes and hang at the epoch's end.
        """
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return
        found = (dist.get_rank(), dist.get_world_size())
        if found == (self.rank, self.world_size):
            return
        if self._inferred:
            self.set_distributed(*found)
            return
        raise RuntimeError(
            f"TokenBudgetBatchSampler was built for rank {self.rank} of world_size "
            f"{self.world_size}, but torch.distributed runs rank {found[0]} of {found[1]}: "
            "every rank must plan for the real topology or the ranks get different batches "
            "and hang. Pass rank/world_size of the process group (in a LightningModule or "
            "DataModule: trainer.global_rank and trainer.world_size), or leave them unset."
        )

    def __len__(self) -> int:
        """Micro-batches the next iteration yields (the rest of the epoch after a resume)."""
        self._sync_with_process_group()
        total = self.plan.num_micro_batches_per_rank
        position = self._position
        if position.consumed >= total and not position.restored:
            return total  # a finished epoch iterated again starts over
        return total - position.consumed

    def __iter__(self) -> Iterator[list[int]]:
        """Yield this rank's :class:`MicroBatch` es from the current position."""
        self._sync_with_process_group()
        plan = self.plan
        total = plan.num_micro_batches_per_rank
        position = self._position
        if position.consumed >= total and not position.restored:
            position.consumed = 0  # a finished epoch iterated again starts over
        position.restored = False
        for j in range(position.consumed, total):
            position.consumed = j + 1
            yield self.micro_batch(j)

    def micro_batch(self, position: int) -> MicroBatch:
        """The :class:`MicroBatch` this rank runs at ``position`` of the epoch (no advance).

        Raises:
            IndexError: when ``position`` is not in ``[0, micro-batches per rank)``.

        Example:
            >>> sampler = TokenBudgetBatchSampler([3, 3, 5], 6, rank=0, world_size=1,
            ...                                   shuffle=False)
            >>> list(sampler.micro_batch(1)), sampler.micro_batch(1).step
            ([0, 1], 1)
        """
        return micro_batch_of(
            self.plan,
            self.planner,
            self.rank,
            position,
            epoch=self._position.epoch,
            first_step=self._position.steps_before,
        )

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, to resume exactly there.

        Args:
            consumed: micro-batches of this epoch this rank has *trained* on, counted from the
                epoch's start as the training loop counts them (:attr:`consumed`,
                :attr:`epoch_length`); defaults to the number taken, which runs ahead of
                training when a DataLoader prefetches.

        Returns:
            A small dict of plain Python values (the same on every rank), including a digest
            of the lengths the plan was made from (``lengths_digest``), the budgets of every
            plan of the epoch and its ledger (how many examples it consumed, and a digest of
            which).

        Raises:
            ValueError: when ``consumed`` is outside this epoch, or counts fewer micro-batches
                than the epoch ran before its current plan.
        """
        position = self._position
        plan = self.plan
        before, total = position.counted_before, plan.num_micro_batches_per_rank
        count = position.consumed
        if consumed is not None:
            count = check_count("consumed", consumed, minimum=0) - before
        if not 0 <= count <= total:
            raise SettingValueError(
                f"consumed must be in [{before}, {before + total}] for this epoch (the "
                f"micro-batches trained since its start; {before} ran before its current "
                f"plan), got {consumed!r}.",
                setting="consumed",
                value=consumed,
            )
        saved = EpochPosition(
            position.epoch, count, history=position.history, offset=position.offset
        )
        saved.budgets = position.budgets
        state = save_state(
            saved,
            self.planner,
            self.world_size,
            self.accumulate_grad_batches,
            self.lengths_digest,
            consumed_ledger(plan, count),
        )
        if self._shares.set_by_run and self._shares.shares is not None:
            state["rank_shares"] = list(self._shares.shares)
        return state

    def load_state_dict(
        self, state: Mapping[str, Any], *, on_mismatch: OnMismatch = "error"
    ) -> None:
        """Resume from :meth:`state_dict`, also with another world size or accumulation.

        The state must come from the same data (checked with a digest of the lengths and loss
        lengths) and the same settings (seed, number of examples, planner settings): resuming
        a plan made from other lengths would train some of the epoch's examples twice and never
        others.

        Args:
            state: a :meth:`state_dict`.
            on_mismatch: what to do when the state was saved for other data or settings:
                ``"error"`` (default) raises; ``"restart_epoch"`` starts the saved epoch afresh
                (with a warning): the epoch number is kept, the current data and settings are
                planned for it, and every example of the epoch is trained exactly once from its
                start (examples trained before the checkpoint in that epoch are trained again).
                :attr:`epoch_length` still counts the micro-batches the training loop counted
                before the restart, so that Lightning, which restores its batch counter, runs
                the whole fresh plan.

        States written before the lengths digest existed (version 1) cannot prove that the
        lengths are unchanged: they are accepted with a warning under ``"error"`` (their
        seed, number of examples and settings are still checked), and restart the epoch
        under ``"restart_epoch"``.

        Raises:
            TypeError: when ``state`` is not a mapping.
            SettingValueError: for an unknown ``on_mismatch`` (``SettingTypeError`` for one
                that is not a string).
            ValueError: when the state has missing, unknown or invalid entries.
            ResumeMismatchError: (a ``ValueError``) with ``on_mismatch="error"``, when the
                state was saved for other data or settings; ``.changed`` names what differs
                (``"lengths"``, ``"seed"``, ``"num_examples"``, a setting's name, or
                ``"fingerprint"`` for a state without its settings) and the message lists every
                mismatch and how to start the epoch afresh.

        Example:
            >>> s = TokenBudgetBatchSampler([3, 4, 5, 6], 8, rank=0, world_size=1)
            >>> _ = next(iter(s)); state = s.state_dict()
            >>> t = TokenBudgetBatchSampler([3, 4, 5, 5], 8, rank=0, world_size=1)
            >>> t.load_state_dict(state)  # doctest: +ELLIPSIS
            Traceback (most recent call last):
            ...
            lightning_varbatch.errors.ResumeMismatchError: The sampler state was saved for other...
            >>> import warnings
            >>> with warnings.catch_warnings():
            ...     warnings.simplefilter("ignore")
            ...     t.load_state_dict(state, on_mismatch="restart_epoch")
            >>> len(t) == t.plan.num_micro_batches_per_rank, t.epoch_length - len(t)
            (True, 1)
        """
        check_choice(
            "on_mismatch",
            on_mismatch,
            ON_MISMATCH,
            what=" (what to do with a state saved for other data or settings)",
        )
        saved = read_state(state, self._equal_budgets)
        self._shares.restore(state.get("rank_shares"), self.world_size)
        resume_position(
            self._position,
            self.planner,
            saved,
            state_differences(saved, self.planner, self.lengths_digest),
            restart=on_mismatch == "restart_epoch",
            topology=(self.world_size, self.accumulate_grad_batches),
            memory=self._memory() if isinstance(self.planner, LANE_PLANNERS) else None,
        )
        self.plan  # noqa: B018  (the rest of the epoch, guarded, before anything is yielded)

    def _equal_budgets(self, world_size: int) -> tuple[int, ...] | None:
        """``max_tokens`` on every rank (``None`` for a planner without per-rank budgets)."""
        if not isinstance(self.planner, LANE_PLANNERS):
            return None
        return (self.max_tokens,) * world_size

    def _memory(self) -> tuple[int, ...]:
        """Every rank's memory budget now: ``rank_max_tokens``, else ``max_tokens``."""
        memory = self.config.rank_max_tokens
        return memory if memory is not None else (self.max_tokens,) * self.world_size
