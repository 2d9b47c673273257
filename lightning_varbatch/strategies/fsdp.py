"""FSDP that runs on CPU (gloo) as well as CUDA, with an unchanged LightningModule.

Why FSDP1 (``FullyShardedDataParallel`` through Lightning's
:class:`~lightning.pytorch.strategies.FSDPStrategy`) and not FSDP2 (``fully_shard`` through
:class:`~lightning.pytorch.strategies.ModelParallelStrategy`): FSDP2 needs the LightningModule to
shard itself in ``configure_model``, a code change. ``FSDPStrategy`` wraps any module (optionally
with an ``auto_wrap_policy``), keeps Lightning's checkpointing, precision and activation
checkpointing, and averages gradients like DDP (:func:`~lightning_varbatch.loss.token_mean_loss`
is exact). Two things keep it off CPU in Lightning 2.6, both fixed here:

* the accelerator connector rejects ``strategy="fsdp"`` without a GPU, checking the registered
  names and the exact type ``FSDPStrategy``: this subclass (``fsdp_varbatch``) passes;
* Lightning passes ``device_id=root_device.index``, ``None`` on CPU, where FSDP raises "FSDP needs a
  non-CPU accelerator device"; here a CPU run passes ``device_id=torch.device("cpu")``.

``use_orig_params`` defaults to ``True``: ``configure_optimizers`` may use ``self.parameters()``.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from typing import Any

import torch
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.core.optimizer import LightningOptimizer
from lightning.pytorch.strategies import FSDPStrategy
from lightning.pytorch.strategies.fsdp import (
    _has_meta_device_parameters_or_buffers,
    _move_torchmetrics_to_device,
    _setup_activation_checkpointing,
)
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

__all__ = ["VarBatchFSDPStrategy"]


def _cpu_full_state_dict_context(module: Module) -> Any:
    """Full, rank-0-only state dicts gathered without ``offload_to_cpu`` (already on CPU)."""
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.api import FullOptimStateDictConfig

    return FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=True),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=True),
    )


class VarBatchFSDPStrategy(FSDPStrategy):
    """Lightning's FSDP strategy, also on CPU, with ``use_orig_params=True`` by default.

    Takes every argument of :class:`~lightning.pytorch.strategies.FSDPStrategy`
    (``sharding_strategy``, ``auto_wrap_policy``, ``cpu_offload``, ``mixed_precision``, ...); on CPU
    it passes ``device_id=cpu`` to ``FullyShardedDataParallel`` and builds a tuple ``device_mesh``.

    Args:
        *args: positional arguments of ``FSDPStrategy``.
        **kwargs: keyword arguments of ``FSDPStrategy`` and of ``FullyShardedDataParallel``.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> trainer = Trainer(accelerator="cpu", devices=1, strategy="fsdp_varbatch", logger=False)
        >>> type(trainer.strategy).__name__, trainer.strategy.kwargs["use_orig_params"]
        ('VarBatchFSDPStrategy', True)
    """

    strategy_name = "fsdp_varbatch"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("use_orig_params", True)
        super().__init__(*args, **kwargs)

    @property
    def _device_id(self) -> int | torch.device | None:
        # FSDP's device_id: the CUDA index, or the CPU device (None makes FSDP seek a GPU).
        device = self.root_device
        return device if device.type == "cpu" else device.index

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        # Lightning gathers full state dicts with offload_to_cpu=True: on CPU that aliases the
        # unsharded flat parameter, which FSDP frees on leaving the context, so torch's param_hook
        # clone read freed memory (segfaults saving mid-training). Gather without offload on CPU.
        if self.root_device.type != "cpu" or self._state_dict_type != "full":
            return super().lightning_module_state_dict()
        assert self.model is not None
        with _cpu_full_state_dict_context(self.model):
            return self.model.state_dict()

    @override
    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Tensor]:
        if self.root_device.type != "cpu" or self._state_dict_type != "full":
            return super().optimizer_state(optimizer)
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import OptimStateKeyType

        if isinstance(optimizer, LightningOptimizer):
            optimizer = optimizer._optimizer
        assert self.model is not None
        with _cpu_full_state_dict_context(self.model):
            state = FSDP.optim_state_dict(self.model, optimizer)
            if self.global_rank == 0:  # the standard layout, as FSDPStrategy stores it
                state = FSDP.rekey_optim_state_dict(state, OptimStateKeyType.PARAM_ID, self.model)
            return state

    @override
    def setup_environment(self) -> None:
        # FSDPStrategy.setup_environment builds a tuple device_mesh with init_device_mesh("cuda",
        # ...); build it on the root device's type instead, after the process group exists.
        mesh = self.kwargs.get("device_mesh")
        if isinstance(mesh, tuple):
            del self.kwargs["device_mesh"]
        super().setup_environment()
        if isinstance(mesh, tuple):
            from torch.distributed.device_mesh import init_device_mesh

            self.kwargs["device_mesh"] = init_device_mesh(self.root_device.type, mesh)

    @override
    def _setup_model(self, model: Module) -> Module:
        # As FSDPStrategy._setup_model, with device_id=self._device_id.
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(mod, FullyShardedDataParallel) for mod in model.modules()):
            if _has_meta_device_parameters_or_buffers(model):
                rank_zero_warn(
                    "The model is already wrapped in `FSDP` but there are still parameters on the "
                    "meta device."
                )
            if "auto_wrap_policy" in self.kwargs:
                rank_zero_warn(
                    "A FSDP `auto_wrap_policy` is set, but the model is already wrapped. The "
                    "policy will be ignored."
                )
                del self.kwargs["auto_wrap_policy"]
        else:
            model = FullyShardedDataParallel(
                module=model,
                cpu_offload=self.cpu_offload,
                mixed_precision=self.mixed_precision_config,
                sharding_strategy=self.sharding_strategy,
                device_id=self._device_id,
                **self.kwargs,
            )
        _move_torchmetrics_to_device(model, self.root_device)
        _setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model

    @contextmanager
    @override
    def model_sharded_context(self) -> Generator[None, None, None]:
        # As FSDPStrategy.model_sharded_context, with device_id=self._device_id.
        from torch.distributed.fsdp.fully_sharded_data_parallel import FullyShardedDataParallel
        from torch.distributed.fsdp.wrap import enable_wrap

        with enable_wrap(
            wrapper_cls=FullyShardedDataParallel,
            cpu_offload=self.cpu_offload,
            mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy,
            device_id=self._device_id,
            **self.kwargs,
        ):
            yield

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``fsdp_varbatch`` and ``fsdp_varbatch_cpu_offload``.

        Not into the base class's ``_registered_strategies``, which Lightning refuses without a GPU.
        """
        if not torch.distributed.is_available():
            return
        variants: dict[str, tuple[str, dict[str, Any]]] = {
            "": ("full sharding", {}),
            "_cpu_offload": ("full sharding, parameters offloaded to CPU", {"cpu_offload": True}),
        }
        for suffix, (what, params) in variants.items():
            name = cls.strategy_name + suffix
            if name not in strategy_registry:
                strategy_registry.register(
                    name, cls, description=f"FSDP on CPU or CUDA: {what}", **params
                )
