"""The shape budget (issue 17): padding cost of K static shapes, and torch.compile on CPU.

Run from the repository root (venv active)::

    python -m benchmarks.training.compile_shapes            # ~5-6 min on 2 idle CPU cores
    python -m benchmarks.training.compile_shapes --quick    # smoke test, under a minute

A full run writes ``benchmarks/results/compile_shapes.json`` (:class:`benchmarks.results.Run`;
``--result PATH`` elsewhere, ``--no-result`` none); ``--quick`` writes none unless given
``--result``. Compiling the K-shape arm's 8 shapes takes about 3 of the minutes.

``--quick`` plans 100,000 pairs and trains a one-layer ``d_model=32`` model on 400 documents
(budget 1,024, K = 2) in this process, compiling with the ``aot_eager`` backend (dynamo's
graphs, guards and counters without inductor's code generation, which alone takes 10-70 s per
shape on these cores); its numbers only show that every path runs.

**Part 1: the padding of K shapes** (pure planning, no model runs). 1,000,000 (source,
target) pairs of :func:`~lightning_varbatch.planner.synthetic.wmt_like_lengths` (planning
length ``max(source, target)``, 1 to 256), ``max_tokens=16384``, 8 ranks, accumulation 1.
The unrestricted plan (``PlanConfig(max_tokens=16384)``, free shapes) against
``PlanConfig(max_tokens=16384, max_shapes=K)`` for K in 4, 8, 16, 32, 48, 64. Columns:
**real share**: ``diagnose(planner, plan).padding_efficiency`` (real tokens / padded token
slots run, masked rows included); **gap**: ``1 - share / unrestricted share``; **bound**:
the best share *any* K padded lengths can reach on these lengths, real tokens / Σ over
examples of the shortest chosen length that holds it, from the optimal lengths the planner
chose (:func:`~lightning_varbatch.planner.shapes.choose_shape_lengths`, exact dynamic
programming): a plan's share cannot exceed it (the masked rows of each shape's last
micro-batches only lower it); **shapes**: ``diagnose(...).num_shapes``; **steps**: optimizer
steps; **plan s**: ``EpochPlanner(...)`` plus ``plan(0, 8, 1)`` (the shape lengths are
chosen on the first plan). Target of the issue: K = 8 within 2 % of the unrestricted share;
the benchmark prints which K meet it.

**Part 2: torch.compile (inductor) on CPU.** A causal Transformer LM written here
(:class:`TinyLM`: pre-norm blocks, ``F.scaled_dot_product_attention`` with a boolean mask
``causal & key mask``, GELU FFN, tied embeddings; ``d_model=128``, 4 heads, 2 layers, FFN 512,
vocabulary 1,000; AdamW lr 1e-3; fp32; ``torch.set_num_threads(1)``), trained once over the
same ``--docs`` documents (4,000 in a CPU run, :data:`CPU_RUN`; random token ids; lengths:
the target side of ``wmt_like_lengths(docs, seed=1)``, at least 2) with
``TokenBudgetBatchSampler(lengths, 4096, world_size=1, shuffle=True, loss_lengths=lengths -
1)`` and ``PaddingCollate(loss_offset=1)`` (loss = summed cross-entropy / the batch's
``ntokens``). Arms:

* **eager, free shapes** (the baseline): the model as it is; every micro-batch padded to its
  own longest.
* **eager, K shapes**: the same model on the ``max_shapes=K`` plan (K = 8): what the padding
  costs without compiling.
* **compiled, K shapes**: ``torch.compile(model, dynamic=False)`` on the ``max_shapes=K``
  plan, ``torch._dynamo.config.recompile_limit = K`` and ``fail_on_recompile_limit_hit =
  True`` (so that a fallback to eager would fail instead of passing silently).
* **compiled dynamic, free shapes**: ``torch.compile(model, dynamic=True)``, free shapes.
* **compiled static, free shapes**: ``torch.compile(model, dynamic=False)``, free shapes:
  the recompile storm, capped at ``--storm-steps`` steps (2).

Each arm runs in a fresh process (``--quick``: all in this process) with a fresh, empty
inductor cache (``TORCHINDUCTOR_CACHE_DIR`` a new temporary folder) and
``torch._inductor.config.compile_threads = 1``; the batches are collated before timing; a step
is forward + loss + backward + AdamW step + ``zero_grad``, timed with ``time.perf_counter``.
**graphs**: ``torch._dynamo.utils.counters["stats"]["unique_graphs"]`` (graphs dynamo
captured and compiled, forward with its backward; ``frames ok`` counts compiled frames and
agrees with it when nothing breaks the graph; graph breaks are counted and must be 0);
**compile steps**: the steps during which ``graphs`` rose; **compile s**: their summed step
times (compilation plus one step); **steady real tok/s**: real (non-padding) document tokens
of the other steps after the first ``warmup`` (3) steps / their summed step time; **x eager**:
against the eager free-shape arm, run minutes apart in another process (the machine's load
moves it); **all steps s**: every step, compilation included.

**Paired ratios.** After training (nothing left to compile), the processes of ``eager_k``,
``compiled_k`` and ``dynamic_free`` run the arm and its references (:data:`PAIRED`: eager on
free shapes, eager on K shapes, the compiled model) one step each per round, in turn (a b c,
then c b a), for ``--paired-steps`` rounds (24), on micro-batches spread over the epoch: a
change of the machine's load hits them alike. **x eager free, paired**: the arm's real
tokens/s over eager free shapes; **compiled / eager, same batches**: a compiled model's over
the same model run eagerly on the same micro-batches; each with a 90 % bootstrap interval over
the rounds (:func:`paired_ratio`). For the K-shape arm the benchmark asserts ``graphs ==
distinct shapes``.

Before the arms, the benchmark checks the masked rows on the eager model: for a K-shape
micro-batch with fully masked rows, the attention output of those rows (every query sees no
key) must be exactly 0 (torch's SDPA returns zeros there, no NaN), and the loss and every
gradient finite; every arm checks its losses and final weights are finite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
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
    print_table,
    run_training_child,
    torch_machine_line,
    write_json,
)
from benchmarks.results import Run, add_result_option, result_path

# -- Part 1 settings
PAIRS = 1_000_000
PLAN_BUDGET = 16384
WORLD = 8
KS = (4, 8, 16, 32, 48, 64)
TARGET_GAP = 0.02
TARGET_K = 8

# -- Part 2
ARMS = ("eager_free", "eager_k", "compiled_k", "dynamic_free", "static_free")
ARM_NAMES = {
    "eager_free": "eager, free shapes",
    "eager_k": "eager, K shapes",
    "compiled_k": "compiled, K shapes",
    "dynamic_free": "compiled dynamic, free shapes",
    "static_free": "compiled static, free shapes",
}
FIRST_TOKEN = 3
MODULE = "benchmarks.training.compile_shapes"
PAIRED = {
    "eager_k": ("eager_free", "eager_k"),
    "compiled_k": ("eager_free", "eager_k", "compiled_k"),
    "dynamic_free": ("eager_free", "dynamic_free"),
}
"""The variants each arm's process runs in turn after training, one step each per round."""
SAME_BATCHES = {"compiled_k": "eager_k", "dynamic_free": "eager_free"}
"""A compiled arm's eager counterpart on the same micro-batches."""


# -- Part 1: the padding of K shapes -------------------------------------------------------------


@dataclass
class PadRow:
    k: int | None  # None: free shapes
    share: float
    gap: float
    bound: float
    shapes: int
    steps: int
    plan_s: float
    lengths: list[int] = field(default_factory=list)


def run_padding(num_pairs: int, seed: int, ks: Sequence[int]) -> list[PadRow]:
    """The unrestricted plan, then one plan per K; every figure of the table."""
    from lightning_varbatch import EpochPlanner, PlanConfig
    from lightning_varbatch.planner import diagnose, wmt_like_lengths

    pairs = wmt_like_lengths(num_pairs, seed=seed)
    key = pairs.max(axis=1).astype(np.int64)
    rows: list[PadRow] = []
    for k in (None, *ks):
        t0 = time.perf_counter()
        planner = EpochPlanner(pairs, PlanConfig(max_tokens=PLAN_BUDGET, max_shapes=k, seed=seed))
        plan = planner.plan(0, WORLD, 1)
        plan_s = time.perf_counter() - t0
        diag = diagnose(planner, plan)
        chosen = planner.shape_lengths
        if chosen is None:
            bound = 1.0
        else:
            padded = chosen[np.searchsorted(chosen, key)]
            bound = float(key.sum() / padded.sum())
        share = diag.padding_efficiency
        base = rows[0].share if rows else share
        rows.append(
            PadRow(
                k=k,
                share=share,
                gap=1 - share / base,
                bound=bound,
                shapes=diag.num_shapes,
                steps=diag.num_steps,
                plan_s=plan_s,
                lengths=[] if chosen is None else chosen.tolist(),
            )
        )
    return rows


def report_padding(rows: Sequence[PadRow], smoke: bool) -> dict[str, Any]:
    headers = ["shapes allowed", "real share", "gap", "bound", "shapes", "steps", "plan s"]
    table = [
        [
            "unrestricted" if r.k is None else f"max_shapes={r.k}",
            f"{r.share:.4f}",
            f"{100 * r.gap:.2f} %",
            "-" if r.k is None else f"{r.bound:.4f}",
            str(r.shapes),
            f"{r.steps:,}",
            f"{r.plan_s:.2f}",
        ]
        for r in rows
    ]
    print_table(headers, table)
    for r in rows:
        if r.k is not None and r.k <= 16:
            print(f"  K={r.k} lengths: {r.lengths}")
    meet = [r.k for r in rows if r.k is not None and r.gap <= TARGET_GAP]
    at_target = next((r for r in rows if r.k == TARGET_K), None)
    verdict = "smoke test, not judged" if smoke else ""
    if at_target is not None:
        ok = at_target.gap <= TARGET_GAP
        print(
            f"  [{verdict or ('PASS' if ok else 'FAIL')}] K={TARGET_K} within "
            f"{100 * TARGET_GAP:.0f} % of the unrestricted share: gap "
            f"{100 * at_target.gap:.2f} % (share {at_target.share:.4f}; no {TARGET_K} padded "
            f"lengths do better than {at_target.bound:.4f})"
        )
    print(
        f"  smallest K within {100 * TARGET_GAP:.0f} %: "
        + (str(min(meet)) if meet else f"none of {[r.k for r in rows if r.k is not None]}")
    )
    return {"rows": [asdict(r) for r in rows], "smallest_k_within_target": min(meet, default=None)}


# -- Part 2: torch.compile -----------------------------------------------------------------------


@dataclass(kw_only=True)
class CompileSettings(TrainingSettings):
    """Everything a training arm depends on (passed to child processes as JSON)."""

    docs: int = 10_000
    max_shapes: int = 8
    """K of the K-shape arms."""
    storm_steps: int = 3
    """Steps of the static free-shape arm (each one compiles)."""
    paired_steps: int = 40
    """Micro-batches of the eager-against-compiled pass after training."""
    backend: str = "inductor"
    """``torch.compile`` backend."""


DEFAULTS = CompileSettings(
    max_tokens=4096, vocab=1000, d_model=128, nhead=4, layers=2, ffn=512, lr=1e-3, warmup=3
)
"""Part 2's workload: the model and the budget (the GPU script takes these too)."""

CPU_RUN = replace(DEFAULTS, docs=4_000, storm_steps=2, paired_steps=24)
"""What a full CPU run trains (the command's defaults): 4,000 of the workload's documents, 2
steps of the recompile storm and 24 paired rounds, so that a run takes about 5 minutes on 2
idle cores (compiling the 8 shapes alone takes about 3)."""

MEASURED = [
    "lightning_varbatch.planner.epoch_planner",
    "lightning_varbatch.planner.diagnostics",
    "lightning_varbatch.planner.shapes",
    "lightning_varbatch.planner.synthetic",
    "lightning_varbatch.data.sampler",
    "lightning_varbatch.data.collate",
]
"""The package modules the result measured (their import closure is fingerprinted)."""


@dataclass
class ArmResult:
    arm: str
    steps: int
    shapes: int
    graphs: int
    frames_ok: int
    graph_breaks: int
    compile_steps: int
    compile_s: float
    timed_steps: int
    timed_s: float
    timed_real: int
    real: int
    slots: int
    masked_rows: int
    total_s: float
    final_loss: float
    finite: bool
    recompile_limit: int | None
    paired_steps: int = 0
    paired_s: dict[str, list[float]] = field(default_factory=dict)
    """Per paired round, each variant's step time (:data:`PAIRED`)."""
    paired_real: dict[str, list[int]] = field(default_factory=dict)
    """Per paired round, the real tokens of each variant's micro-batch."""
    step_s: list[float] = field(default_factory=list)

    @property
    def tps(self) -> float:
        return self.timed_real / self.timed_s if self.timed_s > 0 else float("nan")


def train_lengths(s: CompileSettings) -> np.ndarray:
    """The target side of ``wmt_like_lengths(docs, seed + 1)``, at least 2 tokens."""
    from lightning_varbatch.planner import wmt_like_lengths

    return np.maximum(2, wmt_like_lengths(s.docs, seed=s.seed + 1)[:, 1].astype(np.int64))


def train_batches(s: CompileSettings, shapes: bool) -> list[dict[str, Any]]:
    """The epoch's collated micro-batches: free shapes, or ``max_shapes`` static shapes."""
    import torch

    from lightning_varbatch import PaddingCollate, TokenBudgetBatchSampler
    from lightning_varbatch.data.collate import attach_plan

    lengths = train_lengths(s)
    sampler = TokenBudgetBatchSampler(
        lengths,
        s.max_tokens,
        rank=0,
        world_size=1,
        shuffle=True,
        seed=s.seed,
        max_shapes=s.max_shapes if shapes else None,
        loss_lengths=lengths - 1,
    )
    g = torch.Generator().manual_seed(s.seed)
    tokens = [torch.randint(FIRST_TOKEN, s.vocab, (int(n),), generator=g) for n in lengths]
    collate = PaddingCollate(loss_offset=1)
    out = []
    for mb in sampler:
        batch = collate(attach_plan([{"tokens": tokens[i]} for i in mb], mb))
        out.append({k: batch[k] for k in ("tokens", "tokens_mask", "ntokens")})
    return out


def make_model(s: CompileSettings) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(s.d_model)
            self.qkv = nn.Linear(s.d_model, 3 * s.d_model)
            self.out = nn.Linear(s.d_model, s.d_model)
            self.norm2 = nn.LayerNorm(s.d_model)
            self.ffn = nn.Sequential(
                nn.Linear(s.d_model, s.ffn), nn.GELU(), nn.Linear(s.ffn, s.d_model)
            )

        def attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            b, n, d = x.shape
            qkv = self.qkv(self.norm1(x)).view(b, n, 3, s.nhead, d // s.nhead)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return a.transpose(1, 2).reshape(b, n, d)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            x = x + self.out(self.attention(x, mask))
            return x + self.ffn(self.norm2(x))

    class TinyLM(nn.Module):
        """Causal LM; ``forward(tokens, mask)`` returns the summed next-token loss."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(s.vocab, s.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(s.layers))
            self.norm = nn.LayerNorm(s.d_model)

        @staticmethod
        def attention_mask(mask: torch.Tensor) -> torch.Tensor:
            """``(B, 1, L, L)``: causal and key is real; a masked row's queries see no key."""
            n = mask.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
            return causal[None, None] & mask[:, None, None, :]

        def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            am = self.attention_mask(mask)
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, am)
            logits = F.linear(self.norm(x), self.embed.weight)
            target = tokens[:, 1:].masked_fill(~mask[:, 1:], -100)
            return F.cross_entropy(
                logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"
            )

    return TinyLM()


def check_masked_rows(s: CompileSettings) -> dict[str, Any]:
    """On the eager model: fully masked rows get zero attention, finite loss and gradients."""
    import torch

    torch.manual_seed(s.seed)
    model = make_model(s)
    batches = train_batches(s, shapes=True)
    per_batch = [int((~b["tokens_mask"].any(1)).sum()) for b in batches]
    batch = batches[int(np.argmax(per_batch))]
    tokens, mask = batch["tokens"], batch["tokens_mask"]
    dead = ~mask.any(1)
    block = model.blocks[0]
    with torch.no_grad():
        att = block.attention(model.embed(tokens), model.attention_mask(mask))
    loss = model(tokens, mask) / batch["ntokens"]
    loss.backward()
    grads = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    masked = int(dead.sum())
    worst = float(att[dead].abs().max()) if dead.any() else 0.0
    nan = bool(torch.isnan(att).any())
    finite = bool(torch.isfinite(loss))
    return {
        "shape": list(tokens.shape),
        "masked_rows": masked,
        "attention_max_abs_on_masked_rows": worst,
        "attention_nan": nan,
        "loss_finite": finite,
        "grads_finite": grads,
        "ok": masked > 0 and worst == 0.0 and not nan and finite and grads,
    }


def graph_counts() -> tuple[int, int, int]:
    """(graphs compiled, frames compiled, graph breaks) from dynamo's counters."""
    from torch._dynamo.utils import counters

    return (
        int(counters["stats"]["unique_graphs"]),
        int(counters["frames"]["ok"]),
        int(sum(counters["graph_break"].values())),
    )


def run_arm(arm: str, s: CompileSettings) -> ArmResult:
    """Train one arm once over its micro-batches; time every step."""
    import torch
    import torch._dynamo
    import torch._inductor.config
    from torch._dynamo.utils import counters

    if s.device != "cpu" or s.bf16:
        raise ValueError(
            f"compile_shapes measures fp32 on CPU; got device={s.device!r}, bf16={s.bf16}"
        )
    torch.set_num_threads(s.threads)
    torch._inductor.config.compile_threads = 1
    torch._dynamo.reset()
    counters.clear()
    torch.manual_seed(s.seed)
    free = train_batches(s, shapes=False)
    k_shapes = train_batches(s, shapes=True) if arm in ("eager_k", "compiled_k") else []
    batches = k_shapes if arm.endswith("_k") else free
    if arm == "static_free":
        batches = batches[: s.storm_steps]
    if s.max_steps is not None:
        batches = batches[: s.max_steps]
    model = make_model(s)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=s.lr)
    dynamo = torch._dynamo.config
    limit: int | None = None
    saved = (dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit)
    if arm == "compiled_k":
        limit = len({tuple(b["tokens"].shape) for b in batches})
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = limit, True
    elif arm == "static_free":
        limit = len(batches) + 1
        dynamo.recompile_limit = limit
    elif arm == "dynamic_free":
        limit = dynamo.recompile_limit
    fn = model
    if arm in ("compiled_k", "static_free", "dynamic_free"):
        fn = torch.compile(model, dynamic=arm == "dynamic_free", backend=s.backend)
    times: list[float] = []
    compiled: list[bool] = []
    losses: list[float] = []

    def step(run: Any, batch: dict[str, Any]) -> float:
        t0 = time.perf_counter()
        loss = run(batch["tokens"], batch["tokens_mask"]) / batch["ntokens"].clamp(min=1)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        return time.perf_counter() - t0

    variants = {
        "eager_free": (model, free),
        "eager_k": (model, k_shapes),
        "compiled_k": (fn, k_shapes),
        "dynamic_free": (fn, free),
    }
    names = PAIRED.get(arm, ())
    paired_s: dict[str, list[float]] = {v: [] for v in names}
    paired_real: dict[str, list[int]] = {v: [] for v in names}
    try:
        for batch in batches:
            before = graph_counts()[0]
            times.append(step(fn, batch))
            compiled.append(graph_counts()[0] > before)
        # After training (nothing left to compile): the arm and its references, one step each
        # per round in turn (a b c, then c b a, ...), so that a change of the machine's load
        # hits them alike; a compiled arm also runs its own model eagerly on the same batches.
        graphs = graph_counts()[0]
        for i in range(s.paired_steps if names else 0):
            for v in names if i % 2 == 0 else names[::-1]:
                run, pool = variants[v]
                batch = pool[(i * len(pool)) // s.paired_steps]  # spread over the epoch
                paired_s[v].append(step(run, batch))
                paired_real[v].append(int(batch["tokens_mask"].sum()))
        assert graph_counts()[0] == graphs, "the paired pass compiled again"
    finally:
        dynamo.recompile_limit, dynamo.fail_on_recompile_limit_hit = saved
    graphs, frames, breaks = graph_counts()
    real = [int(b["tokens_mask"].sum()) for b in batches]
    timed = [
        i for i in range(len(batches)) if i >= min(s.warmup, len(batches) - 1) and not compiled[i]
    ]
    finite = bool(np.isfinite(losses).all()) and all(
        bool(torch.isfinite(p).all()) for p in model.parameters()
    )
    return ArmResult(
        arm=arm,
        steps=len(batches),
        shapes=len({tuple(b["tokens"].shape) for b in batches}),
        graphs=graphs,
        frames_ok=frames,
        graph_breaks=breaks,
        compile_steps=sum(compiled),
        compile_s=sum(t for t, c in zip(times, compiled, strict=True) if c),
        timed_steps=len(timed),
        timed_s=sum(times[i] for i in timed),
        timed_real=sum(real[i] for i in timed),
        real=sum(real),
        slots=sum(int(b["tokens"].numel()) for b in batches),
        masked_rows=sum(int((~b["tokens_mask"].any(1)).sum()) for b in batches),
        total_s=sum(times),
        final_loss=losses[-1],
        finite=finite,
        recompile_limit=limit,
        paired_steps=s.paired_steps if names else 0,
        paired_s=paired_s,
        paired_real=paired_real,
        step_s=times,
    )


def spawn(arm: str, s: CompileSettings) -> ArmResult:
    """Run one arm in a fresh process with a fresh, empty inductor cache."""
    cache = tempfile.mkdtemp(prefix="inductor-cache-")
    try:
        found = run_training_child(MODULE, arm, s, TORCHINDUCTOR_CACHE_DIR=cache)
        return ArmResult(**found)
    finally:
        shutil.rmtree(cache, ignore_errors=True)


def run_in_process(arm: str, s: CompileSettings) -> ArmResult:
    """One arm in this process, with a fresh, empty inductor cache folder."""
    cache = tempfile.mkdtemp(prefix="inductor-cache-")
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    try:
        return run_arm(arm, s)
    finally:
        if old is None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
        shutil.rmtree(cache, ignore_errors=True)


def paired_ratio(
    r: ArmResult, num: str, den: str, resamples: int = 2000, seed: int = 0
) -> list[float]:
    """``[ratio, low, high]``: real tokens/s of variant ``num`` over ``den`` in ``r``'s paired
    pass, with a 90 % bootstrap interval over its rounds (each round resampled as a whole)."""
    ns, nr = np.asarray(r.paired_s[num]), np.asarray(r.paired_real[num], dtype=np.float64)
    ds, dr = np.asarray(r.paired_s[den]), np.asarray(r.paired_real[den], dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, ns.size, (resamples, ns.size))
    boot = (nr[idx].sum(1) / ns[idx].sum(1)) / (dr[idx].sum(1) / ds[idx].sum(1))
    point = (nr.sum() / ns.sum()) / (dr.sum() / ds.sum())
    return [float(point), float(np.quantile(boot, 0.05)), float(np.quantile(boot, 0.95))]


def interval(x: list[float] | None) -> str:
    """``1.05 [1.02, 1.08]``, or ``-``."""
    return "-" if x is None else f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]"


def report_training(results: dict[str, ArmResult]) -> dict[str, Any]:
    base = results["eager_free"].tps
    headers = [
        "arm",
        "steps",
        "shapes",
        "graphs",
        "compile steps",
        "compile s",
        "s/compile",
        "slots/real",
        "steady real tok/s",
        "x eager",
        "x eager free, paired [90 %]",
        "compiled / eager, same batches [90 %]",
        "all steps s",
    ]
    rows = []
    out: dict[str, Any] = {}
    for arm, r in results.items():
        steady = r.timed_steps > 0
        vs_free = paired_ratio(r, arm, "eager_free") if r.paired_steps else None
        same = SAME_BATCHES.get(arm)
        vs_same = paired_ratio(r, arm, same) if r.paired_steps and same else None
        rows.append(
            [
                ARM_NAMES[arm],
                str(r.steps),
                str(r.shapes),
                str(r.graphs),
                str(r.compile_steps),
                f"{r.compile_s:.1f}" if r.compile_steps else "-",
                f"{r.compile_s / r.compile_steps:.1f}" if r.compile_steps else "-",
                f"{r.slots / r.real:.3f}",
                f"{r.tps:,.0f}" if steady else "- (all compile)",
                f"{r.tps / base:.2f}" if steady else "-",
                interval(vs_free),
                interval(vs_same),
                f"{r.total_s:.1f}",
            ]
        )
        d = asdict(r)
        d["tps"] = r.tps if steady else None
        d["speedup_vs_eager"] = r.tps / base if steady else None
        d["paired_vs_eager_free"] = vs_free
        d["paired_vs_same_batches"] = vs_same
        d["step_median_s"] = statistics.median(r.step_s)
        d["compile_per_shape_s"] = r.compile_s / r.compile_steps if r.compile_steps else None
        out[arm] = d
    print_table(headers, rows)
    return out


def check_k_arm(results: dict[str, ArmResult]) -> bool:
    """The issue's count: compilations of the K-shape arm == its distinct shapes (asserted)."""
    r = results.get("compiled_k")
    if r is None:
        return True
    ok = r.graphs == r.shapes and r.graph_breaks == 0 and r.compile_steps == r.shapes
    print(
        f"  [{'PASS' if ok else 'FAIL'}] compiled, K shapes: {r.graphs} graphs compiled "
        f"(unique_graphs; frames ok {r.frames_ok}, graph breaks {r.graph_breaks}) for "
        f"{r.shapes} distinct shapes in {r.steps} steps, recompile_limit={r.recompile_limit}"
    )
    assert ok, f"compiled K-shape arm: {r.graphs} graphs for {r.shapes} shapes"
    return ok


def describe_training(s: CompileSettings) -> None:
    lengths = train_lengths(s)
    print(
        f"documents: {lengths.size:,} (target side of wmt_like_lengths, >= 2), "
        f"{int(lengths.sum()):,} tokens; median {float(np.median(lengths)):.0f}, mean "
        f"{float(lengths.mean()):.1f}, max {int(lengths.max())}; budget {s.max_tokens} tokens, "
        f"max_shapes={s.max_shapes} for the K arms"
    )
    print(
        f"model: TinyLM d_model={s.d_model}, {s.layers} layers, {s.nhead} heads, FFN {s.ffn}, "
        f"vocab {s.vocab}; AdamW lr {s.lr}; fp32; torch.set_num_threads({s.threads}); "
        f"torch.compile backend {s.backend!r} (inductor compile_threads=1); warmup {s.warmup} "
        f"steps; static free-shape arm capped at {s.storm_steps} steps"
    )


# -- the script ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = CPU_RUN
    p = argparse.ArgumentParser(description="Shape-budget benchmark (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="smoke test (< 1 min), all in-process")
    p.add_argument("--pairs", type=int, default=PAIRS, help="pairs of Part 1")
    p.add_argument("--docs", type=int, default=d.docs, help="documents of Part 2")
    p.add_argument("--max-shapes", type=int, default=d.max_shapes, help="K of Part 2")
    p.add_argument("--storm-steps", type=int, default=d.storm_steps)
    p.add_argument("--paired-steps", type=int, default=d.paired_steps, help="paired rounds")
    p.add_argument("--arms", nargs="+", choices=ARMS, default=None, help="Part 2 arms to run")
    p.add_argument(
        "--backend",
        default=None,
        help="torch.compile backend (default inductor; --quick: aot_eager, no code generation)",
    )
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_result_option(p, "compile_shapes")
    add_child_options(p, ARMS)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        emit_result(asdict(run_arm(args.child, CompileSettings.from_json(args.settings))))
        return 0
    s = replace(
        CPU_RUN,
        docs=args.docs,
        max_shapes=args.max_shapes,
        storm_steps=args.storm_steps,
        paired_steps=args.paired_steps,
        seed=args.seed,
    )
    arms = tuple(args.arms or ARMS)
    if "eager_free" not in arms:
        arms = ("eager_free", *arms)
    if args.quick:
        args.pairs = 100_000
        s.docs, s.max_tokens, s.max_shapes, s.warmup, s.paired_steps = 400, 1024, 2, 1, 6
        s.vocab, s.d_model, s.nhead, s.layers, s.ffn = 128, 32, 2, 1, 64
        s.backend = "aot_eager"
    if args.backend is not None:
        s.backend = args.backend
    settings = {**asdict(s), "pairs": args.pairs, "plan_budget": PLAN_BUDGET, "world": WORLD}
    run = Run("compile_shapes", settings=settings, package=MEASURED, bench=[MODULE])
    t_start = time.perf_counter()
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    print(
        f"\nPart 1: padding of K static shapes, wmt_like_lengths({args.pairs:,}) pairs "
        f"(planning length max(source, target)), max_tokens={PLAN_BUDGET}, {WORLD} ranks"
    )
    padding = report_padding(run_padding(args.pairs, args.seed, KS), smoke=args.quick)
    print(
        "  real share = diagnose().padding_efficiency (real tokens / padded slots, masked rows "
        "included); gap = 1 - share / unrestricted share; bound = the best share of any K "
        "padded lengths (optimal lengths, no masked rows)"
    )
    where = "in-process" if args.quick else "one process per arm"
    print(f"\nPart 2: torch.compile (backend {s.backend!r}) on CPU, {where}")
    describe_training(s)
    masked = check_masked_rows(s)
    print(
        f"  [{'PASS' if masked['ok'] else 'FAIL'}] masked rows (eager, a {masked['shape'][0]} x "
        f"{masked['shape'][1]} micro-batch with {masked['masked_rows']} masked rows): attention "
        f"max |out| on them {masked['attention_max_abs_on_masked_rows']}, NaN "
        f"{masked['attention_nan']}, loss finite {masked['loss_finite']}, grads finite "
        f"{masked['grads_finite']}"
    )
    assert masked["ok"], masked
    results: dict[str, ArmResult] = {}
    for arm in arms:
        r = run_in_process(arm, s) if args.quick else spawn(arm, s)
        results[arm] = r
        print(
            f"  {ARM_NAMES[arm]:<30} {r.steps:4d} steps, {r.shapes:3d} shapes, {r.graphs:3d} "
            f"graphs, {r.total_s:7.1f} s, finite {r.finite}",
            flush=True,
        )
        assert r.finite, f"{arm}: a loss or a weight is not finite"
    print(
        "\ngraphs = dynamo counters['stats']['unique_graphs']; compile steps = steps in which "
        "it rose (their time: compile s); steady real tok/s = real tokens / time of the other "
        f"steps after the first {s.warmup}; x eager = against eager, free shapes; x eager "
        f"free paired = the arm's real tok/s over eager free shapes, and compiled / eager = over "
        f"its own model run eagerly on the same micro-batches, both in the arm's process after "
        f"training, one step each per round in turn, {s.paired_steps} rounds (90 % bootstrap "
        "interval over the rounds)"
    )
    training = report_training(results)
    check_k_arm(results)
    print("machine after:", torch_machine_line())
    wall = time.perf_counter() - t_start
    print(f"wall time: {wall:.0f} s")
    numbers = {
        "padding": padding,
        "masked_rows": masked,
        "training": training,
        "settings": asdict(s),
        "wall_s": wall,
    }
    write_json(args.json, numbers)
    run.write(numbers, result_path(args))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
