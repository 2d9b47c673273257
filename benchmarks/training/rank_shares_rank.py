"""Rank shares benchmark, one rank: the workload, the arms' epochs and the gradient checks.

What each of the two ``torch.distributed`` processes of :mod:`benchmarks.training.rank_shares`
runs (its ``--rank-child RANK PORT``; its docstring describes the arms and the checks): the
settings passed to the children (:class:`ShareSettings`), the examples (:class:`Data`), one
arm's sampler, model and timed epochs on a rank (:class:`Arm`), the float64 gradient check of
a step, and :func:`run_rank`, every factor's arms in one process group.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from lightning_varbatch.planner import wmt_like_lengths

WORLD = 2
ARMS = {"a": "equal shares", "b": "fixed [1, 1/f]", "c": "balancing"}


@dataclass(kw_only=True)
class ShareSettings:
    """Everything a rank's run depends on (passed to the children as JSON)."""

    examples: int = 2000
    max_tokens: int = 2048
    delay_us: float = 50.0
    """Sleep per padded token on rank 0; rank 1 sleeps ``factor`` times as long."""
    factors: list[float] = field(default_factory=lambda: [1.5, 2.0])
    epochs: int = 5
    accumulate: int = 1
    vocab: int = 256
    d_model: int = 16
    lr: float = 0.05
    seed: int = 0
    smoothing: float | None = None
    """``balanced_shares(smoothing=)`` of arm c; ``None``: the library's default."""
    check_steps: int = 2
    """Steps per epoch whose gradient is checked against float64 (first, last, then middle)."""

    def to_json(self) -> str:
        import json

        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> ShareSettings:
        import json

        return cls(**json.loads(text))


class Data:
    """The examples: WMT-like target lengths, random tokens, labels a function of the token."""

    def __init__(self, s: ShareSettings) -> None:
        self.lengths = wmt_like_lengths(s.examples, seed=s.seed)[:, 1].astype(np.int64)
        rng = np.random.default_rng([s.seed, 1])
        self.tokens = rng.integers(0, s.vocab, int(self.lengths.sum()), dtype=np.int64)
        self.labels = (self.tokens * 7 + 3) % s.vocab
        self.offsets = np.cumsum(self.lengths) - self.lengths

    def positions(self, ids: np.ndarray) -> np.ndarray:
        lens = self.lengths[ids]
        within = np.arange(int(lens.sum())) - np.repeat(np.cumsum(lens) - lens, lens)
        return np.asarray(within + np.repeat(self.offsets[ids], lens))

    def batch(self, ids: np.ndarray) -> tuple[Any, Any]:
        import torch

        pos = self.positions(ids)
        return torch.from_numpy(self.tokens[pos]), torch.from_numpy(self.labels[pos])

    def padded(self, ids: np.ndarray) -> int:
        return int(len(ids) * self.lengths[ids].max()) if len(ids) else 0


def reference_gradient(model: Any, ids: np.ndarray, data: Data) -> Any:
    """The float64 gradient of the token-mean loss over ``ids`` in one process."""
    import torch
    import torch.nn.functional as F

    ref = copy.deepcopy(model).double()
    for p in ref.parameters():
        p.grad = None  # nothing of the ranks' own gradients in the reference
    x, y = data.batch(ids)
    F.cross_entropy(ref(x), y, reduction="mean").backward()
    return torch.cat([p.grad.reshape(-1) for p in ref.parameters()])


def check_step(
    model: Any, flat: Any, ids: np.ndarray, step_ntokens: int, data: Data, rank: int
) -> dict[str, Any] | None:
    """Rank 0 compares the all-reduced gradient with the float64 one over the step's examples."""
    import torch.distributed as dist

    everyone: list[Any] = [None] * WORLD
    dist.all_gather_object(everyone, ids.tolist())
    out = None
    if rank == 0:
        union = np.concatenate([np.asarray(x, dtype=np.int64) for x in everyone])
        ref = reference_gradient(model, union, data)
        err = float((flat.double() - ref).abs().max() / ref.abs().max())
        out = {"rel_err": err, "tokens_ok": int(data.lengths[union].sum()) == step_ntokens}
    dist.barrier()
    return out


class Arm:
    """One arm on this rank (the process group is up): its sampler, model and epoch records."""

    def __init__(
        self, arm: str, factor: float, rank: int, data: Data, s: ShareSettings, delay_us: float
    ) -> None:
        import torch

        from lightning_varbatch import TokenBudgetBatchSampler

        self.arm, self.factor, self.rank, self.data, self.s = arm, factor, rank, data, s
        self.sampler = TokenBudgetBatchSampler(
            data.lengths,
            s.max_tokens,
            rank=rank,
            world_size=WORLD,
            accumulate_grad_batches=s.accumulate,
            seed=s.seed,
            rank_shares=[1.0, 1.0 / factor] if arm == "b" else None,
        )
        self.delay = delay_us * 1e-6 * (factor if rank == 1 else 1.0)
        torch.manual_seed(s.seed)
        self.model = torch.nn.Sequential(
            torch.nn.Embedding(s.vocab, s.d_model), torch.nn.Linear(s.d_model, s.vocab)
        )
        self.epochs: list[dict[str, Any]] = []
        self.smoothed: tuple[float, ...] | None = None  # arm c: speeds smoothed over epochs

    def result(self) -> dict[str, Any]:
        return {"arm": self.arm, "factor": self.factor, "rank": self.rank, "epochs": self.epochs}

    def run_epoch(self, epoch: int) -> None:
        """Train one epoch (timed), check coverage and, for arm c, balance (untimed)."""
        import torch
        import torch.distributed as dist
        import torch.nn.functional as F

        from lightning_varbatch import MicroBatch
        from lightning_varbatch.planner import balanced_shares, smoothed_speeds

        s, data, rank, sampler, model = self.s, self.data, self.rank, self.sampler, self.model
        params = list(model.parameters())  # plain SGD by hand: torch.optim costs 2 s to import
        sampler.set_epoch(epoch)
        plan = sampler.plan
        shares, budgets = sampler.rank_shares, sampler.rank_budgets
        work = [
            float(plan.micro_batch_load[plan.rank_micro_batches(r)].sum()) for r in range(WORLD)
        ]
        last = plan.num_steps - 1
        checked = list(dict.fromkeys([0, last, last // 2]))[: s.check_steps]
        compute = wait = check_s = 0.0
        trained, step_ids, checks = [], [], []
        dist.barrier()
        t_start = time.perf_counter()
        for batch in sampler:
            assert isinstance(batch, MicroBatch)
            t0 = time.perf_counter()
            ids = np.asarray(batch, dtype=np.int64)
            x, y = data.batch(ids)
            loss = F.cross_entropy(model(x), y, reduction="sum") / batch.step_ntokens
            loss.backward()
            time.sleep(self.delay * data.padded(ids))  # the slow device
            compute += time.perf_counter() - t0
            trained.append(ids)
            step_ids.append(ids)
            if batch.micro < s.accumulate - 1:
                continue
            flat = torch.cat([p.grad.reshape(-1) for p in params])  # type: ignore[union-attr]
            t1 = time.perf_counter()
            dist.all_reduce(flat)
            wait += time.perf_counter() - t1
            if batch.step in checked:
                t2 = time.perf_counter()
                found = check_step(
                    model, flat, np.concatenate(step_ids), batch.step_ntokens, data, rank
                )
                checks += [found] if found else []
                check_s += time.perf_counter() - t2
            offset = 0
            with torch.no_grad():
                for p in params:
                    p.sub_(s.lr * flat[offset : offset + p.numel()].view_as(p))
                    p.grad = None
                    offset += p.numel()
            step_ids = []
        dist.barrier()
        wall = time.perf_counter() - t_start - check_s
        # untimed: coverage over the union of the ranks, then the balancing
        mine = np.concatenate(trained) if trained else np.zeros(0, dtype=np.int64)
        gathered: list[Any] = [None] * WORLD
        dist.all_gather_object(gathered, (compute, mine.tolist(), len(trained)))
        union = np.concatenate([np.asarray(g[1], dtype=np.int64) for g in gathered])
        seconds = [float(g[0]) for g in gathered]
        record = {
            "epoch": epoch,
            "wall_s": wall,
            "compute_s": seconds,
            "wait_s": wait,
            "work": work,
            "shares": None if shares is None else list(shares),
            "budgets": list(budgets),
            "micro_batches_per_rank": plan.num_micro_batches_per_rank,
            "ran_micro_batches": [int(g[2]) for g in gathered],
            "steps": plan.num_steps,
            "tokens": int(data.lengths[union].sum()),
            "once": bool(np.array_equal(np.sort(union), np.arange(len(data.lengths)))),
            "checks": checks,
        }
        if self.arm == "c":  # what RankShareBalancer does at an epoch's end
            current = shares if shares is not None else (1.0,) * WORLD
            given = {} if s.smoothing is None else {"smoothing": s.smoothing}
            new = balanced_shares(seconds, work, current, previous=self.smoothed, **given)
            self.smoothed = smoothed_speeds(seconds, work, self.smoothed, **given)
            sampler.set_rank_shares(new)
            record["next_shares"] = list(new)
        self.epochs.append(record)


def run_rank(rank: int, port: int, s: ShareSettings) -> list[dict[str, Any]]:
    """Every factor's arms on this rank, in one process group.

    The arms of a factor take turns epoch by epoch (a, b, c, then c, b, a, ...), so that a
    change of the machine's load falls on all three alike.
    """
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    data = Data(s)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD
    )
    try:
        # discarded warm-up: the first use of gloo and of the allocator
        Arm("a", 1.0, rank, data, replace(s, check_steps=1), 0.0).run_epoch(0)
        out = []
        for factor in s.factors:
            arms = [Arm(arm, factor, rank, data, s, s.delay_us) for arm in ARMS]
            for epoch in range(s.epochs):
                for arm in arms if epoch % 2 == 0 else arms[::-1]:
                    arm.run_epoch(epoch)
            out += [arm.result() for arm in arms]
        return out
    finally:
        dist.destroy_process_group()
