"""Strategy smoke on one CUDA GPU: DDP, FSDP and DeepSpeed ZeRO 2/3 on token-budget batches.

Each strategy trains a small causal Transformer LM (pre-norm blocks, SDPA, tied embeddings) in
a fresh process (:func:`benchmarks.harness.run_child`), on ``accelerator="gpu", devices=1``
with ``bf16-mixed`` and AdamW, through the library's public pieces:
``TokenBudgetDataModule`` (``train_loss_lengths = lengths - 1``), ``PaddingCollate(loss_offset=1)``
and ``step_token_mean``. Strategies: Lightning's ``"ddp"``, ``"fsdp_varbatch"``
(``VarBatchFSDPStrategy``), ``"deepspeed_varbatch"`` (``VarBatchDeepSpeedStrategy``, ZeRO 2)
and ``"deepspeed_varbatch_stage_3"``. Per strategy it records: finished (and the error text if
not), optimizer steps, whether the final loss is finite, real (non-padding input) tokens/s over
the last 10 optimizer steps (``torch.cuda.synchronize`` at each step's end), and
``torch.cuda.max_memory_allocated`` over the fit.

Then, in the same process, the one-step gradient check of ``tests/strategies``: a tiny model
of the same kind (``d_model=64``, 2 layers, explicit softmax attention) in fp32
(``precision="32-true"``), SGD lr=1, ``accumulate_grad_batches=2``, one optimizer step; its
parameters after the step are compared with a float64 single-process reference computed on
CPU from the union of that step's micro-batches with the token-mean loss (``rel_err``: largest
parameter difference over the largest reference update). The naive recipe (each micro-batch's
own token mean, averaged) is computed too: ``naive_gap`` is its distance to the exact update,
the size of the error the check can see. ``ok`` when ``rel_err < 1e-3`` and
``naive_gap > 10 * rel_err``.

Run from the repository root (DeepSpeed installed; it needs no compiled op here)::

    python -m benchmarks.gpu.strategies --json gpu_strategies.json     # ~1 min on one GPU
    python -m benchmarks.gpu.strategies --device cpu --tiny            # smoke test on CPU

``--budget-s`` bounds the whole run: each child gets what is left, minus a reserve for the
children after it, and a child that runs out of time is reported with what it had printed.
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from benchmarks.harness import (
    ChildFailed,
    TrainingSettings,
    add_child_options,
    child_command,
    child_env,
    command_line,
    emit_result,
    fmt,
    print_table,
    read_results,
    write_json,
)

MODULE = "benchmarks.gpu.strategies"
STRATEGIES = ("ddp", "fsdp_varbatch", "deepspeed_varbatch", "deepspeed_varbatch_stage_3")
LAST_STEPS = 10
"""Optimizer steps at the end of each run over which tokens/s is measured."""
CHECK_LR = 1.0
CHECK_ACCUMULATE = 2


@dataclass(kw_only=True)
class StrategySettings(TrainingSettings):
    """What a strategy child depends on (passed as JSON)."""

    docs: int = 4000
    median_length: int = 160
    longest: int = 1024
    accumulate: int = 2
    grad_check: bool = True


DEFAULTS = StrategySettings(
    max_tokens=16384,
    vocab=8192,
    d_model=512,
    nhead=8,
    layers=4,
    ffn=2048,
    lr=3e-4,
    max_steps=20,
    threads=4,
    device="cuda",
    bf16=True,
)


def check_settings(s: StrategySettings) -> StrategySettings:
    """The gradient check's sizes (small: its float64 reference runs on the CPU)."""
    return StrategySettings(
        max_tokens=1024,
        vocab=256,
        d_model=64,
        nhead=4,
        layers=2,
        ffn=128,
        lr=CHECK_LR,
        device=s.device,
        bf16=False,
        docs=300,
        median_length=24,
        longest=128,
        threads=s.threads,
        seed=s.seed,
    )


def tiny(s: StrategySettings) -> StrategySettings:
    """Sizes that run on CPU in seconds (smoke test of every code path)."""
    return StrategySettings(
        max_tokens=512,
        vocab=64,
        d_model=32,
        nhead=2,
        layers=1,
        ffn=64,
        lr=1e-3,
        max_steps=12,
        device=s.device,
        bf16=False,
        docs=400,
        median_length=20,
        longest=64,
        threads=1,
    )


# -- data and model (the child's side) -----------------------------------------------------------


def make_lengths(docs: int, median: int, longest: int, seed: int) -> Any:
    """Lognormal document lengths (median ``median``), clipped to ``[4, longest]``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    raw = rng.lognormal(math.log(median), 0.8, size=docs)
    return np.clip(raw.round(), 4, longest).astype(np.int64)


def make_items(lengths: Any, vocab: int, seed: int) -> list[dict[str, Any]]:
    """One item per document: random token ids in ``[1, vocab)`` (0 is padding) and its id."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return [
        {"tokens": torch.randint(1, vocab, (int(n),), generator=g), "id": i}
        for i, n in enumerate(lengths)
    ]


def make_net(s: StrategySettings, *, math_attention: bool) -> Any:
    """A causal Transformer LM: ``net(tokens) -> logits``; right padding needs no mask."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(s.d_model)
            self.qkv = nn.Linear(s.d_model, 3 * s.d_model)
            self.proj = nn.Linear(s.d_model, s.d_model)
            self.norm2 = nn.LayerNorm(s.d_model)
            self.ffn = nn.Sequential(
                nn.Linear(s.d_model, s.ffn), nn.GELU(), nn.Linear(s.ffn, s.d_model)
            )

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, n, d = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(b, n, 3, s.nhead, d // s.nhead).unbind(2)
            q, k, v = (t.transpose(1, 2) for t in (q, k, v))
            if math_attention:  # exact and backend-free, for the float64 comparison
                scores = (q @ k.transpose(-1, -2)) / math.sqrt(d // s.nhead)
                causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
                a = scores.masked_fill(~causal, float("-inf")).softmax(-1) @ v
            else:
                a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, n, d))
            return x + self.ffn(self.norm2(x))

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(s.vocab, s.d_model)
            self.position = nn.Embedding(s.longest, s.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(s.layers))
            self.norm = nn.LayerNorm(s.d_model)

        def forward(self, tokens: torch.Tensor) -> torch.Tensor:
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.embed(tokens) + self.position(positions)[None]
            for block in self.blocks:
                x = block(x)
            return F.linear(self.norm(x), self.embed.weight)

    return Net()


def loss_sum(net: Any, batch: dict[str, Any]) -> Any:
    """Summed next-token cross entropy over the real tokens (fp32 logits)."""
    import torch.nn.functional as F

    tokens, mask = batch["tokens"], batch["tokens_mask"]
    logits = net(tokens)[:, :-1].float()
    target = tokens[:, 1:].masked_fill(~mask[:, 1:], -100)
    return F.cross_entropy(
        logits.flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"
    )


def full_params(trainer: Any, net: Any) -> dict[str, Any]:
    """The whole, unsharded parameters as float64 CPU tensors (gathered under FSDP / ZeRO 3)."""
    from contextlib import nullcontext

    strategy = trainer.strategy
    context: Any = nullcontext()
    if type(strategy).__name__ == "VarBatchFSDPStrategy":
        from torch.distributed.fsdp import FullyShardedDataParallel

        context = FullyShardedDataParallel.summon_full_params(strategy.model)
    elif getattr(strategy, "zero_stage_3", False):
        import deepspeed

        context = deepspeed.zero.GatheredParameters(list(net.parameters()))
    with context:
        return {n: p.detach().double().cpu().clone() for n, p in net.named_parameters()}


def run_fit(strategy: str, s: StrategySettings, *, check: bool) -> dict[str, Any]:
    """One ``Trainer.fit``: the timed bf16 run, or (``check``) the fp32 one-step check."""
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

    import lightning_varbatch.strategies  # noqa: F401  (registers the strategy names)
    from lightning_varbatch import PaddingCollate, TokenBudgetDataModule, step_token_mean

    if check:
        s = check_settings(s)
    cuda = s.device.startswith("cuda")
    seed_everything(s.seed, verbose=False)
    lengths = make_lengths(s.docs, s.median_length, s.longest, s.seed)
    items = make_items(lengths, s.vocab, s.seed)
    accumulate = CHECK_ACCUMULATE if check else s.accumulate

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net(s, math_attention=check)
            self.first_step_ids: list[list[int]] = []
            self.last_loss: torch.Tensor | None = None

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            summed = loss_sum(self.net, batch)
            if self.trainer.global_step == 0:
                self.first_step_ids.append([int(i) for i in batch["id"].tolist()])
            self.last_loss = (summed / batch["ntokens"].clamp(min=1)).detach()
            return step_token_mean(summed, batch, self.trainer)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            if check:
                return torch.optim.SGD(self.parameters(), lr=CHECK_LR)
            return torch.optim.AdamW(self.parameters(), lr=s.lr)

    class Steps(Callback):
        """Step-end times and real tokens per optimizer step; parameters after step 1."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.tokens: list[int] = []
            self.losses: list[float] = []
            self.pending: Any = 0
            self.after_first: dict[str, Any] | None = None

        def sync(self) -> float:
            if cuda:
                torch.cuda.synchronize()
            return time.perf_counter()

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.times.append(self.sync())

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.pending = self.pending + batch["input_tokens"]
            if (batch_idx + 1) % accumulate:
                return
            self.times.append(self.sync())
            self.tokens.append(int(self.pending))
            self.pending = 0
            if pl_module.last_loss is not None:
                self.losses.append(float(pl_module.last_loss))
            if check and self.after_first is None and trainer.global_step >= 1:
                self.after_first = full_params(trainer, pl_module.net)

    module = Module()
    init = {n: p.detach().double().clone() for n, p in module.net.named_parameters()}
    datamodule = TokenBudgetDataModule(
        items,
        lengths,
        s.max_tokens,
        train_loss_lengths=lengths - 1,
        collate=PaddingCollate(loss_offset=1),
        seed=s.seed,
    )
    steps = Steps()
    precision = "bf16-mixed" if (s.bf16 and not check) else "32-true"
    trainer = Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        strategy=strategy,
        precision=precision,  # type: ignore[arg-type]
        use_distributed_sampler=False,
        accumulate_grad_batches=accumulate,
        max_steps=1 if check else (s.max_steps or -1),
        callbacks=[steps],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.fit(module, datamodule=datamodule)
    if check:
        return grad_check_result(s, init, steps.after_first, module.first_step_ids, items)
    n = min(LAST_STEPS, len(steps.tokens))
    window = steps.times[-1] - steps.times[-1 - n] if n else float("nan")
    return {
        "finished": True,
        "strategy_class": type(trainer.strategy).__name__,
        "precision": precision,
        "steps": int(trainer.global_step),
        "micro_batches_per_step": accumulate,
        "final_loss": steps.losses[-1] if steps.losses else None,
        "final_loss_finite": bool(steps.losses) and math.isfinite(steps.losses[-1]),
        "timed_steps": n,
        "real_tokens_per_s": sum(steps.tokens[-n:]) / window if n and window > 0 else None,
        "step_s": [b - a for a, b in zip(steps.times, steps.times[1:], strict=False)],
        "step_tokens": steps.tokens,
        "max_memory_allocated": int(torch.cuda.max_memory_allocated()) if cuda else None,
    }


def reference_update(
    s: StrategySettings,
    init: dict[str, Any],
    items: list[dict[str, Any]],
    micro_ids: list[list[int]],
    *,
    naive: bool,
) -> dict[str, Any]:
    """Parameters after one SGD step in float64 on CPU, from the step's micro-batches."""
    import torch

    from lightning_varbatch import PaddingCollate

    net = make_net(s, math_attention=True).double()
    with torch.no_grad():
        for name, p in net.named_parameters():
            p.copy_(init[name])
    collate = PaddingCollate(loss_offset=1)
    batches = [collate([{"tokens": items[i]["tokens"]} for i in ids]) for ids in micro_ids]
    sums = [loss_sum(net, b).double() for b in batches]
    counts = [int(b["ntokens"]) for b in batches]
    if naive:
        loss = sum(x / n for x, n in zip(sums, counts, strict=True)) / len(batches)
    else:
        loss = sum(sums) / sum(counts)
    net.zero_grad()
    loss.backward()  # type: ignore[union-attr]
    return {n: (p - CHECK_LR * p.grad).detach() for n, p in net.named_parameters()}


def grad_check_result(
    s: StrategySettings,
    init: dict[str, Any],
    after: dict[str, Any] | None,
    micro_ids: list[list[int]],
    items: list[dict[str, Any]],
) -> dict[str, Any]:
    """The run's first update against the exact and the naive float64 references."""
    if after is None:
        return {"ok": False, "error": "no parameters recorded after the first step"}
    exact = reference_update(s, init, items, micro_ids, naive=False)
    naive = reference_update(s, init, items, micro_ids, naive=True)

    def largest(a: dict[str, Any], b: dict[str, Any]) -> float:
        return max(float((a[n] - b[n]).abs().max()) for n in a)

    update = largest(exact, init)
    rel_err = largest(after, exact) / update
    naive_gap = largest(naive, exact) / update
    return {
        "ok": rel_err < 1e-3 and naive_gap > 10 * rel_err,
        "rel_err": rel_err,
        "naive_gap": naive_gap,
        "largest_update": update,
        "micro_batches": len(micro_ids),
        "examples": sum(len(m) for m in micro_ids),
    }


def error_text(err: BaseException) -> str:
    return f"{type(err).__name__}: {err}"[:3000]


def child_main(strategy: str, settings_json: str) -> int:
    """One strategy: the timed run, then the gradient check; each reported as it ends."""
    import torch

    s = StrategySettings.from_json(settings_json)
    torch.set_num_threads(s.threads)
    try:
        train = run_fit(strategy, s, check=False)
    except Exception as err:  # reported, not raised: the parent tabulates every strategy
        train = {"finished": False, "error": error_text(err)}
    emit_result({"strategy": strategy, "phase": "train", **train})
    if s.grad_check:
        try:
            grad = run_fit(strategy, s, check=True)
        except Exception as err:
            grad = {"ok": False, "error": error_text(err)}
        emit_result({"strategy": strategy, "phase": "grad_check", **grad})
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        try:
            torch.distributed.destroy_process_group()
        except Exception:  # teardown only; the results are out
            pass
    return 0


# -- the parent ----------------------------------------------------------------------------------


def run_strategy(strategy: str, s: StrategySettings, timeout: float) -> dict[str, Any]:
    """One strategy in a fresh process; its merged results (also when it failed or hung)."""
    extra = {} if s.device.startswith("cuda") else {"DS_ACCELERATOR": "cpu"}
    env = child_env(**extra)
    env.setdefault("OMP_NUM_THREADS", str(s.threads))
    command = child_command(MODULE, "--child", strategy, "--settings", s.to_json())
    record: dict[str, Any] = {"strategy": strategy}
    t0 = time.perf_counter()
    try:
        from benchmarks.harness import run_child

        found = run_child(command, env=env, timeout=timeout)
    except ChildFailed as failure:
        f = failure.failures[0]
        found = read_results(f.stdout)
        record["child_error"] = f"{f.reason}; stderr ends: {f.stderr[-1500:]}"
    record["wall_s"] = time.perf_counter() - t0
    for r in found:
        phase = r.pop("phase", "train")
        r.pop("strategy", None)
        record[phase] = r
    record.setdefault("train", {"finished": False, "error": record.get("child_error", "?")})
    return record


def report(records: Sequence[dict[str, Any]]) -> None:
    rows = []
    for r in records:
        t, g = r["train"], r.get("grad_check", {})
        mem = t.get("max_memory_allocated")
        rows.append(
            [
                r["strategy"],
                "yes" if t.get("finished") else "NO",
                str(t.get("steps", "-")),
                str(t.get("final_loss_finite", "-")),
                fmt(t.get("real_tokens_per_s"), ".0f"),
                fmt(mem / 2**20 if mem else None, ".0f"),
                fmt(g.get("rel_err"), ".1e"),
                fmt(g.get("naive_gap"), ".1e"),
                {True: "ok", False: "FAIL"}.get(g.get("ok"), "-"),  # type: ignore[call-overload]
                fmt(r["wall_s"], ".1f"),
            ]
        )
    print_table(
        [
            "strategy",
            "finished",
            "steps",
            "loss finite",
            "real tok/s",
            "peak MiB",
            "grad rel err",
            "naive gap",
            "grad",
            "wall s",
        ],
        rows,
    )
    for r in records:
        for what, part in (("train", r["train"]), ("grad_check", r.get("grad_check", {}))):
            if part.get("error"):
                print(f"\n{r['strategy']} {what} error: {part['error']}")
        if r.get("child_error"):
            print(f"\n{r['strategy']} child: {r['child_error']}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="GPU strategy smoke (see the module docstring).")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny model and data: smoke test")
    p.add_argument("--strategies", nargs="+", default=list(STRATEGIES), choices=STRATEGIES)
    p.add_argument("--steps", type=int, default=None, help="optimizer steps (default 20)")
    p.add_argument("--no-grad-check", action="store_true")
    p.add_argument("--budget-s", type=float, default=75.0, help="wall-clock bound of the run")
    p.add_argument("--reserve-s", type=float, default=12.0, help="kept for each later child")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    add_child_options(p, STRATEGIES)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        code = child_main(args.child, args.settings)
        os._exit(code)  # skip interpreter teardown (NCCL / DeepSpeed atexit hooks can hang)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_strategies: no CUDA device; use --device cpu --tiny to smoke-test on CPU")
        return 2
    s = replace(DEFAULTS if not args.tiny else tiny(DEFAULTS), device=args.device)
    s = replace(s, bf16=s.bf16 and args.device.startswith("cuda"))
    s = replace(s, grad_check=not args.no_grad_check)
    if args.steps is not None:
        s = replace(s, max_steps=args.steps)
    print("command:", command_line(MODULE, argv))
    print("settings:", s.to_json())
    deadline = time.perf_counter() + args.budget_s
    records: list[dict[str, Any]] = []
    out: dict[str, Any] = {"settings": s.to_json(), "torch": torch.__version__, "runs": records}
    if torch.cuda.is_available() and args.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
    for i, strategy in enumerate(args.strategies):
        later = len(args.strategies) - i - 1
        timeout = max(8.0, deadline - time.perf_counter() - args.reserve_s * later)
        print(f"-- {strategy} (timeout {timeout:.0f} s)", flush=True)
        records.append(run_strategy(strategy, s, timeout))
        write_json(args.json, out)  # after every strategy: a later hang loses nothing
    print()
    report(records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
