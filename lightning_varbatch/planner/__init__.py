"""The epoch planner: numpy only, no torch, no Lightning.

Everything that decides *which examples form which micro-batch on which rank* lives here (modules:
``docs/architecture.md``); :class:`Planner` is the contract both planners keep with the sampler. The
torch and Lightning layers (:mod:`lightning_varbatch.data`, strategies, callbacks) only read plans.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> planner = EpochPlanner([3, 5, 2, 7, 4], PlanConfig(max_tokens=10))
    >>> plan = planner.plan(epoch=0, world_size=1)
    >>> sorted(int(i) for i in plan.order)
    [0, 1, 2, 3, 4]
"""

from lightning_varbatch.planner.batch_schedule import BatchSchedule
from lightning_varbatch.planner.diagnostics import PlanDiagnostics, diagnose, rank_loads
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.flops import FlopModel
from lightning_varbatch.planner.length_warmup import SCHEDULES as LENGTH_WARMUP_SCHEDULES
from lightning_varbatch.planner.length_warmup import LengthWarmupTrace
from lightning_varbatch.planner.lengths import MAX_OVERSIZE_FRACTION
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import MIXING_POLICIES, DataSource
from lightning_varbatch.planner.mixture_report import dataset_breakdown, format_breakdown
from lightning_varbatch.planner.one_call import plan_epoch
from lightning_varbatch.planner.pair_order import PAIR_ORDERS, pair_slots
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.rank_shares import rank_budgets
from lightning_varbatch.planner.schedule_report import (
    ScheduleReport,
    ScheduleStage,
    schedule_report,
)
from lightning_varbatch.planner.scheduled_plan import schedule_counts
from lightning_varbatch.planner.settings import (
    DEFAULT_FLOP_ATTENTION,
    LAYOUTS,
    OVERSIZE_POLICIES,
    TAIL_POLICIES,
    PlanConfig,
)
from lightning_varbatch.planner.share_balance import balanced_shares, smoothed_speeds
from lightning_varbatch.planner.synthetic import wmt_like_lengths
from lightning_varbatch.planner.warmup_report import WarmupReport, WarmupStage, warmup_report

__all__ = [
    "DEFAULT_FLOP_ATTENTION",
    "LAYOUTS",
    "LENGTH_WARMUP_SCHEDULES",
    "MAX_OVERSIZE_FRACTION",
    "MIXING_POLICIES",
    "OVERSIZE_POLICIES",
    "PAIR_ORDERS",
    "TAIL_POLICIES",
    "BatchSchedule",
    "DataSource",
    "EpochPlan",
    "EpochPlanner",
    "FlopModel",
    "LengthWarmupTrace",
    "MixturePlanner",
    "PlanConfig",
    "PlanDiagnostics",
    "Planner",
    "ScheduleReport",
    "ScheduleStage",
    "WarmupReport",
    "WarmupStage",
    "balanced_shares",
    "dataset_breakdown",
    "diagnose",
    "format_breakdown",
    "pair_slots",
    "plan_epoch",
    "rank_budgets",
    "rank_loads",
    "schedule_counts",
    "schedule_report",
    "smoothed_speeds",
    "warmup_report",
    "wmt_like_lengths",
]
