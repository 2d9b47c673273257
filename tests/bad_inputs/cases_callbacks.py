"""Callbacks (BatchSizeLRScaler, TokenThroughputMonitor) and strategy settings.

Example:
    >>> len(CASES) > 30
    True
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import BatchSizeLRScaler, TokenThroughputMonitor
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.strategies import resolve_deepspeed_batch_config
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import POSITIVE_REAL_BAD, int_family, real_family

LR = "lightning_varbatch/callbacks/lr_scaling.py"
TP = "lightning_varbatch/callbacks/throughput.py"
DS = "lightning_varbatch/strategies/deepspeed_config.py"


def _scaler(name: str) -> Any:
    def call(value: Any) -> Any:
        return BatchSizeLRScaler(**{name: value})

    return call


def _monitor(name: str) -> Any:
    def call(value: Any) -> Any:
        return TokenThroughputMonitor(**{name: value})

    return call


def _tiny_fit(callback: Any, tmp: Path) -> None:
    """One process, two steps of a linear model on a plain DataLoader of dict batches."""
    import torch
    from lightning.pytorch import LightningModule, Trainer

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.layer(batch["x"]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = [{"x": torch.ones(2)} for _ in range(4)]
    loader = torch.utils.data.DataLoader(data, batch_size=2)
    trainer = Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        callbacks=[callback],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(tmp),
    )
    trainer.fit(Model(), loader)


def _scaler_no_reference(tmp: Path) -> None:
    # The counts are readable (tokens_fn), but nothing says what batch size the LR is for.
    _tiny_fit(BatchSizeLRScaler(rule="linear", tokens_fn=lambda batch: 4), tmp)


def _fit_with(make: Any) -> Any:
    def run(tmp: Path) -> None:
        _tiny_fit(make(), tmp)

    return run


def _ds(config: dict[str, Any], acc: int = 2, world: int = 2) -> Any:
    return resolve_deepspeed_batch_config(config, accumulate_grad_batches=acc, world_size=world)


CASES: list[Case] = [
    error(
        "lr-rule-unknown",
        "callbacks",
        "BatchSizeLRScaler(rule='cubic')",
        lambda tmp: BatchSizeLRScaler(rule="cubic"),
        "rule",
        "cubic",
        "linear",
        fix_in=LR,
        raises=SettingValueError,
    ),
    error(
        "lr-by-unknown",
        "callbacks",
        "BatchSizeLRScaler(by='words')",
        lambda tmp: BatchSizeLRScaler(by="words"),
        "by",
        "words",
        "tokens",
        fix_in=LR,
        raises=SettingValueError,
    ),
    *real_family(
        "lr-reference",
        "callbacks",
        "reference",
        _scaler("reference"),
        good=1024.0,
        what="BatchSizeLRScaler(reference=",
        fix_in=LR,
    ),
    *int_family(
        "lr-max_tokens",
        "callbacks",
        "max_tokens",
        _scaler("max_tokens"),
        required=False,
        good=4096,
        what="BatchSizeLRScaler(max_tokens=",
        fix_in=LR,
    ),
    *real_family(
        "lr-min_scale",
        "callbacks",
        "min_scale",
        _scaler("min_scale"),
        good=0.5,
        what="BatchSizeLRScaler(min_scale=",
        fix_in=LR,
    ),
    *real_family(
        "lr-max_scale",
        "callbacks",
        "max_scale",
        _scaler("max_scale"),
        good=2.0,
        what="BatchSizeLRScaler(max_scale=",
        fix_in=LR,
    ),
    error(
        "lr-min-over-max",
        "callbacks",
        "BatchSizeLRScaler(min_scale=2, max_scale=1)",
        lambda tmp: BatchSizeLRScaler(min_scale=2.0, max_scale=1.0),
        "min_scale",
        "max_scale",
        "2",
        fix_in=LR,
        raises=SettingValueError,
    ),
    error(
        "lr-tokens_fn-str",
        "callbacks",
        "BatchSizeLRScaler(tokens_fn='ntokens')",
        lambda tmp: BatchSizeLRScaler(tokens_fn="ntokens"),
        "tokens_fn",
        "str",
        fix_in=LR,
        raises=SettingTypeError,
    ),
    *int_family(
        "lr-log_every_n_steps",
        "callbacks",
        "log_every_n_steps",
        _scaler("log_every_n_steps"),
        required=False,
        good=10,
        what="BatchSizeLRScaler(log_every_n_steps=",
        fix_in=LR,
    ),
    error(
        "lr-no-reference-plain-loader",
        "callbacks",
        "BatchSizeLRScaler(tokens_fn=...) without reference/max_tokens on a plain DataLoader "
        "(tiny fit)",
        _scaler_no_reference,
        "reference",
        "max_tokens",
        raises=ValueError,
        fix_in=LR,
    ),
    error(
        "lr-no-counts-plain-loader",
        "callbacks",
        "BatchSizeLRScaler(reference=8) on a plain DataLoader without ntokens or tokens_fn",
        _fit_with(lambda: BatchSizeLRScaler(reference=8.0)),
        "tokens_fn",
        "ntokens",
        raises=TypeError,
        fix_in=LR,
    ),
    error(
        "lr-examples-no-counts",
        "callbacks",
        "BatchSizeLRScaler(by='examples', reference=8) without nexamples or examples_fn",
        _fit_with(lambda: BatchSizeLRScaler(by="examples", reference=8.0)),
        "examples_fn",
        raises=TypeError,
        fix_in=LR,
    ),
    error(
        "lr-tokens_fn-returns-str",
        "callbacks",
        "tokens_fn returning the string '4'",
        _fit_with(lambda: BatchSizeLRScaler(reference=8.0, tokens_fn=lambda batch: "4")),
        "tokens_fn",
        "str",
        raises=TypeError,
        fix_in=LR,
    ),
    error(
        "lr-tokens_fn-returns-negative",
        "callbacks",
        "tokens_fn returning -4",
        _fit_with(lambda: BatchSizeLRScaler(reference=8.0, tokens_fn=lambda batch: -4)),
        "tokens_fn",
        "-4",
        raises=ValueError,
        fix_in=LR,
    ),
    error(
        "lr-tokens_fn-returns-nan",
        "callbacks",
        "tokens_fn returning nan",
        _fit_with(lambda: BatchSizeLRScaler(reference=8.0, tokens_fn=lambda b: float("nan"))),
        "tokens_fn",
        "nan",
        raises=ValueError,
        fix_in=LR,
    ),
    accepted(
        "lr-tokens_fn-returns-numpy",
        "callbacks",
        "tokens_fn returning np.int64(4) (tiny fit)",
        _fit_with(lambda: BatchSizeLRScaler(reference=8.0, tokens_fn=lambda b: np.int64(4))),
        fix_in=LR,
    ),
    error(
        "tp-tokens_fn-returns-str",
        "callbacks",
        "TokenThroughputMonitor(tokens_fn returning 'many') (tiny fit)",
        _fit_with(
            lambda: TokenThroughputMonitor(tokens_fn=lambda b: "many", examples_fn=lambda b: 2)
        ),
        "tokens_fn",
        "str",
        raises=TypeError,
        fix_in=TP,
    ),
    error(
        "tp-tokens_fn-returns-negative",
        "callbacks",
        "TokenThroughputMonitor(tokens_fn returning -4) (tiny fit)",
        _fit_with(lambda: TokenThroughputMonitor(tokens_fn=lambda b: -4, examples_fn=lambda b: 2)),
        "tokens_fn",
        "-4",
        raises=ValueError,
        fix_in=TP,
    ),
    *int_family(
        "tp-log_every_n_steps",
        "callbacks",
        "log_every_n_steps",
        _monitor("log_every_n_steps"),
        required=False,
        good=10,
        what="TokenThroughputMonitor(log_every_n_steps=",
        fix_in=TP,
    ),
    *real_family(
        "tp-flops_per_token",
        "callbacks",
        "flops_per_token",
        _monitor("flops_per_token"),
        good=6e9,
        what="TokenThroughputMonitor(flops_per_token=",
        fix_in=TP,
    ),
    *real_family(
        "tp-peak_flops",
        "callbacks",
        "peak_flops",
        _monitor("peak_flops"),
        good=1e12,
        members=[m for m in POSITIVE_REAL_BAD if m[0] != "zero"],
        what="TokenThroughputMonitor(peak_flops=",
        fix_in=TP,
    ),
    error(
        "tp-tokens_fn-str",
        "callbacks",
        "TokenThroughputMonitor(tokens_fn='ntokens')",
        lambda tmp: TokenThroughputMonitor(tokens_fn="ntokens"),
        "tokens_fn",
        "str",
        fix_in=TP,
        raises=SettingTypeError,
        setting="tokens_fn",
    ),
    error(
        "tp-padding_fn-int",
        "callbacks",
        "TokenThroughputMonitor(padding_fn=1)",
        lambda tmp: TokenThroughputMonitor(padding_fn=1),
        "padding_fn",
        "int",
        fix_in=TP,
        raises=SettingTypeError,
        setting="padding_fn",
    ),
    error(
        "tp-dataset_names-str",
        "callbacks",
        "TokenThroughputMonitor(dataset_names='wmt') (a string, not a list)",
        lambda tmp: TokenThroughputMonitor(dataset_names="wmt"),
        "dataset_names",
        "wmt",
        fix_in=TP,
        raises=SettingTypeError,
        setting="dataset_names",
    ),
    error(
        "tp-prog_bar-str",
        "callbacks",
        "TokenThroughputMonitor(prog_bar='no')",
        lambda tmp: TokenThroughputMonitor(prog_bar="no"),
        "prog_bar",
        "no",
        fix_in=TP,
        raises=SettingTypeError,
        setting="prog_bar",
    ),
    accepted(
        "tp-numpy-settings",
        "callbacks",
        "TokenThroughputMonitor(log_every_n_steps=np.int64(5), peak_flops=np.float64(1e12))",
        lambda tmp: TokenThroughputMonitor(
            log_every_n_steps=np.int64(5), peak_flops=np.float64(1e12)
        ),
        fix_in=TP,
    ),
    # -- strategies ----------------------------------------------------------------------
    error(
        "ds-gas-mismatch",
        "strategies",
        "DeepSpeed config gradient_accumulation_steps=4 with accumulate_grad_batches=2",
        lambda tmp: _ds({"gradient_accumulation_steps": 4}),
        "gradient_accumulation_steps",
        "4",
        "accumulate_grad_batches",
        fix_in=DS,
        raises=SettingValueError,
        setting="gradient_accumulation_steps",
    ),
    error(
        "ds-train-batch-not-multiple",
        "strategies",
        "DeepSpeed train_batch_size=6 with accumulation 2 x world 2",
        lambda tmp: _ds({"train_batch_size": 6}),
        "train_batch_size",
        "6",
        "4",
        fix_in=DS,
        raises=SettingValueError,
        setting="train_batch_size",
    ),
    error(
        "ds-train-batch-mismatch",
        "strategies",
        "train_batch_size=16 with train_micro_batch_size_per_gpu=2, accumulation 2, world 2",
        lambda tmp: _ds({"train_batch_size": 16, "train_micro_batch_size_per_gpu": 2}),
        "train_batch_size",
        "16",
        "8",
        fix_in=DS,
        raises=SettingValueError,
        setting="train_batch_size",
    ),
    error(
        "ds-micro-zero",
        "strategies",
        "DeepSpeed train_micro_batch_size_per_gpu=0",
        lambda tmp: _ds({"train_micro_batch_size_per_gpu": 0}),
        "train_micro_batch_size_per_gpu",
        "0",
        fix_in=DS,
        raises=SettingValueError,
        setting="train_micro_batch_size_per_gpu",
    ),
    error(
        "ds-gas-str",
        "strategies",
        "DeepSpeed gradient_accumulation_steps='2'",
        lambda tmp: _ds({"gradient_accumulation_steps": "2"}),
        "gradient_accumulation_steps",
        "'2'",
        fix_in=DS,
        raises=SettingValueError,
        setting="gradient_accumulation_steps",
    ),
    accepted(
        "ds-gas-auto",
        "strategies",
        "DeepSpeed gradient_accumulation_steps='auto'",
        lambda tmp: _ds({"gradient_accumulation_steps": "auto"}),
        fix_in=DS,
    ),
    accepted(
        "ds-numpy-settings",
        "strategies",
        "DeepSpeed train_micro_batch_size_per_gpu=np.int64(2)",
        lambda tmp: _ds({"train_micro_batch_size_per_gpu": np.int64(2)}),
        fix_in=DS,
    ),
]
