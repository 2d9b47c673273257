"""Cost models: how much of the token budget a micro-batch uses.

A cost model is a vectorised ``cost(num_examples, longest, total) -> cost`` of three arrays, one
entry per candidate micro-batch: its examples, its longest example's padded length (rounded up to
``pad_to_multiple_of``) and its unpadded tokens; non-decreasing in each, checked against the budget.

Built-in models (pass the name as ``cost=``):

==============  ===============================================  ==============================
name            cost of a micro-batch                            use it for
==============  ===============================================  ==============================
``"padded"``    ``num_examples * longest``                       padded batches (fairseq rule)
``"sum"``       ``total``                                        packed / varlen attention
``"quadratic"`` ``num_examples * (longest + c * longest**2)``    attention-dominated models
``"packed"``    ``total`` rounded up to ``pad_to_multiple_of``   ``layout="packed"`` (one row)
==============  ===============================================  ==============================
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Literal, TypeAlias

import numpy as np

from lightning_varbatch.checks import check_choice, check_real
from lightning_varbatch.errors import SettingTypeError, SettingValueError

CostName: TypeAlias = Literal["padded", "sum", "quadratic", "packed"]
CostFn: TypeAlias = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]
COST_NAMES: tuple[str, ...] = ("padded", "sum", "quadratic", "packed")


def padded_cost(num_examples: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Token slots after padding: ``num_examples * longest``."""
    del total
    return np.asarray(num_examples, dtype=np.float64) * longest


def sum_cost(num_examples: np.ndarray, longest: np.ndarray, total: np.ndarray) -> np.ndarray:
    """Unpadded tokens: ``total``."""
    del num_examples, longest
    return np.asarray(total, dtype=np.float64)


def quadratic_cost(
    num_examples: np.ndarray, longest: np.ndarray, total: np.ndarray, *, coef: float
) -> np.ndarray:
    """Padded tokens plus an attention term: ``n * L + coef * n * L**2``.

    Example:
        >>> int(quadratic_cost(np.array([2]), np.array([8]), np.array([9]), coef=0.5)[0])
        80
    """
    del total
    longest = np.asarray(longest, dtype=np.float64)
    return np.asarray(num_examples, dtype=np.float64) * (longest + coef * longest * longest)


def packed_cost(
    num_examples: np.ndarray, longest: np.ndarray, total: np.ndarray, *, multiple: int = 1
) -> np.ndarray:
    """Slots of one packed row: the real tokens rounded up to ``multiple`` (the alignment).

    Example:
        >>> int(packed_cost(np.array([3]), np.array([10]), np.array([25]), multiple=8)[0])
        32
    """
    del num_examples, longest
    return np.ceil(np.asarray(total, dtype=np.float64) / multiple) * multiple


def resolve_cost(
    cost: CostName | CostFn, *, quadratic_coef: float = 1 / 64, multiple: int = 1
) -> CostFn:
    """Turn a cost name or callable into a vectorised cost function.

    Args:
        cost: a name of :data:`COST_NAMES` or a callable ``(num_examples, longest, total)``.
        quadratic_coef: the coefficient ``c`` of the ``"quadratic"`` model.
        multiple: the row alignment of the ``"packed"`` model (``pad_to_multiple_of``).

    Raises:
        SettingValueError: for an unknown name or a negative ``quadratic_coef``.
        SettingTypeError: when ``cost`` is neither a name nor callable.

    Example:
        >>> resolve_cost("padded")(np.array([2]), np.array([5]), np.array([7])).tolist()
        [10.0]
    """
    if isinstance(cost, str):
        if cost == "padded":
            return padded_cost
        if cost == "sum":
            return sum_cost
        if cost == "quadratic":
            check_real("quadratic_coef", quadratic_coef, strict=False)
            return partial(quadratic_cost, coef=float(quadratic_coef))
        if cost == "packed":
            return sum_cost if multiple == 1 else partial(packed_cost, multiple=int(multiple))
        check_choice(
            "cost", cost, COST_NAMES, what=" or a callable (num_examples, longest, total) -> cost"
        )
    if callable(cost):
        return cost
    raise SettingTypeError(
        f"cost must be one of {', '.join(COST_NAMES)} or a callable, got {cost!r} "
        f"({type(cost).__name__}); pass e.g. cost='padded'.",
        setting="cost",
        value=cost,
    )


def checked_cost(
    cost_fn: CostFn, num_examples: np.ndarray, longest: np.ndarray, total: np.ndarray
) -> np.ndarray:
    """The cost model on candidate micro-batches, checked for shape and finiteness.

    Raises:
        SettingValueError: a custom ``cost=`` giving a wrong count or NaN/infinite/negative costs.
    """
    raw = cost_fn(num_examples, longest, total)
    try:
        cost = np.asarray(raw, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise SettingValueError(
            f"cost= returned {type(raw).__name__} {raw!r:.60}, not numbers: a cost model "
            "must return one float per candidate micro-batch (an array shaped like its "
            f"num_examples argument) ({err}).",
            setting="cost",
            value=cost_fn,
        ) from None
    shape = np.shape(num_examples)
    if cost.shape != shape:
        raise SettingValueError(
            f"cost= returned shape {cost.shape} for {shape} candidate micro-batches: a cost "
            "model must return one value per candidate (compute it elementwise from "
            "num_examples, longest and total, e.g. num_examples * longest).",
            setting="cost",
            value=cost_fn,
        )
    bad = ~np.isfinite(cost) | (cost < 0)
    if bad.any():
        j = int(np.flatnonzero(bad.reshape(-1))[0])
        raise SettingValueError(
            f"cost= returned {cost.reshape(-1)[j]} for a micro-batch of "
            f"{int(np.reshape(num_examples, -1)[j])} examples (longest "
            f"{int(np.reshape(longest, -1)[j])}): costs must be finite and >= 0; fix the "
            "cost model.",
            setting="cost",
            value=cost_fn,
        )
    return cost


def probe_cost(fn: CostFn) -> None:
    """Call a custom cost model once on two candidates and check what comes back.

    Raises:
        SettingValueError: when it fails, returns the wrong shape, or non-finite / negative costs.

    Example:
        >>> probe_cost(lambda n, longest, total: n * longest)
    """
    n, longest, total = np.array([1, 2]), np.array([8, 8]), np.array([8, 16])
    try:
        out = np.asarray(fn(n, longest, total), dtype=np.float64)
    except Exception as err:  # any failure of user code is reported the same way
        raise SettingValueError(
            f"cost= raised {type(err).__name__}: {err} when called as cost(num_examples, "
            "longest, total) on numpy arrays of two candidates; a cost model must work "
            "elementwise on arrays (e.g. lambda n, longest, total: n * longest).",
            setting="cost",
            value=fn,
        ) from err
    if out.shape != n.shape or not np.isfinite(out).all() or (out < 0).any():
        raise SettingValueError(
            f"cost= returned {out.tolist()!r} (shape {out.shape}) for two candidate "
            "micro-batches: a cost model must return one finite cost >= 0 per candidate, an "
            "array shaped like num_examples (e.g. lambda n, longest, total: n * longest).",
            setting="cost",
            value=fn,
        )


def check_cost(cost: object, layout: str) -> CostName | CostFn:
    """The ``cost`` setting, checked against the ``layout``; the cost the planner uses.

    ``layout="packed"`` takes only the ``"packed"`` cost; a callable is probed once.

    Raises:
        SettingValueError: for an unknown name or a cost the layout cannot use.
        SettingTypeError: for something neither a name nor a callable.

    Example:
        >>> check_cost("padded", "packed"), check_cost("sum", "padded")
        ('packed', 'sum')
    """
    if isinstance(cost, str):
        check_choice(
            "cost", cost, COST_NAMES, what=" or a callable (num_examples, longest, total) -> cost"
        )
    elif not callable(cost):
        raise SettingTypeError(
            f"cost must be one of {', '.join(repr(c) for c in COST_NAMES)} or a callable "
            f"(num_examples, longest, total) -> cost, got {cost!r} ({type(cost).__name__}); "
            "pass e.g. cost='padded'.",
            setting="cost",
            value=cost,
        )
    if layout == "packed":
        if cost not in ("padded", "packed"):
            raise SettingValueError(
                f"layout='packed' budgets the real tokens of a packed row itself, so "
                f"cost={cost!r} cannot apply: leave cost unset with layout='packed' (or use "
                "layout='padded' for another cost model).",
                setting="cost",
                value=cost,
            )
        return "packed"
    if cost == "packed":
        raise SettingValueError(
            "cost='packed' is the budget of packed rows: set layout='packed' instead of "
            "cost='packed' (the collate and the rank balance change with it).",
            setting="cost",
            value=cost,
        )
    if callable(cost):
        probe_cost(cost)
    return cost  # type: ignore[return-value]
