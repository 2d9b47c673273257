"""The LM example in a hand-written Lightning Fabric loop: the same data, model and config.

From the repository root (docs/fabric.md)::

    python examples/lm/fabric_train.py                                  # one process
    python examples/lm/fabric_train.py trainer.devices=2 strategy=deepspeed
    python examples/lm/fabric_train.py trainer.devices=8 strategy=fsdp  # on GPUs

``examples/lm/train.py`` is the Trainer's run; here :class:`~lightning_varbatch.TokenBudgetLoop`
drives the loop, and every key of ``examples/lm/conf/config.yaml`` applies, the Trainer's
groups as follows. ``strategy``: ``ddp`` is Fabric's DDP; ``deepspeed`` is
:class:`~lightning_varbatch.VarBatchFabricDeepSpeedStrategy` (``trainer.gradient_clip_val``
becomes DeepSpeed's ``gradient_clipping``); ``fsdp`` is Fabric's ``FSDPStrategy``, GPUs only
(on CPU it is refused with exit status 2). ``trainer``: ``max_steps``, ``max_epochs``,
``accumulate_grad_batches``, ``accelerator``, ``devices``, ``num_nodes``, ``precision``,
``gradient_clip_val``, ``log_every_n_steps``; validation runs once, after training.
``callbacks.lr_scaler`` / ``callbacks.throughput`` give the arguments of
:class:`~lightning_varbatch.BatchSizeLRRule` / :class:`~lightning_varbatch.TokenThroughputMeter`;
the other callbacks and ``logger`` are not used: logs go to a Fabric ``CSVLogger`` in
``<output_dir>/logs``. ``ckpt_path``: a ``<output_dir>/checkpoints/last.ckpt`` this script saved.
Without a Trainer, ``CausalLM.configure_optimizers`` has no ``max_steps`` to decay the LR to:
its schedule is the warmup, then constant. Rank 0 writes ``<output_dir>/metrics.json``.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("LIGHTNING_VARBATCH_CONF", str(ROOT / "conf"))  # the shared conf/ groups

import hydra  # noqa: E402
import torch  # noqa: E402
from lightning.fabric import Fabric  # noqa: E402
from lightning.fabric.loggers import CSVLogger  # noqa: E402
from lightning.fabric.strategies import FSDPStrategy  # noqa: E402
from omegaconf import DictConfig, OmegaConf  # noqa: E402
from torch import Tensor  # noqa: E402

from examples.common.building import instantiate, set_up_process  # noqa: E402
from examples.common.cli import check_overrides, run_entry  # noqa: E402
from examples.common.config_checks import ConfigError  # noqa: E402
from examples.common.summary import summary_of  # noqa: E402
from examples.lm.checks import check_config  # noqa: E402
from examples.lm.datamodule import build_datamodule  # noqa: E402
from examples.lm.train import RUN_TOTALS  # noqa: E402
from lightning_varbatch import (  # noqa: E402
    BatchSizeLRRule,
    TokenBudgetLoop,
    TokenThroughputMeter,
    VarBatchFabricDeepSpeedStrategy,
    keys,
)

CONF_DIR = Path(__file__).resolve().parent / "conf"

__all__ = ["CONF_DIR", "build_fabric", "main", "train"]


def build_fabric(cfg: DictConfig) -> Fabric:
    """Fabric for ``cfg.trainer`` with the Fabric equivalent of ``cfg.strategy``, launched.

    Raises:
        ConfigError: for ``strategy=fsdp`` on CPU or a strategy without a Fabric equivalent.

    Example:
        >>> fabric = build_fabric(cfg)  # doctest: +SKIP
        >>> type(fabric.strategy).__name__  # strategy=deepspeed  # doctest: +SKIP
        'VarBatchFabricDeepSpeedStrategy'
    """
    trainer, spec = cfg.trainer, cfg.strategy
    accelerator, devices = trainer.get("accelerator", "auto"), trainer.get("devices", 1)
    nodes, clip = int(trainer.get("num_nodes", 1)), trainer.get("gradient_clip_val")
    on_cpu = accelerator == "cpu" or (accelerator == "auto" and not torch.cuda.is_available())
    name = str(spec._target_).rsplit(".", 1)[-1]
    strategy: Any
    if "DeepSpeed" in name:
        if on_cpu:
            os.environ.setdefault("DS_ACCELERATOR", "cpu")  # before DeepSpeed is imported
        strategy = VarBatchFabricDeepSpeedStrategy(
            accumulate_grad_batches=int(trainer.accumulate_grad_batches),
            stage=int(spec.stage),
            offload_optimizer=bool(spec.offload_optimizer),
            offload_parameters=bool(spec.offload_parameters),
            cpu_shm_comm=bool(spec.get("cpu_shm_comm", False)),
        )
        if clip:  # Fabric's clip_gradients refuses DeepSpeed: the engine clips
            strategy.config["gradient_clipping"] = float(clip)
        if spec.offload_optimizer:  # as examples/common/building.py: no DeepSpeedCPUAdam build
            strategy.config["zero_force_ds_cpu_optimizer"] = False
    elif "FSDP" in name:
        if on_cpu:
            raise ConfigError(
                "strategy=fsdp: Lightning Fabric runs FSDP on GPUs only; on CPU use "
                "strategy=ddp or strategy=deepspeed (or examples/lm/train.py, whose Trainer "
                "FSDP runs on CPU)."
            )
        strategy = FSDPStrategy(
            sharding_strategy=spec.sharding_strategy,
            cpu_offload=bool(spec.cpu_offload),
            state_dict_type=spec.state_dict_type,
        )
    elif "DDP" in name:
        strategy = "auto" if devices in (1, "1") and nodes == 1 else "ddp"
    else:
        raise ConfigError(
            f"strategy: {spec._target_} has no Fabric equivalent here; use strategy=ddp, "
            "strategy=deepspeed or strategy=fsdp."
        )
    fabric = Fabric(
        accelerator=accelerator,
        devices=devices,
        num_nodes=nodes,
        strategy=strategy,
        precision=trainer.precision,
        loggers=CSVLogger(root_dir=cfg.output_dir, name="logs"),
    )
    fabric.launch()
    return fabric


def _rule_args(cfg: DictConfig, name: str) -> dict[str, Any] | None:
    """The arguments of ``callbacks.<name>``, or ``None`` when it is off."""
    spec = OmegaConf.to_container(cfg.callbacks.get(name) or {}, resolve=True)
    if not isinstance(spec, dict) or not spec or not spec.pop("enabled", True):
        return None
    return {str(k): v for k, v in spec.items() if k != "_target_"}


def _summed(fabric: Fabric, value: Tensor) -> Tensor:
    """``value`` summed over the ranks (a collective)."""
    summed = fabric.all_reduce(value, reduce_op="sum")
    assert isinstance(summed, Tensor)
    return summed


def validate(fabric: Fabric, model: Any, dm: Any) -> float:
    """The validation split's token-mean loss: each rank its share, summed over the ranks."""
    loader = dm.val_dataloader()
    loader.batch_sampler.set_distributed(fabric.global_rank, fabric.world_size)
    total = torch.zeros(2, dtype=torch.float64, device=fabric.device)
    model.eval()
    with torch.no_grad():
        for batch in fabric.setup_dataloaders(loader):
            loss_sum, ntokens = model.loss_sum(batch)
            total += torch.stack([loss_sum.double(), ntokens.double()])
    model.train()
    total = _summed(fabric, total)
    return float(total[0] / total[1])


def fit(fabric: Fabric, cfg: DictConfig, loop: TokenBudgetLoop, scheduler: Any) -> float:
    """Train to ``trainer.max_steps`` (or ``max_epochs``); the last logged step's loss."""
    model, (optimizer,) = loop.model, loop.optimizers
    max_steps, max_epochs = int(cfg.trainer.max_steps), int(cfg.trainer.get("max_epochs", -1))
    clip = cfg.trainer.get("gradient_clip_val")
    clip_here = bool(clip) and not isinstance(fabric.strategy, VarBatchFabricDeepSpeedStrategy)
    step_loss = torch.zeros((), dtype=torch.float64, device=fabric.device)
    last_loss, epoch = float("nan"), loop.epoch
    while loop.steps != max_steps and not 0 <= max_epochs <= epoch:
        for batch in loop.epoch_batches(epoch):
            loss_sum, _ = model.loss_sum(batch)
            loop.backward(loop.token_mean(loss_sum, batch))
            step_loss += loss_sum.detach()
            if clip_here and loop.at_boundary:
                fabric.clip_gradients(model, optimizer, max_norm=float(clip))
            if not loop.step():
                continue
            scheduler.step()
            if loop.steps % loop.log_every_n_steps == 0 or loop.steps == max_steps:
                # the step's exact token mean over every rank (a collective: all ranks log)
                last_loss = float(_summed(fabric, step_loss)) / int(batch[keys.STEP_NTOKENS])
                loss_log = {"train/loss": last_loss, "train/ppl": math.exp(last_loss)}
                fabric.log_dict(loss_log, step=loop.steps - 1)
            step_loss.zero_()
            if loop.steps == max_steps:
                break
        epoch += 1
    return last_loss


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, model and Fabric; train; save ``last.ckpt``; validate.

    Returns:
        ``train/loss`` (the last logged step's token mean over every rank), ``val/loss``,
        ``val/ppl``, ``steps``, ``steps_by_rank``, ``seconds``, the meter's totals
        (``train/run/...``, also under :data:`examples.lm.train.RUN_TOTALS`' names),
        ``world_size``, ``strategy``, ``checkpoint``, ``output_dir`` and the data summary
        (``data``); rank 0 also writes them to ``<output_dir>/metrics.json``.

    Raises:
        ConfigError: for a setting that cannot work (before anything is written).

    Example:
        >>> metrics = train(cfg)  # doctest: +SKIP
        >>> metrics["steps"] == cfg.trainer.max_steps  # doctest: +SKIP
        True
    """
    start = time.perf_counter()
    check_config(cfg)
    set_up_process(cfg)  # seed, CPU threads
    fabric = build_fabric(cfg)
    # one folder for every rank (a ${now:...} output_dir may differ between processes)
    output_dir = Path(fabric.broadcast(str(Path(cfg.output_dir).resolve())))
    dm, tokenizer, info = build_datamodule(cfg)
    model = instantiate("model", cfg.model, vocab_size=tokenizer.get_vocab_size(), _convert_="all")
    configured = model.configure_optimizers()
    # the scheduler on the torch optimizer, before setup (DeepSpeed's is not a torch Optimizer)
    scheduler = configured["lr_scheduler"]["scheduler"]
    model, optimizer = fabric.setup(model, configured["optimizer"])
    model.mark_forward_method("loss_sum")  # through DDP's / DeepSpeed's forward
    rule, meter = _rule_args(cfg, "lr_scaler"), _rule_args(cfg, "throughput")
    loop = TokenBudgetLoop(
        fabric.setup_dataloaders(dm.train_dataloader()),  # Fabric's defaults keep the sampler
        [optimizer],
        fabric=fabric,
        model=model,
        accumulate_grad_batches=int(cfg.trainer.accumulate_grad_batches),
        lr_rule=None if rule is None else BatchSizeLRRule(**rule),
        meter=None if meter is None else TokenThroughputMeter(**meter),
        log_every_n_steps=int(cfg.trainer.log_every_n_steps),
    )
    state = {"model": model, "optimizer": optimizer, "scheduler": scheduler, "loop": loop}
    if cfg.ckpt_path:
        fabric.load(cfg.ckpt_path, state)
    last_loss = fit(fabric, cfg, loop, scheduler)
    totals = loop.end()  # the meter's run totals (a collective)
    checkpoint = output_dir / "checkpoints" / "last.ckpt"
    fabric.save(checkpoint, state)  # at a step boundary: the loop's state is whole
    val = validate(fabric, model, dm)
    steps = fabric.all_gather(torch.tensor(loop.steps, device=fabric.device))
    assert isinstance(steps, Tensor)
    metrics: dict[str, Any] = {
        "output_dir": str(output_dir),
        "layout": cfg.layout,
        "strategy": type(fabric.strategy).__name__,
        "world_size": fabric.world_size,
        "steps": loop.steps,
        "steps_by_rank": {str(r): n for r, n in enumerate(steps.reshape(-1).tolist())},
        "train/loss": last_loss,
        "val/loss": val,
        "val/ppl": math.exp(val),
        **totals,
        **{name: totals[key] for name, key in RUN_TOTALS.items() if key in totals},
        "checkpoint": str(checkpoint),
        "data": info,
        "seconds": time.perf_counter() - start,
    }
    if fabric.is_global_zero:
        for logger in fabric.loggers:
            logger.finalize("success")  # CSVLogger writes metrics.csv
        (output_dir / "metrics.json").write_text(json.dumps(summary_of(metrics), indent=2))
        print(
            f"Done ({cfg.layout}, {metrics['strategy']}): {loop.steps} steps in "
            f"{metrics['seconds']:.0f}s on {fabric.world_size} process(es); train loss "
            f"{last_loss:.3f}, val loss {val:.3f}; metrics: {output_dir / 'metrics.json'}"
        )
    fabric.barrier()
    return metrics


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Command-line entry: ``python examples/lm/fabric_train.py [overrides]``."""
    run_entry(train, cfg)
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()  # before interpreter exit (gloo's threads)


if __name__ == "__main__":
    check_overrides(sys.argv, CONF_DIR)
    main()
