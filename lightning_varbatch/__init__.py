"""Token-budgeted, variable-size batches for PyTorch Lightning under DDP, FSDP and DeepSpeed.

Example:
    >>> import numpy as np
    >>> from lightning_varbatch import TokenBudgetBatchSampler
    >>> sampler = TokenBudgetBatchSampler(np.array([3, 5, 2, 7, 4]), max_tokens=10,
    ...                                   rank=0, world_size=1)
    >>> sorted(i for batch in sampler for i in batch)
    [0, 1, 2, 3, 4]
"""

from lightning_varbatch.callbacks import BatchSizeLRScaler, TokenThroughputMonitor
from lightning_varbatch.collate import BatchInfoDataset, CollatedItems, PaddingCollate
from lightning_varbatch.config import PlanConfig
from lightning_varbatch.datamodule import (
    TokenBudgetDataLoader,
    TokenBudgetDataModule,
    token_budget_dataloader,
)
from lightning_varbatch.mixing import MixturePlanner
from lightning_varbatch.planning import EpochPlan, EpochPlanner, plan_epoch
from lightning_varbatch.sampler import MicroBatch, TokenBudgetBatchSampler
from lightning_varbatch.sources import DataSource
from lightning_varbatch.strategies import VarBatchDeepSpeedStrategy, VarBatchFSDPStrategy

__all__ = [
    "BatchInfoDataset",
    "BatchSizeLRScaler",
    "CollatedItems",
    "DataSource",
    "EpochPlan",
    "EpochPlanner",
    "MicroBatch",
    "MixturePlanner",
    "PaddingCollate",
    "PlanConfig",
    "TokenBudgetBatchSampler",
    "TokenBudgetDataLoader",
    "TokenBudgetDataModule",
    "TokenThroughputMonitor",
    "VarBatchDeepSpeedStrategy",
    "VarBatchFSDPStrategy",
    "plan_epoch",
    "token_budget_dataloader",
]
__version__ = "0.1.0"
