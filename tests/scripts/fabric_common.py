"""The settings of the Fabric runs, shared by ``fabric_train.py`` (per rank) and its test."""

from __future__ import annotations

STEPS = 6  # optimizer steps of a run (the epoch has 5: the runs cross an epoch boundary)
SAVE_AT = 3  # the killed run saves after this step and SIGKILLs itself in the next
REFERENCE = 64.0  # the LR rule's reference step size (tokens)


def decay(step: int) -> float:
    """The LambdaLR factor of optimizer step ``step``."""
    return 1.0 / (1.0 + 0.5 * step)
