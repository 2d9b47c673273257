"""WorstBatchCheck on one CUDA GPU: its measured peaks against a real training epoch's.

A causal Transformer LM (``benchmarks.gpu.strategies.make_net``: pre-norm blocks, causal SDPA,
tied embeddings) trains one epoch of ``TokenBudgetDataModule`` micro-batches (lognormal
lengths with a long tail, ``PaddingCollate(loss_offset=1)``, ``step_token_mean``, AdamW,
``bf16-mixed``, ``accelerator="gpu", devices=1``) with the library's ``WorstBatchCheck``
(every kind: ``padded_tokens``, ``examples``, ``attention``) in the callbacks. The check runs
its worst micro-batches in ``on_train_start`` and reports each one's peak
(``torch.cuda.max_memory_allocated`` after a reset, source ``cuda_max_allocated``). During the
epoch a probe callback measures every micro-batch the same way: the peak over forward +
backward (reset in ``on_train_batch_start``, read in ``on_after_backward``) and over the whole
batch with the optimizer step (read in ``on_train_batch_end``), and the memory allocated when
the batch starts.

Reported: the check's largest peak and its micro-batches (position, examples x longest); the
epoch's largest forward + backward peak, which micro-batch had it, and whether the check ran
that micro-batch (``picked_the_peak``: same position, or the same shape); the ratio of the
two peaks; the same comparison on the rises above the memory allocated before each run
(the check runs before the optimizer's state exists, so absolute peaks differ by it: its
bytes are reported as ``optimizer_state_bytes``).

Run from the repository root on a machine with one CUDA GPU::

    python -m benchmarks.gpu.worst_batch --json gpu_worst_batch.json   # ~15 s on a GPU
    python -m benchmarks.gpu.worst_batch --device cpu --tiny           # smoke test on CPU

On CPU the figures are the process's resident-set high-water marks (``VmHWM``), as the check's
own CPU source: they only show that every path runs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from benchmarks.gpu.strategies import (
    StrategySettings,
    loss_sum,
    make_items,
    make_lengths,
    make_net,
)
from benchmarks.harness import command_line, print_table, proc_kib, reset_hwm, write_json

MODULE = "benchmarks.gpu.worst_batch"

DEFAULTS = StrategySettings(
    max_tokens=16384,
    vocab=16000,
    d_model=768,
    nhead=12,
    layers=4,
    ffn=3072,
    lr=3e-4,
    device="cuda",
    bf16=True,
    docs=2500,
    median_length=120,
    longest=2048,
    accumulate=1,
    grad_check=False,
    threads=4,
)

TINY = replace(
    DEFAULTS,
    max_tokens=1024,
    vocab=64,
    d_model=32,
    nhead=2,
    layers=1,
    ffn=64,
    docs=400,
    median_length=20,
    longest=128,
    threads=1,
    bf16=False,
)


class Memory:
    """Peak memory: CUDA's allocator figures, or the process's RSS high-water mark on CPU."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda

    def reset(self) -> None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        else:
            reset_hwm()

    def allocated(self) -> int | None:
        if self.cuda:
            import torch

            return int(torch.cuda.memory_allocated())
        kib = proc_kib("VmRSS")
        return None if kib is None else kib * 1024

    def peak(self) -> int | None:
        if self.cuda:
            import torch

            torch.cuda.synchronize()
            return int(torch.cuda.max_memory_allocated())
        kib = proc_kib("VmHWM")
        return None if kib is None else kib * 1024


def run(s: StrategySettings) -> dict[str, Any]:
    """One epoch with WorstBatchCheck and the probe; the comparison."""
    import torch
    from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything

    from lightning_varbatch import (
        PaddingCollate,
        TokenBudgetDataModule,
        WorstBatchCheck,
        step_token_mean,
    )

    cuda = s.device.startswith("cuda")
    memory = Memory(cuda)
    seed_everything(s.seed, verbose=False)
    lengths = make_lengths(s.docs, s.median_length, s.longest, s.seed)
    items = make_items(lengths, s.vocab, s.seed)

    class Module(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = make_net(s, math_attention=False)

        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            return step_token_mean(loss_sum(self.net, batch), batch, self.trainer)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.AdamW(self.parameters(), lr=s.lr)

    class Probe(Callback):
        def __init__(self) -> None:
            self.before_check: int | None = None
            self.rows: list[dict[str, Any]] = []

        def on_train_start(self, trainer: Any, pl_module: Any) -> None:
            self.before_check = memory.allocated()  # runs before WorstBatchCheck's hook

        def on_train_batch_start(
            self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int
        ) -> None:
            memory.reset()
            tokens = batch["tokens"]
            self.rows.append(
                {
                    "position": batch_idx,
                    "examples": int(tokens.shape[0]),
                    "longest": int(tokens.shape[1]),
                    "start_allocated": memory.allocated(),
                }
            )

        def on_after_backward(self, trainer: Any, pl_module: Any) -> None:
            self.rows[-1]["fb_peak"] = memory.peak()

        def on_train_batch_end(
            self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int
        ) -> None:
            self.rows[-1]["step_peak"] = memory.peak()

    probe = Probe()
    check = WorstBatchCheck(verbose=True)
    datamodule = TokenBudgetDataModule(
        items,
        lengths,
        s.max_tokens,
        train_loss_lengths=lengths - 1,
        collate=PaddingCollate(loss_offset=1),
        seed=s.seed,
    )
    trainer = Trainer(
        accelerator="gpu" if cuda else "cpu",
        devices=1,
        precision="bf16-mixed" if s.bf16 else "32-true",
        use_distributed_sampler=False,
        max_epochs=1,
        callbacks=[probe, check],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    module = Module()
    t0 = time.perf_counter()
    trainer.fit(module, datamodule=datamodule)
    seconds = time.perf_counter() - t0
    state = trainer.optimizers[0].state.values()
    optimizer_bytes = sum(
        t.numel() * t.element_size() for st in state for t in st.values() if torch.is_tensor(t)
    )
    return compare(check.report, probe.rows, probe.before_check, optimizer_bytes, seconds)


def compare(
    report: list[dict[str, Any]],
    rows: list[dict[str, Any]],
    before_check: int | None,
    optimizer_bytes: int,
    seconds: float,
) -> dict[str, Any]:
    """The check's peaks against the epoch's."""
    measured = [r for r in rows if r.get("fb_peak") is not None]
    top = max(measured, key=lambda r: r["fb_peak"]) if measured else None
    check_peak = max((r["peak_bytes"] or 0 for r in report), default=0)
    picked_positions = {int(r["position"]) for r in report}
    picked_shapes = {(int(r["examples"]), int(r["longest"])) for r in report}
    rises = [r["fb_peak"] - r["start_allocated"] for r in measured if r["start_allocated"]]
    train_rise = max(rises, default=None)
    check_rise = check_peak - before_check if before_check is not None else None
    by_peak = sorted(measured, key=lambda r: -r["fb_peak"])
    rank_of = {int(m["position"]): i + 1 for i, m in enumerate(by_peak)}
    ranks = {int(r["position"]): rank_of.get(int(r["position"])) for r in report}
    return {
        "seconds": seconds,
        "micro_batches": len(rows),
        "check": report,
        "check_max_peak_bytes": check_peak,
        "train_max_fb_peak_bytes": top["fb_peak"] if top else None,
        "train_max_step_peak_bytes": max((r.get("step_peak") or 0 for r in rows), default=None),
        "train_peak_batch": top,
        "picked_the_peak": bool(top)
        and (
            top["position"] in picked_positions  # type: ignore[index]
            or (top["examples"], top["longest"]) in picked_shapes  # type: ignore[index]
        ),
        "check_over_train_peak": check_peak / top["fb_peak"] if top and top["fb_peak"] else None,
        "check_rise_bytes": check_rise,
        "train_max_rise_bytes": train_rise,
        "check_over_train_rise": check_rise / train_rise if check_rise and train_rise else None,
        "check_positions_rank_in_epoch": ranks,
        "optimizer_state_bytes": optimizer_bytes,
        "rows": rows,
    }


def mib(x: int | None) -> str:
    return "-" if x is None else f"{x / 2**20:.0f}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="WorstBatchCheck on a GPU (module docstring).")
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="tiny model and data: smoke test")
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu_worst_batch: no CUDA device; use --device cpu --tiny on CPU")
        return 2
    s = replace(TINY if args.tiny else DEFAULTS, device=args.device)
    torch.set_num_threads(s.threads)
    print("command:", command_line(MODULE, argv))
    print("settings:", s.to_json())
    out = run(s)
    out["settings"] = s.to_json()
    out["torch"] = torch.__version__
    if s.device.startswith("cuda"):
        out["gpu"] = torch.cuda.get_device_name(0)
    write_json(args.json, out)
    print()
    print_table(
        ["kind", "position", "examples x longest", "peak MiB", "rank in epoch"],
        [
            [
                str(r["kind"]),
                str(r["position"]),
                f"{r['examples']} x {r['longest']}",
                mib(r["peak_bytes"]),
                str(out["check_positions_rank_in_epoch"].get(int(r["position"]), "-")),
            ]
            for r in out["check"]
        ],
    )
    top = out["train_peak_batch"] or {}
    print(
        f"\nepoch: {out['micro_batches']} micro-batches in {out['seconds']:.1f} s; largest "
        f"forward+backward peak {mib(out['train_max_fb_peak_bytes'])} MiB at micro-batch "
        f"{top.get('position')} ({top.get('examples')} x {top.get('longest')}); with the "
        f"optimizer step {mib(out['train_max_step_peak_bytes'])} MiB; optimizer state "
        f"{mib(out['optimizer_state_bytes'])} MiB"
    )
    print(
        f"check: largest peak {mib(out['check_max_peak_bytes'])} MiB "
        f"(x{out['check_over_train_peak'] or float('nan'):.3f} of the epoch's); rise above "
        f"allocated {mib(out['check_rise_bytes'])} MiB vs the epoch's "
        f"{mib(out['train_max_rise_bytes'])} MiB; picked the peaking micro-batch: "
        f"{out['picked_the_peak']}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
