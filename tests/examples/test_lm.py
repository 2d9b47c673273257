"""The language-model example (``examples/lm``): packed and padded layouts.

* a few training steps of each layout through ``train(cfg)``: finite, falling loss and a
  ``metrics.json``;
* the model's summed token loss (and its gradients) over a packed row equals that of the same
  documents padded, in float64: switching ``layout`` does not change what is optimised;
* every training document is trained exactly once per epoch in packed mode (one and two
  ranks);
* every ``layout`` x ``strategy`` composes with Hydra and builds what ``train()`` builds;
* documents cut by ``data.oversize=truncate`` keep exact loss counts in both layouts.
"""

from __future__ import annotations

import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate
from omegaconf import DictConfig, open_dict

from examples.common.building import build_callbacks, build_logger, build_strategy
from examples.common.config_checks import ConfigError
from examples.lm.checks import LAYOUTS, check_config
from examples.lm.datamodule import build_datamodule, flop_model
from examples.lm.model import CausalLM
from examples.lm.train import CONF_DIR, train
from lightning_varbatch import (
    PackingCollate,
    PaddingCollate,
    TokenBudgetBatchSampler,
    token_budget_dataloader,
)

STRATEGIES = ("ddp", "fsdp", "deepspeed")
TINY = [
    "data.num_docs=400",
    "data.valid=40",
    "data.vocab_size=300",
    "data.max_length=64",
    "data.max_tokens=512",
    "model.d_model=32",
    "model.nhead=2",
    "model.num_layers=1",
    "model.dim_feedforward=64",
    "model.lr=1.0e-2",
    "model.warmup_steps=2",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "trainer.log_every_n_steps=1",
    "callbacks.checkpoint.enabled=false",
]


def make(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def _train_losses(log_dir: str) -> list[float]:
    with open(Path(log_dir) / "metrics.csv", newline="") as f:
        return [float(row["train/loss"]) for row in csv.DictReader(f) if row.get("train/loss")]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_short_run_learns_and_writes_metrics(
    layout: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)  # train() sets it (cpu_threads=1)
    steps = 16
    cfg = make(
        *TINY,
        f"layout={layout}",
        f"trainer.max_steps={steps}",
        f"trainer.val_check_interval={steps}",
        f"output_dir={tmp_path}",
    )
    metrics = train(cfg)
    assert metrics["global_step"] == steps and metrics["layout"] == layout
    losses = _train_losses(metrics["log_dir"])
    assert len(losses) == steps and all(math.isfinite(x) for x in losses)
    assert sum(losses[-4:]) / 4 < sum(losses[:4]) / 4 - 0.3, losses
    assert math.isfinite(metrics["val/loss"])
    assert metrics["val/ppl"] == pytest.approx(math.exp(metrics["val/loss"]), rel=1e-5)
    assert metrics["tokens_per_sec"] > 0 and metrics["train_seconds"] > 0
    assert metrics["loss_tokens"] < metrics["input_tokens"] <= metrics["padded_tokens"]
    if layout == "packed":  # no padding but the row alignment (pad_to_multiple_of=1: none)
        assert metrics["padding_efficiency"] == 1.0
        assert metrics["data"]["flop_attention"] > 0
    saved = json.loads((tmp_path / "metrics.json").read_text())
    assert saved["layout"] == layout and saved["global_step"] == steps
    assert saved["val/loss"] == pytest.approx(metrics["val/loss"])
    assert (tmp_path / "tokenizer.json").exists()
    # without ModelCheckpoint (TINY disables it) the finished run's state is still saved, and
    # metrics.json names it: a requeued job resumes from there instead of starting over
    last = tmp_path / "checkpoints" / "last.ckpt"
    assert saved["checkpoint"] == str(last) and saved["trained"] is True
    assert torch.load(last, map_location="cpu", weights_only=True)["global_step"] == steps


def _documents() -> list[dict[str, list[int]]]:
    generator = torch.Generator().manual_seed(0)
    lengths = [2, 17, 5, 31, 9, 3, 24]  # a 2-token document has a single prediction
    return [
        {"tokens": [1, *torch.randint(4, 60, (n - 2,), generator=generator).tolist(), 2]}
        for n in lengths
    ]


def test_packed_and_padded_give_the_same_loss_and_gradients() -> None:
    torch.manual_seed(0)
    model = CausalLM(
        vocab_size=60, d_model=32, nhead=4, num_layers=2, dim_feedforward=64, dropout=0.0
    ).double()
    docs = _documents()
    # alignment padding in both layouts: the packed row's tail and every padded row
    packed = PackingCollate(pad_to_multiple_of=8)(docs)
    padded = PaddingCollate(pad_to_multiple_of=8, loss_offset=1)(docs)
    assert packed["input_ids"].shape[1] > packed["cu_seqlens"][-1]  # there is row padding

    def loss_and_grads(
        batch: dict[str, Any],
    ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        model.zero_grad()
        params = list(model.parameters())
        loss, ntokens = model.loss_sum(batch)
        loss.backward()
        grads = [torch.zeros_like(p) if p.grad is None else p.grad.clone() for p in params]
        return loss.detach(), ntokens, grads

    loss_packed, n_packed, grads_packed = loss_and_grads(packed)
    loss_padded, n_padded, grads_padded = loss_and_grads(padded)
    expected = sum(len(d["tokens"]) - 1 for d in docs)
    assert int(n_packed) == int(n_padded) == int(packed["ntokens"]) == expected
    torch.testing.assert_close(loss_packed, loss_padded, rtol=0, atol=1e-6)
    for got, want in zip(grads_packed, grads_padded, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # ... and both equal the documents one at a time
    with torch.no_grad():
        alone = sum(float(model.loss_sum(PaddingCollate(loss_offset=1)([d]))[0]) for d in docs)
    assert float(loss_packed) == pytest.approx(alone, abs=1e-6)


@pytest.fixture(scope="module")
def packed_datamodule() -> tuple[DictConfig, tuple[Any, Any, dict[str, Any]]]:
    cfg = make(*TINY, "layout=packed", "data.max_tokens=256")
    return cfg, build_datamodule(cfg)


@pytest.mark.parametrize("world_size", [1, 2])
def test_packed_epochs_train_every_document_once(
    packed_datamodule: tuple[DictConfig, tuple[Any, Any, dict[str, Any]]], world_size: int
) -> None:
    cfg, (dm, _, info) = packed_datamodule
    dataset = dm.datasets["train"]
    planner = dm.planner("train")
    orders = []
    for epoch in (0, 1):
        seen: list[int] = []
        for rank in range(world_size):
            sampler = TokenBudgetBatchSampler.from_planner(
                planner, rank=rank, world_size=world_size, accumulate_grad_batches=1
            )
            sampler.set_epoch(epoch)
            for batch in token_budget_dataloader(dataset, sampler, collate_fn=dm.collate):
                real = int(batch["cu_seqlens"][-1])
                assert batch["input_ids"].shape == (1, real)  # one row, no padding
                assert real <= cfg.data.max_tokens
                assert int(batch["ntokens"]) == real - len(batch["id"])
                seen += batch["id"].tolist()
        assert sorted(seen) == list(range(info["train_docs"])), "a document missing or repeated"
        orders.append(seen)
    assert orders[0] != orders[1]  # reshuffled every epoch


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_layout_and_strategy_builds(layout: str, strategy: str, tmp_path: Path) -> None:
    cfg = make(*TINY, f"layout={layout}", f"strategy={strategy}", f"output_dir={tmp_path}")
    check_config(cfg)
    with open_dict(cfg):
        cfg.trainer.devices = 2
    built = build_strategy(cfg)
    assert (
        type(built).__name__
        == {
            "ddp": "DDPStrategy",
            "fsdp": "VarBatchFSDPStrategy",
            "deepspeed": "VarBatchDeepSpeedStrategy",
        }[strategy]
    )
    names = {type(c).__name__ for c in build_callbacks(cfg)}
    assert {"BatchSizeLRScaler", "TokenThroughputMonitor", "PreemptionCheckpoint"} <= names
    assert type(build_logger(cfg)).__name__ == "CSVLogger"


@pytest.mark.parametrize("layout", LAYOUTS)
def test_each_layout_builds_its_data_and_model(layout: str, tmp_path: Path) -> None:
    cfg = make(*TINY, f"layout={layout}", f"output_dir={tmp_path}")
    dm, tokenizer, info = build_datamodule(cfg)
    collate = {"packed": PackingCollate, "padded": PaddingCollate}[layout]
    assert isinstance(dm.collate, collate)
    assert dm.planner("train").config.layout == layout
    model = instantiate(cfg.model, vocab_size=tokenizer.get_vocab_size(), _convert_="all")
    assert isinstance(model, CausalLM)
    batch = next(iter(dm.val_dataloader()))
    with torch.no_grad():
        loss, ntokens = model.loss_sum(batch)
    assert math.isfinite(float(loss)) and int(ntokens) == int(batch["ntokens"])
    if layout == "packed":
        want = flop_model(cfg.model, tokenizer.get_vocab_size()).flop_attention
        assert dm.planner("train").config.flop_attention == pytest.approx(want)
        assert info["flop_attention"] == pytest.approx(want)


def test_defaults_compose_from_the_shared_groups() -> None:
    cfg = make()
    assert cfg.layout == "packed" and cfg.strategy._target_.endswith("DDPStrategy")
    assert cfg.trainer._target_ == "lightning.pytorch.Trainer" and cfg.trainer.max_steps == 300
    assert cfg.callbacks.lr_scaler.enabled and cfg.callbacks.throughput.enabled
    check_config(cfg)


@pytest.mark.parametrize(
    ("override", "setting"),
    [("layout=ragged", "layout"), ("data.max_tokens=0", "data.max_tokens")],
)
def test_bad_settings_name_themselves(override: str, setting: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(setting)):
        check_config(make(override))


def test_a_budget_below_the_longest_document_is_a_config_error() -> None:
    cfg = make(*TINY, "data.max_tokens=16")
    with pytest.raises(ConfigError, match=re.escape("data.max_tokens=16")):
        build_datamodule(cfg)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_truncated_documents_keep_exact_loss_counts(layout: str) -> None:
    budget = 56  # below the longest documents (data.max_length=64)
    cfg = make(*TINY, f"layout={layout}", f"data.max_tokens={budget}", "data.oversize=truncate")
    dm, _, _ = build_datamodule(cfg)
    sampler = TokenBudgetBatchSampler.from_planner(dm.planner("train"), rank=0, world_size=1)
    assert dm.planner("train").truncate_to == budget
    cut = 0
    # the collate checks every micro-batch's loss tokens against the plan's count
    for batch in token_budget_dataloader(dm.datasets["train"], sampler, collate_fn=dm.collate):
        tokens = batch["input_ids"] if layout == "packed" else batch["tokens"]
        assert tokens.numel() <= budget
        cut += int(tokens.shape[-1] == budget)
    assert cut > 0  # some documents were cut
