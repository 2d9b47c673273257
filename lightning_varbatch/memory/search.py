"""The search of :func:`find_max_tokens`: probe, fit, pick the largest budget, verify.

Each round fits the memory model (:mod:`~.memory.model`) to the probes run so far
(:mod:`~.memory.probes`), picks the largest budget whose planned micro-batches are all predicted
to fit (:mod:`~.memory.prediction`: from the candidates, or by bisection of the bounds) and
probes its worst shape; the first budget whose probe fits is the :class:`~.result.BudgetResult`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy.typing as npt

from lightning_varbatch.memory.model import Coefficients, Probe, check_growth, fit_memory_model
from lightning_varbatch.memory.prediction import Worst, predict_worst
from lightning_varbatch.memory.probes import RunBatch, probe_shapes, run_probe
from lightning_varbatch.memory.result import BudgetResult
from lightning_varbatch.memory.settings import Search, search_settings

__all__ = ["find_max_tokens"]


def find_max_tokens(
    run_batch: RunBatch,
    lengths: npt.ArrayLike,
    memory_limit_bytes: int,
    *,
    candidates: Iterable[int] | None = None,
    bounds: tuple[int, int] | None = None,
    step: int | None = None,
    probes: int = 4,
    margin: float = 0.1,
    rounds: int = 3,
    epochs: int = 1,
    world_size: int = 1,
    **plan_settings: Any,
) -> BudgetResult:
    """The largest ``max_tokens`` whose planned micro-batches fit in ``memory_limit_bytes``.

    ``probes`` shapes (alternately the longest length and a third of it, growing to the lower
    quarter of the search range) are run with ``run_batch`` and ``a + b·B·L + c·B·L²`` is fitted to
    their peaks. Each budget is planned (``lengths``, ``plan_settings``, ``epochs``, ``world_size``)
    and its worst micro-batch must be predicted under ``memory_limit_bytes * (1 - margin)``: the
    largest such candidate, or the largest multiple of ``step`` in ``bounds`` by bisection. The
    choice is verified by probing its worst shape; a probe over the limit (or out of memory) joins
    the fit and the search reruns, at most ``rounds`` times. Settings are checked before any probe;
    under ``oversize="error"`` budgets below the longest example's own cost are never considered.

    Args:
        run_batch: ``run_batch(examples, length)`` runs forward and backward on a synthetic
            batch of that shape, returns its peak bytes (e.g. :func:`~.peak_memory.measure_peak`);
            it may raise :data:`OUT_OF_MEMORY` (``torch.OutOfMemoryError``, ``MemoryError``).
        lengths: the training lengths, ``(n,)`` or ``(n, 2)``, as the data module plans them.
        memory_limit_bytes: memory the worst micro-batch may use (the figure ``run_batch``
            returns: device memory, or the process's resident set on CPU).
        candidates: budgets to choose from.
        bounds: ``(low, high)`` without ``candidates`` (default: longest length to 64 × its cost).
        step: bisection step (default: ``pad_to_multiple_of``, at least ``(high - low) / 1024``).
        probes: initial probes (at least 3).
        margin: share of the limit kept free for what the model misses (0-1).
        rounds: verification rounds.
        epochs: epochs planned per budget (their worst micro-batch counts).
        world_size: ranks to plan for.
        **plan_settings: other ``PlanConfig`` settings (``max_examples``, ``cost``, ``seed``, ...).

    Returns:
        The :class:`BudgetResult`.

    Raises:
        SettingTypeError: for a setting of the wrong type (an unknown plan setting too).
        SettingValueError: for a setting out of range, ``candidates``/``bounds`` all below the
            longest example (under ``oversize="error"``), or ``max_tokens`` among plan settings.
        TypeError: when ``run_batch`` returns something other than a number.
        ValueError: when it returns zero, a negative number, NaN or infinity, the probes'
            memory does not grow with the batch, or no budget is predicted to fit.
        RuntimeError: when the chosen budget's worst shape still exceeds the limit after ``rounds``.

    Example:
        >>> result = find_max_tokens(lambda b, n: 10_000 + 4 * b * n, [30, 60, 90] * 100,
        ...                          60_000, bounds=(90, 50_000), step=10)
        >>> result.max_tokens, result.worst_examples, result.worst_longest
        (11060, 122, 90)
    """
    search = search_settings(
        run_batch,
        lengths,
        memory_limit_bytes,
        candidates=candidates,
        bounds=bounds,
        step=step,
        probes=probes,
        margin=margin,
        rounds=rounds,
        epochs=epochs,
        world_size=world_size,
        plan_settings=plan_settings,
    )
    first_tokens = [max(search.low, search.longest), search.probe_top]
    done = [
        run_probe(run_batch, b, n)
        for b, n in probe_shapes(search.longest, first_tokens, search.probes)
    ]
    return _verified(run_batch, search, done)


def _verified(run_batch: RunBatch, search: Search, done: list[Probe]) -> BudgetResult:
    """The rounds of fit, choice and verifying probe, from the initial probes ``done``."""
    refused: list[tuple[int, ValueError]] = []
    ceiling = search.high
    for _ in range(search.rounds):
        coef = fit_memory_model(done)
        check_growth(coef, done)
        choice = _choose(search, coef, ceiling, refused)
        if choice is None:
            raise _nothing_fits(search, coef, refused)
        budget, (predicted, examples, length) = choice
        final = run_probe(run_batch, examples, length)
        done.append(final)
        if final.peak_bytes is not None and final.peak_bytes <= search.limit:
            return BudgetResult(
                max_tokens=budget,
                memory_limit_bytes=search.limit,
                margin=float(search.margin),
                coefficients=coef,
                worst_examples=examples,
                worst_longest=length,
                predicted_bytes=predicted,
                measured_bytes=final.peak_bytes,
                probes=tuple(done),
            )
        if final.peak_bytes is None:  # out of memory: no peak to fit; search below, halfway
            ceiling = search.low + (budget - search.low) // 2
    raise RuntimeError(
        f"find_max_tokens: after {search.rounds} rounds the chosen budget's worst micro-batch "
        f"still exceeds memory_limit_bytes={search.limit} (probes: "
        f"{[(p.examples, p.length, p.peak_bytes) for p in done]}): memory does not follow "
        "a + b·B·L + c·B·L²; raise margin= or rounds=, or pass explicit candidates."
    )


def _fits(
    search: Search, budget: int, coef: Coefficients, refused: list[tuple[int, ValueError]]
) -> Worst | None:
    """The budget's predicted worst micro-batch if it fits under the limit, else ``None``."""
    if search.config.oversize == "error" and budget < search.needed:
        return None  # cannot hold the longest example
    worst = predict_worst(
        search.lengths,
        budget,
        coef,
        search.epochs,
        search.world_size,
        search.plan_settings,
        refused,
    )
    return worst if worst is not None and worst[0] <= search.allowed else None


def _choose(
    search: Search, coef: Coefficients, ceiling: int, refused: list[tuple[int, ValueError]]
) -> tuple[int, Worst] | None:
    """Largest budget ≤ ``ceiling`` predicted to fit (a candidate or bisected), its worst batch."""
    if search.grid is not None:
        for budget in reversed([g for g in search.grid if g <= ceiling]):
            found = _fits(search, budget, coef, refused)
            if found is not None:
                return budget, found
        return None
    step, low = search.step, search.low
    assert step is not None
    # budgets low + k * step; under oversize="error" from the first that holds the longest example
    lo_k = 0 if search.config.oversize != "error" else max(0, -(-(search.needed - low) // step))
    hi_k = (ceiling - low) // step
    choice: tuple[int, Worst] | None = None
    while lo_k <= hi_k:
        mid = (lo_k + hi_k) // 2
        found = _fits(search, low + mid * step, coef, refused)
        if found is not None:
            choice = (low + mid * step, found)
            lo_k = mid + 1
        else:
            hi_k = mid - 1
    return choice


def _nothing_fits(
    search: Search, coef: Coefficients, refused: list[tuple[int, ValueError]]
) -> ValueError:
    """The error when no budget is predicted to fit, with the smallest budget's prediction."""
    strict = search.config.oversize == "error"
    first = search.low if not strict else max(search.low, search.needed)
    if search.grid is not None:
        first = next(g for g in search.grid if not strict or g >= search.needed)
    smallest = predict_worst(
        search.lengths, first, coef, search.epochs, search.world_size, search.plan_settings
    )
    if smallest is None:
        why = next((str(e) for b, e in refused if b == first), "")
        said = f"cannot be planned ({why})" if why else "cannot be planned"
        fix = "Pass larger candidates or bounds, or oversize='error' to see the longest example."
    else:
        said = (
            f"is predicted to need {smallest[0]:.0f} bytes ({smallest[1]} examples x "
            f"{smallest[2]} tokens)"
        )
        fix = "Raise the limit, shorten the longest examples, or use less memory per token."
    return ValueError(
        f"No budget fits memory_limit_bytes={search.limit} with margin={search.margin}: the "
        f"smallest, max_tokens={first}, {said} (fitted a, b, c = {coef}). {fix}"
    )
