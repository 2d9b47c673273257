"""Token-budgeted, variable-size batches for PyTorch Lightning under DDP, FSDP and DeepSpeed.

The package is layered (see ``docs/architecture.md``): :mod:`lightning_varbatch.planner` is
numpy only; :mod:`lightning_varbatch.data`, :mod:`lightning_varbatch.strategies`,
:mod:`lightning_varbatch.callbacks` and :mod:`lightning_varbatch.loss` need torch and Lightning.
The names below are imported on first use, so ``import lightning_varbatch`` and the numpy-only
plan report (``python -m lightning_varbatch.plan``) do not load torch. The strategy names
(``"deepspeed_varbatch"``, ``"fsdp_varbatch"``, ...) are registered once Lightning is imported.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch import TokenBudgetBatchSampler
    >>> sampler = TokenBudgetBatchSampler(np.array([3, 5, 2, 7, 4]), max_tokens=10,
    ...                                   rank=0, world_size=1)
    >>> sorted(i for batch in sampler for i in batch)
    [0, 1, 2, 3, 4]
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from lightning_varbatch._registration import register_when_lightning_loads
from lightning_varbatch.errors import (
    ResumeMismatchError,
    SettingError,
    SettingTypeError,
    SettingValueError,
)

if TYPE_CHECKING:
    from lightning_varbatch.attention import document_attention
    from lightning_varbatch.callbacks import (
        BatchSizeLRRule,
        BatchSizeLRScaler,
        RankShareBalancer,
        TokenThroughputMeter,
        TokenThroughputMonitor,
        WorstBatchCheck,
    )
    from lightning_varbatch.data.collate import PaddingCollate
    from lightning_varbatch.data.datamodule import TokenBudgetDataModule
    from lightning_varbatch.data.loader import TokenBudgetDataLoader, token_budget_dataloader
    from lightning_varbatch.data.micro_batch import MicroBatch
    from lightning_varbatch.data.packed_collate import PackingCollate
    from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
    from lightning_varbatch.data.sampler_resume import ON_MISMATCH
    from lightning_varbatch.data.streaming import StreamingBatches
    from lightning_varbatch.data.streaming_datamodule import StreamingDataModule
    from lightning_varbatch.data.streaming_loader import StreamingDataLoader
    from lightning_varbatch.loss import (
        example_mean_loss,
        loop_token_mean,
        step_token_mean,
        token_mean_loss,
    )
    from lightning_varbatch.memory import BudgetResult, find_max_tokens
    from lightning_varbatch.peak_memory import measure_peak
    from lightning_varbatch.planner import (
        DataSource,
        EpochPlan,
        EpochPlanner,
        MixturePlanner,
        PlanConfig,
        plan_epoch,
    )
    from lightning_varbatch.planner.flops import transformer_flops
    from lightning_varbatch.planner.windows import WindowedPlanner
    from lightning_varbatch.sources import column_lengths, tokenized_lengths
    from lightning_varbatch.sources.hf_iterable import shards_from_hf_iterable
    from lightning_varbatch.sources.litdata_shards import shards_from_litdata
    from lightning_varbatch.sources.shards import ShardedSource, shards_from_files
    from lightning_varbatch.strategies import (
        VarBatchDeepSpeedStrategy,
        VarBatchFabricDeepSpeedStrategy,
        VarBatchFSDPStrategy,
    )
    from lightning_varbatch.training_loop import TokenBudgetLoop

_WHERE = {
    "BatchSizeLRRule": "lightning_varbatch.callbacks",
    "BatchSizeLRScaler": "lightning_varbatch.callbacks",
    "TokenThroughputMeter": "lightning_varbatch.callbacks",
    "RankShareBalancer": "lightning_varbatch.callbacks",
    "TokenThroughputMonitor": "lightning_varbatch.callbacks",
    "WorstBatchCheck": "lightning_varbatch.callbacks",
    "BudgetResult": "lightning_varbatch.memory",
    "find_max_tokens": "lightning_varbatch.memory",
    "measure_peak": "lightning_varbatch.peak_memory",
    "MicroBatch": "lightning_varbatch.data.micro_batch",
    "PaddingCollate": "lightning_varbatch.data.collate",
    "PackingCollate": "lightning_varbatch.data.packed_collate",
    "document_attention": "lightning_varbatch.attention",
    "transformer_flops": "lightning_varbatch.planner.flops",
    "TokenBudgetBatchSampler": "lightning_varbatch.data.sampler",
    "ON_MISMATCH": "lightning_varbatch.data.sampler_resume",
    "StreamingBatches": "lightning_varbatch.data.streaming",
    "StreamingDataLoader": "lightning_varbatch.data.streaming_loader",
    "StreamingDataModule": "lightning_varbatch.data.streaming_datamodule",
    "WindowedPlanner": "lightning_varbatch.planner.windows",
    "ShardedSource": "lightning_varbatch.sources.shards",
    "shards_from_files": "lightning_varbatch.sources.shards",
    "shards_from_hf_iterable": "lightning_varbatch.sources.hf_iterable",
    "shards_from_litdata": "lightning_varbatch.sources.litdata_shards",
    "TokenBudgetDataLoader": "lightning_varbatch.data.loader",
    "TokenBudgetDataModule": "lightning_varbatch.data.datamodule",
    "token_budget_dataloader": "lightning_varbatch.data.loader",
    "example_mean_loss": "lightning_varbatch.loss",
    "loop_token_mean": "lightning_varbatch.loss",
    "step_token_mean": "lightning_varbatch.loss",
    "token_mean_loss": "lightning_varbatch.loss",
    "DataSource": "lightning_varbatch.planner",
    "EpochPlan": "lightning_varbatch.planner",
    "EpochPlanner": "lightning_varbatch.planner",
    "MixturePlanner": "lightning_varbatch.planner",
    "PlanConfig": "lightning_varbatch.planner",
    "plan_epoch": "lightning_varbatch.planner",
    "column_lengths": "lightning_varbatch.sources",
    "tokenized_lengths": "lightning_varbatch.sources",
    "VarBatchDeepSpeedStrategy": "lightning_varbatch.strategies",
    "VarBatchFabricDeepSpeedStrategy": "lightning_varbatch.strategies",
    "VarBatchFSDPStrategy": "lightning_varbatch.strategies",
    "TokenBudgetLoop": "lightning_varbatch.training_loop",
}

__all__ = [
    "ON_MISMATCH",
    "BatchSizeLRRule",
    "BatchSizeLRScaler",
    "BudgetResult",
    "DataSource",
    "EpochPlan",
    "EpochPlanner",
    "MicroBatch",
    "MixturePlanner",
    "PackingCollate",
    "PaddingCollate",
    "PlanConfig",
    "RankShareBalancer",
    "ResumeMismatchError",
    "SettingError",
    "SettingTypeError",
    "SettingValueError",
    "ShardedSource",
    "StreamingBatches",
    "StreamingDataLoader",
    "StreamingDataModule",
    "TokenBudgetBatchSampler",
    "TokenBudgetDataLoader",
    "TokenBudgetDataModule",
    "TokenBudgetLoop",
    "TokenThroughputMeter",
    "TokenThroughputMonitor",
    "VarBatchDeepSpeedStrategy",
    "VarBatchFSDPStrategy",
    "VarBatchFabricDeepSpeedStrategy",
    "WindowedPlanner",
    "WorstBatchCheck",
    "column_lengths",
    "document_attention",
    "example_mean_loss",
    "find_max_tokens",
    "loop_token_mean",
    "measure_peak",
    "plan_epoch",
    "shards_from_files",
    "shards_from_hf_iterable",
    "shards_from_litdata",
    "step_token_mean",
    "token_budget_dataloader",
    "token_mean_loss",
    "tokenized_lengths",
    "transformer_flops",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """Import a public name from its layer on first use."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'lightning_varbatch' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_WHERE})


register_when_lightning_loads()
