"""The one guard of a partly consumed epoch: the rest is exactly what is left, within budget.

Every path continuing a partly run epoch passes :func:`guard_remainder` before anything is yielded:
from the lengths and the plan alone, the rest holds exactly the planned examples not consumed (but
counted drops), repeats only what the plan reports and keeps every micro-batch within its rank's
budget, else :class:`RemainderError` names the cause. It returns the ledger (:func:`ids_digest` of
the consumed ids) a saved state carries and a load compares (``docs/planning.md``).

Example:
    >>> from lightning_varbatch.planner.epoch_planner import EpochPlanner
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> planner = EpochPlanner(np.arange(1, 41), PlanConfig(max_tokens=60))
    >>> plan = planner.plan_resumed(0, 2, 1, [(3, 1, 2)])  # 2 micro-batches on 3 ranks, then 2
    >>> ledger = guard_remainder(planner, plan)
    >>> ledger.consumed == int(plan.consumed_counts.sum()), ledger.dropped, ledger.repeated
    (True, 0, 0)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_varbatch.errors import RemainderError
from lightning_varbatch.planner.costs import checked_cost
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.protocol import Planner

__all__ = ["EpochLedger", "consumed_ledger", "guard_remainder", "ids_digest"]


def _mixed(ids: np.ndarray) -> np.ndarray:
    """Every id through a 64-bit mixer (splitmix64's finaliser)."""
    x = np.asarray(ids, dtype=np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def ids_digest(ids: np.ndarray | None, counts: np.ndarray | None = None) -> int:
    """An order-free digest of a multiset of example ids (a 64-bit sum of mixed ids).

    ``counts``: the multiset as a count per id instead (``ids`` then unused, pass ``None``).

    Example:
        >>> ids_digest(np.array([3, 1, 2])) == ids_digest(np.array([1, 2, 3]))
        True
        >>> ids_digest(np.array([1, 2])) == ids_digest(np.array([1, 3]))
        False
        >>> ids_digest(np.array([0, 2, 2])) == ids_digest(None, np.array([1, 0, 2]))
        True
    """
    with np.errstate(over="ignore"):
        if counts is not None:
            mixed = _mixed(np.arange(counts.shape[0])) * counts.astype(np.uint64)
        else:
            mixed = _mixed(np.asarray(ids))
        return int(mixed.sum(dtype=np.uint64))


@dataclass(frozen=True)
class EpochLedger:
    """What an epoch consumed up to a position, and what it drops and repeats in all.

    Attributes:
        consumed: examples consumed (repeats counted), over every rank.
        digest: :func:`ids_digest` of them.
        dropped: planned examples the epoch never trains (``tail="drop"``).
        repeated: extra runs of examples the epoch trains more than once.
    """

    consumed: int
    digest: int
    dropped: int
    repeated: int


def _micro_batch_ranks(plan: EpochPlan, micro_batches: np.ndarray) -> np.ndarray:
    """The rank that runs each of ``micro_batches`` (ids into the plan's ``assign``)."""
    ranks = np.broadcast_to(np.arange(plan.world_size)[None, :, None], plan.assign.shape)
    owner = np.full(plan.micro_batch_start.shape[0], -1, dtype=np.int64)
    owner[plan.assign.reshape(-1)] = ranks.reshape(-1)
    return owner[micro_batches]


def _check_budgets(planner: Planner, plan: EpochPlan, micro_batches: np.ndarray) -> None:
    """Every micro-batch in ``micro_batches`` within its rank's (and dataset's) budget."""
    if micro_batches.size == 0:
        return
    mbs = np.unique(micro_batches)
    mbs = mbs[plan.micro_batch_size[mbs] > 0]
    if mbs.size == 0:
        return
    positions, firsts = plan.positions(mbs)
    key = planner.prepared.key[plan.order[positions]].astype(np.int64)
    longest = np.maximum.reduceat(key, firsts)
    total = np.add.reduceat(key, firsts)
    sizes = plan.micro_batch_size[mbs].astype(np.int64)
    dataset = (
        np.zeros(mbs.size, dtype=np.int64)
        if plan.micro_batch_dataset is None
        else plan.micro_batch_dataset[mbs]
    )
    ranks = _micro_batch_ranks(plan, mbs)
    configs = [p.config for p in getattr(planner, "planners", [planner])]
    common = planner.config.max_tokens
    for d in np.unique(dataset).tolist():
        mine = dataset == d
        config = configs[d]
        p = config.pad_to_multiple_of
        cost = checked_cost(config.cost_fn, sizes[mine], -(-longest[mine] // p) * p, total[mine])
        own = config.max_tokens
        if plan.rank_budget is None:
            limit = np.full(cost.shape, own, dtype=np.int64)
        else:  # the ranks' budgets, in the dataset's own scale (a mixture's may differ)
            limit = plan.rank_budget[ranks[mine]].astype(np.int64) * own // common
        if plan.micro_batch_shape is not None:
            shape = plan.micro_batch_shape[mbs[mine]]
            cost = np.maximum(cost, shape[:, 0] * shape[:, 1])
        over = np.flatnonzero(cost > limit + 1e-9)
        if over.size:
            j = int(over[0])
            raise RemainderError(
                f"the rest of epoch {plan.epoch} would give rank {int(ranks[mine][j])} a "
                f"micro-batch of cost {cost[j]:g} over its budget {int(limit[j])}: refusing "
                "the plan rather than running it (a bug; please report it with the settings).",
                cause="over budget",
            )


def consumed_ledger(plan: EpochPlan, start: int) -> tuple[int, int]:
    """``(examples, digest)`` of what the epoch consumed up to ``start`` micro-batches of ``plan``.

    The same figures :func:`guard_remainder` returns, without its checks (a checkpoint's).

    Example:
        >>> from lightning_varbatch.planner import plan_epoch
        >>> plan = plan_epoch(np.array([4, 4, 4, 4]), max_tokens=8, world_size=2)
        >>> consumed_ledger(plan, 1) == (4, ids_digest(np.arange(4)))
        True
    """
    ids = plan.consumed_ids(start)
    examples, digest = int(ids.size), ids_digest(ids)
    if plan.consumed_counts is not None:
        examples += int(plan.consumed_counts.sum())
        digest = (digest + ids_digest(None, plan.consumed_counts)) % (1 << 64)
    return examples, digest


def guard_remainder(
    planner: Planner, plan: EpochPlan, start: int = 0, consumed: np.ndarray | None = None
) -> EpochLedger:
    """Check the rest of ``plan`` after ``start`` micro-batches per rank; the epoch's ledger.

    The epoch consumed what its earlier topologies ran (``consumed``, else ``plan.consumed_counts``)
    plus every rank's first ``start`` micro-batches of ``plan``; over the epoch every planned
    example must run once, but those the plan reports dropped or repeated. A mixture that samples
    its epochs (``steps_per_epoch``) is checked for its budgets only.

    Args:
        planner: the planner that made ``plan`` (its lengths and settings).
        plan: the plan of the epoch, or of its re-planned rest.
        start: micro-batches per rank of ``plan`` already consumed.
        consumed: for a rest of an epoch just planned, each example's runs before it; once
            checked, the plan's ``consumed_counts`` (its ``num_duplicated``: the epoch's).

    Returns:
        The ledger of the consumed part and the epoch's drops and repeats in all.

    Raises:
        RemainderError: when the rest repeats a consumed example, loses one the tail policy
            does not drop, repeats more than the plan reports, or is over a rank's budget.
    """
    n = planner.num_examples
    done, rest = plan.consumed_micro_batches(start)
    given = consumed if consumed is not None else plan.consumed_counts
    before = np.zeros(n, dtype=np.int64) if given is None else given.astype(np.int64)
    ran = before + np.bincount(plan.ids_of_micro_batches(done), minlength=n)
    remaining = np.bincount(plan.ids_of_micro_batches(rest), minlength=n)
    planned = np.ones(n, dtype=bool)
    if planner.prepared.kept is not None:
        planned[:] = False
        planned[planner.prepared.kept] = True
    epoch = f"the rest of epoch {plan.epoch}"
    bug = ": refusing the plan rather than running it (a bug; please report it with the settings)."
    if (remaining[~planned] > 0).any():
        bad = int(np.flatnonzero(~planned & (remaining > 0))[0])
        raise RemainderError(
            f"{epoch} holds example {bad}, which oversize='skip' leaves out{bug}", "unplanned"
        )
    trained = ran + remaining
    lost = int(((trained == 0) & planned).sum())
    repeated = int(np.maximum(trained - 1, 0).sum())
    if getattr(planner, "steps_per_epoch", None) is None:  # one pass: each example once
        again = np.flatnonzero((before > 0) & (remaining > 0))
        if again.size:
            raise RemainderError(
                f"{epoch} would train {again.size} example(s) again that earlier topologies "
                f"of the epoch consumed (e.g. {again[:5].tolist()}){bug}",
                "repeated",
            )
        if lost != plan.num_dropped:
            raise RemainderError(
                f"{epoch} would leave {lost} planned example(s) of the epoch untrained, but "
                f"the tail policy drops {plan.num_dropped}{bug}",
                "lost",
            )
        reported = plan.num_duplicated
        if consumed is not None:  # the plan's own repeats, and those before it
            reported += int(np.maximum(before - 1, 0).sum())
        if repeated != reported:
            raise RemainderError(
                f"the epoch would repeat {repeated} example run(s), but its plan reports "
                f"{reported}{bug}",
                "repeated",
            )
    _check_budgets(planner, plan, rest)
    if consumed is not None:  # checked: the plan is the rest of the epoch
        object.__setattr__(plan, "consumed_counts", consumed)
        object.__setattr__(plan, "num_duplicated", repeated)
    return EpochLedger(
        consumed=int(ran.sum()),
        digest=ids_digest(None, ran),
        dropped=lost,
        repeated=repeated,
    )
