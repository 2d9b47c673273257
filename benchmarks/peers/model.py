"""The fitted cost model of :mod:`benchmarks.peers.seeds` (an explanation) and its extra rows.

**Time model.** The forward + loss + backward of :mod:`benchmarks.peers.rank`'s step
(``TranslationModel`` of :mod:`benchmarks.workload`, 1 thread, train mode) is timed
(process CPU time, the least of 3 interleaved passes) on a grid of shapes and on real
micro-batches of the first seed. A micro-batch of ``n`` pairs, longest source ``S``, longest
``[BOS] + target`` ``T``, ``R`` real target tokens:

    t = c0 + c1 n + c2 nS + c3 nT + c4 nS^2 + c5 nT^2 + c6 nST + c7 R + c8 (nS)^1.5 + c9 (nT)^1.5

(launch cost, per-row work, linear layers and the vocabulary projection per padded slot,
self-attention on each side, cross-attention, the loss on real tokens; the last two: the
slowdown once activations outgrow the caches, ~1.5x per token at 2,000 tokens a side against
500), fitted by least squares on the relative error (non-negative) on the grid (each shape
full and ragged, to tell ``R`` from ``nT``) and every other real micro-batch; the rest are
held out. The **per-step cost** (flatten and divide the gradients, Adam, ``zero_grad``) is
timed too; the all-reduce is left out. The model ranks configurations and explains the
measurement of :mod:`benchmarks.peers.timing`; it measures nothing itself. **Unpadded**, a
micro-batch costs the same sum with every feature per pair (``sum s_i``, ``sum s_i^2``, ...,
``(sum s_i)^1.5``).

**Memory model.** The peak of torch's CPU allocations during the same forward + backward
(weights, Adam's state and inputs already held): ``torch.profiler(profile_memory=True)``
records every allocation and free of torch's CPU allocator; the peak of their running sum.
Unlike the resident set (what ``lightning_varbatch.peak_memory`` reads on a CPU) it is
deterministic and blind to what ``malloc`` keeps. The same features, fitted the same way,
rank micro-batches; the peaks that set a limit are measured.

**Extra rows.** ``ours_max``: our sampler with ``pair_order="max"``. ``fairseq_pkg``: fairseq's
own ``batch_by_size`` (the ``ve-fairseq`` 0.12.3 wheel for CPython 3.11), dealt by fairseq's
own ``EpochBatchIterator``. The bare ``deepspeed`` row (DeepSpeed's own ``batch_by_seqlens``,
~n^3) is not run above :data:`DEEPSPEED_MAX_N` pairs; its configurations of
:mod:`benchmarks.peers.sweep` are (an equal result in O(n log n)).
"""

from __future__ import annotations

import importlib.metadata
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.peers.batches import BY_NAME, deal, unavailable, versions

NAMES = ("1", "n", "nS", "nT", "nS^2", "nT^2", "nST", "R", "(nS)^1.5", "(nT)^1.5")
MODULE = "benchmarks.peers.seeds"
EXTRA = {"ours_max": "ours (max order)", "fairseq_pkg": "fairseq pkg batch_by_size"}
DEEPSPEED_MAX_N = 1000
"""batch_by_seqlens grows ~n^3: 0.4 / 3.0 / 30.8 s at 1k / 2k / 4k pairs (M=512, here)."""
FAIRSEQ_NOTE = "fairseq's own: ShardedIterator(fill_value=[]) + trainer dummy batch"


# -- the extra rows -------------------------------------------------------------------------------


def label(row: str) -> str:
    """A row's or configuration's label (``lhotse DynamicBucketing [buckets=30]``)."""
    from benchmarks.peers.sweep import knob_text, split

    base = split(row)[0]
    text = EXTRA.get(base) or BY_NAME[base].label
    return f"{text} [{knob_text(row)}]" if ":" in row else text


def by_batch_size(row: str) -> bool:
    base = row.partition(":")[0]
    return base in BY_NAME and BY_NAME[base].setting == "batch_size"


def row_status(row: str, n: int) -> str | None:
    """``None`` if the row (or configuration) runs here, else why not."""
    knobs, row = ":" in row, row.partition(":")[0]
    if row == "deepspeed" and n > DEEPSPEED_MAX_N and not knobs:
        return f"not run above {DEEPSPEED_MAX_N:,} pairs (batch_by_seqlens ~n^3)"
    if row == "fairseq_pkg":
        try:
            from fairseq.data.iterators import EpochBatchIterator  # noqa: F401
        except Exception as e:  # not installed, or failing to import on this Python
            return f"not importable: {type(e).__name__}: {e}"[:100]
    return None if row in EXTRA else unavailable(BY_NAME[row])


def row_versions(row: str) -> dict[str, str]:
    row = row.partition(":")[0]
    if row == "fairseq_pkg":
        return {"ve-fairseq": importlib.metadata.version("ve-fairseq")}
    return versions(BY_NAME["ours" if row == "ours_max" else row])


def workload(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(raw (source, target) lengths, (source, [BOS] + target) pairs) of one seed."""
    from lightning_varbatch.planner import wmt_like_lengths

    raw = wmt_like_lengths(n, seed=seed).astype(np.int64)
    return raw, raw + np.array([0, 1])


def _fairseq_pkg(tl: np.ndarray, m: int, rank: int, world: int, seed: int) -> list[list[int]]:
    """Rank ``rank``'s batches of epoch 1 as fairseq's translation task makes them.

    ``LanguagePairDataset.ordered_indices`` under ``numpy_seed(seed)`` (a permutation, then
    stable sorts by target then source size), ``batch_by_size(num_tokens_vec = max(src, tgt),
    max_tokens=m)``, then ``EpochBatchIterator``: batches shuffled with ``seed + epoch``,
    ``ShardedIterator(fill_value=[])``. The fill (an empty batch, trained by fairseq as a dummy
    batch) is left out here: the caller sees the unequal counts and applies the workaround.
    """
    from benchmarks.planning.baselines_libs import fairseq_batches, fairseq_shard

    batches = fairseq_batches(tl, m, seed)
    return [list(map(int, b)) for b in fairseq_shard(batches, len(tl), world, rank, seed, 0)]


def deal_row(name: str, tl: np.ndarray, setting: int, rank: int, world: int, seed: int) -> Any:
    """One rank's batches of row ``name``: a peer of ``peer_batches``, an extra row, or a
    configuration with knobs (:func:`benchmarks.peers.sweep.deal_config`)."""
    if ":" in name:
        from benchmarks.peers.sweep import deal_config

        return deal_config(name, tl, setting, rank, world, seed)
    if name == "fairseq_pkg":
        return _fairseq_pkg(tl, setting, rank, world, seed)
    if name == "ours_max":
        from lightning_varbatch import TokenBudgetBatchSampler

        s = TokenBudgetBatchSampler(
            tl, setting, rank=rank, world_size=world, seed=seed, pair_order="max"
        )
        return [list(map(int, b)) for b in s]
    return deal(name, tl, setting, rank, world, seed)


def largest(fits: Callable[[int], bool], guess: int, lo: int, hi: int, res: int) -> int:
    """The largest setting found to fit: gallop from ``guess``, then bisect to ``res``."""
    a, b, c, d = None, None, min(hi, max(lo, guess)), res  # a fits, b does not
    while a is None or b is None:
        if fits(c):
            a = c
        elif c == lo:
            raise RuntimeError(f"even the smallest setting {lo} does not fit")
        else:
            b = c
        if b is None and a == hi:
            return a
        c, d = (min(hi, a + d) if b is None else max(lo, b - d)), 2 * d  # type: ignore[operator]
    while b - a > res:
        a, b = ((a + b) // 2, b) if fits((a + b) // 2) else (a, (a + b) // 2)
    return a


# -- features and fits ----------------------------------------------------------------------------


def padded_features(n: Any, s: Any, t: Any, r: Any) -> np.ndarray:
    """(k, 10) features of :data:`NAMES` for micro-batches of n pairs padded to (s, t)."""
    n, s, t, r = (np.asarray(x, dtype=np.float64) for x in (n, s, t, r))
    cols = [n * s, n * t, n * s * s, n * t * t, n * s * t, r, (n * s) ** 1.5, (n * t) ** 1.5]
    return np.stack([np.ones_like(n), n, *cols], 1)


def per_batch(batches: list[list[int]], tl: np.ndarray) -> dict[str, np.ndarray]:
    """Per micro-batch: n, S, T, R and the per-pair sums the unpadded cost needs."""
    sizes = np.array([len(b) for b in batches], dtype=np.int64)
    if not sizes.size:
        return {k: np.zeros(0) for k in ("n", "S", "T", "R", "unpadded")}
    at = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    s, t = (tl[np.concatenate(batches), i].astype(np.float64) for i in (0, 1))
    sums = [np.add.reduceat(x, at) for x in (s, t, s * s, t * t, s * t)]
    n = sizes.astype(np.float64)
    out = {"n": n, "S": np.maximum.reduceat(s, at), "T": np.maximum.reduceat(t, at)}
    out["R"] = sums[1] - n
    cache = [sums[0] ** 1.5, sums[1] ** 1.5]
    out["unpadded"] = np.stack([np.ones_like(n), n, *sums, out["R"], *cache], 1)
    return out


def fit(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Least squares of the relative error, non-negative: a column whose coefficient comes out
    negative is dropped (the most negative first) and the rest refitted. (coef, rel. errors)."""
    scale = np.abs(x).max(axis=0)
    scale[scale == 0] = 1.0
    a, keep, coef = (x / scale) / y[:, None], np.ones(x.shape[1], dtype=bool), np.zeros(0)
    while coef.size == 0 or coef.min() < 0:
        if coef.size:
            keep[np.flatnonzero(keep)[np.argmin(coef)]] = False
        coef = np.linalg.lstsq(a[:, keep], np.ones_like(y), rcond=None)[0]
    out = np.zeros(x.shape[1])
    out[keep] = coef / scale[keep]
    return out, x @ out / y - 1


# -- measuring ------------------------------------------------------------------------------------


class Bench:
    """The benchmark model and its optimizer, to time and probe micro-batches (1 thread)."""

    def __init__(self, s: Any) -> None:
        import torch

        from benchmarks.workload import build_model

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.s = s
        self.model = build_model(s)
        self.model.train()
        self.params = [p for p in self.model.parameters() if p.requires_grad]
        self.opt = torch.optim.Adam(self.params, lr=s.lr)

    def batch(self, raw: np.ndarray) -> dict[str, Any]:
        """The padded batch of pairs with (source, target) lengths ``raw`` (target w/o BOS)."""
        from benchmarks.workload import collate

        return collate(np.arange(len(raw)), raw.astype(np.int64), self.s.vocab, 0)

    def fwd_bwd(self, batch: dict[str, Any]) -> None:
        import torch.nn.functional as F

        logits = self.model(batch)
        real = batch["target_mask"][:, 1:]
        loss = F.cross_entropy(logits[real], batch["target"][:, 1:][real], reduction="sum")
        loss.backward()

    def seconds(self, batch: dict[str, Any], repeats: int) -> float:
        """The fastest of ``repeats`` forward + backward passes."""
        best = float("inf")
        for _ in range(repeats):
            t0 = time.process_time()
            self.fwd_bwd(batch)
            best = min(best, time.process_time() - t0)
            self.opt.zero_grad(set_to_none=True)
        return best

    def step_seconds(self, batch: dict[str, Any], repeats: int) -> float:
        """The fastest per-step cost around the pass: flatten, divide, Adam, ``zero_grad``."""
        import torch

        best = float("inf")
        for _ in range(repeats):
            self.fwd_bwd(batch)
            t0 = time.process_time()
            flat = torch.cat([*(p.grad.reshape(-1) for p in self.params), torch.ones(1)])
            for p, g in zip(
                self.params, flat[:-1].split([p.numel() for p in self.params]), strict=True
            ):
                p.grad = (g / 2.0).view_as(p)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            best = min(best, time.process_time() - t0)
        return best

    def peak_bytes(self, batch: dict[str, Any]) -> int:
        """Peak of torch's live CPU allocations over one forward + backward (profiler)."""
        import torch
        from torch.profiler import ProfilerActivity, profile

        saved, null = os.dup(2), os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, 2)  # kineto prints two lines to stderr per profile
        try:
            with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
                self.fwd_bwd(batch)
        finally:
            os.dup2(saved, 2)
            os.close(saved), os.close(null)
        self.opt.zero_grad(set_to_none=True)
        events = prof.profiler.kineto_results.events()  # type: ignore[union-attr]
        cpu = torch.autograd.DeviceType.CPU
        mine = [e for e in events if e.name() == "[memory]" and e.device_type() == cpu]
        steps = [b for _, b in sorted((e.start_ns(), e.nbytes()) for e in mine)]
        return int(np.cumsum([0, *steps]).max())


def grid(longest: int, quick: bool) -> list[tuple[int, int, int]]:
    """(n, S, T) shapes to calibrate: padded slots per side up to 8k (2k quick)."""
    lengths = [8, 24, 64, 160, longest] if not quick else [8, 40, longest]
    sides = [256, 1024, 2048] if not quick else [128, 512]
    pairs = {(s, min(t, longest)) for s in lengths for t in (s, s * 3 // 2)}
    out = {(max(1, p // max(s, t)), s, t) for p in sides for s, t in pairs}
    out |= {(max(1, 8192 // s), s, s) for s in (64, longest)} if not quick else set()
    return sorted(out)


def shape_raw(n: int, s: int, t: int, ragged: bool, rng: np.random.Generator) -> np.ndarray:
    """(n, 2) raw (source, target) lengths with longest ``s`` and ``[BOS]+target`` ``t``."""
    raw = np.tile(np.array([[s, t - 1]], dtype=np.int64), (n, 1))
    if ragged and n > 1:
        raw[1:, 0] = rng.integers(max(1, s // 3), s + 1, n - 1)
        raw[1:, 1] = rng.integers(max(1, (t - 1) // 3), t, n - 1)
    return np.maximum(raw, 1)


def stats_of(raw: np.ndarray) -> tuple[int, int, int, int]:
    """(n, S, T, R) of a micro-batch with raw lengths ``raw``."""
    return len(raw), int(raw[:, 0].max()), int(raw[:, 1].max()) + 1, int(raw[:, 1].sum())


def calibrate(
    bench: Bench, grid_shapes: list[tuple[int, int, int]], real: list[np.ndarray], log: Any
) -> dict[str, Any]:
    """Time and probe the grid's shapes and the real micro-batches ``real`` (raw lengths) in
    3 interleaved passes; fit both models on the grid and every other real micro-batch, hold
    the rest out. The numbers, JSON-ready."""
    rng = np.random.default_rng(12345)
    bench.seconds(bench.batch(shape_raw(8, 64, 64, False, rng)), 2)  # warm-up
    raws = [shape_raw(n, s, t, r, rng) for n, s, t in grid_shapes for r in (0, 1)] + real
    batches = [bench.batch(raw) for raw in raws]
    t0, secs = time.perf_counter(), np.full(len(raws), np.inf)
    for _ in range(3):  # interleaved passes: a burst of load spoils one pass, not all
        for i, batch in enumerate(batches):
            secs[i] = min(secs[i], bench.seconds(batch, 1))
    peaks = np.array([bench.peak_bytes(batch) for batch in batches], dtype=np.float64)
    step_s = bench.step_seconds(bench.batch(shape_raw(8, 64, 64, False, rng)), 3)
    rows = np.array([stats_of(raw) for raw in raws])
    x, held = padded_features(*rows.T), np.arange(len(raws)) >= len(raws) - len(real)
    held[len(raws) - len(real) :: 2] = False
    out: dict[str, Any] = {"features": list(NAMES), "step_s": step_s, "held_out": held.tolist()}
    for name, y in (("time", secs), ("mem", peaks)):
        coef, _ = fit(x[~held], y[~held])
        err = x @ coef / y - 1
        out.update({f"{name}_coef": coef.tolist(), f"{name}_rel_err": err.tolist()})
        fitted, other = np.abs(err[~held]), np.abs(err[held]) if held.any() else np.zeros(1)
        log(
            f"{name} model: |relative error| on the {(~held).sum()} fitted micro-batches median "
            f"{np.median(fitted):.3f}, max {fitted.max():.3f}; on {held.sum()} held-out real "
            f"ones median {np.median(other):.3f}, max {other.max():.3f}"
        )
    log(f"calibrated in {time.perf_counter() - t0:.0f} s; per-step cost {1000 * step_s:.1f} ms")
    return out | {"shapes": rows.tolist(), "seconds": secs.tolist(), "peak_bytes": peaks.tolist()}
