"""One rank of one peer's training run (the child process of :mod:`benchmarks.peers.training`).

The process group is up (gloo). For each run this rank:

1. **plans**: makes its own micro-batches with the peer's package
   (:func:`benchmarks.peers.batches.deal`), timed (``plan_s``: building the sampler and walking
   its epoch, imports done before);
2. **checks the counts**: all-reduces every rank's batch count *before* training. Unequal counts
   would hang the gradient all-reduce at the end of the epoch: the run records them, then
   applies the peer's named workaround (:func:`benchmarks.peers.batches.workaround`) or, if the
   peer has none, does not train;
3. **trains** every micro-batch once, in order: the same ``TranslationModel`` with the same
   initial weights on every rank and in every run, Adam, the **exact token-mean loss**: each
   rank backpropagates its *summed* cross entropy over real target tokens (times the batch's
   weight: 0 for a workaround's dummy batch), concatenates its gradients with its weighted token
   count, and one ``all_reduce`` sums both; the gradients are then divided by the global token
   count (the gradient of the mean over all real target tokens of the step, on both ranks);
4. **measures** per step: compute (forward + backward + concatenation), the time in
   ``all_reduce``, the step time (to the end of the optimizer step); the wall time of the timed
   steps (after ``warmup`` steps and a barrier); the rise of the RSS high-water mark over the
   loop (:func:`benchmarks.harness.reset_hwm`); the ids of every example trained with weight > 0,
   per micro-batch (the parent counts dropped and repeated examples and budget overshoots from
   these, not from the plan).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.harness import proc_kib, reset_hwm
from benchmarks.peers.batches import deal, preload, workaround
from benchmarks.workload import TranslationSettings, build_model, collate, plan_lengths


@dataclass
class RunSpec:
    """One configuration: a peer at one setting, in one comparison (or both)."""

    peer: str
    setting: int
    tag: str
    """``budget``, ``memory`` or ``both``: the comparisons it appears in."""

    @property
    def key(self) -> str:
        return f"{self.peer}@{self.setting}"


@dataclass
class RankRun:
    """What one rank reports for one run."""

    peer: str
    setting: int
    rank: int
    planned: int
    """Micro-batches the peer gave this rank."""
    counts: list[int]
    """Every rank's planned count (from the all-reduce before training)."""
    trained: bool
    """False when the counts differed and the peer has no workaround (it would hang)."""
    plan_s: float = 0.0
    dummy: int = 0
    """Micro-batches added by the workaround (trained with weight 0)."""
    batches: list[list[int]] = field(default_factory=list)
    """The ids of every micro-batch trained with weight > 0, in order."""
    compute_s: list[float] = field(default_factory=list)
    allreduce_s: list[float] = field(default_factory=list)
    step_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    """Weighted real target tokens per step (this rank)."""
    wall_s: float = 0.0
    """Wall time of the timed steps (after the warm-up steps and a barrier)."""
    cpu_s: float = 0.0
    """This process's CPU time over the timed steps (what other jobs on the cores do not add)."""
    peak_mb: float | None = None
    warmup: int = 0


def exchange_counts(n: int, rank: int, world: int) -> list[int]:
    """Every rank's batch count (one small all-reduce)."""
    import torch
    import torch.distributed as dist

    t = torch.zeros(world, dtype=torch.int64)
    t[rank] = n
    dist.all_reduce(t)
    return [int(x) for x in t.tolist()]


def train_run(spec: RunSpec, rank: int, world: int, s: TranslationSettings) -> RankRun:
    """Plan, check the counts, and train one configuration on this rank."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    from benchmarks.workload import workload_lengths

    device = torch.device(s.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    lengths = workload_lengths(s)
    tl = plan_lengths(lengths)
    preload(spec.peer)
    dist.barrier()
    t0 = time.perf_counter()
    mine = deal(spec.peer, tl, spec.setting, rank, world, s.seed)
    plan_s = time.perf_counter() - t0
    counts = exchange_counts(len(mine), rank, world)
    out = RankRun(spec.peer, spec.setting, rank, len(mine), counts, True, plan_s)
    weights = [1.0] * len(mine)
    if len(set(counts)) > 1:
        fixed = workaround(spec.peer, mine, counts)
        if fixed is None:
            out.trained = False
            return out
        mine, weights = fixed
        out.dummy = sum(1 for w in weights if w == 0.0)
    out.batches = [b for b, w in zip(mine, weights, strict=True) if w > 0]
    data = [
        {
            k: v.to(device)
            for k, v in collate(
                np.asarray(b, dtype=np.int64), lengths, s.vocab, s.seed + 7919 * j + rank
            ).items()
        }
        for j, b in enumerate(mine)
    ]
    torch.manual_seed(s.seed)  # the same initial weights on every rank, in every run
    model = build_model(s).to(device)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=s.lr)
    warm = min(s.warmup, max(0, len(data) - 1))
    out.warmup = warm
    sync()
    dist.barrier()
    rss_before = proc_kib("VmRSS")
    hwm_ok = not cuda and reset_hwm()
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    t_start, c_start = time.perf_counter(), time.process_time()
    for j, (batch, w) in enumerate(zip(data, weights, strict=True)):
        if j == warm:
            sync()
            dist.barrier()
            t_start, c_start = time.perf_counter(), time.process_time()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            logits = model(batch)
        real = batch["target_mask"][:, 1:]
        loss = F.cross_entropy(logits[real].float(), batch["target"][:, 1:][real], reduction="sum")
        (loss * w).backward()
        ntok = int(real.sum()) if w > 0 else 0
        grads = [
            (p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params
        ]
        flat = torch.cat([*grads, torch.tensor([float(ntok)], device=device)]).cpu()
        t1 = time.perf_counter()
        dist.all_reduce(flat)
        t2 = time.perf_counter()
        total = max(1.0, float(flat[-1]))
        offset = 0
        for p in params:
            n = p.numel()
            p.grad = (flat[offset : offset + n] / total).view_as(p).to(device)
            offset += n
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        t3 = time.perf_counter()
        if j >= warm:
            out.compute_s.append(t1 - t0)
            out.allreduce_s.append(t2 - t1)
            out.step_s.append(t3 - t0)
            out.tokens.append(ntok)
    out.wall_s = time.perf_counter() - t_start
    out.cpu_s = time.process_time() - c_start
    if cuda:
        out.peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    elif hwm_ok and rss_before is not None:
        hwm = proc_kib("VmHWM")
        out.peak_mb = None if hwm is None else (hwm - rss_before) / 1024
    dist.barrier()
    return out


def run_rank(
    specs: list[RunSpec], rank: int, world: int, port: int, s: TranslationSettings
) -> list[RankRun]:
    """This rank's part of every run in ``specs``, in order, in one process group."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(s.threads)
    if s.device.startswith("cuda"):
        torch.cuda.set_device(torch.device(s.device).index or 0)  # both ranks share the one GPU
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    try:
        return [train_run(spec, rank, world, s) for spec in specs]
    finally:
        dist.destroy_process_group()


def as_dict(run: RankRun) -> dict[str, Any]:
    """A :class:`RankRun` as JSON-ready data."""
    from dataclasses import asdict

    return asdict(run)
