"""The throughput maths: one rank's counts over a logging window, and the global metrics.

:class:`RankWindow` holds what one rank saw in a window of optimizer steps, as a vector
(:meth:`RankWindow.to_vector`) for one all-gather; :func:`window_metrics` turns all ranks'
windows into the logged figures. No torch.distributed or Lightning: the maths is tested alone.

Example:
    >>> a = RankWindow(tokens=300, examples=6, real=500, padded=1000, compute=2.0, elapsed=4.0)
    >>> b = RankWindow(tokens=100, examples=2, real=200, padded=400, compute=1.0, elapsed=4.0)
    >>> m = window_metrics([a, b], steps=2)
    >>> m["train/tokens_per_sec"], m["train/imbalance"], m["train/padding_efficiency"]
    (100.0, 1.5, 0.5)
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = [
    "RankWindow",
    "ScheduleWindow",
    "dataset_metrics",
    "rank_metrics",
    "run_metrics",
    "window_metrics",
]

_SCALARS = ("tokens", "examples", "real", "padded", "compute", "elapsed", "no_padding")


@dataclass
class RankWindow:
    """One rank's counts since the last logged step.

    Attributes:
        tokens: loss tokens.
        examples: examples.
        real: real tokens of every padded field (for the padding efficiency).
        padded: token slots after padding of every padded field.
        compute: the rank's own compute seconds: forwards and losses, before any gradient sync.
        elapsed: wall seconds of the window.
        no_padding: 1.0 when a micro-batch had no padding counts (padding metrics skipped).
        dataset_tokens: loss tokens per mixed dataset.
        dataset_batches: micro-batches per mixed dataset.
    """

    tokens: float = 0.0
    examples: float = 0.0
    real: float = 0.0
    padded: float = 0.0
    compute: float = 0.0
    elapsed: float = 0.0
    no_padding: float = 0.0
    dataset_tokens: list[float] = field(default_factory=list)
    dataset_batches: list[float] = field(default_factory=list)

    @classmethod
    def empty(cls, num_datasets: int) -> RankWindow:
        """A window with zero counts for ``num_datasets`` mixed datasets."""
        return cls(dataset_tokens=[0.0] * num_datasets, dataset_batches=[0.0] * num_datasets)

    def add_counts(self, other: RankWindow) -> None:
        """Add ``other``'s token and example counts (not its times or per-dataset counts).

        Example:
            >>> run = RankWindow()
            >>> run.add_counts(RankWindow(tokens=3, examples=1, real=4, padded=8))
            >>> run.add_counts(RankWindow(tokens=2, examples=1, real=2, padded=2, no_padding=1.0))
            >>> run.tokens, run.examples, run.real, run.padded, run.no_padding
            (5.0, 2.0, 6.0, 10.0, 1.0)
        """
        self.tokens += other.tokens
        self.examples += other.examples
        self.real += other.real
        self.padded += other.padded
        self.no_padding = max(self.no_padding, other.no_padding)

    def to_vector(self) -> list[float]:
        """Flat floats (scalars, then tokens and batches per dataset) for one all-gather."""
        return [float(getattr(self, name)) for name in _SCALARS] + [
            x for pair in zip(self.dataset_tokens, self.dataset_batches, strict=True) for x in pair
        ]

    @classmethod
    def from_vector(cls, row: list[float]) -> RankWindow:
        """The inverse of :meth:`to_vector`.

        Example:
            >>> w = RankWindow(tokens=3, dataset_tokens=[1.0, 2.0], dataset_batches=[1.0, 1.0])
            >>> RankWindow.from_vector(w.to_vector()) == w
            True
        """
        k = len(_SCALARS)
        scalars = dict(zip(_SCALARS, row[:k], strict=True))
        rest = row[k:]
        return cls(**scalars, dataset_tokens=list(rest[0::2]), dataset_batches=list(rest[1::2]))


@dataclass
class ScheduleWindow:
    """The scheduled token budgets and planned costs of a window's steps (a batch schedule).

    Global counts, read alike by every rank from its batches (no gather); steps without: skipped.

    Attributes:
        budget: the steps' scheduled token budgets (``keys.STEP_BUDGET``), summed.
        cost: their planned costs (``keys.STEP_COST``, the budget's unit), summed.
        steps: the steps that carried both.
    """

    budget: float = 0.0
    cost: float = 0.0
    steps: int = 0

    def add(self, budget: float, cost: float) -> None:
        """Count one optimizer step's scheduled budget and planned cost."""
        self.budget += budget
        self.cost += cost
        self.steps += 1

    def metrics(self) -> dict[str, float]:
        """The ``train/schedule/...`` metrics: means per step and the fill (none if empty).

        Example:
            >>> w = ScheduleWindow()
            >>> w.add(96, 90)
            >>> w.add(192, 150)
            >>> w.metrics()  # doctest: +NORMALIZE_WHITESPACE
            {'train/schedule/budget_tokens': 144.0, 'train/schedule/cost_tokens': 120.0,
             'train/schedule/fill': 0.8333333333333334}
            >>> ScheduleWindow().metrics()
            {}
        """
        if not self.steps:
            return {}
        return {
            "train/schedule/budget_tokens": self.budget / self.steps,
            "train/schedule/cost_tokens": self.cost / self.steps,
            "train/schedule/fill": self.cost / self.budget if self.budget > 0 else float("nan"),
        }


def _max_over_mean(values: list[float]) -> float:
    mean = sum(values) / len(values)
    return max(values) / mean if mean > 0 else float("nan")


def window_metrics(
    windows: list[RankWindow],
    steps: int,
    flops_per_token: float | None = None,
    peak_flops: float | None = None,
) -> dict[str, float]:
    """The global metrics of one window from every rank's counts (see the monitor's table).

    Args:
        windows: one :class:`RankWindow` per rank.
        steps: optimizer steps in the window.
        flops_per_token: model FLOPs per loss token, for ``train/flops_per_sec``.
        peak_flops: peak FLOP/s of one device, for ``train/mfu``.
    """
    world = len(windows)
    elapsed = max(w.elapsed for w in windows)
    tokens = sum(w.tokens for w in windows)
    examples = sum(w.examples for w in windows)
    per_sec = tokens / elapsed if elapsed > 0 else float("nan")
    metrics = {
        "train/tokens_per_sec": per_sec,
        "train/device/tokens_per_sec": per_sec / world,
        "train/examples_per_sec": examples / elapsed if elapsed > 0 else 0.0,
        "train/batch/examples": examples / steps,
        "train/batch/tokens": tokens / steps,
        "train/imbalance": _max_over_mean([w.tokens for w in windows]),
        "train/step_time_imbalance": _max_over_mean([w.compute for w in windows]),
        "train/step_time": elapsed / steps,
    }
    padded = sum(w.padded for w in windows)
    if not any(w.no_padding for w in windows) and padded > 0:
        padded_per_sec = padded / elapsed if elapsed > 0 else float("nan")
        metrics["train/padded_tokens_per_sec"] = padded_per_sec
        metrics["train/device/padded_tokens_per_sec"] = padded_per_sec / world
        metrics["train/padding_efficiency"] = sum(w.real for w in windows) / padded
    if flops_per_token is not None:
        flops_per_sec = float(flops_per_token) * per_sec
        metrics["train/flops_per_sec"] = flops_per_sec
        metrics["train/device/flops_per_sec"] = flops_per_sec / world
        if peak_flops is not None:
            metrics["train/mfu"] = flops_per_sec / world / peak_flops
    return metrics


def rank_metrics(
    windows: list[RankWindow], shares: tuple[float, ...] | None = None
) -> dict[str, float]:
    """Each rank's loss tokens per second of the window's wall time, and its share in force.

    Over the window's (slowest rank's) wall time, so the rates add up to ``train/tokens_per_sec``.
    Nothing for a single rank (see ``train/device/...``); shares only if given, one per rank.

    Example:
        >>> a, b = RankWindow(tokens=300, elapsed=3.0), RankWindow(tokens=150, elapsed=2.9)
        >>> rank_metrics([a, b], (1.0, 0.5))  # doctest: +NORMALIZE_WHITESPACE
        {'train/rank/0/tokens_per_sec': 100.0, 'train/rank/1/tokens_per_sec': 50.0,
         'train/rank/0/share': 1.0, 'train/rank/1/share': 0.5}
    """
    if len(windows) < 2:
        return {}
    elapsed = max(w.elapsed for w in windows)
    out = {
        f"train/rank/{r}/tokens_per_sec": (w.tokens / elapsed if elapsed > 0 else float("nan"))
        for r, w in enumerate(windows)
    }
    if shares is not None and len(shares) == len(windows):
        out.update({f"train/rank/{r}/share": float(s) for r, s in enumerate(shares)})
    return out


def dataset_metrics(
    windows: list[RankWindow], names: list[str], tokens_per_sec: float, totals: list[float]
) -> dict[str, float]:
    """Per-dataset shares and rates of one window; adds the window's tokens to ``totals``.

    Example:
        >>> w = RankWindow(tokens=4, dataset_tokens=[3.0, 1.0], dataset_batches=[1.0, 1.0])
        >>> totals = [0.0, 0.0]
        >>> dataset_metrics([w], ["a", "b"], 2.0, totals)["train/dataset/a/token_share"]
        0.75
    """
    out: dict[str, float] = {}
    tokens = sum(w.tokens for w in windows)
    batches = sum(sum(w.dataset_batches) for w in windows)
    rate = tokens_per_sec / tokens if tokens > 0 else 0.0
    for d, name in enumerate(names):
        d_tokens = sum(w.dataset_tokens[d] for w in windows)
        d_batches = sum(w.dataset_batches[d] for w in windows)
        totals[d] += d_tokens
        prefix = f"train/dataset/{name}/"
        out[prefix + "tokens_per_sec"] = d_tokens * rate
        out[prefix + "token_share"] = d_tokens / tokens if tokens > 0 else 0.0
        out[prefix + "batch_share"] = d_batches / batches if batches > 0 else 0.0
        out[prefix + "total_tokens"] = totals[d]
    return out


def run_metrics(windows: list[RankWindow], seconds: float) -> dict[str, float]:
    """The totals of a whole training run from every rank's counts (see the monitor's table).

    Args:
        windows: one :class:`RankWindow` per rank holding its counts of the run.
        seconds: the run's wall time, from its first training micro-batch to its end.

    Example:
        >>> a = RankWindow(tokens=90, examples=3, real=100, padded=200)
        >>> b = RankWindow(tokens=30, examples=1, real=60, padded=120)
        >>> m = run_metrics([a, b], seconds=8.0)
        >>> m["train/run/loss_tokens"], m["train/run/input_tokens_per_sec"]
        (120.0, 20.0)
        >>> m["train/run/padding_efficiency"]
        0.5
    """
    metrics = {
        "train/run/loss_tokens": float(sum(w.tokens for w in windows)),
        "train/run/examples": float(sum(w.examples for w in windows)),
        "train/run/seconds": float(seconds),
    }
    if any(w.no_padding for w in windows):
        return metrics
    real = float(sum(w.real for w in windows))
    padded = float(sum(w.padded for w in windows))
    metrics["train/run/input_tokens"] = real
    metrics["train/run/padded_tokens"] = padded
    metrics["train/run/input_tokens_per_sec"] = real / seconds if seconds > 0 else float("nan")
    metrics["train/run/padding_efficiency"] = real / padded if padded else float("nan")
    return metrics
