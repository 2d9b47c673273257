"""DeepSpeed under Lightning Fabric for token-budgeted batches, on CUDA and on CPU.

Fabric's :class:`~lightning.fabric.strategies.DeepSpeedStrategy` sets a nominal micro-batch size of
1 but runs on CUDA only and divides each loss by ``gradient_accumulation_steps``; a Fabric loop sums
its gradients itself (:func:`~lightning_varbatch.loss.loop_token_mean`), so this subclass:

* sets ``gradient_accumulation_steps`` to the loop's ``accumulate_grad_batches`` (checking a config
  that sets it, :func:`~lightning_varbatch.strategies.resolve_deepspeed_batch_config`); the loop
  (:class:`~lightning_varbatch.TokenBudgetLoop`) steps every micro-batch, DeepSpeed at its boundary;
* calls ``DeepSpeedEngine.backward`` with ``scale_wrt_gas=False``: the gradient is then the DDP
  one, the sum over the step's micro-batches averaged over ranks;
* runs on CPU (gloo) as well as CUDA, as :class:`~lightning_varbatch.VarBatchDeepSpeedStrategy`.
"""

from __future__ import annotations

import argparse
import copy
import inspect
from typing import Any

from lightning.fabric.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.fabric.strategies.registry import _StrategyRegistry
from lightning.fabric.utilities.seed import reset_seed
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from lightning_varbatch.checks import check_count, check_flag
from lightning_varbatch.strategies.deepspeed import (
    DEEPSPEED_VARIANTS,
    check_cpu_deepspeed,
    without_shm_comm_op,
)
from lightning_varbatch.strategies.deepspeed_config import resolve_deepspeed_batch_config

__all__ = ["VarBatchFabricDeepSpeedStrategy"]

_TAKES_SCHEDULER = "scheduler" in inspect.signature(DeepSpeedStrategy._initialize_engine).parameters


class VarBatchFabricDeepSpeedStrategy(DeepSpeedStrategy):
    """Fabric's DeepSpeed (ZeRO 0-3, offload) for token-budgeted batches, on CUDA or CPU.

    Takes every argument of Fabric's ``DeepSpeedStrategy``, plus:

    Args:
        *args: positional arguments of ``DeepSpeedStrategy``.
        accumulate_grad_batches: micro-batches per optimizer step (the loop's).
        cpu_shm_comm: on CPU, let DeepSpeed JIT-build its shared-memory all-reduce op.
        **kwargs: keyword arguments of ``DeepSpeedStrategy`` (``stage``, ``config``, ...).

    Raises:
        ValueError: (at launch) for a config whose batch settings contradict the loop's.
        RuntimeError: for an accelerator other than CPU or CUDA.

    Example:
        >>> from lightning.fabric import Fabric
        >>> from lightning.fabric.strategies import STRATEGY_REGISTRY
        >>> STRATEGY_REGISTRY["deepspeed_varbatch"]["strategy"] is VarBatchFabricDeepSpeedStrategy
        True
        >>> strategy = VarBatchFabricDeepSpeedStrategy(accumulate_grad_batches=2)  # doctest: +SKIP
        >>> fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)  # doctest: +SKIP
    """

    def __init__(
        self,
        *args: Any,
        accumulate_grad_batches: int = 1,
        cpu_shm_comm: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.accumulate_grad_batches = check_count(
            "accumulate_grad_batches", accumulate_grad_batches
        )
        self.cpu_shm_comm = check_flag("cpu_shm_comm", cpu_shm_comm)
        if isinstance(self.config, dict):  # our copy: the batch settings are filled in place
            self.config = copy.deepcopy(self.config)
            self.config.setdefault("zero_allow_untested_optimizer", True)

    @property
    def _on_cpu(self) -> bool:
        return type(self.accelerator).__name__ == "CPUAccelerator"

    @override
    def setup_environment(self) -> None:
        if not self._on_cpu:
            super().setup_environment()
            return
        check_cpu_deepspeed(self, "Fabric")
        DDPStrategy.setup_environment(self)  # skips the CUDA-only check; calls _setup_distributed

    @override
    def _setup_distributed(self) -> None:
        if not self._on_cpu:
            super()._setup_distributed()
            return
        # Fabric's requires device index == local rank (None on CPU): the rest of it.
        reset_seed()
        self._set_world_ranks()
        with without_shm_comm_op(keep=self.cpu_shm_comm):
            self._init_deepspeed_distributed()
        if not self._config_initialized:
            self._format_config()
            self._config_initialized = True

    @override
    def _format_config(self) -> None:
        super()._format_config()
        assert isinstance(self.config, dict)
        resolve_deepspeed_batch_config(
            self.config,
            self.accumulate_grad_batches,
            self.world_size,
            "VarBatchFabricDeepSpeedStrategy(accumulate_grad_batches=...)",
        )

    @override
    def _initialize_engine(
        self, model: Module, optimizer: Optimizer | None = None, *args: Any
    ) -> Any:
        # As Fabric's, with a device rank valid on CPU (a CPU device has index None). Lightning
        # 2.6 also takes and returns the scheduler; 2.5 takes (model, optimizer), returns two.
        import deepspeed

        index = self.root_device.index
        engine, ds_optimizer, _, ds_scheduler = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self.local_rank if index is None else index),
            config=self.config,
            model=model,
            model_parameters=filter(lambda p: p.requires_grad, model.parameters()),
            optimizer=optimizer,
            lr_scheduler=args[0] if args else None,
            dist_init_required=False,
        )
        if _TAKES_SCHEDULER:
            return engine, ds_optimizer, ds_scheduler
        return engine, ds_optimizer

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        # The loop sums micro-batch gradients (loop_token_mean): no division by the accumulation.
        kwargs.setdefault("scale_wrt_gas", False)
        super().backward(tensor, module, *args, **kwargs)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``deepspeed_varbatch`` and its variants with Fabric (as for the Trainer)."""
        for suffix, (what, params) in DEEPSPEED_VARIANTS.items():
            name = "deepspeed_varbatch" + suffix
            if name not in strategy_registry:
                strategy_registry.register(
                    name, cls, description=f"DeepSpeed for variable-size batches: {what}", **params
                )
