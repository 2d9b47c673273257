"""Pick ``max_tokens`` for a memory limit from a few measured probes.

:func:`find_max_tokens` fits the memory model ``a + b·B·L + c·B·L²`` (``B`` examples padded
to length ``L``: fixed memory, activations, attention scores) to a handful of probes, each a
forward and backward pass on a synthetic batch of one shape, then picks the largest
``max_tokens`` whose planned micro-batches are all predicted to fit under
``memory_limit_bytes * (1 - margin)``, and verifies it with one more probe of the predicted
worst shape. :func:`~lightning_varbatch.callbacks.worst_batch.measure_peak` measures a probe.

Example:
    >>> import numpy as np
    >>> def run_batch(examples: int, length: int) -> int:  # a model's peak bytes, known exactly
    ...     return 1000 + 8 * examples * length + examples * length**2 / 16
    >>> result = find_max_tokens(run_batch, np.arange(8, 129).repeat(20), 200_000,
    ...                          candidates=range(1024, 16385, 1024))
    >>> result.max_tokens, result.overrides(), (result.worst_examples, result.worst_longest)
    (10240, ['data.max_tokens=10240'], (80, 128))
    >>> [round(c, 4) for c in result.coefficients], result.measured_bytes <= 180_000
    ([1000.0, 8.0, 0.0625], True)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lightning_varbatch.planner.diagnostics import tile_figures
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["BudgetResult", "Probe", "find_max_tokens", "fit_memory_model"]

RunBatch = Callable[[int, int], int | float]


@dataclass(frozen=True)
class Probe:
    """One measured shape: ``examples`` sequences padded to ``length`` needed ``peak_bytes``.

    ``peak_bytes`` is ``None`` when the probe ran out of memory.
    """

    examples: int
    length: int
    peak_bytes: float | None


def fit_memory_model(probes: Iterable[Probe]) -> tuple[float, float, float]:
    """Least-squares ``(a, b, c)`` of ``peak ≈ a + b·B·L + c·B·L²``, every coefficient >= 0.

    A coefficient the unconstrained fit makes negative (noise) is set to 0 and the others are
    refitted.

    Raises:
        ValueError: with fewer than 3 successful probes, or shapes that cannot separate the
            three terms.

    Example:
        >>> fit_memory_model([Probe(1, 8, 100 + 2 * 8 + 64), Probe(4, 8, 100 + 64 + 256),
        ...                   Probe(2, 16, 100 + 64 + 512)])
        (100.0, 2.0, 1.0)
    """
    done = [p for p in probes if p.peak_bytes is not None]
    if len(done) < 3:
        raise ValueError(
            f"fitting a + b·B·L + c·B·L² needs at least 3 successful probes, got {len(done)}: "
            "raise probes= or the memory limit, or pass smaller bounds/candidates."
        )
    bl = np.array([p.examples * p.length for p in done], dtype=np.float64)
    bll = bl * np.array([p.length for p in done], dtype=np.float64)
    x = np.stack([np.ones_like(bl), bl, bll], axis=1)
    y = np.array([float(p.peak_bytes or 0) for p in done])
    scale = np.abs(x).max(axis=0)
    active = [0, 1, 2]
    coef = np.zeros(3)
    while active:
        sub = x[:, active] / scale[active]
        if np.linalg.matrix_rank(sub) < len(active):
            raise ValueError(
                "the probes' shapes cannot separate a, b and c (they need different lengths "
                f"and sizes): {[(p.examples, p.length) for p in done]}."
            )
        solution = np.linalg.lstsq(sub, y, rcond=None)[0] / scale[active]
        negative = [a for a, s in zip(active, solution, strict=True) if s < 0]
        if not negative:
            coef[:] = 0.0
            coef[active] = solution
            break
        active = [a for a in active if a not in negative]
    a, b, c = (float(np.round(v, 9)) for v in coef)
    return a, b, c


@dataclass(frozen=True)
class BudgetResult:
    """The chosen budget, the fitted memory model and the probes it came from.

    Attributes:
        max_tokens: the chosen budget of one micro-batch.
        memory_limit_bytes: the limit it was chosen for.
        margin: the share of the limit kept free when predicting.
        coefficients: ``(a, b, c)`` of ``peak ≈ a + b·B·L + c·B·L²``.
        worst_examples: examples of the plan's micro-batch predicted to need most memory.
        worst_longest: its longest padded length.
        predicted_bytes: the model's prediction for it.
        measured_bytes: what the final probe of that shape measured.
        probes: every probe, in the order they ran.
    """

    max_tokens: int
    memory_limit_bytes: int
    margin: float
    coefficients: tuple[float, float, float]
    worst_examples: int
    worst_longest: int
    predicted_bytes: float
    measured_bytes: float
    probes: tuple[Probe, ...] = field(default_factory=tuple)

    def predict(self, examples: int, length: int) -> float:
        """Predicted peak bytes of ``examples`` sequences padded to ``length``."""
        a, b, c = self.coefficients
        return a + b * examples * length + c * examples * length * length

    def overrides(self, prefix: str = "data") -> list[str]:
        """Hydra-style overrides that set the budget, e.g. ``["data.max_tokens=12288"]``."""
        return [f"{prefix}.max_tokens={self.max_tokens}"]

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (probes as a list of dicts)."""
        d = asdict(self)
        d["coefficients"] = list(self.coefficients)
        d["probes"] = [asdict(p) for p in self.probes]
        return d

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")


def _planning_lengths(lengths: npt.ArrayLike) -> np.ndarray:
    arr = np.asarray(lengths)
    if arr.ndim == 2:
        arr = arr.max(axis=1)
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(
            "lengths must be a non-empty (n,) or (n, 2) array of per-example lengths, got shape "
            f"{np.shape(lengths)}."
        )
    return arr.astype(np.int64)


def _worst(
    lengths: npt.ArrayLike,
    max_tokens: int,
    coef: tuple[float, float, float],
    epochs: int,
    world_size: int,
    settings: dict[str, Any],
) -> tuple[float, int, int] | None:
    """Predicted peak of the plan's most demanding micro-batch and its shape (None: unplannable)."""
    try:
        planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, **settings))
    except ValueError:
        return None
    a, b, c = coef
    best: tuple[float, int, int] | None = None
    for epoch in range(epochs):
        plan = planner.plan(epoch=epoch, world_size=world_size)
        tiles = tile_figures(planner, plan)
        run = np.unique(np.asarray(plan.assign).reshape(-1))
        run = run[tiles.size[run] > 0]
        if run.size == 0:
            continue
        slots = tiles.slots[run].astype(np.float64)
        longest = tiles.longest[run].astype(np.float64)
        if planner.config.layout == "packed":
            attention = tiles.squares[run]
        else:
            attention = tiles.rows[run] * longest * longest  # a shape's masked rows run too
        predicted = a + b * slots + c * attention
        i = int(np.argmax(predicted))
        if best is None or predicted[i] > best[0]:
            best = (float(predicted[i]), int(tiles.rows[run][i]), int(tiles.longest[run][i]))
    return best


def _probe(run_batch: RunBatch, examples: int, length: int) -> Probe:
    try:
        peak = run_batch(examples, length)
    except torch.OutOfMemoryError:
        return Probe(examples, length, None)
    if isinstance(peak, bool) or not isinstance(peak, (int, float, np.number)) or peak < 0:
        raise TypeError(
            f"run_batch({examples}, {length}) must return the peak memory in bytes (a number "
            f">= 0), got {peak!r}."
        )
    return Probe(examples, length, float(peak))


def _probe_shapes(longest: int, tokens: Sequence[int], count: int) -> list[tuple[int, int]]:
    """``count`` shapes alternating the longest length and a third of it, growing in tokens."""
    short = max(1, longest // 3)
    lo, hi = min(tokens), max(tokens)
    shapes: list[tuple[int, int]] = []
    for i in range(count):
        t = lo * (hi / lo) ** (i / max(1, count - 1))
        length = longest if i % 2 == 0 else short
        shape = (max(1, int(t // length)), length)
        if shape in shapes:  # keep shapes distinct: one more example
            shape = (shape[0] + 1, length)
        shapes.append(shape)
    return shapes


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

    ``probes`` shapes (alternately the longest length and a third of it, growing from one
    longest example to the lower quarter of the search range) are run with ``run_batch``;
    ``a + b·B·L + c·B·L²`` is fitted to their peaks (:func:`fit_memory_model`). Every budget
    considered is planned (an :class:`~lightning_varbatch.planner.epoch_planner.EpochPlanner`
    of ``lengths`` and ``plan_settings``, epochs ``0 .. epochs - 1``, ``world_size`` ranks)
    and its most demanding micro-batch under the model must fit under
    ``memory_limit_bytes * (1 - margin)``: the largest such candidate (with ``candidates``) or
    the largest multiple of ``step`` in ``bounds`` found by bisection (which assumes the
    predicted peak grows with the budget). The choice is verified by probing its worst shape;
    if that probe exceeds the limit (or runs out of memory), it joins the fit and the search
    runs again, at most ``rounds`` times (after an out-of-memory probe, below the midpoint
    between the lowest budget and the failed one).

    Args:
        run_batch: ``run_batch(examples, length)`` runs forward and backward on a synthetic
            batch of that shape and returns its peak memory in bytes (e.g. with
            :func:`~lightning_varbatch.callbacks.worst_batch.measure_peak`); it may raise
            ``torch.OutOfMemoryError``.
        lengths: the training lengths, ``(n,)`` or ``(n, 2)``, as the data module plans them.
        memory_limit_bytes: memory the worst micro-batch may use (the figure ``run_batch``
            returns: device memory, or the process's resident set on CPU).
        candidates: budgets to choose from.
        bounds: ``(low, high)`` budgets to search when no ``candidates`` are given (default:
            from the longest length to 64 times it).
        step: resolution of the bisection (default: ``pad_to_multiple_of``, at least
            ``(high - low) / 1024``).
        probes: initial probes (at least 3).
        margin: share of the limit kept free for what the model misses (0-1).
        rounds: verification rounds.
        epochs: epochs planned per budget (their worst micro-batch counts).
        world_size: ranks to plan for.
        **plan_settings: other :class:`~lightning_varbatch.PlanConfig` settings
            (``max_examples``, ``cost``, ``pad_to_multiple_of``, ``seed``, ...).

    Returns:
        The :class:`BudgetResult`.

    Raises:
        ValueError: for bad arguments, or no budget predicted to fit (the message gives the
            smallest budget's prediction).
        RuntimeError: when the chosen budget's worst shape still exceeds the limit after
            ``rounds`` verifications.

    Example:
        >>> result = find_max_tokens(lambda b, n: 10_000 + 4 * b * n, [30, 60, 90] * 100,
        ...                          60_000, bounds=(90, 50_000), step=10)
        >>> result.max_tokens, result.worst_examples, result.worst_longest
        (11060, 122, 90)
    """
    if isinstance(memory_limit_bytes, bool) or not isinstance(
        memory_limit_bytes, (int, np.integer)
    ):
        raise ValueError(
            f"memory_limit_bytes must be a positive integer, got {memory_limit_bytes!r}."
        )
    if memory_limit_bytes <= 0:
        raise ValueError(f"memory_limit_bytes must be positive, got {memory_limit_bytes}.")
    if not callable(run_batch):
        raise TypeError("run_batch must be callable: run_batch(examples, length) -> peak bytes.")
    if not (isinstance(margin, (int, float)) and 0 <= margin < 1):
        raise ValueError(f"margin must be in [0, 1), got {margin!r}.")
    for name, value, low in (("probes", probes, 3), ("rounds", rounds, 1), ("epochs", epochs, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name} must be an integer >= {low}, got {value!r}.")
    planning = _planning_lengths(lengths)
    multiple = int(plan_settings.get("pad_to_multiple_of", 1))
    longest = -(-int(planning.max()) // multiple) * multiple
    grid: list[int] | None = None
    if candidates is not None:
        grid = sorted({int(c) for c in candidates})
        if not grid or grid[0] < 1:
            raise ValueError(f"candidates must be positive budgets, got {grid!r}.")
        low, high = grid[0], grid[-1]
    else:
        low, high = bounds if bounds is not None else (longest, 64 * longest)
        if not 0 < low <= high:
            raise ValueError(f"bounds must be (low, high) with 0 < low <= high, got {bounds!r}.")
        step = step if step is not None else max(multiple, math.ceil((high - low) / 1024))
        if step < 1:
            raise ValueError(f"step must be >= 1, got {step!r}.")
    allowed = memory_limit_bytes * (1 - margin)
    probe_top = max(longest, low + (high - low) // 4)
    done = [
        _probe(run_batch, b, n)
        for b, n in _probe_shapes(longest, [max(low, longest), probe_top], probes)
    ]

    def fits(budget: int, coef: tuple[float, float, float]) -> tuple[float, int, int] | None:
        worst = _worst(lengths, budget, coef, epochs, world_size, plan_settings)
        return worst if worst is not None and worst[0] <= allowed else None

    ceiling = high
    for _ in range(rounds):
        coef = fit_memory_model(done)
        choice: tuple[int, tuple[float, int, int]] | None = None
        if grid is not None:
            for budget in reversed([g for g in grid if g <= ceiling]):
                found = fits(budget, coef)
                if found is not None:
                    choice = (budget, found)
                    break
        else:
            assert step is not None
            lo_k, hi_k = 0, (ceiling - low) // step  # budgets low + k * step
            while lo_k <= hi_k:
                mid = (lo_k + hi_k) // 2
                found = fits(low + mid * step, coef)
                if found is not None:
                    choice = (low + mid * step, found)
                    lo_k = mid + 1
                else:
                    hi_k = mid - 1
        if choice is None:
            smallest = _worst(lengths, low, coef, epochs, world_size, plan_settings)
            said = (
                "cannot be planned"
                if smallest is None
                else f"is predicted to need {smallest[0]:.0f} bytes ({smallest[1]} examples x "
                f"{smallest[2]} tokens)"
            )
            raise ValueError(
                f"No budget fits memory_limit_bytes={memory_limit_bytes} with margin={margin}: "
                f"the smallest, max_tokens={low}, {said} (fitted a, b, c = {coef}). Raise the "
                "limit, shorten the longest examples, or use less memory per token."
            )
        budget, (predicted, examples, length) = choice
        final = _probe(run_batch, examples, length)
        done.append(final)
        if final.peak_bytes is not None and final.peak_bytes <= memory_limit_bytes:
            return BudgetResult(
                max_tokens=budget,
                memory_limit_bytes=int(memory_limit_bytes),
                margin=float(margin),
                coefficients=coef,
                worst_examples=examples,
                worst_longest=length,
                predicted_bytes=predicted,
                measured_bytes=final.peak_bytes,
                probes=tuple(done),
            )
        if final.peak_bytes is None:  # out of memory: no peak to fit; search below, halfway
            ceiling = low + (budget - low) // 2
    raise RuntimeError(
        f"find_max_tokens: after {rounds} rounds the chosen budget's worst micro-batch still "
        f"exceeds memory_limit_bytes={memory_limit_bytes} (probes: "
        f"{[(p.examples, p.length, p.peak_bytes) for p in done]}): memory does not follow "
        "a + b·B·L + c·B·L²; raise margin= or rounds=, or pass explicit candidates."
    )
