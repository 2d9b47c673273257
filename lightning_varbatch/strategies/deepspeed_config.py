"""DeepSpeed's batch settings for variable-size batches: nominal, consistent, and said so.

DeepSpeed requires ``train_batch_size == micro × gradient_accumulation_steps × world_size`` and
labels its throughput with these numbers; with token-budgeted batches they are nominal.
:func:`resolve_deepspeed_batch_config` sets consistent values (the accumulation from the Trainer),
refuses a config that contradicts the Trainer, and warns where DeepSpeed reports figures on them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from lightning.pytorch.utilities.rank_zero import rank_zero_warn

from lightning_varbatch.errors import SettingValueError

__all__ = ["resolve_deepspeed_batch_config"]

_MONITORS = ("tensorboard", "wandb", "csv_monitor", "comet")


def _setting(config: Mapping[str, Any], key: str) -> int | None:
    """A positive-integer batch setting of the config; ``None`` when unset or ``"auto"``."""
    value = config.get(key)
    if value is None or value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise SettingValueError(
            f"The DeepSpeed config sets {key}={value!r}; it must be a positive integer "
            f"(or leave it out and VarBatchDeepSpeedStrategy sets it).",
            setting=key,
            value=value,
        )
    return int(value)  # a numpy integer as a plain int: DeepSpeed writes the config as JSON


def resolve_deepspeed_batch_config(
    config: dict[str, Any],
    accumulate_grad_batches: int,
    world_size: int,
    accumulation_setting: str = "Trainer(accumulate_grad_batches=...)",
) -> dict[str, Any]:
    """Fill in DeepSpeed's batch settings for variable-size batches, in place.

    DeepSpeed's ``train_batch_size == train_micro_batch_size_per_gpu ×
    gradient_accumulation_steps × world_size`` is nominal here (never checked against a real
    batch). This sets ``gradient_accumulation_steps`` from the Trainer, the micro-batch size to
    ``1`` unless given (or derived from a given ``train_batch_size``), ``train_batch_size`` to the
    product, and switches DeepSpeed's throughput timer off unless the config configures it.

    Args:
        config: the DeepSpeed config dict (modified and returned).
        accumulate_grad_batches: ``Trainer(accumulate_grad_batches)``.
        world_size: number of data-parallel processes.
        accumulation_setting: where the user sets the accumulation, for the error message.

    Returns:
        ``config``, completed.

    Raises:
        ValueError: when the config's ``gradient_accumulation_steps`` differs from the Trainer's,
            or ``train_batch_size`` is not ``micro × accumulation × world size`` (names the fix).

    Example:
        >>> resolve_deepspeed_batch_config({}, accumulate_grad_batches=2, world_size=4)
        {'gradient_accumulation_steps': 2, 'train_micro_batch_size_per_gpu': 1, \
'train_batch_size': 8, 'timers': {'throughput': {'enabled': False}}}
    """
    acc, world = accumulate_grad_batches, world_size
    micro, expected = _batch_sizes(config, acc, world, accumulation_setting)
    config["gradient_accumulation_steps"] = acc
    config["train_micro_batch_size_per_gpu"] = micro
    config["train_batch_size"] = expected
    _nominal_figures_off(config, micro)
    return config


def _batch_sizes(config: Mapping[str, Any], acc: int, world: int, where: str) -> tuple[int, int]:
    """``(micro, train_batch_size)`` consistent with the loop, or the error saying why not."""
    gas = _setting(config, "gradient_accumulation_steps")
    if gas is not None and gas != acc:
        raise SettingValueError(
            f"The DeepSpeed config sets gradient_accumulation_steps={gas} but the loop has "
            f"accumulate_grad_batches={acc}. Remove gradient_accumulation_steps from the DeepSpeed "
            f"config (the strategy sets it from the loop's accumulation) or set "
            f"{where.replace('...', str(gas))}.",
            setting="gradient_accumulation_steps",
            value=gas,
        )
    micro = _setting(config, "train_micro_batch_size_per_gpu")
    total = _setting(config, "train_batch_size")
    if micro is None:
        if total is None:
            micro = 1  # nominal: DeepSpeed never checks it against the real batches
        elif total % (acc * world):
            raise SettingValueError(
                f"The DeepSpeed config sets train_batch_size={total}, which is not a multiple of "
                f"accumulate_grad_batches ({acc}) * world size ({world}) = {acc * world}. With "
                "variable-size batches it is nominal: remove train_batch_size from the DeepSpeed "
                f"config, or set it to a multiple of {acc * world}.",
                setting="train_batch_size",
                value=total,
            )
        else:
            micro = total // (acc * world)
    expected = micro * acc * world
    if total is not None and total != expected:
        raise SettingValueError(
            f"The DeepSpeed config sets train_batch_size={total} but expected "
            f"train_micro_batch_size_per_gpu ({micro}) * accumulate_grad_batches ({acc}) * "
            f"world size ({world}) = {expected}. With variable-size batches both values are "
            "nominal (DeepSpeed never checks them against the real batches): remove "
            f"train_batch_size from the DeepSpeed config, or set it to {expected}.",
            setting="train_batch_size",
            value=total,
        )
    return micro, expected


def _nominal_figures_off(config: dict[str, Any], micro: int) -> None:
    """Turn DeepSpeed's nominal throughput timer off; warn about its other nominal figures.

    A configured timer stays (warning if on); the monitors' and flops profiler's figures warn too.
    """
    # DeepSpeed's ThroughputTimer logs "RunningAvgSamplesPerSec" as train_batch_size / time.
    timers = config.setdefault("timers", {})
    if "throughput" not in timers:
        timers["throughput"] = {"enabled": False}
    elif timers["throughput"].get("enabled", True):
        rank_zero_warn(
            "The DeepSpeed config enables timers.throughput: its samples/sec assume "
            f"{micro} example(s) per micro-batch, which token-budgeted batches do not have. "
            "Use lightning_varbatch's throughput callback instead."
        )
    if any(isinstance(config.get(m), Mapping) and config[m].get("enabled") for m in _MONITORS):
        rank_zero_warn(
            "A DeepSpeed monitor is enabled: its 'Train/Samples/*' x-axis counts "
            "train_batch_size samples per step, a nominal number with variable-size batches."
        )
    profiler = config.get("flops_profiler")
    if isinstance(profiler, Mapping) and profiler.get("enabled"):
        # deepspeed/profiling/flops_profiler/profiler.py, print_model_profile.
        rank_zero_warn(
            "The DeepSpeed flops profiler is enabled: its 'samples/second' assumes "
            f"{micro} example(s) per micro-batch; its FLOPS figures are real."
        )
