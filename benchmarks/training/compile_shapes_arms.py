"""Shape-budget benchmark, Part 2's measurement: one training arm, timed step by step.

The arms of Part 2 of :mod:`benchmarks.training.compile_shapes` (its docstring describes what
they measure): :func:`run_arm` trains one arm once over its micro-batches, timing every step and
counting dynamo's graphs, then runs the paired pass (:data:`PAIRED`); :func:`spawn` runs it in
a fresh process (the entry point's ``--child ARM``), :func:`run_in_process` in this one, each
with a fresh, empty inductor cache.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.harness import run_training_child
from benchmarks.training.compile_shapes_workload import CompileSettings, make_model, train_batches

ARMS = ("eager_free", "eager_k", "compiled_k", "dynamic_free", "static_free")
ARM_NAMES = {
    "eager_free": "eager, free shapes",
    "eager_k": "eager, K shapes",
    "compiled_k": "compiled, K shapes",
    "dynamic_free": "compiled dynamic, free shapes",
    "static_free": "compiled static, free shapes",
}
MODULE = "benchmarks.training.compile_shapes"
"""The entry point: its ``--child ARM`` runs :func:`run_arm` (see :func:`spawn`)."""
PAIRED = {
    "eager_k": ("eager_free", "eager_k"),
    "compiled_k": ("eager_free", "eager_k", "compiled_k"),
    "dynamic_free": ("eager_free", "dynamic_free"),
}
"""The variants each arm's process runs in turn after training, one step each per round."""


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
