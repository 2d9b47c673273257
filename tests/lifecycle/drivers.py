"""Every front end a run can use, behind one interface the lifecycle model drives.

A driver builds the front end of every rank of a :class:`~tests.lifecycle.spec.RunSpec` (the
sampler of each rank, a ``TokenBudgetDataModule`` per rank with the Trainer's attributes it
reads, a mixture's samplers, a stream per rank, a ``StreamingDataModule`` per rank), takes
micro-batches on every rank, saves the state a checkpoint would hold, loads one, and starts the
next epoch, as Lightning's loop would. It reports what it saw as :class:`Taken` records; it
never judges them (the model does).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from lightning_varbatch import (
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
)
from lightning_varbatch.data.streaming import StreamingBatches
from lightning_varbatch.sources.shards import ShardedSource
from lightning_varbatch.training_loop import TokenBudgetLoop
from tests.lifecycle.spec import RunSpec


@dataclass(frozen=True)
class Taken:
    """One micro-batch one rank ran: its ids and what the plan said of it."""

    rank: int
    ids: tuple[int, ...]
    step: int | None
    budget: int | None  # the plan's budget of this rank (None: not exposed)
    pad: tuple[int, int] | None  # (rows, length) under a shape budget
    fraction: float | None = None  # the plan's fraction of this step (a batch schedule)
    step_budget: int | None = None  # what the batch says the step may hold (a schedule)
    budgets: tuple[int, ...] | None = None  # every rank's budget of the plan


def _items(lengths: np.ndarray, offset: int = 0) -> list[dict[str, Any]]:
    """Dataset items of exactly these lengths, each carrying its global id."""
    out = []
    for i, row in enumerate(lengths.tolist()):
        if isinstance(row, list):
            item = {"source": [1] * row[0], "target": [1] * row[1]}
        else:
            item = {"tokens": [1] * row}
        item["id"] = offset + i
        out.append(item)
    return out


def ids_collate(items: Any) -> dict[str, Any]:
    """A user collate that keeps what the model checks: the ids and the plan's counts."""
    return {"ids": list(items.ids), "info": dict(items.info)}


class _MemoryShard:
    """An in-memory shard: rows of token ids (the ``Shard`` protocol)."""

    def __init__(self, name: str, rows: np.ndarray, first: int) -> None:
        self.name, self.rows, self.first = name, rows, first

    @property
    def num_rows(self) -> int:
        return int(self.rows.shape[0])

    def lengths(self) -> np.ndarray:
        return self.rows

    def read(self, rows: Any) -> Iterator[dict[str, Any]]:
        for r in np.asarray(rows).tolist():
            yield _items(self.rows[r : r + 1], self.first + r)[0]


def _source(spec: RunSpec) -> ShardedSource:
    lengths = spec.lengths[0]
    bounds = np.cumsum([0, *spec.shard_rows])
    return ShardedSource(
        [
            _MemoryShard(f"part-{i}", lengths[a:b], int(a))
            for i, (a, b) in enumerate(itertools.pairwise(bounds))
        ]
    )


def _trainer(spec: RunSpec, rank: int, epoch: int, trained: int, resumed: bool) -> Any:
    """The attributes of a Lightning Trainer a DataModule reads (no process group)."""
    world = spec.world
    return SimpleNamespace(
        global_rank=rank,
        world_size=world,
        accumulate_grad_batches=spec.acc,
        ckpt_path="last.ckpt" if resumed else None,
        strategy=SimpleNamespace(
            root_device=torch.device("cpu"),
            all_gather=lambda t: t.reshape(1, -1).repeat(world, 1),  # every rank agrees
        ),
        fit_loop=SimpleNamespace(
            epoch_progress=SimpleNamespace(current=SimpleNamespace(processed=epoch)),
            epoch_loop=SimpleNamespace(
                batch_progress=SimpleNamespace(current=SimpleNamespace(processed=trained))
            ),
        ),
    )


class Driver:
    """Builds the front end of every rank; takes, saves, loads; starts epochs."""

    def __init__(self, spec: RunSpec) -> None:
        self.spec = spec
        self.epoch = 0
        self.trained = 0  # micro-batches per rank trained this epoch (the loop's count)
        self._cursor: dict[int, list[Any]] = {}  # each rank's plan and position in it
        self.ranks = [self._build(r) for r in range(spec.world)]
        self._iters: list[Iterator[Any] | None] = [None] * spec.world

    # -- per kind ---------------------------------------------------------------------------

    def _build(self, rank: int) -> Any:
        raise NotImplementedError

    def _iterate(self, rank: int) -> Iterator[Any]:
        raise NotImplementedError

    def _taken(self, rank: int, batch: Any) -> Taken:
        raise NotImplementedError

    def state(self) -> Any:
        raise NotImplementedError

    def _load(self, rank: int, state: Any) -> None:
        raise NotImplementedError

    def _set_epoch(self, rank: int, epoch: int) -> None:
        raise NotImplementedError

    def remaining(self) -> list[int] | None:
        """Micro-batches each rank has left this epoch (``None``: a stream does not know)."""
        return None

    def report(self) -> tuple[int, int] | None:
        """``(dropped, duplicated)`` examples the library reports for the epoch, if it does."""
        return None

    def budgets(self) -> tuple[int, ...] | None:
        return None

    def window_of(self, example: int) -> int:
        """The part of the epoch ``example`` is planned in (a stream's window; else 0)."""
        return 0

    # -- shared ------------------------------------------------------------------------------

    def take(self, count: int) -> list[list[Taken]]:
        """Up to ``count`` micro-batches on every rank (fewer at the epoch's end)."""
        out: list[list[Taken]] = []
        for rank in range(self.spec.world):
            if self._iters[rank] is None:
                self._iters[rank] = self._iterate(rank)
            it = self._iters[rank]
            assert it is not None
            got = []
            for _ in range(count):
                try:
                    got.append(self._taken(rank, next(it)))
                except StopIteration:
                    break
            out.append(got)
        taken = {len(g) for g in out}
        if len(taken) == 1:
            self.trained += taken.pop()
        return out

    def load(self, state: Any, epoch: int, trained: int) -> None:
        """Resume every rank from ``state`` (Lightning restores its counters first)."""
        self.epoch, self.trained = epoch, trained
        for rank in range(self.spec.world):
            self._load(rank, state)
        self._iters = [None] * self.spec.world

    def next_epoch(self) -> None:
        self.epoch += 1
        self.trained = 0
        for rank in range(self.spec.world):
            self._set_epoch(rank, self.epoch)
        self._iters = [None] * self.spec.world


class SamplerDriver(Driver):
    """The sampler of every rank (``TokenBudgetBatchSampler``), or a mixture's."""

    def _build(self, rank: int) -> TokenBudgetBatchSampler:
        s = self.spec
        if s.kind == "mixture":
            return TokenBudgetBatchSampler.from_sources(
                list(s.lengths),
                s.max_tokens,
                rank=rank,
                world_size=s.world,
                accumulate_grad_batches=s.acc,
                **s.plan_settings(),
            )
        return TokenBudgetBatchSampler(
            s.lengths[0],
            s.max_tokens,
            rank=rank,
            world_size=s.world,
            accumulate_grad_batches=s.acc,
            **s.plan_settings(),
        )

    def sampler(self, rank: int) -> TokenBudgetBatchSampler:
        sampler = self.ranks[rank]
        assert isinstance(sampler, TokenBudgetBatchSampler)
        return sampler

    def _iterate(self, rank: int) -> Iterator[Any]:
        self._mark(rank)
        return iter(self.sampler(rank))

    def _mark(self, rank: int) -> None:
        """Where this rank's iteration starts in its plan (to read the plan's step fraction)."""
        sampler = self.sampler(rank)
        plan = sampler.plan
        self._cursor[rank] = [plan, plan.num_micro_batches_per_rank - len(sampler)]

    def _taken(self, rank: int, batch: Any) -> Taken:
        pad = None if batch.pad_rows is None else (batch.pad_rows, batch.pad_length)
        sampler = self.sampler(rank)
        fraction = None
        if batch.step_budget is not None:  # a batch schedule: the plan's fraction of the step
            plan, position = self._cursor[rank]
            self._cursor[rank][1] += 1
            mb = int(plan.rank_micro_batches(rank)[position])
            assert plan.micro_batch_ids(mb).tolist() == list(batch), "read the wrong micro-batch"
            step = position // plan.accumulate_grad_batches
            fraction = 1.0 if plan.step_fraction is None else float(plan.step_fraction[step])
        return Taken(
            rank,
            tuple(batch),
            batch.step,
            sampler.rank_budgets[rank],
            pad,
            fraction,
            batch.step_budget,
            tuple(sampler.rank_budgets),
        )

    def state(self) -> Any:
        return self.sampler(0).state_dict()

    def _load(self, rank: int, state: Any) -> None:
        self.sampler(rank).load_state_dict(state)

    def _set_epoch(self, rank: int, epoch: int) -> None:
        self.sampler(rank).set_epoch(epoch)

    def remaining(self) -> list[int] | None:
        return [len(self.sampler(r)) for r in range(self.spec.world)]

    def report(self) -> tuple[int, int] | None:
        plan = self.sampler(0).plan
        return plan.num_dropped, plan.num_duplicated

    def set_rank_shares(self, shares: tuple[float, ...]) -> None:
        for rank in range(self.spec.world):
            self.sampler(rank).set_rank_shares(shares)


class DataModuleDriver(SamplerDriver):
    """A ``TokenBudgetDataModule`` per rank, each with the Trainer attributes it reads."""

    def _build(self, rank: int) -> TokenBudgetDataModule:
        s = self.spec
        dm = TokenBudgetDataModule(
            _items(s.lengths[0]), s.lengths[0], s.max_tokens, **s.plan_settings()
        )
        dm.trainer = _trainer(s, rank, self.epoch, self.trained, resumed=False)
        return dm

    def _dm(self, rank: int) -> TokenBudgetDataModule:
        dm = self.ranks[rank]
        assert isinstance(dm, TokenBudgetDataModule)
        return dm

    def sampler(self, rank: int) -> TokenBudgetBatchSampler:
        dm = self._dm(rank)
        if "train" not in dm.samplers:
            dm.train_dataloader()
        return dm.samplers["train"]

    def _sync(self, rank: int, resumed: bool = False) -> None:
        self._dm(rank).trainer = _trainer(self.spec, rank, self.epoch, self.trained, resumed)

    def _iterate(self, rank: int) -> Iterator[Any]:
        self._sync(rank)
        loader = self._dm(rank).train_dataloader()
        self._mark(rank)
        return iter(loader.batch_sampler)  # what the DataLoader iterates (no collate needed)

    def take(self, count: int) -> list[list[Taken]]:
        out = super().take(count)
        for rank in range(self.spec.world):
            self._sync(rank)
        return out

    def state(self) -> Any:
        self._sync(0)
        return self._dm(0).state_dict()

    def load(self, state: Any, epoch: int, trained: int) -> None:
        self.epoch, self.trained = epoch, trained
        for rank in range(self.spec.world):
            self._sync(rank, resumed=True)
            self._dm(rank).load_state_dict(state)
            self._dm(rank).train_dataloader()  # Lightning builds the loader: the state applies
        self._iters = [None] * self.spec.world

    def _set_epoch(self, rank: int, epoch: int) -> None:
        self._sync(rank)
        loader = self._dm(rank).train_dataloader()
        loader.sampler.set_epoch(epoch)  # what Lightning relays at the epoch's start

    def set_rank_shares(self, shares: tuple[float, ...]) -> None:
        for rank in range(self.spec.world):
            self._dm(rank).set_rank_shares(shares)


class LoopDriver(SamplerDriver):
    """A ``TokenBudgetLoop`` per rank over a DataModule's loader built outside a Trainer.

    As in a Fabric loop: the rank comes from Fabric (a stand-in here), the loop sets the
    sampler's topology and accumulation, takes whole optimizer steps (it saves only at a
    step's end) and saves and loads its own state (the sampler's position inside it).
    """

    def _build(self, rank: int) -> TokenBudgetLoop:
        s = self.spec
        dm = TokenBudgetDataModule(
            _items(s.lengths[0]),
            s.lengths[0],
            s.max_tokens,
            collate=ids_collate,
            **s.plan_settings(),
        )
        fabric = SimpleNamespace(global_rank=rank, world_size=s.world, loggers=[], strategy=None)
        return TokenBudgetLoop(dm.train_dataloader(), fabric=fabric, accumulate_grad_batches=s.acc)

    def sampler(self, rank: int) -> TokenBudgetBatchSampler:
        return self.ranks[rank].sampler

    def _iterate(self, rank: int) -> Iterator[Any]:
        loop, sampler = self.ranks[rank], self.sampler(rank)
        for i, batch in enumerate(loop.epoch_batches(self.epoch)):  # the loop sets the epoch
            if i == 0:  # where this iteration started in the epoch's plan
                self._mark(rank)
                self._cursor[rank][1] -= 1  # its first micro-batch is taken already
            position = sampler.consumed_from_epoch_count(sampler.consumed) - 1
            micro_batch = sampler.micro_batch(position)
            assert batch["ids"] == list(micro_batch), "the loop handed out another micro-batch"
            loop.step()  # trained (no model here): the loop's count moves on
            yield micro_batch

    def take(self, count: int) -> list[list[Taken]]:
        acc = self.spec.acc
        return super().take(-(-count // acc) * acc)  # whole optimizer steps

    def state(self) -> Any:
        return self.ranks[0].state_dict()

    def _load(self, rank: int, state: Any) -> None:
        self.ranks[rank].load_state_dict(state)

    def _set_epoch(self, rank: int, epoch: int) -> None:
        """Nothing: the loop starts the next epoch at its first micro-batch (``epoch_batches``)."""


def _windows(planner: Any, epoch: int) -> np.ndarray:
    """The window of every example of a stream in ``epoch``."""
    out = np.zeros(planner.num_examples, dtype=np.int64)
    for w in range(planner.num_windows):
        for shard, a, b in planner.window_spans(epoch, w):
            out[planner.offsets[shard] + a : planner.offsets[shard] + b] = w
    return out


class StreamDriver(Driver):
    """A ``StreamingBatches`` per rank over in-memory shards."""

    def window_of(self, example: int) -> int:
        return int(_windows(self.ranks[0].planner, self.epoch)[example])

    def __init__(self, spec: RunSpec) -> None:
        self.source = _source(spec)
        self.since_iter = 0  # micro-batches per rank since this iteration started
        super().__init__(spec)

    def _build(self, rank: int) -> StreamingBatches:
        s = self.spec
        return StreamingBatches(
            self.source,
            s.max_tokens,
            window=s.window,
            collate=ids_collate,
            rank=rank,
            world_size=s.world,
            accumulate_grad_batches=s.acc,
            **s.plan_settings(),
        )

    def _iterate(self, rank: int) -> Iterator[Any]:
        self.since_iter = 0
        return iter(self.ranks[rank])

    def take(self, count: int) -> list[list[Taken]]:
        out = super().take(count)
        self.since_iter += len(out[0])
        return out

    def _taken(self, rank: int, batch: Any) -> Taken:
        return Taken(rank, tuple(batch["ids"]), None, None, None)

    def state(self) -> Any:
        return self.ranks[0].state_dict(self.since_iter)

    def _load(self, rank: int, state: Any) -> None:
        self.ranks[rank].load_state_dict(state)

    def _set_epoch(self, rank: int, epoch: int) -> None:
        """Nothing: the loop starts the next epoch at its first micro-batch (``epoch_batches``)."""

    def _set_epoch(self, rank: int, epoch: int) -> None:
        self.ranks[rank].set_epoch(epoch)
        self.since_iter = 0


class StreamingDataModuleDriver(Driver):
    """A ``StreamingDataModule`` per rank, each with the Trainer attributes it reads."""

    def window_of(self, example: int) -> int:
        return int(_windows(self.ranks[0].planner("train"), self.epoch)[example])

    def __init__(self, spec: RunSpec) -> None:
        self.source = _source(spec)
        super().__init__(spec)

    def _build(self, rank: int) -> StreamingDataModule:
        s = self.spec
        dm = StreamingDataModule(
            self.source, s.max_tokens, window=s.window, collate=ids_collate, **s.plan_settings()
        )
        dm.trainer = _trainer(s, rank, self.epoch, self.trained, resumed=False)
        return dm

    def _sync(self, rank: int, resumed: bool = False) -> None:
        self.ranks[rank].trainer = _trainer(self.spec, rank, self.epoch, self.trained, resumed)

    def _iterate(self, rank: int) -> Iterator[Any]:
        self._sync(rank)
        return iter(self.ranks[rank].train_dataloader())

    def take(self, count: int) -> list[list[Taken]]:
        out = super().take(count)
        for rank in range(self.spec.world):
            self._sync(rank)
        return out

    def _taken(self, rank: int, batch: Any) -> Taken:
        return Taken(rank, tuple(int(i) for i in batch["ids"]), None, None, None)

    def state(self) -> Any:
        self._sync(0)
        return self.ranks[0].state_dict()

    def load(self, state: Any, epoch: int, trained: int) -> None:
        self.epoch, self.trained = epoch, trained
        for rank in range(self.spec.world):
            self._sync(rank, resumed=True)
            self.ranks[rank].load_state_dict(state)
        self._iters = [None] * self.spec.world

    def _set_epoch(self, rank: int, epoch: int) -> None:
        self._sync(rank)  # the loader sets the stream's epoch from the fit loop at iter()


DRIVERS: dict[str, type[Driver]] = {
    "sampler": SamplerDriver,
    "mixture": SamplerDriver,
    "datamodule": DataModuleDriver,
    "loop": LoopDriver,
    "stream": StreamDriver,
    "streaming_dm": StreamingDataModuleDriver,
}


def build(spec: RunSpec) -> Driver:
    """The driver of ``spec``'s kind, every rank built."""
    return DRIVERS[spec.kind](spec)
