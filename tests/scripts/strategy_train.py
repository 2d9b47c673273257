"""One rank of a run on token-budgeted batches: ``strategy_train.py OUT STRATEGY [DS_CONFIG]``.

``--source hf`` (anywhere, see ``hf_source.py``): the same sequences as a Hugging Face
dataset, through ``TokenBudgetDataModule(ds, "tokens", ...)`` and the library's collate (each
micro-batch one Arrow read); the record then also says what the loader read.
``--source stream:DIR``: the same sequences as parquet shards in DIR (the test writes them),
streamed by ``StreamingDataModule`` (one window: the same guarantees, another loader).
``--length-warmup N`` (anywhere): the epoch planned with a length warm-up over its first N
optimizer steps (the cap from ``WARMUP_MIN``; list and ``hf`` sources), so the first steps hold
only short sequences; the record then holds the realised cap of every step (``caps``).
``--rank-shares a,b`` and ``--rank-max-tokens a,b`` (anywhere): a mixed cluster, each rank's
share of a step's work and its memory budget (list and ``hf`` sources); the record then holds
the shares and per-rank budgets the sampler planned with (``rank_shares``, ``rank_budgets``).

``--layout packed`` (anywhere, see ``packed_model.py``): the epoch planned with
``layout="packed"`` and ``loss_lengths = lengths - 1``, every micro-batch one padding-free row
of whole documents (``PackingCollate``), a causal attention model kept inside each document
(``document_attention``) and the next-token loss normalised by ``step_token_mean``.

Launched once per rank by ``tests.launch.launch`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* set),
so Lightning sees processes created externally and does not re-run this script itself. Writes
``OUT/rank<r>.json``: initial parameters, the full parameters after every optimizer step, the
micro-batches this rank trained on, and what the strategy configured. With a DeepSpeed config
(JSON) as third argument, a ValueError from ``Trainer.fit`` is recorded instead of raised.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import torch
from hf_source import (
    RecordingCollate,
    as_dataset,
    is_hf,
    is_stream,
    loader_evidence,
    pop_source,
)
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from lightning.pytorch.strategies import StrategyRegistry
from packed_model import (
    RecordingPackingCollate,
    make_packed_model,
    packed_loss_sum,
    pop_layout,
    row_record,
)
from strategy_common import (
    ACCUMULATE,
    DIM,
    LR,
    MAX_TOKENS,
    SEED,
    VOCAB,
    collate,
    loss_sum,
    make_model,
    make_sequences,
    pop_length_warmup,
    pop_per_rank,
    rank_settings,
    sequence_columns,
    warmup_settings,
)
from teardown import shutdown
from torch.utils.data import DataLoader, Dataset

from lightning_varbatch import (
    MicroBatch,
    StreamingDataModule,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    shards_from_files,
    token_budget_dataloader,
)
from lightning_varbatch.loss import step_token_mean, token_mean_loss
from lightning_varbatch.strategies import VarBatchDeepSpeedStrategy  # registers the names

STEPS = 3
DS_KEYS = (
    "train_micro_batch_size_per_gpu",
    "gradient_accumulation_steps",
    "train_batch_size",
    "timers",
)


class Sequences(Dataset[dict[str, Any]]):
    def __init__(self, sequences: list[list[int]]) -> None:
        self.sequences = sequences

    def __len__(self) -> int:
        return len(self.sequences)

    def __getitem__(self, index: int) -> dict[str, Any]:
        raise TypeError("batches are fetched whole, through __getitems__")

    def __getitems__(self, batch: MicroBatch) -> list[dict[str, Any]]:
        # The DataLoader passes the batch sampler's MicroBatch through: its plan bookkeeping
        # (step, micro, step_ntokens) travels with every example.
        return [
            {
                "id": i,
                "tokens": self.sequences[i],
                "step": batch.step,
                "micro": batch.micro,
                "step_ntokens": batch.step_ntokens,
            }
            for i in batch
        ]


def full_params(trainer: Trainer, module: torch.nn.Module) -> dict[str, list[Any]]:
    """Every rank's view of the whole, unsharded parameters (a collective under sharding)."""
    strategy = trainer.strategy
    context: Any
    if type(strategy).__name__ == "VarBatchFSDPStrategy":
        from torch.distributed.fsdp import FullyShardedDataParallel

        context = FullyShardedDataParallel.summon_full_params(strategy.model)
    elif getattr(strategy, "zero_stage_3", False):
        import deepspeed

        context = deepspeed.zero.GatheredParameters(list(module.parameters()))
    else:
        from contextlib import nullcontext

        context = nullcontext()
    with context:
        return {n: p.detach().double().tolist() for n, p in module.named_parameters()}


class Model(LightningModule):
    """The model; its data comes from a datamodule (``--source hf``) or :class:`ListModel`."""

    def __init__(self, layout: str = "padded") -> None:
        super().__init__()
        self.packed = layout == "packed"
        self.net = make_packed_model(VOCAB, DIM, MAX_TOKENS, SEED) if self.packed else make_model()
        self.micro_batches: list[dict[str, Any]] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        trainer = self.trainer
        if self.packed:
            summed = packed_loss_sum(self.net, batch)
        else:
            summed = loss_sum(self.net, batch["tokens"])
        record = {
            "batch_idx": batch_idx,
            "global_step": trainer.global_step,
            "step": batch["step"],
            "micro": batch["micro"],
            "ids": batch["ids"],
            "ntokens": int(batch["ntokens"]),
            "step_ntokens": int(batch["step_ntokens"]),
        }
        if "collated_from" in batch:
            record["collated_from"] = batch["collated_from"]
        if self.packed:
            record.update(row_record(batch))
            self.micro_batches.append(record)
            return step_token_mean(summed, batch, trainer)
        self.micro_batches.append(record)
        return token_mean_loss(
            summed, batch["step_ntokens"], trainer.world_size, trainer.accumulate_grad_batches
        )

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=LR)


class ListModel(Model):
    """The sequences as a Python list, through the sampler, a torch DataLoader and ``collate``."""

    def __init__(
        self,
        sequences: list[list[int]],
        layout: str = "padded",
        warmup: int | None = None,
        ranks: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(layout)
        self.sequences = sequences
        self.warmup = {**warmup_settings(warmup), **(ranks or {})}

    def train_dataloader(self) -> DataLoader[dict[str, Any]]:
        lengths = [len(s) for s in self.sequences]
        if self.packed:
            # One packed row per micro-batch; a document of n tokens has n - 1 labels.
            packed = TokenBudgetBatchSampler(
                lengths,
                MAX_TOKENS,
                layout="packed",
                loss_lengths=[n - 1 for n in lengths],
                rank=self.trainer.global_rank,
                world_size=self.trainer.world_size,
                accumulate_grad_batches=self.trainer.accumulate_grad_batches,
                seed=0,
                **self.warmup,
            )
            items = [{"id": i, "tokens": s} for i, s in enumerate(self.sequences)]
            return token_budget_dataloader(items, packed, collate_fn=RecordingPackingCollate())
        sampler = TokenBudgetBatchSampler(
            lengths,
            MAX_TOKENS,
            rank=self.trainer.global_rank,
            world_size=self.trainer.world_size,
            accumulate_grad_batches=self.trainer.accumulate_grad_batches,
            seed=0,
            **self.warmup,
        )
        return DataLoader(Sequences(self.sequences), batch_sampler=sampler, collate_fn=collate)


def hf_datamodule(
    source: str,
    layout: str = "padded",
    warmup: int | None = None,
    ranks: dict[str, Any] | None = None,
) -> TokenBudgetDataModule:
    """The same sequences as a Hugging Face dataset, planned from its ``tokens`` column."""
    settings = {**warmup_settings(warmup), **(ranks or {})}
    if layout == "packed":
        columns = sequence_columns()
        return TokenBudgetDataModule(
            as_dataset(columns, source),
            "tokens",
            MAX_TOKENS,
            layout="packed",
            train_loss_lengths=[len(t) - 1 for t in columns["tokens"]],
            collate=RecordingPackingCollate(),
            seed=0,
            **settings,
        )
    return TokenBudgetDataModule(
        as_dataset(sequence_columns(), source),
        "tokens",
        MAX_TOKENS,
        collate=RecordingCollate(),
        seed=0,
        **settings,
    )


def stream_datamodule(source: str) -> StreamingDataModule:
    """The same sequences as parquet shards (written by the test), streamed in one window."""
    shards = shards_from_files(source.split(":", 1)[1], "tokens", cache_dir=None)
    return StreamingDataModule(
        shards, MAX_TOKENS, window=shards.num_rows, collate=RecordingCollate(), seed=0
    )


class Snapshots(Callback):
    """The full parameters after every optimizer step (the step counter moved)."""

    def __init__(self) -> None:
        self.params: dict[int, dict[str, list[Any]]] = {}
        self.seen = 0

    def on_train_batch_end(self, trainer: Trainer, pl_module: LightningModule, *args: Any) -> None:
        if trainer.global_step != self.seen:
            self.seen = trainer.global_step
            self.params[trainer.global_step] = full_params(trainer, pl_module.net)


def make_strategy(name: str, config: dict[str, Any] | None) -> Any:
    if config is not None:
        return VarBatchDeepSpeedStrategy(config=config)
    if name.endswith("_offload"):
        # ZeRO-Offload refuses a client optimizer other than DeepSpeedCPUAdam (a JIT-compiled op)
        # unless told otherwise; plain SGD keeps the update comparable and the test fast.
        strategy = StrategyRegistry.get(name)
        strategy.config["zero_force_ds_cpu_optimizer"] = False
        return strategy
    return name


def train(out: Path, args: list[str]) -> dict[str, Any]:
    """One run on this rank; ``args``: the command line after OUT. Returns the rank's record.

    ``out`` is unused (the record is returned); it keeps the signature of the other phases
    (``strategy_phases.py``).
    """
    del out
    argv = list(args)
    source = pop_source(argv)
    layout = pop_layout(argv)
    warmup = pop_length_warmup(argv)
    ranks = rank_settings(
        pop_per_rank(argv, "--rank-shares", float), pop_per_rank(argv, "--rank-max-tokens", int)
    )
    name = argv[0]
    config = json.loads(argv[1]) if len(argv) > 1 else None
    rank = int(os.environ["RANK"])
    seed_everything(0, verbose=False)
    model: Model
    datamodule: TokenBudgetDataModule | StreamingDataModule | None = None
    if is_stream(source):
        if warmup is not None or ranks:
            raise SystemExit("--length-warmup, --rank-*: list and hf sources only")
        model, datamodule = Model(layout), stream_datamodule(source)
    elif is_hf(source):
        model, datamodule = Model(layout), hf_datamodule(source, layout, warmup, ranks)
    else:
        model = ListModel(make_sequences(), layout, warmup, ranks)
    init = {n: p.detach().double().tolist() for n, p in model.net.named_parameters()}
    snapshots = Snapshots()
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy=make_strategy(name, config),
        use_distributed_sampler=False,
        accumulate_grad_batches=ACCUMULATE,
        max_steps=STEPS,
        callbacks=[snapshots],
        enable_checkpointing=False,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    try:
        trainer.fit(model, datamodule=datamodule)
    except ValueError as error:
        if config is None:
            raise
        # A bad DeepSpeed config is the scenario under test: record what the user would see.
        return {"rank": rank, "error": str(error)}
    strategy = trainer.strategy
    ds_config = getattr(strategy, "config", None) or {}
    record = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "strategy": type(strategy).__name__,
        "global_step": trainer.global_step,
        "init": init,
        "params": {str(k): v for k, v in snapshots.params.items()},
        "micro_batches": model.micro_batches,
        "deepspeed_config": {k: ds_config[k] for k in DS_KEYS if k in ds_config},
        "source": source,
        "layout": layout,
        "length_warmup": warmup,
    }
    sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
    trace = getattr(getattr(sampler, "plan", None), "length_warmup", None)
    if trace is not None:  # the realised cap of every step the run trained
        record["caps"] = [trace.cap_at(s) for s in range(STEPS)]
    if ranks:  # what the plan was made with
        record["rank_shares"] = getattr(sampler, "rank_shares", None)
        record["rank_budgets"] = getattr(sampler, "rank_budgets", None)
    if is_hf(source):
        record["loader"] = loader_evidence(trainer.train_dataloader)
    return record


def main() -> None:
    out = Path(sys.argv[1])  # tests.launch.launch puts OUT first
    record = train(out, sys.argv[2:])
    (out / f"rank{record['rank']}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
