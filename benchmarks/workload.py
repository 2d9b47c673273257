"""The training-throughput workload and one measured run of it (a child process's work).

:class:`TranslationSettings` is everything a run depends on (:data:`DEFAULTS`: the CPU sizes);
:func:`run_config` trains one configuration
(``"a"`` token budget, ``"b"`` random fixed-size, ``"c"`` sorted fixed-size batches; see
:mod:`benchmarks.training.throughput`) for one epoch and measures it.
:mod:`benchmarks.training.straggler` and :mod:`benchmarks.gpu.throughput` use the same model
and data.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.harness import TrainingSettings, proc_kib, reset_hwm

CONFIGS = ("a", "m", "b", "c")
NAMES = {
    "a": "(a) ours: token budget",
    "m": "(a') ours, pair_order=max",
    "b": "(b) random, fixed B",
    "c": "(c) sorted, fixed B",
}
TARGET_SPEEDUP = 2.5
PAD_ID, BOS_ID, FIRST_WORD = 0, 1, 3


# -- the workload --------------------------------------------------------------------------------


@dataclass(kw_only=True)
class TranslationSettings(TrainingSettings):
    """Everything a run depends on; the parent passes it to each child as JSON."""

    target_tokens: int = 40_000
    """Real target tokens of the workload (its examples are the first that reach them)."""
    length_scale: float = 0.5
    """Factor on the WMT-like lengths."""
    dropout: float = 0.1


DEFAULTS = TranslationSettings(
    max_tokens=1024, vocab=8000, d_model=128, nhead=4, layers=2, ffn=512, lr=1e-4
)
"""The CPU workload of :mod:`benchmarks.training.throughput` and ``.straggler``."""


def workload_lengths(s: TranslationSettings) -> np.ndarray:
    """(n, 2) int64 (source, target) lengths: WMT-like, scaled, enough real target tokens."""
    from lightning_varbatch.planner import wmt_like_lengths

    n = max(16, int(2 * s.target_tokens / max(1.0, 26.0 * s.length_scale)))
    while True:
        raw = wmt_like_lengths(n, seed=s.seed).astype(np.float64)
        lengths = np.maximum(1, np.rint(raw * s.length_scale)).astype(np.int64)
        total = np.cumsum(lengths[:, 1])
        if total[-1] >= s.target_tokens:
            m = int(np.searchsorted(total, s.target_tokens)) + 1
            return lengths[:m]
        n *= 2


def plan_lengths(lengths: np.ndarray) -> np.ndarray:
    """Tensor lengths (source, [BOS] + target) that the planner and the padding see."""
    out = lengths.copy()
    out[:, 1] += 1
    return out


def make_batches(
    kind: str, lengths: np.ndarray, s: TranslationSettings
) -> tuple[list[np.ndarray], int]:
    """(batches of example ids, fixed batch size B derived from (a)) for configuration ``kind``."""
    from lightning_varbatch import TokenBudgetBatchSampler

    tensor_lengths = plan_lengths(lengths)
    ours = {
        order: [
            np.asarray(b, dtype=np.int64)
            for b in TokenBudgetBatchSampler(
                tensor_lengths, s.max_tokens, rank=0, world_size=1, seed=s.seed, pair_order=order
            )
        ]
        for order in ("two_sided", "max")
    }
    n = lengths.shape[0]
    fixed = max(1, round(n / len(ours["two_sided"])))
    if kind in ("a", "m"):  # the same cut: as many micro-batches in either order
        return ours["two_sided" if kind == "a" else "max"], fixed
    rng = np.random.default_rng([s.seed, 7])
    if kind == "b":
        order = rng.permutation(n)
        return [order[i : i + fixed] for i in range(0, n, fixed)], fixed
    if kind == "c":
        key = tensor_lengths.max(axis=1)
        order = np.argsort(key, kind="stable")
        batches = [order[i : i + fixed] for i in range(0, n, fixed)]
        return [batches[i] for i in rng.permutation(len(batches))], fixed
    raise ValueError(f"unknown configuration {kind!r}; expected one of {CONFIGS}")


def collate(ids: np.ndarray, lengths: np.ndarray, vocab: int, seed: int) -> dict[str, Any]:
    """Padded random-token batch in the layout ``TranslationModel`` reads."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    src = torch.from_numpy(lengths[ids, 0])
    tgt = torch.from_numpy(lengths[ids, 1] + 1)  # [BOS] + target
    batch: dict[str, Any] = {}
    for name, lens in (("source", src), ("target", tgt)):
        width = int(lens.max())
        mask = torch.arange(width)[None, :] < lens[:, None]
        tokens = torch.randint(FIRST_WORD, vocab, (len(ids), width), generator=g)
        tokens = tokens.masked_fill(~mask, PAD_ID)
        batch[name] = tokens
        batch[f"{name}_mask"] = mask
    batch["target"][:, 0] = BOS_ID
    return batch


def slots_and_real(batches: Sequence[np.ndarray], lengths: np.ndarray) -> tuple[int, int]:
    """(allocated source + target slots, real source + target tokens) over the batches."""
    tl = plan_lengths(lengths)
    slots = real = 0
    for ids in batches:
        sub = tl[ids]
        slots += len(ids) * int(sub[:, 0].max() + sub[:, 1].max())
        real += int(sub.sum())
    return slots, real


# -- one run (child process) ---------------------------------------------------------------------


@dataclass
class RunResult:
    kind: str
    steps: int
    fixed_batch: int
    timed_steps: int
    timed_s: float
    timed_real_tgt: int
    total_s: float
    real_tgt: int
    slots: int
    real: int
    mean_examples: float
    max_examples: int
    max_slots: int
    peak_mb: float | None
    rss_before_mb: float | None
    step_s: list[float] = field(default_factory=list)


def build_model(s: TranslationSettings) -> Any:
    from examples.translation.model import TranslationModel

    return TranslationModel(
        vocab_size=s.vocab,
        d_model=s.d_model,
        nhead=s.nhead,
        num_encoder_layers=s.layers,
        num_decoder_layers=s.layers,
        dim_feedforward=s.ffn,
        dropout=s.dropout,
        max_positions=512,
        decode_batches=0,
    )


def run_config(kind: str, s: TranslationSettings) -> RunResult:
    """Train one configuration for one epoch of the workload; measure it."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    lengths = workload_lengths(s)
    batches, fixed = make_batches(kind, lengths, s)
    if s.max_steps is not None:
        batches = batches[: s.max_steps]
    data = [collate(ids, lengths, s.vocab, s.seed + i) for i, ids in enumerate(batches)]
    slots, real = slots_and_real(batches, lengths)
    model = build_model(s).to(device)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(batch: dict[str, Any]) -> int:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            logits = model(batch)
        labels = batch["target"][:, 1:]
        real_mask = batch["target_mask"][:, 1:]
        ntok = int(real_mask.sum())
        loss = F.cross_entropy(logits[real_mask].float(), labels[real_mask], reduction="sum")
        (loss / ntok).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ntok

    moved = [{k: v.to(device, non_blocking=True) for k, v in b.items()} for b in data]
    del data
    sync()
    rss_before = proc_kib("VmRSS")
    hwm_ok = device.type == "cpu" and reset_hwm()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times: list[float] = []
    toks: list[int] = []
    t_start = time.perf_counter()
    for batch in moved:
        sync()
        t0 = time.perf_counter()
        ntok = step(batch)
        sync()
        times.append(time.perf_counter() - t0)
        toks.append(ntok)
    total = time.perf_counter() - t_start
    peak_mb: float | None = None
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    elif hwm_ok and rss_before is not None:
        hwm = proc_kib("VmHWM")
        peak_mb = None if hwm is None else (hwm - rss_before) / 1024
    w = min(s.warmup, max(0, len(times) - 1))
    sizes = [len(b) for b in batches]
    tl = plan_lengths(lengths)
    return RunResult(
        kind=kind,
        steps=len(times),
        fixed_batch=fixed,
        timed_steps=len(times) - w,
        timed_s=sum(times[w:]),
        timed_real_tgt=sum(toks[w:]),
        total_s=total,
        real_tgt=sum(toks),
        slots=slots,
        real=real,
        mean_examples=float(np.mean(sizes)),
        max_examples=max(sizes),
        max_slots=max(len(b) * int(tl[b, 0].max() + tl[b, 1].max()) for b in batches),
        peak_mb=peak_mb,
        rss_before_mb=None if rss_before is None else rss_before / 1024,
        step_s=times,
    )
