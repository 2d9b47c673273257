"""DeepSpeed for token-budgeted, variable-size batches, on CUDA and on CPU.

Lightning's :class:`~lightning.pytorch.strategies.DeepSpeedStrategy` assumes a fixed micro-batch
size, CUDA devices and that DeepSpeed's loss scaling composes with Lightning's. This subclass:

* never reads a batch size from the DataLoader: ``train_micro_batch_size_per_gpu`` is a nominal
  ``1`` unless the config sets it; DeepSpeed uses it only for ``train_batch_size`` and its
  throughput logs, never against the real batches (it counts micro-steps, not samples);
* sets ``gradient_accumulation_steps`` to ``Trainer(accumulate_grad_batches)`` and checks a config
  that sets either value, with an error that says which setting to change;
* turns DeepSpeed's throughput timer off, since its samples/sec are ``nominal micro × ...``;
* scales gradients like DDP: Lightning's automatic optimisation already divides the loss by
  ``accumulate_grad_batches``, so ``DeepSpeedEngine.backward`` gets ``scale_wrt_gas=False``
  (else the update is 1/A of the DDP one, measured with A=2 on ZeRO 2). Lightning calls
  ``engine.step()`` on every micro-batch; DeepSpeed applies it at its accumulation boundary;
* runs on CPU (gloo) as well as CUDA, without JIT-building DeepSpeed's shared-memory comm op;
* allows a torch optimizer under ZeRO with a user ``config=`` (``zero_allow_untested_optimizer:
  true`` unless the config sets it), as Lightning's default config does.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.seed import reset_seed
from lightning.pytorch.accelerators import CPUAccelerator, CUDAAccelerator
from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy
from lightning.pytorch.strategies.deepspeed import remove_module_hooks
from lightning.pytorch.utilities.rank_zero import rank_zero_warn
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler, ReduceLROnPlateau
from typing_extensions import override

from lightning_varbatch.checks import check_flag
from lightning_varbatch.strategies.deepspeed_config import resolve_deepspeed_batch_config

if TYPE_CHECKING:
    import deepspeed

__all__ = [
    "DEEPSPEED_VARIANTS",
    "VarBatchDeepSpeedStrategy",
    "check_cpu_deepspeed",
    "resolve_deepspeed_batch_config",
    "without_shm_comm_op",
]

#: The registered variants ``"deepspeed_varbatch" + suffix``: suffix -> (what, the arguments).
DEEPSPEED_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "": ("ZeRO stage 2", {}),
    "_stage_0": ("ZeRO disabled (stage 0)", {"stage": 0}),
    "_stage_1": ("ZeRO stage 1", {"stage": 1}),
    "_stage_2": ("ZeRO stage 2", {"stage": 2}),
    "_stage_2_offload": (
        "ZeRO stage 2, optimizer offloaded to CPU",
        {"stage": 2, "offload_optimizer": True},
    ),
    "_stage_3": ("ZeRO stage 3", {"stage": 3}),
    "_stage_3_offload": (
        "ZeRO stage 3, optimizer and parameters offloaded to CPU",
        {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    ),
    "_stage_3_offload_nvme": (
        "ZeRO stage 3, optimizer and parameters offloaded to NVMe",
        {
            "stage": 3,
            "offload_optimizer": True,
            "offload_parameters": True,
            "remote_device": "nvme",
            "offload_params_device": "nvme",
            "offload_optimizer_device": "nvme",
        },
    ),
}


@contextlib.contextmanager
def without_shm_comm_op(keep: bool = False) -> Iterator[None]:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce op.

    ``keep=True`` (the strategies' ``cpu_shm_comm``) changes nothing.

    ``deepspeed.comm.torch.TorchBackend.__init__`` calls ``build_shm_op()``, which on a CPU
    accelerator JIT-builds ``deepspeed_shm_comm`` (30-90 s, needs g++) on first use. Gloo needs no
    compiled op; ``build_shm_op`` returning ``None`` is DeepSpeed's own fallback for such hosts.
    """
    if keep:
        yield
        return
    # ``import deepspeed.comm.torch as m`` would bind torch itself: deepspeed.comm imports torch.
    ds_torch_comm: Any = importlib.import_module("deepspeed.comm.torch")
    original = ds_torch_comm.build_shm_op
    ds_torch_comm.build_shm_op = lambda: None
    try:
        yield
    finally:
        ds_torch_comm.build_shm_op = original


def check_cpu_deepspeed(strategy: Any, runner: str) -> None:
    """Refuse an accelerator other than the CPU, or DeepSpeed on another one than the CPU."""
    if type(strategy.accelerator).__name__ != "CPUAccelerator":
        name = type(strategy.accelerator).__name__
        raise RuntimeError(
            f"{type(strategy).__name__} runs on CUDA or CPU, got {name}. "
            f"Set {runner}(accelerator='cuda') or {runner}(accelerator='cpu')."
        )
    from deepspeed.accelerator import get_accelerator

    ds_device = get_accelerator().device_name()
    if ds_device != "cpu":
        raise RuntimeError(
            f"The {runner} runs on CPU but DeepSpeed selected its {ds_device!r} accelerator. "
            "Start the processes with the environment variable DS_ACCELERATOR=cpu, or use "
            f"{runner}(accelerator='cuda')."
        )


class VarBatchDeepSpeedStrategy(DeepSpeedStrategy):
    """DeepSpeed (ZeRO 0-3, offload) for token-budgeted batches, on CUDA or CPU.

    Takes every argument of :class:`~lightning.pytorch.strategies.DeepSpeedStrategy`, plus:

    Args:
        *args: positional arguments of ``DeepSpeedStrategy``.
        cpu_shm_comm: on CPU, let DeepSpeed JIT-build its shared-memory all-reduce op (faster
            collectives on one host; a 30-90 s compile on first use, needs g++). Default: gloo.
        **kwargs: ``DeepSpeedStrategy``'s (``stage``, ``offload_optimizer``, ``config``, ...).

    What differs from Lightning's strategy is listed in the module docstring; the gradient is
    the DDP one, so :func:`~lightning_varbatch.loss.token_mean_loss` is the step's exact token mean.

    Raises:
        ValueError: (at ``Trainer.fit``) for a config whose ``gradient_accumulation_steps`` or
            ``train_batch_size`` contradicts the Trainer (:func:`resolve_deepspeed_batch_config`).
        RuntimeError: an accelerator other than CPU or CUDA, or a mismatched DeepSpeed accelerator.

    Example:
        >>> from lightning.pytorch import Trainer
        >>> from lightning.pytorch.strategies import StrategyRegistry
        >>> StrategyRegistry["deepspeed_varbatch_stage_3"]["strategy"] is VarBatchDeepSpeedStrategy
        True
        >>> trainer = Trainer(  # doctest: +SKIP
        ...     accelerator="cpu", devices=2, strategy="deepspeed_varbatch_stage_3",
        ...     accumulate_grad_batches=2, use_distributed_sampler=False)
    """

    strategy_name = "deepspeed_varbatch"

    def __init__(self, *args: Any, cpu_shm_comm: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cpu_shm_comm = check_flag("cpu_shm_comm", cpu_shm_comm)
        if isinstance(self.config, dict):
            # A copy: the batch settings are filled in at fit time; a user's dict must not change.
            self.config = copy.deepcopy(self.config)
            # As Lightning's default config: without zero_allow_untested_optimizer, a user's dict
            # makes deepspeed.initialize assert for any torch optimizer (unless the user decided).
            self.config.setdefault("zero_allow_untested_optimizer", True)

    @property
    def _on_cpu(self) -> bool:
        return isinstance(self.accelerator, CPUAccelerator)

    @property
    def _device_rank(self) -> int:
        # Lightning's device_rank (root_device.index) is None on CPU, failing in DeepSpeed.
        index = self.root_device.index
        return self.local_rank if index is None else index

    @override
    def setup_environment(self) -> None:
        # DeepSpeedStrategy.setup_environment refuses all but CUDA; DeepSpeed runs on CPU (gloo).
        if isinstance(self.accelerator, CUDAAccelerator):
            super().setup_environment()
            return
        check_cpu_deepspeed(self, "Trainer")
        DDPStrategy.setup_environment(self)  # skips the CUDA-only check, not the DDP setup

    @override
    def setup_distributed(self) -> None:
        if not self._on_cpu:
            super().setup_distributed()
            return
        # Its setup_distributed requires device index == local rank (None on CPU): do the rest.
        reset_seed()
        self.set_world_ranks()
        with without_shm_comm_op(keep=self.cpu_shm_comm):
            self._init_deepspeed_distributed()

    @override
    def backward(
        self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any
    ) -> Tensor:
        # Lightning's automatic optimisation divides the loss by accumulate_grad_batches and
        # DeepSpeedEngine.backward (DeepSpeedPrecision.backward passes it kwargs) divides it again
        # unless scale_wrt_gas=False: Lightning-AI/pytorch-lightning#6170, transformers#35808.
        kwargs.setdefault("scale_wrt_gas", False)
        return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def on_train_start(self) -> None:
        # Lightning calls engine.step() on every micro-batch; DeepSpeed counts the accumulation (no
        # step at the epoch end). An epoch of micro-batches not a multiple of it makes DeepSpeed's
        # boundaries drift from Lightning's (which restart every epoch).
        super().on_train_start()
        assert self.lightning_module is not None
        trainer = self.lightning_module.trainer
        batches, acc = trainer.num_training_batches, int(trainer.accumulate_grad_batches)
        if acc > 1 and math.isfinite(batches) and int(batches) % acc:
            rank_zero_warn(
                f"The epoch has {int(batches)} micro-batches per rank, not a multiple of "
                f"accumulate_grad_batches={acc}. DeepSpeed does not step at the epoch end, so "
                "its accumulation boundaries drift from Lightning's and later optimizer steps "
                "mix micro-batches of two windows. Build the batch sampler with the Trainer's "
                "accumulate_grad_batches (TokenBudgetBatchSampler), or set limit_train_batches "
                f"to a multiple of {acc}."
            )

    @override
    def _setup_model_and_optimizer(
        self,
        model: Module,
        optimizer: Optimizer | None,
        lr_scheduler: LRScheduler | ReduceLROnPlateau | None = None,
    ) -> tuple[deepspeed.DeepSpeedEngine, Optimizer]:
        # As DeepSpeedStrategy._setup_model_and_optimizer, with a device rank valid on CPU.
        import deepspeed

        model_parameters = filter(lambda p: p.requires_grad, model.parameters())
        engine, ds_optimizer, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self._device_rank),
            config=self.config,
            model=model,
            model_parameters=model_parameters,
            optimizer=optimizer,
            lr_scheduler=lr_scheduler,
            dist_init_required=False,
        )
        return engine, ds_optimizer

    @override
    def _initialize_deepspeed_inference(self, model: Module) -> None:
        # As DeepSpeedStrategy's, with a device rank valid on CPU and the throughput timer off.
        import deepspeed

        assert isinstance(self.config, dict)
        inference_config: dict[str, Any] = {
            "train_micro_batch_size_per_gpu": 1,
            "timers": {"throughput": {"enabled": False}},
        }
        for key in ("fp16", "bf16"):
            if key in self.config:
                inference_config[key] = self.config[key]
        if self.zero_stage_3:
            inference_config["zero_allow_untested_optimizer"] = self.config.get(
                "zero_allow_untested_optimizer", True
            )
            inference_config["zero_optimization"] = self.config["zero_optimization"]
        remove_module_hooks(model)
        engine, _, _, _ = deepspeed.initialize(
            args=argparse.Namespace(device_rank=self._device_rank),
            config=inference_config,
            model=model,
            optimizer=None,
            lr_scheduler=None,
            model_parameters=[],
            dist_init_required=False,
        )
        self.model = engine

    @override
    def _format_batch_size_and_grad_accum_config(self) -> None:
        # Lightning's rejects gradient_accumulation_steps and reads batch_sampler.batch_size.
        assert isinstance(self.config, dict)
        if self.lightning_module is None:
            return
        trainer = self.lightning_module.trainer
        resolve_deepspeed_batch_config(
            self.config, int(trainer.accumulate_grad_batches), int(self.world_size)
        )
        if "gradient_clipping" not in self.config:
            self.config["gradient_clipping"] = trainer.gradient_clip_val or 0.0

    @override
    def _auto_select_batch_size(self) -> int:
        # Never read batch_sampler.batch_size: micro-batches have no fixed size.
        assert isinstance(self.config, dict)
        return int(self.config.get("train_micro_batch_size_per_gpu", 1))

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        """Register ``deepspeed_varbatch`` and its stage / offload variants."""
        for suffix, (what, params) in DEEPSPEED_VARIANTS.items():
            name = cls.strategy_name + suffix
            if name not in strategy_registry:
                strategy_registry.register(
                    name,
                    cls,
                    description=f"DeepSpeed for variable-size batches: {what}",
                    **params,
                )
