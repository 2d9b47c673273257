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

import difflib
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from lightning_varbatch.checks import check_count, check_real
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.diagnostics import tile_figures
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.lengths import as_int_lengths
from lightning_varbatch.planner.settings import PlanConfig

__all__ = ["OUT_OF_MEMORY", "BudgetResult", "Probe", "find_max_tokens", "fit_memory_model"]

RunBatch = Callable[[int, int], int | float]

#: The exceptions a probe may raise to say "out of memory": ``torch.OutOfMemoryError`` (CUDA,
#: and every device whose allocator raises it) and Python's ``MemoryError``. They are told
#: apart by type only: torch's CPU allocator raises a plain ``RuntimeError`` ("can't allocate
#: memory"), which is not an out-of-memory probe here but propagates like any other error (a
#: ``run_batch`` for CPU can catch it and raise ``MemoryError``).
OUT_OF_MEMORY: tuple[type[BaseException], ...] = (torch.OutOfMemoryError, MemoryError)


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
    """One planning length per example (the larger of a pair), validated as the planner does."""
    arr = as_int_lengths(lengths, "lengths")
    if arr.ndim == 2:
        arr = arr.max(axis=1)
    return arr.astype(np.int64)


def _worst(
    lengths: npt.ArrayLike,
    max_tokens: int,
    coef: tuple[float, float, float],
    epochs: int,
    world_size: int,
    settings: dict[str, Any],
    refused: list[tuple[int, ValueError]] | None = None,
) -> tuple[float, int, int] | None:
    """Predicted peak of the plan's most demanding micro-batch and its shape.

    ``None`` when the budget cannot be planned (with ``oversize="skip"``/``"truncate"``, too
    many examples over it); the planner's error is appended to ``refused``. The settings were
    validated before any probe ran, so only the budget can be at fault here.
    """
    try:
        planner = EpochPlanner(lengths, PlanConfig(max_tokens=max_tokens, **settings))
    except ValueError as error:
        if refused is not None:
            refused.append((max_tokens, error))
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
    """Run one probe; ``peak_bytes`` is ``None`` when it raised one of :data:`OUT_OF_MEMORY`.

    Raises:
        TypeError: when ``run_batch`` returns something other than a real number.
        ValueError: when it returns zero, a negative number, NaN or infinity.
    """
    try:
        peak = run_batch(examples, length)
    except OUT_OF_MEMORY:
        return Probe(examples, length, None)
    call = f"the probe run_batch(examples={examples}, length={length})"
    if isinstance(peak, (bool, np.bool_)) or not isinstance(peak, (int, float, np.number)):
        raise TypeError(
            f"{call} returned {peak!r} ({type(peak).__name__}): run_batch must return the "
            "peak memory in bytes of a forward and backward pass of that shape, a number > 0 "
            "(e.g. the second value of measure_peak(step, device))."
        )
    value = float(peak)
    if not math.isfinite(value) or value <= 0:
        what = "no memory at all" if value == 0 else "no byte count"
        raise ValueError(
            f"{call} measured {peak!r} bytes, which is {what}: run_batch must return the "
            "peak memory in bytes (a finite number > 0) of a forward and backward pass of "
            "that shape. Check that it measures the device the model computes on, after "
            "the backward (e.g. measure_peak(step, device)[1])."
        )
    return Probe(examples, length, value)


def _check_growth(coef: tuple[float, float, float], probes: Sequence[Probe]) -> None:
    """Refuse a fit in which memory does not grow with the batch (flat or decreasing)."""
    if coef[1] > 0 or coef[2] > 0:
        return
    measured = ", ".join(
        f"{p.examples} x {p.length} tokens: {p.peak_bytes:.0f} bytes"
        for p in sorted(probes, key=lambda p: p.examples * p.length)
        if p.peak_bytes is not None
    )
    raise ValueError(
        "find_max_tokens: the probes' memory does not grow with the batch (flat or "
        f"decreasing as the batch grows: {measured}), so every budget would be predicted to "
        "fit. run_batch must return the peak memory of a forward and backward pass of the "
        "shape it is given, on the device that computes it: check that it runs the batch it "
        "is asked for and measures after the backward (e.g. measure_peak(step, device)[1]); "
        "on CPU, a model too small for the resident set to show it needs larger bounds or "
        "candidates."
    )


def _single_budget(config: PlanConfig, longest: int) -> int:
    """The smallest ``max_tokens`` that holds one example of planning length ``longest``."""
    multiple = config.pad_to_multiple_of
    padded = np.array([-(-longest // multiple) * multiple], dtype=np.int64)
    cost = config.cost_fn(np.ones(1, dtype=np.int64), padded, np.array([longest]))
    return max(1, math.ceil(float(cost[0])))


def _check_plan_settings(settings: dict[str, Any], top: int) -> PlanConfig:
    """Validate the plan settings before any probe runs (``max_tokens`` is the one searched)."""
    if "max_tokens" in settings:
        raise SettingValueError(
            f"find_max_tokens chooses max_tokens itself, got max_tokens="
            f"{settings['max_tokens']!r}: pass the budgets to choose from as candidates= (or "
            "bounds= and step=) instead.",
            setting="max_tokens",
            value=settings["max_tokens"],
        )
    valid = [f.name for f in fields(PlanConfig) if f.name != "max_tokens"]
    unknown = sorted(set(settings) - set(valid))
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, valid, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise SettingTypeError(
            f"find_max_tokens got {name}={settings[name]!r}, which is not a plan setting"
            f"{hint}; check the spelling: the plan settings it passes on are "
            f"{', '.join(valid)}.",
            setting=name,
            value=settings[name],
        )
    return PlanConfig(max_tokens=top, **settings)


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

    Every setting is checked before the first probe runs (the plan settings by
    :class:`~lightning_varbatch.PlanConfig`, the lengths as the planner checks them), so a bad
    setting is reported as such, never as "no budget fits". Under ``oversize="error"``
    budgets below the longest example's own cost are never considered.

    Args:
        run_batch: ``run_batch(examples, length)`` runs forward and backward on a synthetic
            batch of that shape and returns its peak memory in bytes (e.g. with
            :func:`~lightning_varbatch.callbacks.worst_batch.measure_peak`); it may raise
            ``torch.OutOfMemoryError`` or ``MemoryError`` (:data:`OUT_OF_MEMORY`) for a shape
            that does not fit.
        lengths: the training lengths, ``(n,)`` or ``(n, 2)``, as the data module plans them.
        memory_limit_bytes: memory the worst micro-batch may use (the figure ``run_batch``
            returns: device memory, or the process's resident set on CPU).
        candidates: budgets to choose from.
        bounds: ``(low, high)`` budgets to search when no ``candidates`` are given (default:
            from the longest length to 64 times the longest example's cost on its own).
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
        SettingTypeError: for a setting of the wrong type (an unknown plan setting too).
        SettingValueError: for a setting out of range; for ``candidates``/``bounds`` that
            all lie below the longest example (under ``oversize="error"``; the message names
            the example and the smallest budget that holds it); for ``max_tokens`` among
            the plan settings (it is what is searched).
        TypeError: when ``run_batch`` returns something other than a number.
        ValueError: when it returns zero, a negative number, NaN or infinity, or the probes'
            memory does not grow with the batch (the message names each probe and what it
            measured); for no budget predicted to fit (the message gives the smallest
            budget's prediction).
        RuntimeError: when the chosen budget's worst shape still exceeds the limit after
            ``rounds`` verifications.

    Example:
        >>> result = find_max_tokens(lambda b, n: 10_000 + 4 * b * n, [30, 60, 90] * 100,
        ...                          60_000, bounds=(90, 50_000), step=10)
        >>> result.max_tokens, result.worst_examples, result.worst_longest
        (11060, 122, 90)
    """
    limit = check_count("memory_limit_bytes", memory_limit_bytes, what=" (bytes)")
    if not callable(run_batch):
        raise SettingTypeError(
            f"run_batch must be callable as run_batch(examples, length) -> peak bytes, got "
            f"{run_batch!r} ({type(run_batch).__name__}).",
            setting="run_batch",
            value=run_batch,
        )
    margin = check_real("margin", margin, minimum=0.0, maximum=1.0, strict=False)
    if margin == 1.0:
        raise SettingValueError(
            "margin must be a finite number >= 0 and < 1 (the share of the limit kept free), "
            "got 1.0: nothing would be left to fill; pass e.g. margin=0.1.",
            setting="margin",
            value=margin,
        )
    probes = check_count("probes", probes, minimum=3)
    rounds = check_count("rounds", rounds)
    epochs = check_count("epochs", epochs)
    world_size = check_count("world_size", world_size)
    step = check_count("step", step, allow_none=True)
    grid: list[int] | None = None
    if candidates is not None:
        if isinstance(candidates, (str, bytes)) or not isinstance(candidates, Iterable):
            raise SettingTypeError(
                f"candidates must be an iterable of budgets (e.g. range(1024, 65537, 1024)), "
                f"got {candidates!r} ({type(candidates).__name__}).",
                setting="candidates",
                value=candidates,
            )
        grid = sorted({check_count("candidates", c) for c in candidates})
        if not grid:
            raise SettingValueError(
                "candidates is empty: pass the budgets to choose from, e.g. "
                "candidates=range(1024, 65537, 1024) (or leave it unset to search bounds=).",
                setting="candidates",
                value=candidates,
            )
    elif bounds is not None:
        pair = tuple(bounds) if isinstance(bounds, (tuple, list)) else None
        if pair is None or len(pair) != 2:
            raise SettingTypeError(
                f"bounds must be a (low, high) pair of budgets, got {bounds!r}.",
                setting="bounds",
                value=bounds,
            )
        low, high = (check_count("bounds", b) for b in pair)
        if low > high:
            raise SettingValueError(
                f"bounds must be (low, high) with low <= high, got {bounds!r}.",
                setting="bounds",
                value=bounds,
            )
    # the plan settings and the lengths, before any probe runs
    config = _check_plan_settings(plan_settings, grid[-1] if grid else 2**62)
    planning = _planning_lengths(lengths)
    multiple = config.pad_to_multiple_of
    index = int(np.argmax(planning))
    raw_longest = int(planning[index])
    longest = -(-raw_longest // multiple) * multiple
    needed = _single_budget(config, raw_longest)  # the budget that holds the longest example
    if grid is not None:
        low, high = grid[0], grid[-1]
    elif bounds is None:
        low, high = longest, 64 * max(longest, needed)
    else:
        low, high = (int(b) for b in bounds)
    if config.oversize == "error" and high < needed:
        given = "candidates" if grid is not None else "bounds"
        value = (low, high) if grid is None else grid
        shown = f"up to {high}" if grid is not None else f"{value}"
        raise SettingValueError(
            f"find_max_tokens: every budget of {given} ({shown}) is below the longest example: "
            f"example {index} has length {raw_longest} (padded {longest}), and the smallest "
            f"budget that holds it is max_tokens={needed} (cost={config.cost!r}). Pass "
            f"{given} reaching at least {needed}, or oversize='skip' / 'truncate' to leave out "
            "or cut the longest examples.",
            setting=given,
            value=value,
        )
    if grid is None:
        step = step if step is not None else max(multiple, math.ceil((high - low) / 1024))
    allowed = limit * (1 - margin)
    probe_top = max(longest, low + (high - low) // 4)
    done = [
        _probe(run_batch, b, n)
        for b, n in _probe_shapes(longest, [max(low, longest), probe_top], probes)
    ]
    refused: list[tuple[int, ValueError]] = []

    def fits(budget: int, coef: tuple[float, float, float]) -> tuple[float, int, int] | None:
        if config.oversize == "error" and budget < needed:
            return None  # cannot hold the longest example
        worst = _worst(lengths, budget, coef, epochs, world_size, plan_settings, refused)
        return worst if worst is not None and worst[0] <= allowed else None

    ceiling = high
    for _ in range(rounds):
        coef = fit_memory_model(done)
        _check_growth(coef, done)
        choice: tuple[int, tuple[float, int, int]] | None = None
        if grid is not None:
            for budget in reversed([g for g in grid if g <= ceiling]):
                found = fits(budget, coef)
                if found is not None:
                    choice = (budget, found)
                    break
        else:
            assert step is not None
            # budgets low + k * step; under oversize="error" from the first that holds the
            # longest example
            lo_k = 0 if config.oversize != "error" else max(0, -(-(needed - low) // step))
            hi_k = (ceiling - low) // step
            while lo_k <= hi_k:
                mid = (lo_k + hi_k) // 2
                found = fits(low + mid * step, coef)
                if found is not None:
                    choice = (low + mid * step, found)
                    lo_k = mid + 1
                else:
                    hi_k = mid - 1
        if choice is None:
            first = low if config.oversize != "error" else max(low, needed)
            if grid is not None:
                first = next(g for g in grid if config.oversize != "error" or g >= needed)
            smallest = _worst(lengths, first, coef, epochs, world_size, plan_settings)
            if smallest is None:
                why = next((str(e) for b, e in refused if b == first), "")
                said = f"cannot be planned ({why})" if why else "cannot be planned"
                fix = (
                    "Pass larger candidates or bounds, or oversize='error' to see the longest "
                    "example."
                )
            else:
                said = (
                    f"is predicted to need {smallest[0]:.0f} bytes ({smallest[1]} examples x "
                    f"{smallest[2]} tokens)"
                )
                fix = "Raise the limit, shorten the longest examples, or use less memory per token."
            raise ValueError(
                f"No budget fits memory_limit_bytes={limit} with margin={margin}: the "
                f"smallest, max_tokens={first}, {said} (fitted a, b, c = {coef}). {fix}"
            )
        budget, (predicted, examples, length) = choice
        final = _probe(run_batch, examples, length)
        done.append(final)
        if final.peak_bytes is not None and final.peak_bytes <= limit:
            return BudgetResult(
                max_tokens=budget,
                memory_limit_bytes=limit,
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
        f"exceeds memory_limit_bytes={limit} (probes: "
        f"{[(p.examples, p.length, p.peak_bytes) for p in done]}): memory does not follow "
        "a + b·B·L + c·B·L²; raise margin= or rounds=, or pass explicit candidates."
    )
