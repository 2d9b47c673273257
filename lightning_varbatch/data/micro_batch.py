"""A micro-batch of example ids that knows its place in the plan, and rank discovery.

Example:
    >>> from lightning_varbatch.data.micro_batch import MicroBatch
    >>> MicroBatch([4, 2], epoch=0, step=0, micro=0, rank=0, ntokens=9, step_ntokens=30,
    ...            step_nexamples=7).nexamples
    2
"""

from __future__ import annotations

import os

import numpy as np

__all__ = ["MicroBatch", "resolve_rank_world"]


class MicroBatch(list[int]):
    """Example ids of one micro-batch, with where it sits in the plan.

    Attributes:
        epoch: the epoch.
        step: optimizer step within the current plan of the epoch.
        micro: micro-batch within the step (``0 .. accumulate_grad_batches - 1``).
        rank: the rank that runs it.
        ntokens: its loss tokens (target tokens for pairs).
        step_ntokens: loss tokens of the whole optimizer step, over all ranks and micros:
            the exact normaliser of a token-mean loss.
        step_nexamples: examples of the whole optimizer step, over all ranks and micros.
        dataset: index of the dataset the micro-batch comes from (0 unless several are mixed).
        truncate_to: length its examples are cut to (``oversize="truncate"``), else ``None``.
        world_size: the number of ranks the plan was made for (``None``: unknown).
        accumulate_grad_batches: the accumulation the plan was made for (``None``: unknown).
        planned_lengths: the length the plan budgeted for each example, in the order of the
            ids (its planning length after truncation: ``max(source, target)`` for pairs);
            no padded field of an example may be longer. ``None``: unknown (no check).
        pad_rows: under a shape budget (``max_shapes``), the rows every field is padded to
            (masked rows after the real ones); ``None``: free shapes.
        pad_length: under a shape budget, the length every field is padded to.

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


def resolve_rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """Rank and world size: the arguments, else torch.distributed, else ``RANK``/``WORLD_SIZE``.

    Environment values are checked: ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` must be
    integers (``RANK``/``LOCAL_RANK`` >= 0, ``WORLD_SIZE`` >= 1) and ``RANK < WORLD_SIZE``.

    Raises:
        ValueError: when the rank is not in ``[0, world_size)``, or an environment variable
            it reads is not a valid integer; the message names the variable and its value.

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
