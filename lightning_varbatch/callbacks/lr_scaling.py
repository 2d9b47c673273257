"""Scale the learning rate of every optimizer step with the real size of that step.

With token-budgeted batches an optimizer step's size varies; :class:`BatchSizeLRRule` multiplies the
learning rate of the parameter update alone by ``f(actual / reference)`` (torch optimizer step
hooks): schedulers and checkpoints see the unscaled LR. :class:`BatchSizeLRScaler`: its callback.

Example:
    >>> BatchSizeLRRule(rule="sqrt", reference=1024).scale_for(256.0)
    0.5
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np
import torch
from torch.optim import Optimizer
from torch.utils.hooks import RemovableHandle

from lightning_varbatch import keys
from lightning_varbatch.callbacks.batch_counts import (
    CountFn,
    as_number,
    check_count_fns,
    check_positive,
    check_state_keys,
    log_rank_zero,
    read_count,
)
from lightning_varbatch.callbacks.loop_context import LoopContext
from lightning_varbatch.checks import check_choice
from lightning_varbatch.errors import SettingValueError

__all__ = ["BatchSizeLRRule", "torch_optimizer", "training_budget"]

_RULES = ("linear", "sqrt", "none")
_BY = {
    "tokens": (keys.STEP_NTOKENS, keys.NTOKENS),
    "examples": (keys.STEP_NEXAMPLES, keys.NEXAMPLES),
}


def torch_optimizer(optimizer: Any) -> Optimizer:
    """The torch optimizer that really updates the parameters, inside any wrappers.

    Lightning hands callbacks the torch optimizer under DDP and FSDP; under DeepSpeed, the
    ZeRO/bf16 wrapper, whose ``.optimizer`` is the user's (stepped at each accumulation boundary).

    Raises:
        RuntimeError: when no ``torch.optim.Optimizer`` is found.

    Example:
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
        >>> torch_optimizer(opt) is opt
        True
    """
    current, seen = optimizer, set()
    while not isinstance(current, Optimizer) and id(current) not in seen:
        seen.add(id(current))
        inner = getattr(current, "optimizer", None) or getattr(current, "_optimizer", None)
        if inner is None:
            break
        current = inner
    if not isinstance(current, Optimizer):
        raise RuntimeError(
            f"BatchSizeLRScaler found no torch.optim.Optimizer inside {type(optimizer).__name__} "
            "(looked through .optimizer / ._optimizer): it scales the learning rate with step "
            "hooks of the torch optimizer that updates the parameters."
        )
    return current


def training_budget(trainer: Any) -> int | None:
    """The ``max_tokens`` of the loop's train loader, else its sampler's, else its DataModule's.

    ``trainer``: a Trainer or a :class:`~lightning_varbatch.callbacks.loop_context.LoopContext`.

    Example:
        >>> class T: train_dataloader = None; datamodule = type("DM", (), {"max_tokens": 64})()
        >>> training_budget(T())
        64
    """
    loader = getattr(trainer, "train_dataloader", None)
    for owner in (
        loader,
        getattr(loader, "batch_sampler", None),
        getattr(trainer, "datamodule", None),
    ):
        budget = getattr(owner, "max_tokens", None)
        if isinstance(budget, (int, np.integer)) and not isinstance(budget, bool):
            return int(budget)
    return None


class BatchSizeLRRule:
    """Multiply the learning rate of every optimizer step by ``f(actual / reference)``.

    A loop calls :meth:`attach`, :meth:`on_micro_batch` (before each forward),
    :meth:`on_micro_batch_end` (after the optimizer step) and :meth:`detach`
    (:class:`~lightning_varbatch.TokenBudgetLoop`, or :class:`BatchSizeLRScaler` under a Trainer).

    ``actual``: the step's global target tokens (``by="tokens"``) or examples: the batches'
    ``keys.STEP_NTOKENS``/``keys.STEP_NEXAMPLES`` (exact, no collective), else the per-rank counts
    (``keys.NTOKENS``/``keys.NEXAMPLES``, or ``tokens_fn``/``examples_fn``) all-reduced once.

    Order of events in one optimizer step (every strategy, any accumulation):

    1. :meth:`on_micro_batch` of the step's last micro-batch: the factor is computed.
    2. The torch optimizer's step *pre*-hook: each param group's ``lr`` (the scheduler's value)
       is saved and replaced by ``lr × factor``.
    3. The parameter update uses the scaled value.
    4. The step *post*-hook: the saved value is put back (unless the step changed ``lr``).
    5. The loop steps the schedulers (any interval and ``frequency``, ``ReduceLROnPlateau``
       too) and saves checkpoints: all see the unscaled value.

    A step that never reaches the optimizer (a skipped fp16 step) is not scaled.

    Args:
        rule: ``"linear"`` (factor = ratio), ``"sqrt"`` (factor = sqrt(ratio), for Adam-like
            optimizers) or ``"none"`` (factor 1; only logs the ratio).
        by: ``"tokens"`` or ``"examples"``.
        reference: global step size at which the factor is 1. Default (``by="tokens"``):
            ``max_tokens × world_size × accumulate_grad_batches`` with ``max_tokens`` from the
            argument, else the train loader's or the DataModule's (:func:`training_budget`).
        max_tokens: per-rank, per-micro-batch token budget for the default reference.
        min_scale: lower clamp of the factor.
        max_scale: upper clamp of the factor.
        tokens_fn: ``fn(batch)`` -> target tokens of the micro-batch on this rank.
        examples_fn: ``fn(batch)`` -> examples of the micro-batch on this rank.
        log_every_n_steps: log interval in optimizer steps (default: the loop's).

    Raises:
        ValueError: for a bad setting; at the first step, when no reference can be derived.
        TypeError: for a setting of the wrong type, or when a batch cannot be read.

    Logged metrics (rank 0, through the loop's loggers, at the optimizer step's index):

    ===================  ========================================================
    Key                  Meaning
    ===================  ========================================================
    ``train/lr_scale``   factor applied to every param group's lr in this step
    ``train/lr_ratio``   ``actual / reference`` before the rule and the clamp
    ===================  ========================================================

    Example:
        >>> rule = BatchSizeLRRule(rule="linear", reference=8.0, log_every_n_steps=10)
        >>> opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.5)
        >>> rule.attach([opt])
        >>> rule.on_micro_batch({"step_ntokens": 4}, None, boundary=True, step=0)  # type: ignore
        >>> opt.param_groups[0]["params"][0].grad = torch.ones(1)
        >>> opt.step(); rule.on_micro_batch_end(boundary=True); rule.detach()
        >>> opt.param_groups[0]["params"][0].item(), opt.param_groups[0]["lr"]  # 1 - 0.5 * 0.5
        (0.75, 0.5)
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
        check_choice("rule", rule, _RULES, what=" (how the LR follows the step size)")
        check_choice("by", by, tuple(_BY), what=" (what the step size counts)")
        self.reference = check_positive("reference", reference)
        budget = check_positive("max_tokens", max_tokens, integer=True)
        self.max_tokens = None if budget is None else int(budget)
        self.min_scale = check_positive("min_scale", min_scale)
        self.max_scale = check_positive("max_scale", max_scale)
        if (
            self.min_scale is not None
            and self.max_scale is not None
            and self.min_scale > self.max_scale
        ):
            raise SettingValueError(
                f"BatchSizeLRScaler: min_scale={min_scale} is larger than max_scale={max_scale}; "
                "the factor is clamped to [min_scale, max_scale], so set min_scale <= max_scale.",
                setting="min_scale",
                value=min_scale,
            )
        check_count_fns(type(self).__name__, tokens_fn=tokens_fn, examples_fn=examples_fn)
        every = check_positive("log_every_n_steps", log_every_n_steps, integer=True)
        self.rule, self.by = rule, by
        self.count_fn = tokens_fn if by == "tokens" else examples_fn
        self.fn_arg = "tokens_fn" if by == "tokens" else "examples_fn"
        self.log_every_n_steps = None if every is None else int(every)
        self.steps = 0  # real optimizer steps scaled so far
        self.last_scale = 1.0
        self._step_total: float | None = None  # from STEP_* keys (global)
        self._local = 0.0  # summed local counts (all-reduced at the boundary)
        self._scale: float | None = None  # factor of the step about to be taken
        self._stepped = False  # whether the optimizer really stepped with it
        self._applied: dict[int, list[tuple[dict[str, Any], Any, Any]]] = {}
        self._handles: list[RemovableHandle] = []

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

    def _resolve_reference(self, loop: LoopContext) -> float:
        if self.reference is not None:
            return self.reference
        budget = self.max_tokens
        if budget is None:
            budget = training_budget(loop)
        if self.by != "tokens" or budget is None:
            raise ValueError(
                f"BatchSizeLRScaler(by={self.by!r}) cannot derive a reference step size: "
                + (
                    "pass reference=<examples per step at which lr is unchanged>."
                    if self.by != "tokens"
                    else "neither the train loader nor the DataModule has a max_tokens "
                    "(TokenBudgetDataModule, StreamingDataModule and their loaders do); "
                    "pass max_tokens= or reference=."
                )
            )
        self.reference = float(budget) * loop.world_size * int(loop.accumulate_grad_batches)
        return self.reference

    def attach(self, optimizers: Iterable[Any]) -> None:
        """Hook the torch optimizers (inside any wrapper) that the scaled steps update."""
        self.detach()
        seen: set[int] = set()
        for optimizer in optimizers:
            inner = torch_optimizer(optimizer)
            if id(inner) in seen:
                continue
            seen.add(id(inner))
            self._handles.append(inner.register_step_pre_hook(self._before_update))
            self._handles.append(inner.register_step_post_hook(self._after_update))

    def detach(self) -> None:
        """Remove the hooks (and put back an LR a raising step left scaled)."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self._restore_all()

    def _before_update(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        if self._scale is None or id(optimizer) in self._applied:
            return
        applied = []
        for group in optimizer.param_groups:
            base = group["lr"]
            scaled = base * self._scale
            group["lr"] = scaled
            applied.append((group, base, scaled))
        self._applied[id(optimizer)] = applied

    def _after_update(self, optimizer: Optimizer, args: Any, kwargs: Any) -> None:
        applied = self._applied.pop(id(optimizer), None)
        if applied is None:
            return
        self._stepped = True
        for group, base, scaled in applied:
            if group["lr"] is scaled:  # untouched since we scaled it: put the base back
                group["lr"] = base

    def _restore_all(self) -> None:
        for applied in self._applied.values():  # a step that raised between the hooks
            for group, base, scaled in applied:
                if group["lr"] is scaled:
                    group["lr"] = base
        self._applied = {}

    def on_micro_batch(self, batch: Any, loop: LoopContext, boundary: bool, step: int) -> None:
        """Count a micro-batch before its forward; at the step's last one, set the factor.

        Args:
            batch: the micro-batch.
            loop: the loop (read at the boundary only: the collective, the reference's budget).
            boundary: whether this micro-batch ends an optimizer step.
            step: optimizer steps taken before this one (the log step).
        """
        step_key, local_key = _BY[self.by]
        if self.count_fn is None and isinstance(batch, Mapping) and step_key in batch:
            self._step_total = as_number(batch[step_key], f"batch[{step_key!r}]")
        else:
            self._local += read_count(
                batch, local_key, self.count_fn, self.fn_arg, type(self).__name__
            )
        if not boundary:
            return
        reference = self._resolve_reference(loop)
        if self._step_total is not None:
            actual = self._step_total
        else:  # every rank starts the step's last micro-batch: the collective is safe here
            actual = float(loop.sum_over_ranks(torch.tensor(self._local, dtype=torch.float64)))
        scale = self.scale_for(actual)
        self._scale = self.last_scale = scale
        every = self.log_every_n_steps or int(loop.log_every_n_steps)
        if (step + 1) % every == 0:
            ratio = actual / reference
            log_rank_zero(loop, {"train/lr_scale": scale, "train/lr_ratio": ratio}, step)

    def on_micro_batch_end(self, boundary: bool) -> None:
        """After the micro-batch (and the optimizer step it ends): close the step."""
        if not boundary:
            return
        self._restore_all()
        if self._stepped:
            self.steps += 1
        self._stepped = False
        self._scale = None
        self._step_total, self._local = None, 0.0

    def state_dict(self) -> dict[str, Any]:
        """The rule's counts (for a checkpoint)."""
        return {
            "steps": self.steps,
            "last_scale": self.last_scale,
            "reference": self.reference,
            "local": self._local,
            "step_total": self._step_total,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s counts."""
        check_state_keys(type(self).__name__, state_dict, self.state_dict())
        self.steps = int(state_dict["steps"])
        self.last_scale = float(state_dict["last_scale"])
        # "reference" is not restored: a default is re-derived (the world size may change).
        self._local = float(state_dict["local"])
        self._step_total = state_dict["step_total"]
