"""Padding-free packing (issue 16): FLOP balance across ranks, and training tokens/s on CPU.

Run from the repository root (venv active)::

    python -m benchmarks.training.packing            # 4-5 min on 2 shared CPU cores (load 5-6)
    python -m benchmarks.training.packing --quick    # smoke test, about 25 s

**Part 1: per-step FLOP imbalance across ranks** (pure planning, no model runs). Documents
with a long-tailed, SFT-like length distribution: lognormal, median 384, sigma 1.0 (so p99 is
about 10x the median), rounded and clipped to ``[8, 8192]`` (``--docs`` of them, default
200,000; the statistics are printed). 8 ranks, accumulation 1 and 4, a budget of 16,384 tokens
per micro-batch. The compute of a micro-batch is that of
:func:`lightning_varbatch.planner.flops.transformer_flops`: ``Σ L + flop_attention · Σ L²``
(attention kept inside each document), with ``flop_attention`` of ``d_model = 1024`` and, to
show the sensitivity, of ``d_model = 256`` (attention weighs 4x more). Schedules compared:

* **ours, packed**: ``PlanConfig(max_tokens=16384, layout="packed", flop_attention=...)``
  (the flop_attention of the model evaluated), ``EpochPlanner.plan(0, 8, acc)``.
* **ours, packed, token-balanced**: the same with ``flop_attention=0`` (ranks balanced by
  tokens only), evaluated with the true FLOP model: what the FLOP-aware dealing buys.
* **naive packing**: what a ``DataCollatorWithFlattening`` pipeline does. The documents are
  shuffled, then packs are filled greedily in that order (next-fit: a document that does not
  fit the current pack's budget closes it and opens the next); packs are dealt round-robin
  to the ranks in order (pack ``i`` to rank ``i mod 8``, micro-batch by micro-batch); the
  last, partial optimizer step is dropped.
* **ours, padded**: ``PlanConfig(max_tokens=16384)`` (``layout="padded"``, padded cost
  ``n · Lmax``), with the FLOPs of the padded batches: ``n · Lmax`` tokens and
  ``n · Lmax²`` (query, key) pairs.

Columns: optimizer steps per epoch; slot efficiency (real tokens / token slots computed:
``n · Lmax`` for a padded batch, the row's tokens for a packed one); budget fill (mean real
tokens per micro-batch / budget); the per-step FLOP imbalance (busiest rank's FLOPs / mean
rank FLOPs, per optimizer step; mean, p95 and max over the epoch's steps); **epoch (busiest)**:
the busiest rank's FLOPs summed over the epoch's steps (the wall-clock proxy: every step lasts
as long as its busiest rank), relative to ours; **useful**: the documents' own FLOPs
(unpadded) / (8 x that sum), the fraction of the ranks' time spent on real work.
Targets (issue 16): ours mean imbalance <= 1.02 and p95 <= 1.05 (every setting).

**Part 2: training tokens/s on CPU.** ``examples.lm.model.CausalLM`` (pre-norm causal
Transformer LM, RoPE, tied embeddings; ``d_model=64``, 4 heads, 2 layers, FFN 256,
vocabulary 512; AdamW lr 1e-3, no dropout), ``torch.set_num_threads(1)``, fp32, trained once
over the same documents (random token ids) in every configuration. The lengths are the
Part 1 distribution divided by 8 (``--length-div``; median 48, longest 1024) with a budget
of 2,048 tokens (a CPU-sized model of the same shape); the documents are the first ones
whose lengths sum to ``--target-tokens`` (default 100,000).

* **(i) packed**: ``layout="packed"`` plan, ``PackingCollate`` rows,
  :func:`~lightning_varbatch.attention.document_attention` (its ``"sdpa"`` backend on CPU).
* **(ii) padded**: ``layout="padded"`` plan, ``PaddingCollate(loss_offset=1)``, causal SDPA.
* **(iii) random fixed B**: a random permutation cut into batches of ``B = round(budget /
  mean length)`` documents (the mean real tokens per batch match the budget), padded to each
  batch's longest (a plain ``DataLoader`` with ``batch_size=B``).

Each run is a fresh process (``--quick``: in this process), runs interleaved
``i ii iii``, ``iii ii i`` over ``--rounds`` rounds; batches are built before timing; the
step time is forward + loss + backward + optimizer step, the first ``warmup`` steps
untimed. **real tok/s** = real (non-padding) document tokens of the timed steps / their summed
step time (median over rounds); ratios against (iii).

:mod:`benchmarks.gpu.packing` runs Part 2 on one CUDA GPU (bf16, FlashAttention varlen or
FlexAttention).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from benchmarks.harness import (
    TrainingSettings,
    add_child_options,
    command_line,
    emit_result,
    fmt,
    print_table,
    run_training_child,
    torch_machine_line,
    write_json,
)

WORLD = 8
ACCS = (1, 4)
BUDGET = 16384
D_MODELS = (1024, 256)
MEDIAN, SIGMA, SHORTEST, LONGEST = 384, 1.0, 8, 8192
TARGET_MEAN, TARGET_P95 = 1.02, 1.05
TRAIN_CONFIGS = ("packed", "padded", "random")
TRAIN_NAMES = {
    "packed": "(i) ours: packed rows",
    "padded": "(ii) ours: padded layout",
    "random": "(iii) random fixed B",
}
FIRST_TOKEN = 3


# -- the documents -------------------------------------------------------------------------------


def sft_lengths(n: int, seed: int = 0, div: int = 1) -> np.ndarray:
    """``(n,)`` int64 lengths: lognormal (median 384, sigma 1), clipped to [8, 8192], / ``div``."""
    rng = np.random.default_rng([seed, 16])
    raw = np.clip(np.rint(rng.lognormal(np.log(MEDIAN), SIGMA, n)), SHORTEST, LONGEST)
    return np.maximum(2, np.rint(raw / div)).astype(np.int64)


def length_stats(lengths: np.ndarray) -> dict[str, float]:
    """Median, p99, max, mean and p99 / median of ``lengths``."""
    med = float(np.median(lengths))
    p99 = float(np.percentile(lengths, 99))
    return {
        "n": int(lengths.size),
        "median": med,
        "p99": p99,
        "max": int(lengths.max()),
        "mean": float(lengths.mean()),
        "p99_over_median": p99 / med,
        "tokens": int(lengths.sum()),
    }


def describe_lengths(name: str, lengths: np.ndarray) -> dict[str, float]:
    st = length_stats(lengths)
    print(
        f"{name}: {st['n']:,} documents, {st['tokens']:,} tokens; median {st['median']:.0f}, "
        f"mean {st['mean']:.0f}, p99 {st['p99']:.0f} ({st['p99_over_median']:.1f}x the "
        f"median), max {st['max']:,}"
    )
    return st


# -- Part 1: schedules and their FLOPs -----------------------------------------------------------


@dataclass
class Schedule:
    """One epoch's schedule: per micro-batch figures and the ``(steps, ranks, micros)`` deal."""

    name: str
    count: np.ndarray  # documents per micro-batch
    real: np.ndarray  # real tokens per micro-batch
    squares: np.ndarray  # Σ L² per micro-batch (real documents)
    slots: np.ndarray  # token slots computed (n · Lmax padded, the row packed)
    pairs: np.ndarray  # (query, key) pairs computed (n · Lmax² padded, Σ L² packed)
    assign: np.ndarray  # (steps, world, acc) micro-batch ids
    num_docs: int  # distinct documents run

    def flops(self, flop_attention: float) -> np.ndarray:
        """Relative compute of every micro-batch (linear tokens + attention pairs)."""
        return self.slots + flop_attention * self.pairs

    def useful(self, flop_attention: float) -> float:
        """The run documents' own (unpadded) compute."""
        run = self.assign.reshape(-1)
        return float((self.real[run] + flop_attention * self.squares[run]).sum())


def segment_sums(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Sums of ``values[start : start + size]`` for every segment (sizes >= 1)."""
    prefix = np.concatenate(([0.0], np.cumsum(values, dtype=np.float64)))
    return prefix[starts + sizes] - prefix[starts]


def segment_max(values: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Maxima of the segments (sizes >= 1, segments contiguous and covering ``values``)."""
    del sizes
    return np.maximum.reduceat(values, starts)


def plan_schedule(
    name: str, lengths: np.ndarray, layout: str, flop_attention: float, acc: int, seed: int
) -> Schedule:
    """Our planner's schedule for ``layout`` (``"packed"`` or ``"padded"``)."""
    from lightning_varbatch import EpochPlanner, PlanConfig

    if layout == "packed":
        config = PlanConfig(
            max_tokens=BUDGET, layout="packed", flop_attention=flop_attention, seed=seed
        )
    else:
        config = PlanConfig(max_tokens=BUDGET, seed=seed)
    plan = EpochPlanner(lengths, config).plan(0, WORLD, acc)
    # Tiles are contiguous, ascending runs of plan.order that cover it.
    in_order = lengths[plan.order].astype(np.float64)
    starts = np.asarray(plan.micro_batch_start, dtype=np.int64)
    sizes = np.asarray(plan.micro_batch_size, dtype=np.int64)
    if not (np.all(sizes > 0) and starts[0] == 0 and np.all(np.diff(starts) == sizes[:-1])):
        raise RuntimeError("expected contiguous, non-empty tiles covering plan.order")
    real = segment_sums(in_order, starts, sizes)
    squares = segment_sums(in_order * in_order, starts, sizes)
    if layout == "packed":
        slots, pairs = real, squares
    else:
        longest = segment_max(in_order, starts, sizes)
        slots, pairs = sizes * longest, sizes * longest * longest
    run = np.unique(plan.assign.reshape(-1))
    return Schedule(name, sizes, real, squares, slots, pairs, plan.assign, int(sizes[run].sum()))


def naive_packs(lengths: np.ndarray, budget: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Shuffled documents, packs filled greedily in that order: (order, pack sizes)."""
    order = np.random.default_rng([seed, 17]).permutation(lengths.size)
    sizes: list[int] = []
    fill = count = 0
    for length in lengths[order].tolist():
        if count and fill + length > budget:
            sizes.append(count)
            fill = count = 0
        fill += length
        count += 1
    sizes.append(count)
    return order, np.asarray(sizes, dtype=np.int64)


def naive_schedule(lengths: np.ndarray, acc: int, seed: int) -> Schedule:
    """Naive packing: random order, greedy packs, round-robin to ranks, partial step dropped."""
    order, sizes = naive_packs(lengths, BUDGET, seed)
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    in_order = lengths[order].astype(np.float64)
    real = segment_sums(in_order, starts, sizes)
    squares = segment_sums(in_order * in_order, starts, sizes)
    wa = WORLD * acc
    steps = sizes.size // wa
    # Pack i goes to rank i % WORLD; a rank's micro-batches follow in order within a step.
    assign = np.arange(steps * wa).reshape(steps, acc, WORLD).transpose(0, 2, 1)
    num_docs = int(sizes[: steps * wa].sum())
    return Schedule("naive packing", sizes, real, squares, real, squares, assign, num_docs)


@dataclass
class Row:
    name: str
    d_model: int
    acc: int
    steps: int
    slot_eff: float
    fill: float
    imb_mean: float
    imb_p95: float
    imb_max: float
    busiest: float
    busiest_vs_ours: float
    useful: float
    docs: int
    library_mean: float | None = None
    library_max: float | None = None


def evaluate(s: Schedule, flop_attention: float, d_model: int, acc: int) -> Row:
    run = s.assign.reshape(-1)
    loads = s.flops(flop_attention)[s.assign].sum(axis=2)  # (steps, world)
    ratio = loads.max(axis=1) / loads.mean(axis=1)
    busiest = float(loads.max(axis=1).sum())
    return Row(
        name=s.name,
        d_model=d_model,
        acc=acc,
        steps=int(s.assign.shape[0]),
        slot_eff=float(s.real[run].sum() / s.slots[run].sum()),
        fill=float(s.real[run].mean() / BUDGET),
        imb_mean=float(ratio.mean()),
        imb_p95=float(np.percentile(ratio, 95)),
        imb_max=float(ratio.max()),
        busiest=busiest,
        busiest_vs_ours=float("nan"),
        useful=s.useful(flop_attention) / (WORLD * busiest),
        docs=s.num_docs,
    )


def library_check(lengths: np.ndarray, flop_attention: float, acc: int, seed: int) -> Row:
    """``diagnose``'s imbalance_flops of our packed plan (cross-check of Part 1's own figures)."""
    from lightning_varbatch import EpochPlanner, PlanConfig
    from lightning_varbatch.planner import diagnose

    cfg = PlanConfig(max_tokens=BUDGET, layout="packed", flop_attention=flop_attention, seed=seed)
    planner = EpochPlanner(lengths, cfg)
    diag = diagnose(planner, planner.plan(0, WORLD, acc))
    nan = float("nan")
    return Row(
        name="diagnose",
        d_model=0,
        acc=acc,
        steps=diag.num_steps,
        slot_eff=diag.padding_efficiency,
        fill=diag.budget_fill,
        imb_mean=diag.imbalance_flops_mean,
        imb_p95=nan,
        imb_max=diag.imbalance_flops_max,
        busiest=nan,
        busiest_vs_ours=nan,
        useful=nan,
        docs=diag.num_planned,
    )


def run_flops(lengths: np.ndarray, seed: int) -> list[Row]:
    """Part 1: every schedule at every (d_model, accumulation)."""
    from lightning_varbatch import transformer_flops

    rows: list[Row] = []
    for d_model in D_MODELS:
        fa = transformer_flops(d_model).flop_attention
        for acc in ACCS:
            t0 = time.perf_counter()
            ours = evaluate(
                plan_schedule("ours, packed", lengths, "packed", fa, acc, seed), fa, d_model, acc
            )
            tokens = plan_schedule(
                "ours, packed, token-balanced", lengths, "packed", 0.0, acc, seed
            )
            group = [
                ours,
                evaluate(tokens, fa, d_model, acc),
                evaluate(naive_schedule(lengths, acc, seed), fa, d_model, acc),
                evaluate(
                    plan_schedule("ours, padded", lengths, "padded", fa, acc, seed),
                    fa,
                    d_model,
                    acc,
                ),
            ]
            check = library_check(lengths, fa, acc, seed)
            ours.library_mean, ours.library_max = check.imb_mean, check.imb_max
            for r in group:
                r.busiest_vs_ours = r.busiest / ours.busiest
            rows += group
            print(
                f"  d_model={d_model} acc={acc}: planned and evaluated in "
                f"{time.perf_counter() - t0:.1f} s",
                flush=True,
            )
    return rows


def report_flops(rows: Sequence[Row], smoke: bool) -> dict[str, Any]:
    headers = [
        "schedule",
        "d_model",
        "acc",
        "steps",
        "slot eff",
        "fill",
        "imb mean",
        "imb p95",
        "imb max",
        "epoch (busiest)",
        "useful",
    ]
    table = [
        [
            r.name,
            str(r.d_model),
            str(r.acc),
            f"{r.steps:,}",
            f"{r.slot_eff:.4f}",
            f"{r.fill:.3f}",
            f"{r.imb_mean:.4f}",
            f"{r.imb_p95:.4f}",
            f"{r.imb_max:.4f}",
            f"{r.busiest_vs_ours:.3f}x",
            f"{r.useful:.3f}",
        ]
        for r in rows
    ]
    print_table(headers, table)
    verdicts = []
    for r in rows:
        if r.name != "ours, packed":
            continue
        ok = r.imb_mean <= TARGET_MEAN and r.imb_p95 <= TARGET_P95
        agree = (
            r.library_mean is not None
            and abs(r.library_mean - r.imb_mean) < 1e-9
            and r.library_max is not None
            and abs(r.library_max - r.imb_max) < 1e-9
        )
        verdict = "smoke test, not judged" if smoke else ("PASS" if ok else "FAIL")
        verdicts.append(ok)
        print(
            f"  [{verdict}] ours d_model={r.d_model} acc={r.acc}: imbalance mean "
            f"{r.imb_mean:.4f} <= {TARGET_MEAN} and p95 {r.imb_p95:.4f} <= {TARGET_P95}"
            f"; diagnose() {'agrees' if agree else 'DISAGREES'} "
            f"(imbalance_flops_mean {fmt(r.library_mean, '.4f')}, max "
            f"{fmt(r.library_max, '.4f')})"
        )
    return {"rows": [asdict(r) for r in rows], "passed": all(verdicts)}


# -- Part 2: training tokens/s -------------------------------------------------------------------


@dataclass(kw_only=True)
class LMSettings(TrainingSettings):
    """Everything a training run depends on (passed to child processes as JSON)."""

    target_tokens: int = 100_000
    """Real tokens of the documents (the first ones that reach them)."""
    length_div: int = 8
    """Divisor of the Part 1 lengths."""
    backend: str = "auto"
    """``document_attention`` backend of the packed rows."""


DEFAULTS = LMSettings(max_tokens=2048, vocab=512, d_model=64, nhead=4, layers=2, ffn=256, lr=1e-3)
"""The CPU sizes of Part 2 (:mod:`benchmarks.gpu.packing` replaces them)."""


@dataclass
class TrainResult:
    kind: str
    steps: int
    timed_steps: int
    timed_s: float
    timed_real: int
    real: int
    slots: int
    docs_mean: float
    slots_max: int
    fixed_batch: int
    backend: str
    peak_mb: float | None
    step_s: list[float] = field(default_factory=list)


def train_lengths(s: LMSettings) -> np.ndarray:
    """The first documents of the Part 1 distribution (/ ``length_div``) with enough tokens."""
    n = max(16, 2 * s.target_tokens // max(1, MEDIAN // s.length_div))
    while True:
        lengths = sft_lengths(n, s.seed, s.length_div)
        lengths = np.minimum(lengths, s.max_tokens)
        total = np.cumsum(lengths)
        if total[-1] >= s.target_tokens:
            return lengths[: int(np.searchsorted(total, s.target_tokens)) + 1]
        n *= 2


def train_batches(kind: str, lengths: np.ndarray, s: LMSettings) -> tuple[list[np.ndarray], int]:
    """(micro-batches of document ids, the fixed batch size B of (iii)) for ``kind``."""
    from lightning_varbatch import EpochPlanner, PlanConfig, transformer_flops

    fixed = max(1, round(s.max_tokens / float(lengths.mean())))
    if kind == "random":
        order = np.random.default_rng([s.seed, 18]).permutation(lengths.size)
        return [order[i : i + fixed] for i in range(0, lengths.size, fixed)], fixed
    if kind == "packed":
        fa = transformer_flops(s.d_model).flop_attention
        config = PlanConfig(
            max_tokens=s.max_tokens, layout="packed", flop_attention=fa, seed=s.seed
        )
    elif kind == "padded":
        config = PlanConfig(max_tokens=s.max_tokens, seed=s.seed)
    else:
        raise ValueError(f"unknown configuration {kind!r}; expected one of {TRAIN_CONFIGS}")
    plan = EpochPlanner(lengths, config).plan(0, 1, 1)
    return [plan.micro_batch(step, 0) for step in range(plan.num_steps)], fixed


def collate(kind: str, ids: np.ndarray, tokens: list[Any]) -> dict[str, Any]:
    """The model's batch: a packed row for (i), a right-padded batch for (ii) and (iii)."""
    from lightning_varbatch import PackingCollate, PaddingCollate

    items = [{"tokens": tokens[i]} for i in ids.tolist()]
    keep: tuple[str, ...]
    if kind == "packed":
        batch = PackingCollate()(items)
        keep = ("input_ids", "position_ids", "cu_seqlens", "max_seqlen", "labels")
    else:
        batch = PaddingCollate(loss_offset=1)(items)
        keep = ("tokens", "tokens_mask")
    return {k: batch[k] for k in keep}


def run_train(kind: str, s: LMSettings) -> TrainResult:
    """Train one configuration once over the documents; time every step."""
    import torch

    from examples.lm.model import CausalLM
    from lightning_varbatch.attention import select_backend

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    lengths = train_lengths(s)
    batches, fixed = train_batches(kind, lengths, s)
    if s.max_steps is not None:
        batches = batches[: s.max_steps]
    g = torch.Generator().manual_seed(s.seed)
    tokens = [torch.randint(FIRST_TOKEN, s.vocab, (int(n),), generator=g) for n in lengths]
    data = [collate(kind, ids, tokens) for ids in batches]
    moved = [
        {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in b.items()} for b in data
    ]
    del data
    model = CausalLM(
        vocab_size=s.vocab,
        d_model=s.d_model,
        nhead=s.nhead,
        num_layers=s.layers,
        dim_feedforward=s.ffn,
        dropout=0.0,
        attention_backend=s.backend,
    ).to(device)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    dtype = torch.bfloat16 if s.bf16 else torch.float32
    backend = "sdpa (padded)"
    if kind == "packed":
        probe = torch.zeros(1, 1, 8, device=device, dtype=dtype)
        backend = select_backend(probe, backend=s.backend)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times: list[float] = []
    reals: list[int] = []
    for ids, batch in zip(batches, moved, strict=True):
        sync()
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            loss_sum, ntokens = model.loss_sum(batch)
        (loss_sum / ntokens.clamp(min=1)).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sync()
        times.append(time.perf_counter() - t0)
        reals.append(int(lengths[ids].sum()))
    peak_mb = None
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    w = min(s.warmup, max(0, len(times) - 1))
    slots = [
        int(lengths[ids].sum()) if kind == "packed" else len(ids) * int(lengths[ids].max())
        for ids in batches
    ]
    return TrainResult(
        kind=kind,
        steps=len(times),
        timed_steps=len(times) - w,
        timed_s=sum(times[w:]),
        timed_real=sum(reals[w:]),
        real=sum(reals),
        slots=sum(slots),
        docs_mean=float(np.mean([len(b) for b in batches])),
        slots_max=max(slots),
        fixed_batch=fixed,
        backend=backend,
        peak_mb=peak_mb,
        step_s=times,
    )


def spawn(module: str, kind: str, s: LMSettings) -> TrainResult:
    """Configuration ``kind`` in a fresh ``python -m <module> --child <kind>`` process."""
    return TrainResult(**run_training_child(module, kind, s))


def child_main(kind: str, settings: str) -> int:
    """A child's work (``--child KIND --settings JSON``): one run, reported as a result line."""
    emit_result(asdict(run_train(kind, LMSettings.from_json(settings))))
    return 0


def run_training(
    module: str, s: LMSettings, rounds: int, in_process: bool
) -> dict[str, list[TrainResult]]:
    """Every configuration ``rounds`` times, interleaved, each in a fresh process by default."""
    out: dict[str, list[TrainResult]] = {k: [] for k in TRAIN_CONFIGS}
    for r in range(rounds):
        order = TRAIN_CONFIGS if r % 2 == 0 else tuple(reversed(TRAIN_CONFIGS))
        for kind in order:
            res = run_train(kind, s) if in_process else spawn(module, kind, s)
            out[kind].append(res)
            print(
                f"  round {r} {TRAIN_NAMES[kind]:<26} {res.steps:4d} steps, "
                f"{res.timed_s:7.2f} s timed, {res.timed_real / res.timed_s:9,.0f} real tok/s",
                flush=True,
            )
    return out


def report_training(results: dict[str, list[TrainResult]], peak: bool) -> dict[str, Any]:
    """Print the training table; return its numbers."""
    tps = {k: [r.timed_real / r.timed_s for r in runs] for k, runs in results.items()}
    base = statistics.median(tps["random"])
    headers = [
        "configuration",
        "steps",
        "docs/batch",
        "max slots",
        "slots/real",
        "real tok/s",
        "min..max",
        "x (iii)",
        "attention",
    ]
    if peak:
        headers.append("peak MB")
    rows = []
    out: dict[str, Any] = {"configs": {}}
    for kind in TRAIN_CONFIGS:
        r0 = results[kind][0]
        med = statistics.median(tps[kind])
        row = [
            TRAIN_NAMES[kind],
            str(r0.steps),
            f"{r0.docs_mean:.1f}",
            f"{r0.slots_max:,}",
            f"{r0.slots / r0.real:.3f}",
            f"{med:,.0f}",
            f"{min(tps[kind]):,.0f}..{max(tps[kind]):,.0f}",
            f"{med / base:.2f}",
            r0.backend,
        ]
        peaks = [r.peak_mb for r in results[kind] if r.peak_mb is not None]
        if peak:
            row.append(fmt(max(peaks) if peaks else None, ".0f"))
        rows.append(row)
        out["configs"][kind] = {
            "tps_median": med,
            "tps": tps[kind],
            "speedup_vs_random": med / base,
            "steps": r0.steps,
            "slots_per_real": r0.slots / r0.real,
            "docs_mean": r0.docs_mean,
            "fixed_batch": r0.fixed_batch,
            "backend": r0.backend,
            "peak_mb": max(peaks) if peaks else None,
        }
    print_table(headers, rows)
    return out


def describe_training(s: LMSettings) -> None:
    lengths = train_lengths(s)
    describe_lengths(f"training documents (Part 1 lengths / {s.length_div})", lengths)
    print(
        f"model: CausalLM d_model={s.d_model}, {s.layers} layers, {s.nhead} heads, FFN "
        f"{s.ffn}, vocab {s.vocab}; budget {s.max_tokens} tokens; (iii) B = "
        f"{max(1, round(s.max_tokens / float(lengths.mean())))}; device {s.device}, "
        + ("bf16 autocast" if s.bf16 else "fp32")
        + f"; torch.set_num_threads({s.threads})"
    )


# -- the script ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = DEFAULTS
    p = argparse.ArgumentParser(description="Packing benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test (< 45 s), all in-process")
    p.add_argument("--docs", type=int, default=200_000, help="documents of Part 1")
    p.add_argument("--rounds", type=int, default=2, help="interleaved training rounds")
    p.add_argument("--target-tokens", type=int, default=d.target_tokens)
    p.add_argument("--length-div", type=int, default=d.length_div)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_child_options(p, TRAIN_CONFIGS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.settings)
    s = replace(
        DEFAULTS, target_tokens=args.target_tokens, length_div=args.length_div, seed=args.seed
    )
    if args.quick:
        args.docs, args.rounds = 4_000, 1
        s.target_tokens, s.max_steps = 6000, 4
    print("command:", command_line("benchmarks.training.packing", argv))
    print("machine:", torch_machine_line())
    lengths = sft_lengths(args.docs, args.seed)
    stats = describe_lengths("Part 1 documents (lognormal, median 384, sigma 1.0)", lengths)
    print(
        f"  p99 / median = {stats['p99_over_median']:.1f} (>= 8 required), max "
        f"{stats['max']} (<= {LONGEST})"
    )
    print(
        f"\nPart 1: per-step FLOP imbalance, {WORLD} ranks, budget {BUDGET:,} tokens per "
        "micro-batch; FLOPs = tokens + flop_attention x (query, key) pairs, flop_attention of "
        "transformer_flops(d_model)"
    )
    rows = run_flops(lengths, args.seed)
    print(
        "\nimb = busiest rank's FLOPs / mean rank FLOPs per optimizer step (mean, p95, max over "
        "steps); epoch (busiest) = Σ over steps of the busiest rank's FLOPs, relative to ours "
        "(wall-clock proxy); useful = documents' own FLOPs / (ranks x that sum); slot eff = "
        "real tokens / slots computed; fill = mean real tokens per micro-batch / budget"
    )
    flops = report_flops(rows, smoke=args.quick)
    print(
        f"\nPart 2: training tokens/s ({'in-process, 1 round, ' if args.quick else ''}median of "
        f"{args.rounds} interleaved round(s); real tok/s = non-padding document tokens per "
        "second of step time; slots/real = token slots computed per real token)"
    )
    describe_training(s)
    results = run_training("benchmarks.training.packing", s, args.rounds, in_process=args.quick)
    training = report_training(results, peak=False)
    print("machine after:", torch_machine_line())
    write_json(
        args.json,
        {
            "lengths": stats,
            "flops": flops,
            "training": training,
            "settings": asdict(s),
            "passed": flops["passed"],
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
