"""One rank of the Fabric runs: ``fabric_train.py OUT STRATEGY MODE [CKPT]``.

A hand-written Fabric loop over ``TokenBudgetDataModule.train_dataloader()`` handed to
``fabric.setup_dataloaders`` with Fabric's defaults, driven by ``TokenBudgetLoop`` with the LR
rule (linear, a fixed reference) under a ``LambdaLR`` schedule and the throughput meter.
``STRATEGY``: ``ddp`` or ``deepspeed`` (``VarBatchFabricDeepSpeedStrategy``, ZeRO 2); Fabric
refuses its FSDP on CPU ("FSDP is only available on GPU", ``lightning/fabric/connector.py``).

Modes (every rank writes ``OUT/<mode>_rank<r>.json``):

- ``killed``: the bad inputs first (each refused, its message recorded), then an uninterrupted
  run of ``STEPS`` optimizer steps (``reference``: initial and per-step parameters, each
  micro-batch's ids and step, the LR the scheduler gave and the factor the rule applied), then
  the same run saving ``OUT/ckpt`` with ``fabric.save`` after step ``SAVE_AT``; in step
  ``SAVE_AT + 1`` the rank SIGKILLs itself.
- ``resume CKPT``: a new run that loads ``CKPT`` with ``fabric.load`` and trains to ``STEPS``:
  the ids it trained and the final parameters.
- ``rest CKPT``: the same, but it trains the rest of the checkpoint's epoch only (run on
  another world size).
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import torch
from fabric_common import REFERENCE, SAVE_AT, STEPS, decay
from lightning.fabric import Fabric
from strategy_common import ACCUMULATE, LR, MAX_TOKENS, loss_sum, make_model, make_sequences
from teardown import shutdown
from torch.utils.data import DataLoader

from lightning_varbatch import (
    BatchSizeLRRule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    TokenBudgetLoop,
    TokenThroughputMeter,
    VarBatchFabricDeepSpeedStrategy,
    keys,
)


class Records:
    """A logger that keeps what the rules log (rank 0 only logs)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.rows.append({"step": step, **metrics})


def datamodule() -> TokenBudgetDataModule:
    items = [{"id": i, "tokens": s} for i, s in enumerate(make_sequences())]
    return TokenBudgetDataModule(items, [len(s) for s in make_sequences()], MAX_TOKENS, seed=0)


def make_fabric(strategy: str) -> Fabric:
    world = int(os.environ["WORLD_SIZE"])
    chosen: Any = strategy
    if strategy == "deepspeed":
        chosen = VarBatchFabricDeepSpeedStrategy(accumulate_grad_batches=ACCUMULATE, stage=2)
    fabric = Fabric(accelerator="cpu", devices=world, strategy=chosen, loggers=[Records()])
    fabric.launch()
    return fabric


def params(model: torch.nn.Module) -> dict[str, list[Any]]:
    """The parameters by the user module's names (a Fabric module's ``.module``)."""
    module = getattr(model, "module", model)
    return {n: p.detach().double().tolist() for n, p in module.named_parameters()}


def bad_inputs(fabric: Fabric) -> dict[str, str]:
    """Each misuse, refused with its message (the Trainer path's vocabulary)."""
    refused: dict[str, str] = {}
    seqs = make_sequences()
    sampler = TokenBudgetBatchSampler([len(s) for s in seqs], MAX_TOKENS, seed=0)
    plain = DataLoader(list(range(len(seqs))), batch_sampler=sampler)
    attempts = {
        # Fabric re-creates a plain DataLoader's batch sampler to inject a DistributedSampler
        "sampler_injected": lambda: fabric.setup_dataloaders(plain),
        "not_token_budget": lambda: TokenBudgetLoop(DataLoader(seqs, batch_size=2)),
    }
    # a loader planned for accumulation 1 (no loop set it), in a loop that accumulates 2
    loader = fabric.setup_dataloaders(datamodule().train_dataloader())
    batch = next(iter(loader))
    attempts["accumulation_mismatch"] = lambda: loop_token_mean_wrong(batch, fabric)
    for name, attempt in attempts.items():
        try:
            attempt()
        except (TypeError, ValueError, RuntimeError) as error:
            refused[name] = f"{type(error).__name__}: {error}"
    return refused


def loop_token_mean_wrong(batch: dict[str, Any], fabric: Fabric) -> None:
    from lightning_varbatch import loop_token_mean

    loop_token_mean(torch.tensor(1.0), batch, ACCUMULATE, fabric.world_size)


def run(fabric: Fabric, out: Path, mode: str, ckpt: str | None) -> dict[str, Any]:
    torch.manual_seed(0)
    model = make_model()
    init = params(model)
    raw = torch.optim.SGD(model.parameters(), lr=LR)
    scheduler = torch.optim.lr_scheduler.LambdaLR(raw, decay)  # on the torch optimizer (ZeRO's)
    model, optimizer = fabric.setup(model, raw)
    dm = datamodule()
    loader = fabric.setup_dataloaders(dm.train_dataloader())
    rule, meter = BatchSizeLRRule(rule="linear", reference=REFERENCE), TokenThroughputMeter()
    loop = TokenBudgetLoop(
        loader,
        [optimizer],
        fabric=fabric,
        model=model,
        accumulate_grad_batches=ACCUMULATE,
        lr_rule=rule,
        meter=meter,
        log_every_n_steps=2,
    )
    if ckpt is not None:
        state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loop": loop}
        fabric.load(ckpt, state)
    micro: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    snapshots: dict[int, dict[str, list[Any]]] = {}
    for epoch in itertools.count(loop.epoch):
        if loop.steps == STEPS and mode != "rest":
            break
        for batch in loop.epoch_batches(epoch):
            if mode == "killed" and loop.steps == SAVE_AT + 1:
                os.kill(os.getpid(), signal.SIGKILL)  # mid-epoch, after the checkpoint
            micro.append({"ids": batch["id"].tolist(), "step": loop.steps})
            loop.backward(loop.token_mean(loss_sum(model, batch["tokens"]), batch))
            lr = raw.param_groups[0]["lr"]
            if loop.step():
                ntokens = int(batch[keys.STEP_NTOKENS])
                steps.append({"lr": lr, "scale": rule.last_scale, "step_ntokens": ntokens})
                scheduler.step()
                snapshots[loop.steps - 1] = params(model)
                if mode == "killed" and ckpt is None and loop.steps == SAVE_AT:
                    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler}
                    fabric.save(out / "ckpt", {**state, "loop": loop})
            if loop.steps == STEPS and mode != "rest":
                break
        if mode == "rest":  # only the rest of the resumed epoch
            break
    totals = loop.end()
    logged = fabric.loggers[0].rows if fabric.is_global_zero else []
    return {
        "init": init,
        "params": {str(k): v for k, v in snapshots.items()},
        "final": params(model),
        "micro_batches": micro,
        "steps": steps,
        "logged": logged,
        "totals": totals,
    }


def main() -> None:
    out, strategy, mode = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    ckpt = sys.argv[4] if len(sys.argv) > 4 else None
    fabric = make_fabric(strategy)
    record: dict[str, Any] = {"rank": fabric.global_rank, "world_size": fabric.world_size}
    if mode == "killed":
        record["refused"] = bad_inputs(fabric)
        record["reference"] = run(fabric, out, "reference", None)
        (out / f"reference_rank{fabric.global_rank}.json").write_text(json.dumps(record))
        run(fabric, out, "killed", None)  # never returns: SIGKILL in step SAVE_AT + 1
    record["resumed"] = run(fabric, out, mode, ckpt)
    (out / f"rank{fabric.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
