"""Fast checks of the strategies without processes: config validation, registry, overrides."""

from __future__ import annotations

import subprocess
import sys
import warnings
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
import torch
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.fabric.plugins.precision.deepspeed import DeepSpeedPrecision
from lightning.fabric.strategies import STRATEGY_REGISTRY
from lightning.pytorch import Trainer
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy, StrategyRegistry

import lightning_varbatch.strategies as strategies
from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.strategies.deepspeed import DEEPSPEED_VARIANTS, VarBatchDeepSpeedStrategy
from lightning_varbatch.strategies.deepspeed_config import resolve_deepspeed_batch_config
from lightning_varbatch.strategies.fabric_deepspeed import VarBatchFabricDeepSpeedStrategy
from lightning_varbatch.strategies.fsdp import VarBatchFSDPStrategy

DS_NAMES = {
    "deepspeed_varbatch": {},
    "deepspeed_varbatch_stage_0": {"stage": 0},
    "deepspeed_varbatch_stage_1": {"stage": 1},
    "deepspeed_varbatch_stage_2": {"stage": 2},
    "deepspeed_varbatch_stage_2_offload": {"stage": 2, "offload_optimizer": True},
    "deepspeed_varbatch_stage_3": {"stage": 3},
    "deepspeed_varbatch_stage_3_offload": {
        "stage": 3,
        "offload_optimizer": True,
        "offload_parameters": True,
    },
}


def test_the_package_exports_the_strategies_and_registers_every_variant() -> None:
    assert strategies.VarBatchDeepSpeedStrategy is VarBatchDeepSpeedStrategy
    assert strategies.VarBatchFSDPStrategy is VarBatchFSDPStrategy
    assert strategies.resolve_deepspeed_batch_config is resolve_deepspeed_batch_config
    for suffix, (what, params) in DEEPSPEED_VARIANTS.items():
        entry = StrategyRegistry["deepspeed_varbatch" + suffix]
        assert entry["strategy"] is VarBatchDeepSpeedStrategy
        assert entry["init_params"] == params and what in entry["description"]
    assert {n: StrategyRegistry[n]["init_params"] for n in DS_NAMES} == DS_NAMES


# -- resolve_deepspeed_batch_config ----------------------------------------------------------


def test_defaults_are_nominal_and_consistent() -> None:
    config = resolve_deepspeed_batch_config({"zero_optimization": {"stage": 3}}, 4, 8)
    assert config == {
        "zero_optimization": {"stage": 3},
        "gradient_accumulation_steps": 4,
        "train_micro_batch_size_per_gpu": 1,
        "train_batch_size": 32,
        "timers": {"throughput": {"enabled": False}},
    }


@pytest.mark.parametrize(
    ("given", "micro", "total"),
    [
        ({"train_micro_batch_size_per_gpu": 3}, 3, 12),
        ({"train_batch_size": 12}, 3, 12),
        ({"train_micro_batch_size_per_gpu": 3, "train_batch_size": 12}, 3, 12),
        ({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto"}, 1, 4),
        ({"gradient_accumulation_steps": 2}, 1, 4),
        ({"gradient_accumulation_steps": "auto"}, 1, 4),
    ],
)
def test_consistent_user_settings_are_kept(given: dict[str, Any], micro: int, total: int) -> None:
    config = resolve_deepspeed_batch_config(dict(given), 2, 2)
    assert config["train_micro_batch_size_per_gpu"] == micro
    assert config["train_batch_size"] == total
    assert config["gradient_accumulation_steps"] == 2


def test_inconsistent_train_batch_size_names_the_expected_value_and_the_setting() -> None:
    with pytest.raises(ValueError) as info:
        resolve_deepspeed_batch_config(
            {"train_micro_batch_size_per_gpu": 2, "train_batch_size": 10}, 2, 2
        )
    message = str(info.value)
    assert "train_batch_size=10" in message
    assert "train_micro_batch_size_per_gpu (2) * accumulate_grad_batches (2) * world size (2)" in (
        message
    )
    assert "= 8" in message and "remove train_batch_size" in message and "set it to 8" in message


def test_train_batch_size_not_divisible_by_accumulation_and_world() -> None:
    with pytest.raises(ValueError, match=r"train_batch_size=6, which is not a multiple of .* = 4"):
        resolve_deepspeed_batch_config({"train_batch_size": 6}, 2, 2)


def test_gradient_accumulation_steps_different_from_the_trainer() -> None:
    with pytest.raises(
        ValueError,
        match=r"gradient_accumulation_steps=4 but the loop has accumulate_grad_batches=2\. "
        r"Remove gradient_accumulation_steps from the DeepSpeed config .* or set "
        r"Trainer\(accumulate_grad_batches=4\)",
    ):
        resolve_deepspeed_batch_config({"gradient_accumulation_steps": 4}, 2, 2)


# -- Fabric's DeepSpeed ----------------------------------------------------------------------


def fabric_strategy(**kwargs: Any) -> VarBatchFabricDeepSpeedStrategy:
    """A Fabric strategy of 4 processes with Fabric's DeepSpeed precision, not launched."""
    env = LightningEnvironment()
    env.set_world_size(4)
    strategy = VarBatchFabricDeepSpeedStrategy(cluster_environment=env, **kwargs)
    strategy.precision = DeepSpeedPrecision("32-true")
    return strategy


def test_fabric_gets_the_names_and_the_loops_accumulation() -> None:
    for suffix, (_, params) in DEEPSPEED_VARIANTS.items():
        entry = STRATEGY_REGISTRY["deepspeed_varbatch" + suffix]
        assert entry["strategy"] is VarBatchFabricDeepSpeedStrategy
        assert entry["init_params"] == params
    assert STRATEGY_REGISTRY["deepspeed"]["strategy"] is not VarBatchFabricDeepSpeedStrategy
    users = {"zero_optimization": {"stage": 2}}
    strategy = fabric_strategy(accumulate_grad_batches=3, config=users)
    strategy._format_config()
    assert users == {"zero_optimization": {"stage": 2}}  # the user's dict is left alone
    assert strategy.config["gradient_accumulation_steps"] == 3
    assert strategy.config["train_batch_size"] == 12  # nominal: micro 1 x 3 x 4 ranks
    bad = fabric_strategy(accumulate_grad_batches=3, config={"gradient_accumulation_steps": 2})
    with pytest.raises(
        ValueError, match=r"or set VarBatchFabricDeepSpeedStrategy\(accumulate_grad_batches=2\)"
    ):
        bad._format_config()
    with pytest.raises(SettingValueError, match="accumulate_grad_batches"):
        VarBatchFabricDeepSpeedStrategy(accumulate_grad_batches=0)


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "8"])
def test_non_integer_batch_settings(value: object) -> None:
    with pytest.raises(ValueError, match=r"train_micro_batch_size_per_gpu=.* positive integer"):
        resolve_deepspeed_batch_config({"train_micro_batch_size_per_gpu": value}, 1, 1)


def test_throughput_timer_left_to_the_user_but_warned_about() -> None:
    config = {"timers": {"throughput": {"enabled": False, "synchronized": False}}}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_deepspeed_batch_config(config, 1, 1)
    assert config["timers"] == {"throughput": {"enabled": False, "synchronized": False}}
    with pytest.warns(UserWarning, match="samples/sec assume 1 example"):
        resolve_deepspeed_batch_config({"timers": {"throughput": {"enabled": True}}}, 1, 1)
    with pytest.warns(UserWarning, match="DeepSpeed monitor"):
        resolve_deepspeed_batch_config({"csv_monitor": {"enabled": True}}, 1, 1)
    with pytest.warns(UserWarning, match="flops profiler"):
        resolve_deepspeed_batch_config({"flops_profiler": {"enabled": True}}, 1, 1)


# -- the strategies ----------------------------------------------------------------------------


def _with_trainer(strategy: VarBatchDeepSpeedStrategy, accumulate: int, world: int) -> None:
    environment = LightningEnvironment()
    environment.set_world_size(world)
    strategy.cluster_environment = environment
    trainer = SimpleNamespace(accumulate_grad_batches=accumulate, gradient_clip_val=0.5)
    strategy._lightning_module = SimpleNamespace(trainer=trainer)  # type: ignore[assignment]


def test_strategy_formats_the_config_from_the_trainer() -> None:
    strategy = VarBatchDeepSpeedStrategy(stage=3)
    _with_trainer(strategy, accumulate=4, world=2)
    strategy._format_batch_size_and_grad_accum_config()
    assert strategy.config is not None
    assert strategy.config["gradient_accumulation_steps"] == 4
    assert strategy.config["train_micro_batch_size_per_gpu"] == 1
    assert strategy.config["train_batch_size"] == 8
    assert strategy.config["gradient_clipping"] == 0.5
    assert strategy.config["zero_optimization"]["stage"] == 3
    assert strategy._auto_select_batch_size() == 1


def test_strategy_rejects_a_user_config_with_another_accumulation() -> None:
    strategy = VarBatchDeepSpeedStrategy(config={"gradient_accumulation_steps": 8})
    _with_trainer(strategy, accumulate=2, world=2)
    with pytest.raises(ValueError, match=r"Trainer\(accumulate_grad_batches=8\)"):
        strategy._format_batch_size_and_grad_accum_config()


def test_backward_does_not_scale_by_accumulation_a_second_time() -> None:
    # Lightning's closure already divided the loss by accumulate_grad_batches.
    strategy = VarBatchDeepSpeedStrategy()
    with mock.patch.object(DeepSpeedStrategy, "backward", autospec=True) as parent:
        strategy.backward(torch.tensor(1.0), None)
    assert parent.call_args.kwargs == {"scale_wrt_gas": False}


@pytest.mark.parametrize(("name", "params"), DS_NAMES.items())
def test_deepspeed_names_build_the_strategy_on_cpu(name: str, params: dict[str, Any]) -> None:
    assert StrategyRegistry[name]["init_params"] == params
    trainer = Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
    strategy = trainer.strategy
    assert isinstance(strategy, VarBatchDeepSpeedStrategy)
    assert strategy.config is not None
    stage = params.get("stage", 2)
    assert strategy.config["zero_optimization"]["stage"] == stage
    assert ("offload_optimizer" in strategy.config["zero_optimization"]) == bool(
        params.get("offload_optimizer")
    )


@pytest.mark.parametrize("name", ["fsdp_varbatch", "fsdp_varbatch_cpu_offload"])
def test_fsdp_names_build_the_strategy_on_cpu(name: str) -> None:
    trainer = Trainer(accelerator="cpu", devices=2, strategy=name, logger=False)
    assert isinstance(trainer.strategy, VarBatchFSDPStrategy)
    assert trainer.strategy.kwargs["use_orig_params"] is True
    # Not added to the list Lightning uses to refuse FSDP without a GPU.
    assert name not in FSDPStrategy.get_registered_strategies()


def test_lightning_fsdp_still_refuses_cpu() -> None:
    # The reason for the subclass: the stock name is rejected on CPU.
    with pytest.raises(ValueError, match="requires a GPU accelerator"):
        Trainer(accelerator="cpu", devices=2, strategy="fsdp", logger=False)


def test_fsdp_device_id_is_the_cpu_device_on_cpu() -> None:
    strategy = VarBatchFSDPStrategy(parallel_devices=[torch.device("cpu")] * 2)
    assert strategy._device_id == torch.device("cpu")


def test_fsdp_keeps_an_explicit_use_orig_params() -> None:
    assert VarBatchFSDPStrategy(use_orig_params=False).kwargs["use_orig_params"] is False


def test_registering_twice_is_harmless() -> None:
    VarBatchDeepSpeedStrategy.register_strategies(StrategyRegistry)
    VarBatchFSDPStrategy.register_strategies(StrategyRegistry)


@pytest.mark.slow
def test_import_and_registration_without_deepspeed_installed() -> None:
    code = (
        "import sys; sys.modules['deepspeed'] = None\n"
        "import lightning_varbatch.strategies as s\n"
        "from lightning.pytorch.strategies import StrategyRegistry\n"
        "assert 'deepspeed_varbatch_stage_3' in StrategyRegistry\n"
        "assert 'deepspeed' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@pytest.mark.parametrize(("batches", "warns"), [(6, False), (7, True), (float("inf"), False)])
def test_warns_when_the_epoch_breaks_deepspeed_accumulation(batches: float, warns: bool) -> None:
    strategy = VarBatchDeepSpeedStrategy()
    _with_trainer(strategy, accumulate=2, world=2)
    strategy.lightning_module.trainer.num_training_batches = batches  # type: ignore[union-attr]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy.on_train_start()
    messages = [str(w.message) for w in caught if "micro-batches per rank" in str(w.message)]
    assert bool(messages) == warns
    if warns:
        assert (
            "7 micro-batches per rank, not a multiple of accumulate_grad_batches=2" in (messages[0])
        )


def test_user_config_allows_a_torch_optimizer_under_zero() -> None:
    # docs/migrate-deepspeed.md: VarBatchDeepSpeedStrategy(config={...}) with torch SGD.
    given = {"zero_optimization": {"stage": 2}}
    strategy = VarBatchDeepSpeedStrategy(config=given)
    assert strategy.config is not None
    assert strategy.config["zero_allow_untested_optimizer"] is True
    assert given == {"zero_optimization": {"stage": 2}}  # the user's dict is left alone
    _with_trainer(strategy, accumulate=2, world=1)
    strategy._format_batch_size_and_grad_accum_config()
    assert "gradient_accumulation_steps" not in given
    explicit = VarBatchDeepSpeedStrategy(config={**given, "zero_allow_untested_optimizer": False})
    assert explicit.config is not None
    assert explicit.config["zero_allow_untested_optimizer"] is False
    default = VarBatchDeepSpeedStrategy(stage=2, zero_allow_untested_optimizer=False)
    assert default.config is not None
    assert default.config["zero_allow_untested_optimizer"] is False


def test_registration_with_lightning_loaded_registers_now_and_installs_no_hook() -> None:
    """``import lightning_varbatch`` after Lightning: the names are there at once."""
    from lightning_varbatch._registration import register_when_lightning_loads

    finders = list(sys.meta_path)
    register_when_lightning_loads()
    assert sys.meta_path == finders
    assert {"fsdp_varbatch", *DS_NAMES} <= set(StrategyRegistry)
