"""Balance per-rank shares by each rank's measured speed, at epoch boundaries.

On a mixed cluster every step waits for its slowest rank; the planner can give each rank a share of
every step (``PlanConfig.rank_shares``), found by measuring compute per unit of planned cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.utilities.rank_zero import rank_zero_info
from typing_extensions import override

from lightning_varbatch import keys
from lightning_varbatch.callbacks.batch_counts import (
    check_state_keys,
    log_rank_zero,
    rank_shares_in_force,
    read_count,
)
from lightning_varbatch.callbacks.compute_clock import ComputeClock
from lightning_varbatch.checks import check_count
from lightning_varbatch.data.streaming_datamodule import StreamingDataModule
from lightning_varbatch.planner import balanced_shares, smoothed_speeds

__all__ = ["RankShareBalancer"]

_OWNER = "RankShareBalancer"
_STATE_KEYS = ("shares", "history")


def _shares_target(trainer: Trainer) -> Any:
    """What takes new shares: the DataModule if it can, else the train loader's batch sampler."""
    sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
    for target in (getattr(trainer, "datamodule", None), sampler):
        if callable(getattr(target, "set_rank_shares", None)):
            return target
    return None


class RankShareBalancer(Callback):
    """Set every rank's share of each step from its measured speed, at epoch boundaries.

    **What is measured.** A rank's compute time: each micro-batch's forward and loss
    (``on_train_batch_start`` to ``on_before_backward``, ``compute_clock.ComputeClock``),
    before DDP's all-reduce makes a fast rank wait (set ``broadcast_buffers=False`` for a model
    with buffers). Under FSDP and ZeRO-3 the forward waits for the slowest rank, so the shares
    move too little: measure with DDP or ZeRO-1/2, or set ``rank_shares`` by hand. Each epoch's
    first ``warmup_steps`` optimizer steps are not timed (allocator, cuDNN, ``torch.compile``).

    **Planned cost** of a micro-batch: ``plan.micro_batch_load`` at the rank's position (the
    units the shares divide), else (another sampler) ``keys.NTOKENS``. Speed: cost per second.

    **When shares change.** At the end of every ``every_n_epochs``-th epoch the ranks all-gather
    every rank's (seconds, cost, micro-batches) and compute, the same on every rank,
    :func:`~lightning_varbatch.planner.balanced_shares` from the shares in force (equal when
    unset) and the speeds smoothed over periods (``share_balance.smoothed_speeds``), for
    ``trainer.datamodule.set_rank_shares`` (else the loader's ``batch_sampler.set_rank_shares``).
    The sampler plans the next epoch with them (a share too small for the longest example is
    raised; no example is lost or repeated; Lightning learns the new epoch length). A period in
    which some rank timed nothing, or one process, changes nothing (``last_period`` still measures).

    Each period's shares and measurement are kept in ``history`` and the checkpoint; a resumed
    run sets the checkpoint's shares again (a no-op when the sampler's state holds them; skipped
    when the world size changed). The sampler's ``rank_shares`` are rounded to whole tokens.

    Args:
        every_n_epochs: epochs per measurement period (shares change at its end).
        smoothing: weight of the earlier periods' speeds, in ``[0, 1)``: the first period's
            measurement sets the shares; later a speed change moves them ``1 - smoothing`` of the
            way (in ratio) per period, so one slow period does not swing them (0: no smoothing).
        tolerance: relative dead band in ``[0, 1)`` around the shares in force (no change inside).
        warmup_steps: optimizer steps at the start of each epoch that are not timed.
        min_share: the least share (of the largest, 1), in ``(0, 1]``; ``None``: none.

    Raises:
        SettingValueError: for a setting out of its range (the message names it).
        SettingTypeError: for a setting of the wrong type.
        RuntimeError: at the start of a multi-process fit whose training data has no
            ``set_rank_shares`` (neither the DataModule nor the loader's ``batch_sampler``).
        SettingValueError: at the start of a multi-process fit over a ``StreamingDataModule``.

    Logged metrics (rank 0, through the Trainer's loggers, at the period's last step):

    ==============================  ===================================================
    Key                             Meaning
    ==============================  ===================================================
    ``train/rank/<r>/next_share``   rank ``r``'s share set for the next period (largest 1)
    ``train/rank/<r>/speed``        rank ``r``'s measured planned cost per compute second
    ==============================  ===================================================

    Example:
        >>> from lightning_varbatch.callbacks import RankShareBalancer
        >>> trainer = Trainer(callbacks=[RankShareBalancer(smoothing=0.5)])  # doctest: +SKIP
    """

    def __init__(
        self,
        every_n_epochs: int = 1,
        smoothing: float = 0.5,
        tolerance: float = 0.05,
        warmup_steps: int = 1,
        min_share: float | None = None,
    ) -> None:
        self.every_n_epochs = check_count(
            "every_n_epochs", every_n_epochs, what=" (epochs per measurement period)"
        )
        self.warmup_steps = check_count(
            "warmup_steps", warmup_steps, minimum=0, what=" (untimed optimizer steps per epoch)"
        )
        # The same checks as the maths uses, so one bad value gives one message.
        balanced_shares(
            [1.0], [1.0], [1.0], smoothing=smoothing, tolerance=tolerance, min_share=min_share
        )
        self.smoothing = float(smoothing)
        self.tolerance = float(tolerance)
        self.min_share = None if min_share is None else float(min_share)
        self.shares: tuple[float, ...] | None = None
        self.history: list[dict[str, Any]] = []
        self.last_period: dict[str, float] | None = None
        self._seconds, self._work, self._count, self._epochs = 0.0, 0.0, 0, 0
        self._start: Any = None
        self._pending_work = 0.0
        self._clock: ComputeClock | None = None
        self._costs: tuple[Any, np.ndarray] | None = None

    def _planned_cost(self, trainer: Trainer, batch: Any, batch_idx: int) -> float | None:
        """This rank's planned cost of the micro-batch at ``batch_idx`` of the epoch."""
        sampler = getattr(trainer.train_dataloader, "batch_sampler", None)
        plan = getattr(sampler, "plan", None)
        convert = getattr(sampler, "consumed_from_epoch_count", None)
        if plan is None or convert is None:
            return read_count(batch, keys.NTOKENS, None, "tokens_fn", _OWNER)
        if self._costs is None or self._costs[0] is not plan:
            order = plan.rank_micro_batches(int(getattr(sampler, "rank", trainer.global_rank)))
            self._costs = (plan, np.asarray(plan.micro_batch_load, dtype=np.float64)[order])
        position = convert(batch_idx)
        costs = self._costs[1]
        if not 0 <= position < costs.size:
            return None  # not the plan's micro-batch (a loader that repeats): not timed
        return float(costs[position])

    @override
    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._clock = ComputeClock(trainer.strategy.root_device)
        self._reset_period()
        if trainer.world_size == 1:
            rank_zero_info(f"{_OWNER}: one process, nothing to balance (shares stay as set).")
            return
        target = _shares_target(trainer)
        if target is None:
            raise RuntimeError(
                f"{_OWNER} found no set_rank_shares on trainer.datamodule nor on the train "
                "loader's batch_sampler: it balances a TokenBudgetDataModule or a loader over a "
                "TokenBudgetBatchSampler. Use one of those, or remove the callback."
            )
        if isinstance(target, StreamingDataModule):  # refused now, with its reason
            target.set_rank_shares(None)
        if self.shares is None:
            return
        if len(self.shares) != trainer.world_size:
            rank_zero_info(
                f"{_OWNER}: the checkpoint's shares {_show(self.shares)} are for "
                f"{len(self.shares)} ranks, this run has {trainer.world_size}: starting from "
                "the sampler's shares."
            )
            return
        # From a checkpoint: a no-op when the sampler's state holds them; a new loader needs it.
        target.set_rank_shares(self.shares)

    @override
    def on_train_batch_start(
        self, trainer: Trainer, pl_module: LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self._start = None
        if batch_idx // trainer.accumulate_grad_batches < self.warmup_steps:
            return
        cost = self._planned_cost(trainer, batch, batch_idx)
        if cost is None:
            return
        assert self._clock is not None
        self._pending_work = cost
        self._start = self._clock.mark()

    @override
    def on_before_backward(
        self, trainer: Trainer, pl_module: LightningModule, loss: torch.Tensor
    ) -> None:
        if self._start is None or self._clock is None:
            return
        self._seconds += self._clock.interval(self._start, self._clock.mark())
        self._work += self._pending_work
        self._count += 1
        self._start = None  # one interval per micro-batch, even with several backward calls

    def _reset_period(self) -> None:
        self._seconds, self._work, self._count, self._epochs = 0.0, 0.0, 0, 0

    @override
    def on_train_epoch_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        assert self._clock is not None
        self._seconds += self._clock.collect()
        self._epochs += 1
        if self._epochs < self.every_n_epochs:
            return
        local = [self._seconds, self._work, float(self._count)]
        self._reset_period()
        self.last_period = dict(zip(("seconds", "work", "micro_batches"), local, strict=True))
        world = trainer.world_size
        if world == 1:
            return
        # Every rank ends the epoch here: gather on all of them, decide the same on all.
        vector = torch.tensor(local, dtype=torch.float64, device=trainer.strategy.root_device)
        rows = trainer.strategy.all_gather(vector).reshape(-1, len(local)).cpu().tolist()
        seconds, work, counts = (list(column) for column in zip(*rows, strict=True))
        if min(counts) < 1 or min(seconds) <= 0 or min(work) <= 0:
            rank_zero_info(
                f"{_OWNER}: some rank timed no micro-batch this period (micro-batches per rank "
                f"{[int(c) for c in counts]}); shares unchanged. Lower warmup_steps or raise "
                "every_n_epochs."
            )
            return
        target = _shares_target(trainer)
        current = rank_shares_in_force(trainer) or (1.0,) * world
        previous = self._smoothed(world)
        shares = balanced_shares(
            seconds,
            work,
            current,
            smoothing=self.smoothing,
            tolerance=self.tolerance,
            min_share=self.min_share,
            previous=previous,
        )
        smoothed = smoothed_speeds(seconds, work, previous, smoothing=self.smoothing)
        speeds = [w / s for w, s in zip(work, seconds, strict=True)]
        changed = not np.allclose(shares, current, rtol=1e-12)
        if changed:
            target.set_rank_shares(shares)  # from the next epoch's plan on
            rank_zero_info(
                f"{_OWNER}: epoch {trainer.current_epoch}: measured speeds {_show(speeds)} "
                f"(planned cost per compute second); shares {_show(current)} -> {_show(shares)} "
                "from the next epoch."
            )
        self.shares = tuple(float(s) for s in shares)
        self.history.append(
            {
                "epoch": int(trainer.current_epoch),
                "shares": list(self.shares),
                "speeds": speeds,
                "smoothed": list(smoothed),
                "seconds": seconds,
                "work": work,
                "changed": bool(changed),
            }
        )
        metrics = {f"train/rank/{r}/next_share": s for r, s in enumerate(self.shares)}
        metrics.update({f"train/rank/{r}/speed": v for r, v in enumerate(speeds)})
        log_rank_zero(trainer, metrics, max(trainer.global_step - 1, 0))

    def _smoothed(self, world: int) -> tuple[float, ...] | None:
        """The speeds smoothed over the earlier periods (``None``: none measured yet)."""
        if not self.history:
            return None
        smoothed = self.history[-1].get("smoothed")
        if smoothed is None or len(smoothed) != world:  # another world size: start afresh
            return None
        return tuple(float(v) for v in smoothed)

    @override
    def state_dict(self) -> dict[str, Any]:
        return {
            "shares": None if self.shares is None else list(self.shares),
            "history": [dict(entry) for entry in self.history],
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        check_state_keys(_OWNER, state_dict, _STATE_KEYS)
        shares = state_dict["shares"]
        self.shares = None if shares is None else tuple(float(s) for s in shares)
        self.history = [dict(entry) for entry in state_dict["history"]]


def _show(values: Sequence[float]) -> str:
    return "[" + ", ".join(f"{v:.3g}" if math.isfinite(v) else str(v) for v in values) + "]"
