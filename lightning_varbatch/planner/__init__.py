"""The epoch planner: numpy only, no torch, no Lightning.

Everything that decides *which examples form which micro-batch on which rank* lives here:
settings (:class:`PlanConfig`), cost models, length validation, the sorted layout, the tail
policy, the dealing of micro-batches to ranks, the epoch plan, the mixture planner for several
datasets and the diagnostics. :class:`Planner` is the contract both planners keep with the
sampler. The torch and Lightning layers (:mod:`lightning_varbatch.data`,
strategies, callbacks) only read plans; nothing here imports them.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> planner = EpochPlanner([3, 5, 2, 7, 4], PlanConfig(max_tokens=10))
    >>> plan = planner.plan(epoch=0, world_size=1)
    >>> sorted(int(i) for i in plan.order)
    [0, 1, 2, 3, 4]
"""

from lightning_varbatch.planner.diagnostics import PlanDiagnostics, diagnose, rank_loads
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner, plan_epoch
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.sources import DataSource

__all__ = [
    "DataSource",
    "EpochPlan",
    "EpochPlanner",
    "MixturePlanner",
    "PlanConfig",
    "PlanDiagnostics",
    "Planner",
    "diagnose",
    "plan_epoch",
    "rank_loads",
]
