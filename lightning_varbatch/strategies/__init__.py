"""Strategies for token-budgeted batches; importing this module registers their names.

Registered names (``Trainer(strategy=NAME)``; Lightning's ``"ddp"`` needs nothing extra):

* ``"fsdp_varbatch"``, ``"fsdp_varbatch_cpu_offload"``: :class:`VarBatchFSDPStrategy`
  (FSDP1, CPU and CUDA).
* ``"deepspeed_varbatch"`` (ZeRO stage 2), ``"deepspeed_varbatch_stage_0"`` (no ZeRO),
  ``"deepspeed_varbatch_stage_1"``, ``"deepspeed_varbatch_stage_2"``,
  ``"deepspeed_varbatch_stage_2_offload"``, ``"deepspeed_varbatch_stage_3"``,
  ``"deepspeed_varbatch_stage_3_offload"``, ``"deepspeed_varbatch_stage_3_offload_nvme"``:
  :class:`VarBatchDeepSpeedStrategy` (CPU and CUDA); the same names with ``Fabric(strategy=)``:
  :class:`VarBatchFabricDeepSpeedStrategy` (for a loop without a Trainer).

DeepSpeed is optional: its names are registered anyway (``deepspeed`` is imported only when a
strategy is used); without it, constructing one raises Lightning's "you must have DeepSpeed
installed". Under every strategy the gradient is the mean over ranks of each rank's accumulated
gradient, as with DDP, so :func:`~lightning_varbatch.loss.token_mean_loss` is the exact mean.

Example:
    >>> import lightning_varbatch.strategies
    >>> from lightning.pytorch.strategies import StrategyRegistry
    >>> {"fsdp_varbatch", "deepspeed_varbatch_stage_3_offload"} <= set(StrategyRegistry)
    True
"""

from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.pytorch.strategies import StrategyRegistry

from lightning_varbatch.strategies.deepspeed import (
    VarBatchDeepSpeedStrategy,
    resolve_deepspeed_batch_config,
)
from lightning_varbatch.strategies.fabric_deepspeed import VarBatchFabricDeepSpeedStrategy
from lightning_varbatch.strategies.fsdp import VarBatchFSDPStrategy

VarBatchDeepSpeedStrategy.register_strategies(StrategyRegistry)
VarBatchFSDPStrategy.register_strategies(StrategyRegistry)
VarBatchFabricDeepSpeedStrategy.register_strategies(STRATEGY_REGISTRY)

__all__ = [
    "VarBatchDeepSpeedStrategy",
    "VarBatchFSDPStrategy",
    "VarBatchFabricDeepSpeedStrategy",
    "resolve_deepspeed_batch_config",
]
