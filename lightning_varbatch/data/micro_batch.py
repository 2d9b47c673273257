"""A micro-batch of example ids that knows its place in the plan, and rank discovery."""

from __future__ import annotations

import os

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.scheduled_plan import schedule_counts
from lightning_varbatch.planner.settings import PlanConfig

__all__ = [
    "MicroBatch",
    "check_loss_tokens",
    "micro_batch_of",
    "process_group_topology",
    "resolve_rank_world",
]


class MicroBatch(list[int]):
    """Example ids of one micro-batch, with where it sits in the plan.

    Attributes:
        epoch: the epoch.
        step: the epoch's optimizer step (also after a topology change: a begun step counts).
        micro: micro-batch within the step (``0 .. accumulate_grad_batches - 1``).
        rank: the rank that runs it.
        ntokens: its loss tokens (target tokens for pairs).
        step_ntokens: loss tokens of the whole step (all ranks, micros): a token mean's normaliser.
        step_nexamples: examples of the whole optimizer step, over all ranks and micros.
        dataset: index of the dataset the micro-batch comes from (0 unless several are mixed).
        truncate_to: length its examples are cut to (``oversize="truncate"``), else ``None``.
        world_size: the number of ranks the plan was made for (``None``: unknown).
        accumulate_grad_batches: the accumulation the plan was made for (``None``: unknown).
        planned_lengths: each example's budgeted length, in id order (planning length after
            truncation; pairs: ``max(source, target)``), no padded field longer; ``None``: no check.
        pad_rows: under a shape budget, the rows each field is padded to (masked); ``None``: free.
        pad_length: under a shape budget, the length every field is padded to.
        step_budget: under a batch-size schedule, the step's token budget (every rank's
            budget at the step's fraction × the accumulation, summed); ``None``: no schedule.
        step_cost: under a batch-size schedule, the step's planned cost (the same unit).

    Example:
        >>> batch = MicroBatch([4, 2], epoch=0, step=0, micro=0, rank=0, ntokens=9,
        ...                    step_ntokens=30, step_nexamples=7)
        >>> batch, batch.nexamples, batch.step_ntokens
        ([4, 2], 2, 30)
    """

    def __init__(
        self,
        ids: list[int],
        *,
        epoch: int,
        step: int,
        micro: int,
        rank: int,
        ntokens: int,
        step_ntokens: int,
        step_nexamples: int,
        dataset: int = 0,
        truncate_to: int | None = None,
        world_size: int | None = None,
        accumulate_grad_batches: int | None = None,
        planned_lengths: list[int] | None = None,
        pad_rows: int | None = None,
        pad_length: int | None = None,
        step_budget: int | None = None,
        step_cost: int | None = None,
    ) -> None:
        super().__init__(ids)
        self.epoch = epoch
        self.step = step
        self.micro = micro
        self.rank = rank
        self.ntokens = ntokens
        self.step_ntokens = step_ntokens
        self.step_nexamples = step_nexamples
        self.dataset = dataset
        self.truncate_to = truncate_to
        self.world_size = world_size
        self.accumulate_grad_batches = accumulate_grad_batches
        self.planned_lengths = planned_lengths
        self.pad_rows = pad_rows
        self.pad_length = pad_length
        self.step_budget = step_budget
        self.step_cost = step_cost

    @property
    def nexamples(self) -> int:
        """Examples in this micro-batch."""
        return len(self)


def _env_int(name: str, default: int, minimum: int) -> int:
    """An integer environment variable, checked; ``default`` when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        value = None
    if value is None or value < minimum:
        raise ValueError(
            f"The environment variable {name}={raw!r} is not an integer >= {minimum}. It is "
            "set by the launcher (torchrun, SLURM, Lightning); fix or unset it, or pass "
            "rank/world_size explicitly."
        )
    return value


def micro_batch_of(
    plan: EpochPlan,
    planner: Planner,
    rank: int,
    position: int,
    *,
    epoch: int,
    ids: np.ndarray | None = None,
    first_step: int = 0,
) -> MicroBatch:
    """The :class:`MicroBatch` ``rank`` runs at ``position`` of ``plan`` (its run order).

    Args:
        plan: the plan (of the epoch, or of one window of a stream).
        planner: the planner that made it (its lengths, truncation).
        rank: the rank.
        position: the micro-batch's index among the rank's micro-batches of ``plan``.
        epoch: the epoch it belongs to.
        ids: global ids of the plan's local ids (a stream's window); ``None``: the dataset's ids.
        first_step: the epoch's step where ``plan`` starts (a re-planned rest, a later window).

    Raises:
        IndexError: when ``position`` is not in ``[0, micro-batches per rank)``.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> planner = EpochPlanner([3, 3, 5], PlanConfig(max_tokens=6, shuffle=False))
        >>> mb = micro_batch_of(planner.plan(0), planner, 0, 1, epoch=0)
        >>> list(mb), mb.step, mb.ntokens
        ([0, 1], 1, 6)
    """
    total = plan.num_micro_batches_per_rank
    if not 0 <= position < total:
        raise IndexError(f"position {position} is not in [0, {total}) for this epoch.")
    index = int(plan.rank_micro_batches(rank)[position])
    acc = plan.accumulate_grad_batches
    step, micro = divmod(position, acc)
    local = plan.micro_batch_ids(index)
    dataset = int(plan.step_dataset[step, rank, micro])
    shape = (
        (None, None) if plan.micro_batch_shape is None else plan.micro_batch_shape[index].tolist()
    )
    scheduled = schedule_counts(plan, planner)
    return MicroBatch(
        (local if ids is None else ids[local]).tolist(),
        epoch=epoch,
        step=first_step + step,
        micro=micro,
        rank=rank,
        ntokens=int(plan.micro_batch_tokens[index]),
        step_ntokens=int(plan.step_tokens[step]),
        step_nexamples=int(plan.step_examples[step]),
        dataset=dataset,
        truncate_to=planner.dataset_truncate_to(dataset),
        world_size=plan.world_size,
        accumulate_grad_batches=acc,
        planned_lengths=planner.prepared.key[local].tolist(),
        pad_rows=shape[0],
        pad_length=shape[1],
        step_budget=None if scheduled is None else int(scheduled[0][step]),
        step_cost=None if scheduled is None else int(scheduled[1][step]),
    )


def check_loss_tokens(plan: EpochPlan, config: PlanConfig) -> None:
    """Refuse, when planned, a step with no loss tokens (its token mean would divide by 0).

    Raises:
        SettingValueError: naming ``loss_offset`` (or the loss lengths) and the step.

    Example:
        >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
        >>> config = PlanConfig(max_tokens=4, loss_offset=1, shuffle=False)
        >>> check_loss_tokens(EpochPlanner([1, 1, 3], config).plan(0), config)
        Traceback (most recent call last):
        ...
        lightning_varbatch.errors.SettingValueError: Optimizer step 1 of epoch 0 has no loss ...
    """
    empty = np.flatnonzero(plan.step_tokens == 0)
    if not empty.size:
        return
    step = int(empty[0])
    setting = "loss_offset" if config.loss_offset else "loss_lengths"
    why = (
        f"loss_offset={config.loss_offset} leaves no loss token in examples of "
        f"{config.loss_offset} token(s) or fewer"
        if config.loss_offset
        else "its examples' loss lengths are all 0 (one-token examples of packed rows, whose "
        "labels are the next token, have none)"
    )
    raise SettingValueError(
        f"Optimizer step {step} of epoch {plan.epoch} has no loss tokens ({empty.size} such "
        f"step(s) in the epoch): {why}, and the step's token mean (step_token_mean) would "
        "divide by zero. Leave the examples without loss tokens out of the data, or fix the "
        f"{setting}.",
        setting=setting,
        value=config.loss_offset if config.loss_offset else None,
    )


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: the arguments, else torch.distributed, else ``RANK``/``WORLD_SIZE``.

    Environment values are checked: ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` must be
    integers (``RANK``/``LOCAL_RANK`` >= 0, ``WORLD_SIZE`` >= 1) and ``RANK < WORLD_SIZE``.

    Raises:
        ValueError: a rank outside ``[0, world_size)`` or a bad integer in the environment (named).

    Example:
        >>> resolve_rank_world(1, 4)
        (1, 4)
    """
    from_env: list[str] = []
    if rank is None or world_size is None:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            found_rank, found_world = dist.get_rank(), dist.get_world_size()
        else:
            found_rank = _env_int("RANK", 0, 0)
            found_world = _env_int("WORLD_SIZE", 1, 1)
            _env_int("LOCAL_RANK", 0, 0)
            from_env = [n for n in ("RANK", "WORLD_SIZE") if os.environ.get(n, "").strip()]
        rank = found_rank if rank is None else rank
        world_size = found_world if world_size is None else world_size
    if (
        isinstance(world_size, bool)
        or not isinstance(world_size, (int, np.integer))
        or world_size < 1
    ):
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}.")
    if (
        isinstance(rank, bool)
        or not isinstance(rank, (int, np.integer))
        or not 0 <= rank < world_size
    ):
        source = ""
        if from_env:
            shown = ", ".join(
                f"{n}={os.environ[n]!r}" for n in ("RANK", "WORLD_SIZE") if n in os.environ
            )
            source = f" (from the environment: {shown}; the launcher must set RANK < WORLD_SIZE)"
        raise ValueError(f"rank must be in [0, world_size={world_size}), got {rank!r}{source}.")
    return int(rank), int(world_size)


def process_group_topology(rank: int, world_size: int, inferred: bool) -> tuple[int, int] | None:
    """torch.distributed's ``(rank, world_size)`` where it differs from a sampler's, else ``None``.

    A sampler built before the launcher started the ranks (at the top of a script Lightning
    re-executes per rank) resolved its topology too early (``inferred``): it must follow the
    process group, or the ranks plan for different world sizes and hang at the epoch's end.

    Raises:
        RuntimeError: when the sampler was given another rank or world size explicitly.

    Example:
        >>> process_group_topology(0, 1, inferred=True) is None  # no process group here
        True
    """
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    found = (dist.get_rank(), dist.get_world_size())
    if found == (rank, world_size):
        return None
    if inferred:
        return found
    raise RuntimeError(
        f"TokenBudgetBatchSampler was built for rank {rank} of world_size {world_size}, but "
        f"torch.distributed runs rank {found[0]} of {found[1]}: every rank must plan for the "
        "real topology or the ranks get different batches and hang. Pass rank/world_size of "
        "the process group (in a LightningModule or DataModule: trainer.global_rank and "
        "trainer.world_size), or leave them unset."
    )
