"""What both callbacks read from a micro-batch and from the Trainer, in one place.

The callbacks count tokens and examples per micro-batch (:mod:`lightning_varbatch.keys` entries,
or a user function), find the micro-batch that ends a real optimizer step under any strategy, read
the sampler's plan (the length warm-up's cap, the shares in force) and log from global rank 0 only.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from lightning.pytorch import Trainer
from torch import Tensor

from lightning_varbatch import keys
from lightning_varbatch.checks import check_count, check_real
from lightning_varbatch.errors import SettingTypeError

__all__ = [
    "CountFn",
    "PaddingFn",
    "as_number",
    "check_count_fns",
    "check_positive",
    "check_state_keys",
    "is_step_boundary",
    "length_cap",
    "log_rank_zero",
    "rank_shares_in_force",
    "read_count",
    "read_padding",
    "read_schedule",
]

CountFn = Callable[[Any], "int | float | Tensor"]
"""``fn(batch)`` -> a count of the micro-batch on this rank (a number or a 1-element tensor)."""
PaddingFn = Callable[[Any], "tuple[int | float | Tensor, int | float | Tensor]"]
"""``fn(batch)`` -> ``(real tokens, padded slots)`` of the micro-batch on this rank."""


def as_number(value: Any, what: str) -> float:
    """``value`` (a number or a 1-element tensor) as a float.

    Raises:
        TypeError: for anything else; the message names ``what``.

    Example:
        >>> as_number(3, "count")
        3.0
    """
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{what} must be a number or a 1-element tensor, got shape {tuple(value.shape)}."
            )
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numpy numbers are Real
        raise TypeError(
            f"{what} must be a number or a 1-element tensor, got {type(value).__name__}."
        )
    return float(value)


def check_positive(name: str, value: object, *, integer: bool = False) -> float | None:
    """``value`` as a positive finite number (``None`` passes through).

    :func:`~lightning_varbatch.checks.check_real` (``integer``:
    :func:`~lightning_varbatch.checks.check_count`) with ``None`` allowed: the same message as
    every other check of the setting.

    Example:
        >>> check_positive("peak_flops", 1e15)
        1000000000000000.0
        >>> check_positive("log_every_n_steps", 0, integer=True)
        Traceback (most recent call last):
        ...
        lightning_varbatch.errors.SettingValueError: log_every_n_steps must be a positive ...
    """
    if value is None:
        return None
    if integer:
        return check_count(name, value)
    return check_real(name, value)


def check_count_fns(owner: str, **fns: object) -> None:
    """Refuse a count function (``tokens_fn=`` ...) that is not callable: a SettingTypeError."""
    for name, fn in fns.items():
        if fn is not None and not callable(fn):
            raise SettingTypeError(
                f"{owner}({name}=...) must be callable (fn(batch) -> count), got "
                f"{type(fn).__name__}.",
                setting=name,
                value=fn,
            )


def check_state_keys(owner: str, state_dict: object, expected: Iterable[str]) -> None:
    """Refuse a callback state without exactly the ``expected`` keys: a ValueError."""
    wanted = sorted(expected)
    if not isinstance(state_dict, Mapping) or sorted(state_dict) != wanted:
        got = sorted(state_dict) if isinstance(state_dict, Mapping) else type(state_dict)
        raise ValueError(
            f"{owner} state has keys {got}, expected {wanted}: the checkpoint was written by "
            "another version; resume without this callback's state or start a new run."
        )


def _count(value: float, owner: str, where: str) -> float:
    """A count must be finite and >= 0: a NaN would silently turn the LR or a rate into NaN."""
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"{owner} read a count of {value!r} from {where}: counts of tokens or examples must "
            "be finite numbers >= 0; fix the function (or the batch entry) so that it returns "
            "this micro-batch's count on this rank."
        )
    return value


def read_count(batch: Any, key: str, fn: CountFn | None, arg: str, owner: str) -> float:
    """One count of a micro-batch: ``fn(batch)`` if given, else ``batch[key]``.

    Raises:
        TypeError: when ``fn`` is None and the batch has no ``key`` (the message names ``arg``).

    Example:
        >>> read_count({"ntokens": 5}, "ntokens", None, "tokens_fn", "BatchSizeLRScaler")
        5.0
    """
    if fn is not None:
        return _count(as_number(fn(batch), f"{owner}({arg}=...) return value"), owner, arg)
    if isinstance(batch, Mapping) and key in batch:
        return _count(as_number(batch[key], f"batch[{key!r}]"), owner, f"batch[{key!r}]")
    got = (
        f"a dict with keys {sorted(map(str, batch))}"
        if isinstance(batch, Mapping)
        else (f"a {type(batch).__name__}")
    )
    raise TypeError(
        f"{owner} cannot read {key!r} from the batch: expected a dict batch from "
        f"TokenBudgetDataModule / PaddingCollate, got {got}. Pass {owner}({arg}=fn) with fn(batch) "
        "returning the count for this micro-batch on this rank."
    )


def read_padding(batch: Any, fn: PaddingFn | None) -> tuple[float, float] | None:
    """``(real tokens, padded slots)``: ``fn(batch)``, else the batch keys, else ``None``.

    Example:
        >>> read_padding({"input_tokens": 6, "padded_tokens": 8}, None)
        (6.0, 8.0)
    """
    if fn is not None:
        real, padded = fn(batch)
        return as_number(real, "padding_fn()[0]"), as_number(padded, "padding_fn()[1]")
    if isinstance(batch, Mapping) and keys.PADDED_TOKENS in batch and keys.INPUT_TOKENS in batch:
        pair = (batch[keys.INPUT_TOKENS], batch[keys.PADDED_TOKENS])
        return as_number(pair[0], "input"), as_number(pair[1], "pad")
    return None


def read_schedule(batch: Any, owner: str) -> tuple[float, float] | None:
    """The step's scheduled token budget and planned cost, or ``None`` without a schedule.

    Read from ``keys.STEP_BUDGET`` and ``keys.STEP_COST``, which the plan puts on every
    micro-batch of a step (the same on every rank) when a batch-size schedule is configured.

    Raises:
        TypeError: when an entry is not a number or a 1-element tensor.
        ValueError: when it is not finite and >= 0.

    Example:
        >>> read_schedule({"step_budget": 96, "step_cost": 90}, "TokenThroughputMonitor")
        (96.0, 90.0)
        >>> read_schedule({"ntokens": 5}, "TokenThroughputMonitor") is None
        True
    """
    if not (isinstance(batch, Mapping) and keys.STEP_BUDGET in batch and keys.STEP_COST in batch):
        return None
    budget, cost = (
        _count(as_number(batch[key], f"batch[{key!r}]"), owner, f"batch[{key!r}]")
        for key in (keys.STEP_BUDGET, keys.STEP_COST)
    )
    return budget, cost


def is_step_boundary(trainer: Trainer) -> bool:
    """Whether the current micro-batch ends with a real optimizer step (any strategy).

    Valid from ``on_train_batch_start`` on (Lightning counts the batch as ready before it).
    """
    module = trainer.lightning_module
    if not module.automatic_optimization:
        return True
    # Lightning's own rule for counting optimizer steps; also DeepSpeed's boundary (checked).
    return not trainer.fit_loop.epoch_loop._should_accumulate()


def length_cap(trainer: Any, step: int) -> int | None:
    """The realised length-warm-up cap of the run's optimizer ``step``, from the sampler's plan.

    ``None`` without a token-budget training sampler, without a warm-up or outside it. The plan
    is the sampler's current epoch's, the one its loader iterates (cached, not planned again);
    only epoch 0 has a warm-up, and a plan resumed mid-warm-up counts from the run's step.

    Example:
        >>> from types import SimpleNamespace
        >>> length_cap(SimpleNamespace(train_dataloader=None), 0) is None
        True
    """
    sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
    config = getattr(sampler, "config", None)
    warmup = getattr(config, "length_warmup", None)
    if warmup is None or step >= warmup or getattr(sampler, "epoch", None) != 0:
        return None
    trace = getattr(sampler.plan, "length_warmup", None)  # type: ignore[union-attr]
    return None if trace is None else trace.cap_at(step)


def rank_shares_in_force(trainer: Any) -> tuple[float, ...] | None:
    """The shares the training sampler planned its current epoch with (largest 1), or ``None``.

    ``None`` without ``rank_shares`` on the sampler (equal ranks, or another sampler). A share
    set for the next epochs (``set_rank_shares``) shows here from the epoch it is planned with.

    Example:
        >>> from types import SimpleNamespace
        >>> loader = SimpleNamespace(batch_sampler=SimpleNamespace(rank_shares=(2.0, 1.0)))
        >>> rank_shares_in_force(SimpleNamespace(train_dataloader=loader))
        (1.0, 0.5)
    """
    sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
    shares = getattr(sampler, "rank_shares", None)
    if shares is None or len(shares) == 0:
        return None
    top = max(float(s) for s in shares)
    return tuple(float(s) / top for s in shares)


def log_rank_zero(trainer: Any, metrics: dict[str, float], step: int) -> None:
    """Send ``metrics`` to every logger of the Trainer (or loop), from global rank 0 only."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
