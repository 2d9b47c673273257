"""One rank's view of the epoch plan, as a torch batch sampler that resumes mid-epoch.

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

import difflib
import hashlib
import inspect
import warnings
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import fields
from typing import Any, Literal, TypeAlias

import numpy as np
import numpy.typing as npt
from torch.utils.data import Sampler

from lightning_varbatch.checks import check_choice, check_count
from lightning_varbatch.data.micro_batch import MicroBatch, micro_batch_of, resolve_rank_world
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from lightning_varbatch.planner.costs import CostFn, CostName
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import (
    DEFAULT_FLOP_ATTENTION,
    LayoutName,
    OversizePolicy,
    PlanConfig,
    TailPolicy,
)
from lightning_varbatch.planner.sources import DataSource, MixingPolicy, Weights
from lightning_varbatch.sources.arrow_lengths import source_with_column_lengths

OnMismatch: TypeAlias = Literal["error", "restart_epoch"]
ON_MISMATCH: tuple[OnMismatch, ...] = ("error", "restart_epoch")

STATE_VERSION = 2
_STATE_KEYS_V1 = frozenset(
    {
        "version",
        "epoch",
        "seed",
        "num_examples",
        "fingerprint",
        "world_size",
        "accumulate_grad_batches",
        "consumed",
        "history",
    }
)
_STATE_KEYS = _STATE_KEYS_V1 | {"lengths_digest", "restart_offset", "settings"}


def lengths_digest(planner: Planner) -> str:
    """A 16-hex-digit digest of the lengths a plan is made from.

    It covers every example's planning length (after truncation), loss length and whether it
    is skipped, so any change of the data's lengths (a re-tokenised corpus, a lowered
    ``max_length``, an edited file with the same line count) changes it. It does not depend
    on the dtype the lengths were given in. About 10 ms per million examples, computed once
    per sampler.

    Example:
        >>> from lightning_varbatch.planner.settings import PlanConfig
        >>> a = EpochPlanner([3, 4, 5], PlanConfig(max_tokens=8))
        >>> b = EpochPlanner([3, 4, 6], PlanConfig(max_tokens=8))
        >>> lengths_digest(a) == lengths_digest(a), lengths_digest(a) == lengths_digest(b)
        (True, False)
    """
    prepared = planner.prepared
    h = hashlib.blake2b(digest_size=8)
    h.update(np.ascontiguousarray(prepared.key, dtype=np.int32).data)
    h.update(np.ascontiguousarray(prepared.loss, dtype=np.int32).data)
    if prepared.kept is not None:
        h.update(b"kept")
        h.update(np.ascontiguousarray(prepared.kept, dtype=np.int64).data)
    return h.hexdigest()


def _plain(value: Any) -> Any:
    """A numpy scalar as the Python scalar (``np.int64(1024)`` -> ``1024``); else ``value``."""
    return value.item() if isinstance(value, np.generic) else value


def reject_unknown(owner: str, unknown: Iterable[str], valid: Iterable[str]) -> None:
    """Refuse misspelt settings with the closest valid names (a TypeError naming ``owner``).

    Example:
        >>> reject_unknown("f", ["max_tokens"], ["max_tokens", "seed"])  # all known: no error
    """
    valid = sorted(valid)
    given = unknown
    unknown = sorted(set(unknown) - set(valid))
    if not unknown:
        return
    hints = [
        f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name)
        for name in unknown
        for close in [difflib.get_close_matches(name, valid, n=1)]
    ]
    raise SettingTypeError(
        f"{owner} got unknown setting(s) {', '.join(hints)}; valid settings: {valid}. "
        "Check the spelling.",
        setting=unknown[0],
        value=given[unknown[0]] if isinstance(given, Mapping) else None,
    )


def plain_settings(**settings: Any) -> dict[str, Any]:
    """Planner settings with numpy scalars made plain (PlanConfig checks their values)."""
    reject_unknown("The planner", settings, (f.name for f in fields(PlanConfig)))
    return {k: _plain(v) for k, v in settings.items()}


def _check_accumulate(value: Any) -> int:
    return check_count(
        "accumulate_grad_batches",
        value,
        what=" (micro-batches per rank per optimizer step, as Trainer(accumulate_grad_batches))",
    )


def _check_topology(rank: Any, world_size: Any) -> tuple[int | None, int | None]:
    """``rank`` and ``world_size`` as given (``None``: found later), checked as settings."""
    world = check_count("world_size", world_size, allow_none=True)
    if rank is None:
        return None, world
    rank = check_count("rank", rank, minimum=0)
    if world is not None and rank >= world:
        raise SettingValueError(
            f"rank must be in [0, world_size={world}), got {rank}; pass this process's rank "
            "(in a LightningModule or DataModule: trainer.global_rank).",
            setting="rank",
            value=rank,
        )
    return rank, world


def _state_int(state: Mapping[str, Any], key: str, minimum: int = 0) -> int:
    value = state[key]
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(
            f"Not a valid TokenBudgetBatchSampler state: {key}={value!r} must be an integer "
            f">= {minimum}; the checkpoint is damaged or was not written by this sampler."
        )
    return int(value)


def _difference(name: str, saved: Any, now: Any) -> str:
    """One difference between a saved sampler state and the run, in words."""
    if name == "lengths":
        return (
            "the lengths (or loss lengths) differ from those the saved plan was made from "
            f"(lengths digest: saved {saved!r}, now {now!r})"
        )
    return f"{name}: saved {saved!r}, now {now!r}"


class TokenBudgetBatchSampler(Sampler[list[int]]):
    """Token-budgeted micro-batches of one rank; every rank gets the same number.

    All ranks build the same plan from the same lengths and settings (no collective needed)
    and each iterates its own slice: micro-batches of optimizer step ``s`` come in order
    ``(s, micro 0), (s, micro 1), ...``. Batches are :class:`MicroBatch` lists that also carry
    their token counts and the whole step's token count, for exact loss normalisation.

    The planner settings (``max_tokens``, ``max_examples`` ... ``oversize``) are the fields of
    :class:`PlanConfig`, with the same names and defaults (a test keeps them in step); their
    full descriptions are there.

    Args:
        lengths: ``(n,)`` lengths or ``(n, 2)`` (source, target) lengths, one per dataset item.
        max_tokens: token budget of one micro-batch on one rank (see :class:`PlanConfig`).
        rank: this rank; default: torch.distributed, else the ``RANK`` environment variable.
        world_size: number of ranks; default: torch.distributed, else ``WORLD_SIZE``.
        accumulate_grad_batches: micro-batches per rank per optimizer step.
        max_examples: cap on examples per micro-batch.
        cost: cost model name or callable.
        quadratic_coef: coefficient of the quadratic cost.
        batch_size_multiple: round micro-batch sizes down to a multiple of this.
        pad_to_multiple_of: the cost model sees lengths padded to this multiple.
        bucket_width: width of the length buckets mixed freely.
        shuffle: reshuffle every epoch.
        seed: random seed; the plan depends only on it and the epoch.
        tail: ``"spread"``, ``"drop"`` or ``"pad"`` (see :class:`PlanConfig`).
        oversize: ``"error"``, ``"skip"`` or ``"truncate"``.
        layout: ``"padded"`` batches or ``"packed"`` rows (see :class:`PlanConfig`; use
            :class:`~lightning_varbatch.data.packed_collate.PackingCollate` with ``"packed"``).
        flop_attention: attention compute per (query, key) pair relative to one token's
            linear compute; packed micro-batches are dealt to ranks by it.
        max_shapes: pad every micro-batch to one of at most this many static ``(rows,
            length)`` shapes, for ``torch.compile`` (see :class:`PlanConfig`); each
            :class:`MicroBatch` then carries ``pad_rows`` and ``pad_length``.
        loss_lengths: loss tokens per example when they are not the lengths / target column.
        epoch: the starting epoch.

    Raises:
        ValueError: for bad lengths or settings; the message names the setting to change.

    Example:
        >>> import numpy as np
        >>> sampler = TokenBudgetBatchSampler(np.array([[3, 4], [9, 2], [5, 5]]), 12,
        ...                                   rank=0, world_size=1)
        >>> [(list(b), b.ntokens, b.step_ntokens) for b in sampler]
        [([1], 2, 2), ([2, 0], 9, 9)]
    """

    def __init__(
        self,
        lengths: npt.ArrayLike,
        max_tokens: int,
        *,
        rank: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int = 1,
        max_examples: int | None = None,
        cost: CostName | CostFn = "padded",
        quadratic_coef: float = 1 / 64,
        batch_size_multiple: int = 1,
        pad_to_multiple_of: int = 1,
        bucket_width: int = 1,
        shuffle: bool = True,
        seed: int = 0,
        tail: TailPolicy = "spread",
        oversize: OversizePolicy = "error",
        layout: LayoutName = "padded",
        flop_attention: float = DEFAULT_FLOP_ATTENTION,
        max_shapes: int | None = None,
        loss_lengths: npt.ArrayLike | None = None,
        epoch: int = 0,
        _planner: Planner | None = None,
        **unknown: Any,
    ) -> None:
        reject_unknown(
            "TokenBudgetBatchSampler",
            unknown,
            (p for p in inspect.signature(type(self).__init__).parameters if p[0] != "_"),
        )
        planner: Planner
        if _planner is None:
            given = locals()  # the PlanConfig fields are arguments of the same name
            config = PlanConfig(
                **plain_settings(**{f.name: given[f.name] for f in fields(PlanConfig)})
            )
            _check_accumulate(accumulate_grad_batches)
            planner = EpochPlanner(lengths, config, loss_lengths)
        else:  # from_planner: the lengths and settings are the planner's
            _check_accumulate(accumulate_grad_batches)
            planner = _planner
        self.planner = planner
        # Found in the environment (not given): re-read from the process group once it exists.
        self._inferred = rank is None or world_size is None
        self.rank, self.world_size = resolve_rank_world(*_check_topology(rank, world_size))
        self.accumulate_grad_batches = 1
        self._epoch = 0
        self._consumed = 0
        self._restored = False  # a restored position is honoured even at the epoch's end
        self._history: list[tuple[int, int, int]] = []
        # Micro-batches the training loop counted in this epoch before it was restarted afresh
        # (load_state_dict(on_mismatch="restart_epoch")): counted, but no example is excluded.
        self._offset = 0
        self._cache: tuple[tuple[Any, ...], EpochPlan] | None = None
        self._digest: str | None = None
        self.set_distributed(self.rank, self.world_size, _plain(accumulate_grad_batches))
        self.set_epoch(_plain(epoch))

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
        planner = MixturePlanner(
            sources,
            PlanConfig(**plain_settings(max_tokens=max_tokens, **settings)),
            mixing=mixing,
            weights=weights,
            temperature=temperature,
            steps_per_epoch=steps_per_epoch,
        )
        return cls.from_planner(
            planner,
            rank=rank,
            world_size=world_size,
            accumulate_grad_batches=_plain(accumulate_grad_batches),
            epoch=_plain(epoch),
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
        return self._epoch

    @property
    def consumed(self) -> int:
        """Micro-batches of the current plan this rank has taken (yielded or restored)."""
        return self._consumed

    @property
    def epoch_length(self) -> int:
        """Micro-batches of this epoch as a training loop counts them on this rank.

        Those consumed before a world-size change (under the old topology) plus the current
        plan's; equals ``len(self)`` for a fresh epoch. A DataLoader for Lightning should report
        this as its length, since Lightning restores its batch counter on resume. After an epoch
        restarted afresh (``load_state_dict(..., on_mismatch="restart_epoch")``) it also counts
        the micro-batches the loop had counted before the restart.
        """
        done = self._offset + sum(c for _, _, c in self._history)
        return done + self.plan.num_micro_batches_per_rank

    def consumed_from_epoch_count(self, trained: int) -> int:
        """Convert an epoch-level count of trained micro-batches to the current plan's count.

        Example:
            >>> import numpy as np
            >>> TokenBudgetBatchSampler(np.arange(1, 9), 8, rank=0, world_size=1
            ...                         ).consumed_from_epoch_count(2)
            2
        """
        return trained - self._offset - sum(c for _, _, c in self._history)

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
        if epoch != self._epoch:
            self._epoch = epoch
            self._consumed = 0
            self._restored = False
            self._history = []
            self._offset = 0

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
            else _check_accumulate(accumulate_grad_batches)
        )
        rank, world_size = resolve_rank_world(*_check_topology(rank, world_size))
        changed = (world_size, acc) != (self.world_size, self.accumulate_grad_batches)
        if changed and self._consumed:
            self._history.append((self.world_size, self.accumulate_grad_batches, self._consumed))
            self._consumed = 0
        self.rank, self.world_size, self.accumulate_grad_batches = rank, world_size, acc

    # -- the plan ------------------------------------------------------------------------

    @property
    def plan(self) -> EpochPlan:
        """The current epoch's plan (re-planned remainder after a topology change)."""
        key = (self._epoch, tuple(self._history), self.world_size, self.accumulate_grad_batches)
        if self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        plan = self.planner.plan_resumed(
            self._epoch, self.world_size, self.accumulate_grad_batches, self._history
        )
        self._cache = (key, plan)
        return plan

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
        if self._consumed >= total and not self._restored:
            return total  # a finished epoch iterated again starts over
        return total - self._consumed

    def __iter__(self) -> Iterator[list[int]]:
        """Yield this rank's :class:`MicroBatch` es from the current position."""
        self._sync_with_process_group()
        plan = self.plan
        total = plan.num_micro_batches_per_rank
        if self._consumed >= total and not self._restored:
            self._consumed = 0  # a finished epoch iterated again starts over
        self._restored = False
        for j in range(self._consumed, total):
            self._consumed = j + 1
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
        return micro_batch_of(self.plan, self.planner, self.rank, position, epoch=self._epoch)

    # -- checkpointing -------------------------------------------------------------------

    def state_dict(self, consumed: int | None = None) -> dict[str, Any]:
        """Where the epoch stands, to resume exactly there.

        Args:
            consumed: micro-batches of the current plan this rank has *trained* on; defaults to
                the number yielded, which runs ahead of training when a DataLoader prefetches.

        Returns:
            A small dict of plain Python values (the same on every rank), including a digest
            of the lengths the plan was made from (``lengths_digest``).

        Raises:
            ValueError: when ``consumed`` is outside the current plan.
        """
        consumed = self._consumed if consumed is None else consumed
        total = self.plan.num_micro_batches_per_rank
        consumed = check_count("consumed", consumed, minimum=0)
        if consumed > total:
            raise SettingValueError(
                f"consumed must be in [0, {total}] for this epoch, got {consumed!r}.",
                setting="consumed",
                value=consumed,
            )
        return {
            "version": STATE_VERSION,
            "epoch": self._epoch,
            "seed": self.config.seed,
            "num_examples": self.planner.num_examples,
            "fingerprint": self.planner.fingerprint(),
            "lengths_digest": self.lengths_digest,
            "settings": self.config.plain(),
            "world_size": self.world_size,
            "accumulate_grad_batches": self.accumulate_grad_batches,
            "consumed": int(consumed),
            "history": [list(h) for h in self._history],
            "restart_offset": self._offset,
        }

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
        if not isinstance(state, Mapping):
            raise TypeError(
                "load_state_dict expects the dict returned by TokenBudgetBatchSampler."
                f"state_dict(), got {type(state).__name__}: {str(state)[:60]}. Pass the "
                "saved sampler state (in a Lightning checkpoint: "
                "ckpt['datamodule_state_dict'] or your own key)."
            )
        keys = set(state)
        version = state.get("version")
        allowed = _STATE_KEYS_V1 if version == 1 else _STATE_KEYS
        if keys != allowed:
            raise ValueError(
                "Not a TokenBudgetBatchSampler state: missing keys "
                f"{sorted(allowed - keys)}, unknown keys {sorted(map(str, keys - allowed))}. "
                "Pass the dict that TokenBudgetBatchSampler.state_dict() returned, unchanged "
                "(in a Lightning checkpoint: ckpt['datamodule_state_dict']['train_sampler'])."
            )
        if version not in (1, STATE_VERSION):
            raise ValueError(
                f"The sampler state has version {version!r}; this version of "
                f"lightning_varbatch reads versions 1 and {STATE_VERSION}: resume with the "
                "version of the library that wrote the checkpoint."
            )
        epoch = _state_int(state, "epoch")
        consumed = _state_int(state, "consumed")
        saved_topology = (
            _state_int(state, "world_size", 1),
            _state_int(state, "accumulate_grad_batches", 1),
        )
        offset = _state_int(state, "restart_offset") if version != 1 else 0
        try:
            history = [(int(w), int(a), int(c)) for w, a, c in state["history"]]
        except (TypeError, ValueError):
            raise ValueError(
                "Not a valid TokenBudgetBatchSampler state: history must be a list of "
                f"[world_size, accumulate_grad_batches, consumed] triples, got "
                f"{state['history']!r}."
            ) from None
        expected = {
            "seed": self.config.seed,
            "num_examples": self.planner.num_examples,
            "fingerprint": self.planner.fingerprint(),
        }
        # What differs, as data: name -> (saved, now); "lengths" compares the lengths digests.
        differences: dict[str, tuple[Any, Any]] = {}
        if (
            version != 1
            and state["num_examples"] == expected["num_examples"]  # else implied by the count
            and state["lengths_digest"] != self.lengths_digest
        ):
            differences["lengths"] = (state["lengths_digest"], self.lengths_digest)
        differences.update((k, (state[k], v)) for k, v in expected.items() if state[k] != v)
        saved_settings = state.get("settings")
        if isinstance(saved_settings, Mapping) and "fingerprint" in differences:
            # the saved settings say which ones changed: name them instead of the hash
            changed = {
                k: (saved_settings.get(k), v)
                for k, v in self.config.plain().items()
                if k != "seed" and saved_settings.get(k) != v
            }
            if changed or "seed" in differences:  # they explain the hash: name them only
                del differences["fingerprint"]
                differences.update(changed)
        wrong = [_difference(k, saved, now) for k, (saved, now) in differences.items()]
        restart = on_mismatch == "restart_epoch"
        if wrong and not restart:
            raise ResumeMismatchError(
                "The sampler state was saved for other data or settings ("
                + "; ".join(wrong)
                + f"). Resuming epoch {epoch} from it would train some of its examples twice "
                "and never others. Resume with the same dataset, lengths, seed and batching "
                "settings (max_tokens, cost, tail, ...), or start that epoch afresh: "
                "load_state_dict(state, on_mismatch='restart_epoch') "
                "(TokenBudgetDataModule(on_resume_mismatch='restart_epoch'); in the "
                "translation example the data.on_resume_mismatch setting).",
                changed=list(differences),
            )
        if version == 1 and not wrong:
            reason = "cannot prove that the lengths are unchanged (it has no lengths digest)"
            if not restart:
                warnings.warn(
                    f"The sampler state is from an older lightning_varbatch and {reason}: "
                    "resuming as saved. If the data's lengths changed since, resume with "
                    "on_mismatch='restart_epoch' to start the epoch afresh.",
                    UserWarning,
                    stacklevel=2,
                )
            else:
                wrong = [reason]
        # The training loop's count of this epoch's micro-batches when the state was saved.
        counted = offset + sum(c for _, _, c in history) + consumed
        self._epoch = epoch
        self._restored = True
        self._consumed = 0
        if wrong:
            warnings.warn(
                f"Starting epoch {epoch} afresh (on_mismatch='restart_epoch'): the sampler "
                "state was saved for other data or settings (" + "; ".join(wrong) + "). Every "
                f"example of epoch {epoch} is trained once from its start; {counted} "
                "micro-batch(es) of it trained before the checkpoint are not undone.",
                UserWarning,
                stacklevel=2,
            )
            self._history = []
            self._offset = counted
            return
        self._history = history
        self._offset = offset
        if saved_topology == (self.world_size, self.accumulate_grad_batches):
            total = self.plan.num_micro_batches_per_rank
            if not 0 <= consumed <= total:
                if restart:
                    self._history, self._offset = [], counted
                    return
                raise ResumeMismatchError(
                    f"The sampler state says {consumed} micro-batches were consumed but epoch "
                    f"{epoch} has {total}; the checkpoint does not match this data. Start the "
                    "epoch afresh with load_state_dict(state, on_mismatch='restart_epoch').",
                    changed=["consumed"],
                )
            self._consumed = consumed
        elif consumed:
            self._history.append((*saved_topology, consumed))
