"""What a run is built with, drawn from the whole settings space, and the oracle's own arithmetic.

A :class:`RunSpec` is everything a user chooses: which front end drives the data (the sampler of
every rank, ``TokenBudgetDataModule``, a mixture, a stream, ``StreamingDataModule``), the lengths,
the planner settings, the topology and the per-rank settings. :func:`run_specs` draws them;
:func:`changes` draws what a user may change between a save and a load. The oracle never asks the
library what a micro-batch costs: :func:`micro_batch_cost` computes it from the lengths.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from tests.batch_schedule_oracle import Reference, ramp, rank_budgets, thresholds

KINDS = ("sampler", "datamodule", "loop", "mixture", "stream", "streaming_dm")
#: Kinds planned in memory (not window by window).
IN_MEMORY = ("sampler", "datamodule", "loop", "mixture")
QUADRATIC_COEF = 1 / 64


def squared(p: float) -> float:
    """A callable warm-up schedule (slow start)."""
    return p * p


def squared_again(p: float) -> float:
    """The same values as :func:`squared` under another function: a resume must accept it."""
    return p**2


def cubed(p: float) -> float:
    """Another callable schedule: its values differ from :func:`squared`'s."""
    return p * p * p


SCHEDULES: tuple[Any, ...] = ("linear", "root", "step", squared)
#: Front ends that take a batch-size schedule (mixtures and streams refuse one).
SCHEDULED = ("sampler", "datamodule", "loop")


def batch_schedules(draw: st.DrawFn, epoch_tokens: int, least: float) -> str | None:
    """A batch-size schedule whose first fraction holds the longest example on every rank.

    ``least``: the smallest first fraction that does. Thresholds or a ramp (of at least 1000
    tokens: shorter ramps are another test's), reaching 1 within 0.1 to 2.5 epochs.
    """
    firsts = [f for f in (0.25, 0.4, 0.6, 0.8) if f >= least * 1.02]
    if not firsts:
        return None
    first = draw(st.sampled_from(firsts))
    full = max(2, int(epoch_tokens * draw(st.floats(0.1, 2.5))))
    if full >= 1000 and draw(st.booleans()):
        return f"ramp:{first}:{full}"
    middle = max(1, int(full * draw(st.floats(0.1, 0.9))))
    if middle >= full:
        return f"0:{first} {full}:1"
    return f"0:{first} {middle}:{(1 + first) / 2:.3f} {full}:1"


def _text(value: Any) -> str:
    """A schedule this module drew, as text (it may have been rewritten as pairs)."""
    if isinstance(value, str):
        return value
    return " ".join(f"{int(t)}:{f!r}" for t, f in value)


def reference_of(value: Any) -> Reference:
    """The schedule this module drew, as the oracle's reference (exact ramp, thresholds)."""
    text = _text(value)
    if text.startswith("ramp:"):
        _, first, tokens = text.split(":")
        return ramp(float(first), int(tokens))
    return thresholds(*((int(t), float(f)) for t, f in (i.split(":") for i in text.split())))


def other_schedule(value: Any) -> str:
    """Another schedule than ``value`` (its last threshold one token later)."""
    text = _text(value)
    if text.startswith("ramp:"):
        _, first, tokens = text.split(":")
        return f"ramp:{first}:{int(tokens) + 1}"
    *head, last = text.split()
    tokens, _ = last.split(":")
    return " ".join([*head, f"{int(tokens) + 1}:1"])


def same_schedule(value: Any) -> Any:
    """``value`` written as ``(tokens, fraction)`` pairs (a ramp stays text)."""
    text = _text(value)
    if text.startswith("ramp:"):
        return text
    return [(int(t), float(f)) for t, f in (item.split(":") for item in text.split())]


@dataclass(frozen=True, eq=False)
class RunSpec:
    """One run's choices (the oracle reads them; the drivers build from them)."""

    kind: str
    lengths: tuple[np.ndarray, ...]  # one array per dataset: (n,) or (n, 2)
    max_tokens: int
    settings: dict[str, Any] = field(default_factory=dict)  # the other PlanConfig settings
    world: int = 1
    acc: int = 1
    rank_shares: tuple[float, ...] | None = None
    rank_max_tokens: tuple[int, ...] | None = None
    window: int | None = None  # streams
    shard_rows: tuple[int, ...] = ()  # streams: rows per shard

    @property
    def num_examples(self) -> int:
        return sum(int(a.shape[0]) for a in self.lengths)

    @property
    def key(self) -> np.ndarray:
        """Every example's planning length, in global id order."""
        parts = [a.max(axis=1) if a.ndim == 2 else a for a in self.lengths]
        return np.concatenate(parts).astype(np.int64)

    def plan_settings(self) -> dict[str, Any]:
        """The planner settings as the library takes them (rank settings included)."""
        out = dict(self.settings)
        if self.rank_shares is not None:
            out["rank_shares"] = list(self.rank_shares)
        if self.rank_max_tokens is not None:
            out["rank_max_tokens"] = list(self.rank_max_tokens)
        return out

    def memory(self, rank: int) -> int:
        """The most a micro-batch of ``rank`` may cost now (its memory budget)."""
        if self.rank_max_tokens is not None:
            return int(self.rank_max_tokens[rank])
        return self.max_tokens

    def replace(self, **changes: Any) -> RunSpec:
        return dataclasses.replace(self, **changes)

    def describe(self) -> str:
        """The spec's shape, for the explored-paths count (not its numbers)."""
        s = self.settings
        return (
            f"{self.kind}/{s.get('layout', 'padded')}/{s.get('cost', 'padded')}/"
            f"{s.get('tail', 'spread')}/b{s.get('bucket_width', 1)}/"
            f"{'shapes' if s.get('max_shapes') else '-'}/"
            f"{'shares' if self.rank_shares else '-'}/{'mem' if self.rank_max_tokens else '-'}/"
            f"{'warm' if s.get('length_warmup') else '-'}/"
            f"{'sched' if s.get('batch_schedule') else '-'}/w{self.world}a{self.acc}"
        )


def micro_batch_cost(spec: RunSpec, ids: list[int]) -> float:
    """The oracle's cost of a micro-batch of ``ids`` under the spec's cost model."""
    key = spec.key[np.asarray(ids, dtype=np.int64)]
    p = int(spec.settings.get("pad_to_multiple_of", 1))
    padded = -(-int(key.max()) // p) * p
    n = len(ids)
    cost = spec.settings.get("cost", "padded")
    if spec.settings.get("layout") == "packed":
        return float(-(-int(key.sum()) // p) * p)
    if cost == "sum":
        return float(key.sum())
    if cost == "quadratic":
        return n * (padded + QUADRATIC_COEF * padded * padded)
    return float(n * padded)


def single_cost(spec: RunSpec, length: int) -> int:
    """The cost of one example of ``length`` alone (the least budget that holds it)."""
    p = int(spec.settings.get("pad_to_multiple_of", 1))
    padded = -(-length // p) * p
    if spec.settings.get("cost") == "quadratic":
        return math.ceil(padded + QUADRATIC_COEF * padded * padded)
    if spec.settings.get("cost") == "sum":
        return length
    return padded


def holds(
    max_tokens: int,
    world: int,
    shares: tuple[float, ...] | None,
    memory: tuple[int, ...] | None,
    longest: int,
) -> bool:
    """Whether every rank's budget from these shares and memories holds the longest example."""
    limit = np.asarray(memory if memory is not None else [max_tokens] * world, dtype=float)
    speed = np.ones(world) if shares is None else np.asarray(shares) / max(shares)
    return bool((np.floor(float(np.min(limit / speed)) * speed + 1e-9) >= longest).all())


def _lengths(draw: st.DrawFn, n: int, pairs: bool, low: int) -> np.ndarray:
    """``n`` lengths drawn one by one, or (one run in four) 300-1200 from a drawn seed: large
    enough that a schedule's levels hold many steps, and lanes drop whole micro-batches."""
    top = draw(st.sampled_from([8, 24, 48]))
    if draw(st.integers(0, 3)) == 0:
        n = draw(st.integers(300, 1200))
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        out = rng.integers(low, top + 1, size=n * (2 if pairs else 1))
    else:
        size = n * (2 if pairs else 1)
        out = np.asarray(draw(st.lists(st.integers(low, top), min_size=size, max_size=size)))
    out = out.astype(np.int64)
    return out.reshape(n, 2) if pairs else out


@st.composite
def run_specs(draw: st.DrawFn, kinds: tuple[str, ...] = KINDS, scheduled: bool = False) -> RunSpec:
    """A run drawn from the whole settings space (some draws are invalid: the build rejects).

    ``scheduled``: always a batch-size schedule (``kinds`` must be front ends that take one).
    """
    kind = draw(st.sampled_from(kinds))
    world = draw(st.integers(1, 4))
    acc = draw(st.integers(1, 3))
    layout = draw(st.sampled_from(["padded", "padded", "packed"]))
    pairs = layout == "padded" and draw(st.booleans())
    settings: dict[str, Any] = {"seed": draw(st.integers(0, 3))}
    if layout == "packed":
        settings["layout"] = "packed"
    else:
        settings["cost"] = draw(st.sampled_from(["padded", "sum", "quadratic"]))
    if draw(st.booleans()):
        settings["pad_to_multiple_of"] = 4
    if draw(st.booleans()):
        settings["bucket_width"] = 4
    if pairs and draw(st.booleans()):
        settings["pair_order"] = "max"
    settings["tail"] = draw(st.sampled_from(["spread", "drop", "pad"]))
    if draw(st.integers(0, 3)) == 0:
        settings["loss_offset"] = 1
    datasets = 2 if kind == "mixture" else 1
    # every step has loss tokens (packed rows label the next token: one-token rows have none)
    low = 1 + max(settings.get("loss_offset", 0), int(layout == "packed"))
    lengths = tuple(
        _lengths(draw, draw(st.integers(12, 90 if datasets == 2 else 160)), pairs, low)
        for _ in range(datasets)
    )
    spec = RunSpec(kind, lengths, 1, settings, world, acc)
    longest = single_cost(spec, int(spec.key.max()))
    max_tokens = longest * draw(st.integers(1, 5)) + draw(st.integers(0, longest))
    per_rank = world > 1 and draw(st.booleans())
    shares = memory = None
    if per_rank and draw(st.booleans()):
        low = min(1.0, longest / max_tokens + 0.05)
        shares = tuple(round(draw(st.floats(low, 1.0)), 3) for _ in range(world))
    if per_rank and (shares is None or draw(st.booleans())):
        memory = tuple(draw(st.integers(longest, max_tokens)) for _ in range(world))
    if not holds(max_tokens, world, shares, memory, longest):
        shares = None  # memory budgets of at least the longest example always hold
    shapes = (
        not per_rank
        and kind in IN_MEMORY
        and layout == "padded"
        and settings.get("cost") in ("padded", "quadratic")
        and "bucket_width" not in settings
        and draw(st.integers(0, 3)) == 0
    )
    if shapes:
        settings["max_shapes"] = draw(st.integers(2, 4))
    if kind in SCHEDULED and not shapes and (scheduled or draw(st.booleans())):
        budgets = rank_budgets(max_tokens, world, shares, memory)
        schedule = batch_schedules(draw, int(spec.key.sum()), longest / min(budgets))
        if schedule is not None:
            settings["batch_schedule"] = schedule
    assume(not scheduled or "batch_schedule" in settings)
    if "batch_schedule" not in settings and kind in IN_MEMORY and draw(st.integers(0, 2)) == 0:
        settings["length_warmup"] = draw(st.integers(1, 5))
        settings["length_warmup_min"] = draw(st.integers(1, 12))
        settings["length_warmup_schedule"] = draw(st.sampled_from(SCHEDULES))
    window = rows = None
    if kind in ("stream", "streaming_dm"):
        n = spec.num_examples
        window = draw(st.integers(max(world * acc, 8), max(n, world * acc)))
        cuts = sorted(draw(st.lists(st.integers(1, n - 1), max_size=3, unique=True)))
        rows = tuple(np.diff([0, *cuts, n]).tolist())
    return RunSpec(
        kind,
        lengths,
        max_tokens,
        settings,
        world,
        acc,
        shares,
        memory,
        window,
        rows or (),
    )


#: What a user may change between a save and a load, and whether a resume must honour it
#: (``True``) or refuse it with a ResumeMismatchError naming the setting (the name).
HONOURED = "honoured"


def _values(schedule: Any, steps: int) -> Any:
    """A schedule as the planner reads it: its fractions at the warm-up's steps (or its name)."""
    if isinstance(schedule, str):
        return schedule
    return tuple(round(float(schedule(s / steps)), 9) for s in range(steps))


@st.composite
def changes(draw: st.DrawFn, spec: RunSpec) -> tuple[str, RunSpec, str]:
    """``(what changed, the new spec, HONOURED or the setting a refusal must name)``."""
    options = ["nothing", "world", "accumulation", "shares", "rank_max_tokens", "data", "seed"]
    if spec.kind in ("stream", "streaming_dm"):
        options.remove("rank_max_tokens")  # memory budgets: in-memory plans
    if "length_warmup" in spec.settings:
        options.append("schedule")
    if "batch_schedule" in spec.settings:
        options += ["batch_schedule", "batch_schedule_form"]
    if spec.kind == "mixture":
        options.remove("data")
    if spec.lengths[0].ndim == 2:
        options.append("pair_order")
    what = draw(st.sampled_from(options))
    longest = single_cost(spec, int(spec.key.max()))
    if what == "nothing":
        return what, spec, HONOURED
    if what == "accumulation":
        return what, spec.replace(acc=draw(st.integers(1, 3))), HONOURED
    if what == "world":
        world = draw(st.integers(1, 4))
        shares = memory = None
        if world > 1 and spec.rank_shares is not None:
            shares = tuple(spec.rank_shares[r % len(spec.rank_shares)] for r in range(world))
        if world > 1 and spec.rank_max_tokens is not None:
            memory = tuple(
                spec.rank_max_tokens[r % len(spec.rank_max_tokens)] for r in range(world)
            )
        return (
            what,
            spec.replace(world=world, rank_shares=shares, rank_max_tokens=memory),
            (HONOURED),
        )
    if what in ("shares", "rank_max_tokens"):
        if spec.world == 1 or spec.settings.get("max_shapes"):
            return "nothing", spec, HONOURED
        new = spec.replace(**{"rank_shares" if what == "shares" else what: None})
        if what == "shares" and (spec.rank_shares is None or draw(st.booleans())):
            low = min(1.0, longest / spec.max_tokens + 0.05)
            shares = tuple(round(draw(st.floats(low, 1.0)), 3) for _ in range(spec.world))
            new = spec.replace(rank_shares=shares)
        if what == "rank_max_tokens" and (spec.rank_max_tokens is None or draw(st.booleans())):
            memory = tuple(draw(st.integers(longest, spec.max_tokens)) for _ in range(spec.world))
            new = spec.replace(rank_max_tokens=memory)
        if not holds(spec.max_tokens, spec.world, new.rank_shares, new.rank_max_tokens, longest):
            return "nothing", spec, HONOURED
        return what, new, HONOURED
    if what == "schedule":
        new = draw(st.sampled_from([squared_again, cubed, "linear", "root"]))
        old = spec.settings["length_warmup_schedule"]
        same = _values(new, spec.settings["length_warmup"]) == _values(
            old, spec.settings["length_warmup"]
        )
        settings = {**spec.settings, "length_warmup_schedule": new}
        # other values may plan the same (caps are whole tokens): refusing is then optional
        return (
            what,
            spec.replace(settings=settings),
            (HONOURED if same else "length_warmup_schedule?"),
        )
    if what in ("batch_schedule", "batch_schedule_form"):
        text = spec.settings["batch_schedule"]
        changed = what == "batch_schedule"
        new_value = other_schedule(text) if changed else same_schedule(text)
        settings = {**spec.settings, "batch_schedule": new_value}
        # another schedule is refused naming it; the same one written otherwise is honoured
        return what, spec.replace(settings=settings), "batch_schedule" if changed else HONOURED
    if what == "pair_order":  # the other order plans pairs otherwise: refused, named
        other = "two_sided" if spec.settings.get("pair_order") == "max" else "max"
        return what, spec.replace(settings={**spec.settings, "pair_order": other}), "pair_order"
    if what == "seed":
        settings = {**spec.settings, "seed": int(spec.settings.get("seed", 0)) + 1}
        return what, spec.replace(settings=settings), "seed"
    # data: one example one token longer (same count: only the lengths digest tells)
    lengths = [a.copy() for a in spec.lengths]
    first = lengths[0]
    i = draw(st.integers(0, first.shape[0] - 1))
    if first.ndim == 2:
        first[i, 1] = max(first[i, 1] - 1, 1) if first[i, 1] > 1 else first[i, 1] + 1
    else:
        first[i] = first[i] - 1 if first[i] > 1 else first[i] + 1
    new_spec = spec.replace(lengths=tuple(lengths))
    if single_cost(new_spec, int(new_spec.key.max())) > min(
        new_spec.memory(r) for r in range(spec.world)
    ):
        return "nothing", spec, HONOURED
    return what, new_spec, "lengths" if spec.kind in IN_MEMORY else "shards"
