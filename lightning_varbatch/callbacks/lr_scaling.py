"""Scale the learning rate with the real size of every optimizer step.

With token-budgeted batches the size of an optimizer step varies; :class:`BatchSizeLRScaler`
multiplies the learning rate the optimizer and scheduler want by ``f(actual / reference)`` for
that one step, then puts the unscaled value back, so schedulers never see (nor compound) the
factor.

Example:
    >>> scaler = BatchSizeLRScaler(rule="sqrt", reference=1024)
    >>> scaler.scale_for(256.0)
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, Literal

import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor
from torch.optim import Optimizer
from typing_extensions import override

from lightning_varbatch import keys

__all__ = ["BatchSizeLRScaler"]

CountFn = Callable[[Any], "int | float | Tensor"]
_RULES = ("linear", "sqrt", "none")
_BY = {
    "tokens": (keys.STEP_NTOKENS, keys.NTOKENS),
    "examples": (keys.STEP_NEXAMPLES, keys.NEXAMPLES),
}


def _number(value: Any, what: str) -> float:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise TypeError(
                f"{what} must be a number or a 1-element tensor, got shape {tuple(value.shape)}."
            )
        return float(value.item())
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(
            f"{what} must be a number or a 1-element tensor, got {type(value).__name__}."
        )
    return float(value)


def read_count(batch: Any, key: str, fn: CountFn | None, arg: str, owner: str) -> float:
    """One count of a micro-batch: ``fn(batch)`` if given, else ``batch[key]``.

    Raises:
        TypeError: when ``fn`` is None and the batch is not a mapping holding ``key``; the
            message names the argument (``arg``) to pass.
    """
    if fn is not None:
        return _number(fn(batch), f"{owner}({arg}=...) return value")
    if isinstance(batch, Mapping) and key in batch:
        return _number(batch[key], f"batch[{key!r}]")
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


def is_step_boundary(trainer: Trainer) -> bool:
    """Whether the current micro-batch ends with a real optimizer step (any strategy)."""
    module = trainer.lightning_module
    if not module.automatic_optimization:
        return True
    # The rule Lightning itself uses to count optimizer steps and step schedulers; under
    # DeepSpeed it is also DeepSpeed's boundary (VarBatchDeepSpeedStrategy checks alignment).
    return not trainer.fit_loop._should_accumulate()


def log_rank_zero(trainer: Trainer, metrics: dict[str, float], step: int) -> None:
    """Send ``metrics`` to every logger of the Trainer, from global rank 0 only."""
    if trainer.is_global_zero:
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)


class BatchSizeLRScaler(Callback):
    """Multiply the learning rate of every optimizer step by ``f(actual / reference)``.

    ``actual`` is the global size of the step: its target tokens (``by="tokens"``) or examples
    (``by="examples"``) over all ranks and all accumulation micro-batches. On
    ``TokenBudgetDataModule`` batches it is read from ``keys.STEP_NTOKENS`` /
    ``keys.STEP_NEXAMPLES`` (exact, no collective). Otherwise the per-micro-batch, per-rank counts
    (``keys.NTOKENS`` / ``keys.NEXAMPLES``, or ``tokens_fn`` / ``examples_fn``) are summed over
    the step and all-reduced once, on every rank, at the step boundary.

    Just before the real optimizer step (``on_before_optimizer_step`` on the boundary micro-batch:
    under DeepSpeed Lightning calls that hook on every micro-batch, the others are ignored) each
    param group's ``lr`` (what the optimizer/scheduler left there) is saved and replaced by
    ``lr × factor``; at ``on_train_batch_end`` of that micro-batch, before Lightning steps the
    schedulers and before ``ModelCheckpoint`` saves, the saved value is put back, unless someone
    changed ``lr`` in between. Schedulers (warmup, cosine, chainable or closed form, stepped by
    Lightning or by hand) and checkpoints therefore only ever see unscaled values.

    Args:
        rule: ``"linear"`` (factor = ratio), ``"sqrt"`` (factor = sqrt(ratio), for Adam-like
            optimizers) or ``"none"`` (factor 1; only logs the ratio).
        by: ``"tokens"`` or ``"examples"``.
        reference: global step size at which the factor is 1. Default (``by="tokens"``):
            ``max_tokens × world_size × accumulate_grad_batches`` with ``max_tokens`` from the
            argument or the train loader's ``TokenBudgetBatchSampler``.
        max_tokens: per-rank, per-micro-batch token budget for the default reference.
        min_scale: lower clamp of the factor.
        max_scale: upper clamp of the factor.
        tokens_fn: ``fn(batch)`` -> target tokens of the micro-batch on this rank.
        examples_fn: ``fn(batch)`` -> examples of the micro-batch on this rank.
        log_every_n_steps: log interval in optimizer steps (default: the Trainer's).

    Raises:
        ValueError: for an unknown ``rule``/``by``, a non-positive reference or budget, or
            ``min_scale > max_scale``; at the first step, when no reference can be derived.
        TypeError: when a batch cannot be read (the message names ``tokens_fn``/``examples_fn``).

    Logged metrics (rank 0, through the Trainer's loggers, at the optimizer step's index):

    ===================  ========================================================
    Key                  Meaning
    ===================  ========================================================
    ``train/lr_scale``   factor applied to every param group's lr in this step
    ``train/lr_ratio``   ``actual / reference`` before the rule and the clamp
    ===================  ========================================================

    Example:
        >>> from lightning.pytorch import Trainer
        >>> scaler = BatchSizeLRScaler(rule="linear", max_tokens=4096, max_scale=1.0)
        >>> trainer = Trainer(callbacks=[scaler], accumulate_grad_batches=2)  # doctest: +SKIP
    """

    def __init__(
        self,
        rule: Literal["linear", "sqrt", "none"] = "linear",
        by: Literal["tokens", "examples"] = "tokens",
        reference: float | None = None,
        max_tokens: int | None = None,
        min_scale: float | None = None,
        max_scale: float | None = None,
        tokens_fn: CountFn | None = None,
        examples_fn: CountFn | None = None,
        log_every_n_steps: int | None = None,
    ) -> None:
        if rule not in _RULES:
            raise ValueError(f"rule must be one of {_RULES}, got {rule!r}.")
        if by not in _BY:
            raise ValueError(f"by must be 'tokens' or 'examples', got {by!r}.")
        for name, value in (("reference", reference), ("max_tokens", max_tokens)):
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive, got {value!r}.")
        if min_scale is not None and max_scale is not None and min_scale > max_scale:
            raise ValueError(f"min_scale={min_scale} is larger than max_scale={max_scale}.")
        if log_every_n_steps is not None and log_every_n_steps < 1:
            raise ValueError(f"log_every_n_steps must be >= 1, got {log_every_n_steps}.")
        self.rule, self.by = rule, by
        self.reference, self.max_tokens = reference, max_tokens
        self.min_scale, self.max_scale = min_scale, max_scale
        self.count_fn = tokens_fn if by == "tokens" else examples_fn
        self.fn_arg = "tokens_fn" if by == "tokens" else "examples_fn"
        self.log_every_n_steps = log_every_n_steps
        self.steps = 0  # real optimizer steps scaled so far
        self.last_scale = 1.0
        self._step_total: float | None = None  # from STEP_* keys (global)
        self._local = 0.0  # summed local counts (all-reduced at the boundary)
        self._applied: list[tuple[dict[str, Any], Any, Any]] = []

    def scale_for(self, actual: float) -> float:
        """The factor for a step of global size ``actual`` (needs a resolved ``reference``)."""
        if self.reference is None:
            raise RuntimeError("reference is not resolved yet; pass BatchSizeLRScaler(reference=).")
        ratio = actual / self.reference
        scale = {"linear": ratio, "sqrt": math.sqrt(ratio), "none": 1.0}[self.rule]
        if self.min_scale is not None:
            scale = max(scale, self.min_scale)
        if self.max_scale is not None:
            scale = min(scale, self.max_scale)
        return scale

    def _resolve_reference(self, trainer: Trainer) -> float:
        if self.reference is not None:
            return self.reference
        budget = self.max_tokens
        if budget is None:
            loader = trainer.train_dataloader
            budget = getattr(getattr(loader, "batch_sampler", None), "max_tokens", None)
        if self.by != "tokens" or budget is None:
            raise ValueError(
                f"BatchSizeLRScaler(by={self.by!r}) cannot derive a reference step size: "
                + (
                    "pass reference=<examples per step at which lr is unchanged>."
                    if self.by != "tokens"
                    else "the train loader has no TokenBudgetBatchSampler; "
                    "pass max_tokens= or reference=."
                )
            )
        self.reference = float(budget) * trainer.world_size * int(trainer.accumulate_grad_batches)
        return self.reference

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        step_key, local_key = _BY[self.by]
        if self.count_fn is None and isinstance(batch, Mapping) and step_key in batch:
            self._step_total = _number(batch[step_key], f"batch[{step_key!r}]")
        else:
            self._local += read_count(
                batch, local_key, self.count_fn, self.fn_arg, type(self).__name__
            )

    @override
    def on_before_optimizer_step(
        self, trainer: Trainer, pl_module: LightningModule, optimizer: Optimizer
    ) -> None:
        if self._applied or not is_step_boundary(trainer):
            return  # an accumulating micro-batch (DeepSpeed), or already scaled this step
        reference = self._resolve_reference(trainer)
        if self._step_total is not None:
            actual = self._step_total
        else:  # every rank reaches this boundary: the collective is safe here
            local = torch.tensor(
                self._local, dtype=torch.float64, device=trainer.strategy.root_device
            )
            actual = float(trainer.strategy.reduce(local, reduce_op="sum"))
        scale = self.scale_for(actual)
        for group in optimizer.param_groups:
            base = group["lr"]
            scaled = base * scale
            group["lr"] = scaled
            self._applied.append((group, base, scaled))
        self.last_scale = scale
        every = self.log_every_n_steps or int(getattr(trainer, "log_every_n_steps", 50))
        if (trainer.global_step + 1) % every == 0:
            log_rank_zero(
                trainer,
                {"train/lr_scale": scale, "train/lr_ratio": actual / reference},
                trainer.global_step,
            )

    @override
    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if not is_step_boundary(trainer):
            return
        for group, base, scaled in self._applied:
            if group["lr"] is scaled:  # untouched since we scaled it: put the base back
                group["lr"] = base
        if self._applied:
            self.steps += 1
        self._applied = []
        self._step_total, self._local = None, 0.0

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "last_scale": self.last_scale,
            "reference": self.reference,
            "local": self._local,
            "step_total": self._step_total,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        expected = set(self.state_dict())
        if set(state_dict) != expected:
            raise ValueError(
                f"BatchSizeLRScaler state has keys {sorted(state_dict)}, expected "
                f"{sorted(expected)}: the checkpoint was written by another version."
            )
        self.steps = int(state_dict["steps"])
        self.last_scale = float(state_dict["last_scale"])
        # "reference" is informative: a default reference is re-derived from the resumed run
        # (its world size may differ), an explicit one comes from the constructor.
        self._local = float(state_dict["local"])
        self._step_total = state_dict["step_total"]
