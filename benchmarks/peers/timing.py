"""Measured training throughput of ours and every peer: paired, interleaved, bootstrapped.

**Steps.** A configuration's epoch is a list of steps; a step is every rank's micro-batch
(a rank with fewer micro-batches re-runs its first one with the loss x 0, fairseq's own
workaround). Its time is measured in this process, one thread: each rank's forward + loss +
backward of the padded batch (:meth:`benchmarks.peers.model.Bench.fwd_bwd`), then the optimizer's
part (flatten and divide the gradients, Adam, ``zero_grad``); the step takes the slowest rank's
pass plus that part, in wall time (``perf_counter``) and in this process's CPU time
(``process_time``). The gradient all-reduce is not in it (one per step, the same size for
every configuration).

**Paired and interleaved.** Per seed and budget, ``K`` blocks: block ``k`` draws one position
``u`` in the ``k``-th ``1/K`` of the epoch and times step ``floor(u x steps)`` of every
configuration, in an order shuffled per block; load that hits one block hits every
configuration in it alike. A configuration's epoch time on a seed is its step count x the mean
of its ``K`` measured steps; its tokens/s = the real target tokens it trains in the epoch
(counted, weight-0 repeats excluded) / that time.

**Intervals.** :func:`paired_ratio`: the ratio of ours' tokens/s to the peer's over all seeds
(total tokens / total time on each side), and its bootstrap 90 % interval: each resample draws
the seeds with replacement and, within each seed, the blocks with replacement (the same blocks
for both sides: pairs stay pairs). :func:`verdict` claims a lead only where the interval
excludes 1 and gives none from one seed.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np


@dataclass
class Sample:
    """One configuration on one seed at one budget: its epoch and its measured steps."""

    steps: int
    tokens: int
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def rate(self, kind: str) -> float:
        return self.tokens / (self.steps * float(np.mean(getattr(self, kind))))


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def step_time(bench: Any, batches: list[dict[str, Any]]) -> tuple[float, float]:
    """(wall, CPU) seconds of one step: the slowest rank's pass + the optimizer's part."""
    import torch

    walls, cpus = [], []
    for batch in batches:
        w0, c0 = time.perf_counter(), time.process_time()
        bench.fwd_bwd(batch)
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    w0, c0 = time.perf_counter(), time.process_time()
    grads = [p.grad.reshape(-1) for p in bench.params if p.grad is not None]
    flat = torch.cat([*grads, torch.ones(1)])
    sizes = [p.numel() for p in bench.params if p.grad is not None]
    for p, g in zip([p for p in bench.params if p.grad is not None], flat[:-1].split(sizes),
                    strict=True):  # fmt: skip
        p.grad = (g / float(len(batches))).view_as(p)
    bench.opt.step()
    bench.opt.zero_grad(set_to_none=True)
    return max(walls) + time.perf_counter() - w0, max(cpus) + time.process_time() - c0


def measure(
    bench: Any,
    raw: np.ndarray,
    epochs: dict[str, tuple[list[list[list[int]]], int]],
    blocks: int,
    rng: np.random.Generator,
) -> dict[str, Sample]:
    """Time ``blocks`` paired steps of every configuration (``{key: (steps, tokens)}``; a step:
    every rank's micro-batch ids). Returns every configuration's :class:`Sample`."""
    keys = sorted(epochs)
    out = {k: Sample(len(epochs[k][0]), epochs[k][1]) for k in keys}
    warm = epochs[keys[0]][0][0]
    step_time(bench, [bench.batch(raw[np.asarray(ids)]) for ids in warm])  # warm-up, discarded
    for k in range(blocks):
        u = (k + rng.random()) / blocks
        for key in [keys[i] for i in rng.permutation(len(keys))]:
            steps = epochs[key][0]
            j = min(len(steps) - 1, int(u * len(steps)))
            batches = [bench.batch(raw[np.asarray(ids)]) for ids in steps[j]]
            wall, cpu = step_time(bench, batches)
            out[key].wall.append(wall)
            out[key].cpu.append(cpu)
            out[key].positions.append(j)
    return out


def paired_ratio(
    ours: list[Sample], peer: list[Sample], kind: str, n_boot: int = 2000, seed: int = 0
) -> dict[str, float]:
    """Ours' tokens/s / the peer's over the seeds (lists aligned by seed; blocks aligned by
    index), with the bootstrap 90 % interval over seeds and blocks."""
    rng = np.random.default_rng(seed)
    s = len(ours)
    n_o, n_p = (np.array([x.steps for x in side], float) for side in (ours, peer))
    tok_o, tok_p = (np.array([x.tokens for x in side], float) for side in (ours, peer))
    t_o = [np.asarray(getattr(x, kind), float) for x in ours]
    t_p = [np.asarray(getattr(x, kind), float) for x in peer]

    def ratio(m_o: np.ndarray, m_p: np.ndarray, pick: np.ndarray) -> np.ndarray:
        rate_o = tok_o[pick].sum(-1) / (n_o[pick] * m_o).sum(-1)
        rate_p = tok_p[pick].sum(-1) / (n_p[pick] * m_p).sum(-1)
        return np.asarray(rate_o / rate_p)

    point = ratio(np.array([x.mean() for x in t_o]), np.array([x.mean() for x in t_p]),
                  np.arange(s))  # fmt: skip
    m_o, m_p = np.empty((n_boot, s)), np.empty((n_boot, s))
    for i in range(s):
        idx = rng.integers(len(t_o[i]), size=(n_boot, len(t_o[i])))
        m_o[:, i], m_p[:, i] = t_o[i][idx].mean(1), t_p[i][idx].mean(1)
    pick = rng.integers(s, size=(n_boot, s))
    rows = np.arange(n_boot)[:, None]
    boot = ratio(m_o[rows, pick], m_p[rows, pick], pick)
    lo, hi = np.percentile(boot, [5, 95])
    return {"ratio": float(point), "lo": float(lo), "hi": float(hi), "seeds": s,
            "steps": int(sum(len(x) for x in t_o))}  # fmt: skip


def verdict(r: dict[str, float]) -> str:
    """``ours leads`` / ``peer leads`` where the 90 % interval excludes 1, else ``tie``; no
    verdict from one seed."""
    if r["seeds"] < 2:
        return "no verdict (1 seed)"
    return "ours leads" if r["lo"] > 1 else "peer leads" if r["hi"] < 1 else "tie"


def cell(r: dict[str, float]) -> str:
    return f"{r['ratio']:.3f} [{r['lo']:.3f}-{r['hi']:.3f}]"
