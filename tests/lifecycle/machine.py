"""The lifecycle model: random runs through build, take, save, change, load, next epoch.

:class:`LifecycleMachine` is a hypothesis ``RuleBasedStateMachine``. It builds a run from the
whole settings space (:func:`~tests.lifecycle.spec.run_specs`) on one of five front ends
(:mod:`tests.lifecycle.drivers`), then applies random rules: take micro-batches on every rank,
save a checkpoint's state, change what a user may change and load it (elastic, shares, per-rank
budgets, accumulation, a schedule, the data, the seed), change the shares during a fit, finish
the epoch. Its oracle is its own bookkeeping: the ids every rank ran, counted by the model; the
cost of every micro-batch, computed from the lengths; the refusals a change must bring.

* every example exactly once per epoch; ``tail="drop"`` never repeats, ``"pad"`` never loses,
  ``"spread"`` does neither (but where fewer examples are left than a step has micro-batches),
  and what each did is what the library reports for the epoch;
* no micro-batch over the budget of its rank at that moment (its memory budget now, and the
  budget the plan gave it);
* under a batch schedule, no micro-batch over ``floor(fraction × budget)`` of its rank, the
  fraction the plan gives its step; the step budget a batch reports is that fraction of every
  rank's budget; and no step a level (1 %) below the schedule at its clock (the planning
  tokens trained before it, as the model counts them, across saves, loads and epochs), nor
  two of its steps ahead of it;
* every rank the same number of micro-batches, always;
* the optimizer step a micro-batch reports never goes back within an epoch;
* a change the library cannot honour raises ``ResumeMismatchError`` naming it, before any
  micro-batch; a change it can is honoured.

``PATHS`` collects every run's path (the rules and their kinds, not their numbers), so a soak
reports how many distinct paths it explored.
"""

from __future__ import annotations

import collections
from typing import Any

import numpy as np
from hypothesis import assume, note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from lightning_varbatch.errors import ResumeMismatchError, SettingError
from tests.batch_schedule_oracle import behind_allowed, step_capacity
from tests.lifecycle.drivers import Driver, SamplerDriver, Taken, build
from tests.lifecycle.spec import (
    HONOURED,
    KINDS,
    SCHEDULED,
    RunSpec,
    changes,
    micro_batch_cost,
    reference_of,
    run_specs,
)

#: Every explored path: (rule, kind) tuples of one run.
PATHS: set[tuple[tuple[str, ...], ...]] = set()
#: What the runs checked, by kind (epochs, micro-batches, scheduled steps, resumes), for a
#: soak's report: every one of them passed, or the soak failed.
FINDINGS: collections.Counter[str] = collections.Counter()

_BUILD_ERRORS = (SettingError, ValueError, TypeError)


class LifecycleMachine(RuleBasedStateMachine):
    """A run of every rank, driven by random rules (see the module docstring)."""

    kinds: tuple[str, ...] = KINDS
    scheduled = False  # every run under a batch-size schedule (ScheduledMachine)

    def __init__(self) -> None:
        super().__init__()
        self.driver: Driver | None = None
        self.spec: RunSpec | None = None
        self.path: list[tuple[str, ...]] = []
        self.seen: collections.Counter[int] = collections.Counter()
        self.batches: collections.Counter[int] = collections.Counter()  # per dataset
        self.saved: tuple[Any, ...] | None = None
        self.started = False  # whether anything was planned (a first error: an invalid draw)
        self.loaded = False  # whether this epoch was resumed from a state
        self.short_remainder = False  # a re-plan had fewer examples than a step's micro-batches
        self.last_step: list[int] = []
        self._twin: Driver | None = None
        self.repeats_before = 0
        self.step_fraction: dict[int, float] = {}  # under a batch schedule, by epoch step
        self.step_tokens: collections.Counter[int] = collections.Counter()
        self.step_ids: collections.defaultdict[int, list[int]] = collections.defaultdict(list)
        self.step_budgets: dict[int, list[int]] = {}
        self.resumed_tokens = 0  # planning tokens of the examples run before this epoch's load

    # -- helpers --------------------------------------------------------------------------------

    def _take(self, count: int) -> list[list[Taken]]:
        assert self.driver is not None and self.spec is not None
        try:
            got = self.driver.take(count)
        except ResumeMismatchError:
            raise
        except _BUILD_ERRORS as error:
            if self.started:  # fine only where these settings cannot plan the data at all
                try:
                    build(self.spec).take(1)
                except _BUILD_ERRORS:
                    note(f"the settings cannot plan the data: {error}")
                    assume(False)
                raise
            note(f"rejected at first plan: {error}")
            assume(False)
            raise
        self.started = True
        spec = self.spec
        counts = [len(g) for g in got]
        assert len(set(counts)) == 1, f"ranks took different numbers of micro-batches: {counts}"
        FINDINGS["micro-batches"] += sum(counts)
        for rank, batches in enumerate(got):
            for t in batches:
                cost = micro_batch_cost(spec, list(t.ids))
                limit = spec.memory(rank)
                assert cost <= limit + 1e-9, (
                    f"rank {rank} ran a micro-batch of cost {cost} over its memory budget {limit}"
                )
                if t.budget is not None:
                    assert cost <= t.budget + 1e-9, (
                        f"rank {rank} ran a micro-batch of cost {cost} over its plan's budget "
                        f"{t.budget}"
                    )
                if t.fraction is not None:
                    self._check_scheduled(t, cost)
                if t.pad is not None:
                    assert t.pad[0] * t.pad[1] <= spec.max_tokens
                    assert t.pad[0] >= len(t.ids)
                if t.step is not None:
                    assert t.step >= self.last_step[rank], (
                        f"rank {rank}'s step went back from {self.last_step[rank]} to {t.step} "
                        "within the epoch"
                    )
                    self.last_step[rank] = t.step
                self.seen.update(t.ids)
                self.batches[self._part(t.ids[0])] += 1
        return got

    def _check_scheduled(self, t: Taken, cost: float) -> None:
        """A micro-batch under a batch schedule: within its fraction of its rank's budget."""
        assert self.spec is not None and t.fraction is not None and t.budget is not None
        limit = int(t.fraction * t.budget)
        assert cost <= limit + 1e-9, (
            f"rank {t.rank} ran a micro-batch of cost {cost} over floor({t.fraction:g} * "
            f"{t.budget}) = {limit}, its step's fraction of its budget"
        )
        assert t.budgets is not None and t.step_budget is not None
        expected = self.spec.acc * sum(int(t.fraction * b) for b in t.budgets)
        assert t.step_budget == expected, (
            f"a batch says its step may hold {t.step_budget} tokens; at fraction "
            f"{t.fraction:g} of the budgets {t.budgets} x {self.spec.acc} it is {expected}"
        )
        if t.step is not None:
            self.step_budgets[t.step] = list(t.budgets)
            seen = self.step_fraction.setdefault(t.step, t.fraction)
            assert seen == t.fraction, f"step {t.step} at two fractions: {seen}, {t.fraction}"
            self.step_tokens[t.step] += int(self.spec.key[list(t.ids)].sum())
            self.step_ids[t.step] += t.ids

    def _check_clock(self) -> None:
        """Every step at its schedule's fraction at its clock, within the documented bound.

        The clock is the planning tokens trained before the step, as the model counts them:
        ``epoch × epoch tokens``, plus (a resumed epoch) those of the examples run before the
        save, plus those of the steps before. A step is at most a level below the schedule at
        its clock less the longest example (a level's steps run in another order; a ramp's
        levels are merged to span a few steps: by as much more), and starts less than two of
        its own steps before the schedule reaches its fraction (what a level leaves over joins
        the next one). The first step after a load may have begun before the save: its clock
        is known within one full step.
        """
        assert self.spec is not None and self.driver is not None
        if not self.step_fraction:
            return
        spec = self.spec
        reference = reference_of(spec.settings["batch_schedule"])
        clock = self.driver.epoch * int(spec.key.sum()) + self.resumed_tokens
        longest = int(spec.key.max())
        for i, step in enumerate(sorted(self.step_fraction)):
            f, budgets = self.step_fraction[step], self.step_budgets[step]
            cut = step_capacity(1.0, budgets, spec.acc) if i == 0 and self.loaded else 0
            merged = behind_allowed(f, reference, budgets, spec.acc)
            at = clock - longest - merged - cut
            assert f * 1.01 >= reference.at(at) - 1e-6, (
                f"step {step} runs at fraction {f:g}, its schedule says "
                f"{reference.at(at):g} at {clock} - {longest} - {merged} - {cut} tokens trained"
            )
            ahead = reference.reached(f) - clock
            allowed = 2 * step_capacity(f, budgets, spec.acc)
            assert ahead <= allowed, (
                f"step {step} at fraction {f:g} starts at {clock} tokens, {ahead} before its "
                f"schedule reaches it (more than two of its steps, {allowed} tokens)"
            )
            clock += self.step_tokens[step]
            FINDINGS["scheduled steps"] += 1

    def _part(self, example: int) -> tuple[int, int]:
        """The plan ``example`` is in: its dataset, and its window of a stream."""
        assert self.spec is not None and self.driver is not None
        ends = np.cumsum([a.shape[0] for a in self.spec.lengths])
        return int(np.searchsorted(ends, example, side="right")), self.driver.window_of(example)

    def _check_equal_counts(self) -> None:
        assert self.driver is not None
        left = self.driver.remaining()
        if left is not None:
            assert len(set(left)) == 1, f"ranks have different numbers left: {left}"

    # -- rules ------------------------------------------------------------------------------------

    @initialize(data=st.data())
    def build_run(self, data: st.DataObject) -> None:
        spec = data.draw(run_specs(self.kinds, self.scheduled), label="spec")
        try:
            self.driver = build(spec)
            self._check_equal_counts()  # plans the epoch where the front end can
        except _BUILD_ERRORS as error:
            note(f"rejected at build: {error}")
            assume(False)
        self.started = self.driver.remaining() is not None
        self.spec = spec
        self.last_step = [0] * spec.world
        self.path.append(("build", spec.describe()))

    @rule(count=st.integers(1, 7))
    def take(self, count: int) -> None:
        self._take(count)
        self._check_equal_counts()
        self.path.append(("take",))

    @rule()
    def save(self) -> None:
        assert self.driver is not None and self.spec is not None
        if not self.started:
            self._take(0)  # plan first: a checkpoint is saved by a running fit
            self._take(1)
        state = self.driver.state()
        self.saved = (
            state,
            self.spec,
            self.driver.epoch,
            self.driver.trained,
            collections.Counter(self.seen),
            list(self.last_step),
            collections.Counter(self.batches),
        )
        self.path.append(("save",))

    @precondition(lambda self: self.saved is not None)
    @rule(data=st.data())
    def resume(self, data: st.DataObject) -> None:
        assert self.saved is not None
        state, spec, epoch, trained, seen, last_step, batches = self.saved
        what, new_spec, expected = data.draw(changes(spec), label="change")
        note(f"resume: {what} -> {expected}")
        try:
            driver = build(new_spec)
        except _BUILD_ERRORS as error:  # the changed settings are invalid on their own
            note(f"changed settings rejected at build: {error}")
            return
        optional = expected.endswith("?")
        expected = expected.rstrip("?")
        if optional:  # refused (naming it) or honoured: both keep every guarantee
            try:
                build(new_spec).load(state, epoch, trained)
            except ResumeMismatchError as error:
                assert expected in error.changed, (what, error.changed)
                self.path.append(("resume", what, "refused"))
                return
        elif expected != HONOURED:
            try:
                driver.load(state, epoch, trained)
                driver.take(1)
            except ResumeMismatchError as error:
                assert expected in error.changed, (
                    f"the refusal of a changed {what} names {error.changed}, not {expected!r}"
                )
            else:
                raise AssertionError(f"a resume with another {what} was not refused")
            self.path.append(("resume", what, "refused"))
            FINDINGS["resumes refused"] += 1
            return
        try:
            driver.load(state, epoch, trained)
        except ResumeMismatchError:
            raise
        except _BUILD_ERRORS as error:  # the new settings cannot serve the data at all?
            try:
                build(new_spec).take(1)
            except _BUILD_ERRORS:
                note(f"the changed settings cannot plan the data: {error}")
                return
            raise
        self.driver, self.spec = driver, new_spec
        if data.draw(st.booleans(), label="twin"):  # determinism: a second load runs the same
            twin = build(new_spec)
            twin.load(state, epoch, trained)
            self._twin = twin
        self.seen, self.last_step = collections.Counter(seen), list(last_step)
        self.batches = collections.Counter(batches)
        self.step_fraction, self.step_tokens = {}, collections.Counter()
        self.step_ids.clear()
        # repeats the saved topology's plan ran already (legitimate where it was crowded)
        self.repeats_before = sum(c - 1 for c in self.seen.values() if c > 1)
        if new_spec.world != len(self.last_step):
            top = max(self.last_step, default=0)
            self.last_step = [top] * new_spec.world
        self.loaded = True
        self.resumed_tokens = int(new_spec.key[sorted(self.seen)].sum()) if self.seen else 0
        self.started = True
        multiple = new_spec.world * new_spec.acc
        # a re-planned part of the epoch (a dataset; a stream's window) with fewer examples
        # left than a step has micro-batches: "spread" may repeat there (counted)
        parts = collections.Counter(self._part(i) for i in range(spec.num_examples))
        done = collections.Counter(self._part(i) for i in self.seen)
        if any(0 < size - done[part] < multiple for part, size in parts.items()):
            self.short_remainder = True
        self._check_equal_counts()
        if self._twin is not None:
            ours = [[t.ids for t in rank] for rank in self._take(3)]
            theirs = [[t.ids for t in rank] for rank in self._twin.take(3)]
            assert ours == theirs, "two loads of one state on one spec ran different batches"
            self._twin = None
        self.path.append(("resume", what, "honoured"))
        FINDINGS["resumes honoured"] += 1

    @precondition(
        lambda self: (
            self.spec is not None
            and self.spec.world > 1
            and self.spec.kind in ("sampler", "datamodule")
        )
    )
    @rule(data=st.data())
    def set_shares_during_fit(self, data: st.DataObject) -> None:
        assert isinstance(self.driver, SamplerDriver) and self.spec is not None
        spec = self.spec
        longest = max(micro_batch_cost(spec, [i]) for i in range(spec.num_examples))
        low = min(1.0, longest / spec.max_tokens + 0.05)
        shares = tuple(data.draw(st.floats(low, 1.0)) for _ in range(spec.world))
        self.driver.set_rank_shares(shares)
        self.spec = spec.replace(rank_shares=shares)
        try:
            self._check_equal_counts()  # plans with them where nothing of the epoch ran yet
        except _BUILD_ERRORS as error:  # shares these data cannot serve (e.g. too few for
            note(f"the shares cannot plan the data: {error}")  # "drop"): refused clearly
            assume(False)
        self.path.append(("shares",))

    @precondition(lambda self: self.driver is not None and self.driver.epoch < 2)
    @rule()
    def finish_epoch(self) -> None:
        assert self.driver is not None and self.spec is not None
        while True:
            got = self._take(50)
            if not got[0]:
                break
        self._check_epoch()
        try:
            self.driver.next_epoch()
            self._check_equal_counts()  # plans the next epoch where the front end can
        except _BUILD_ERRORS as error:  # e.g. a new world size with too few micro-batches
            try:
                build(self.spec).take(1)
            except _BUILD_ERRORS:
                note(f"the settings cannot plan the data: {error}")
                assume(False)
            raise
        self.seen, self.batches = collections.Counter(), collections.Counter()
        self.step_fraction, self.step_tokens = {}, collections.Counter()
        self.step_ids.clear()
        self.last_step = [0] * self.spec.world
        self.loaded = self.short_remainder = False
        self.repeats_before = self.resumed_tokens = 0
        self.saved = None if self.saved is None else self.saved  # an old state may be loaded
        self.path.append(("epoch",))

    # -- the epoch's oracle ---------------------------------------------------------------------

    def _check_epoch(self) -> None:
        assert self.spec is not None and self.driver is not None
        spec = self.spec
        n = spec.num_examples
        counts = np.bincount(np.fromiter(self.seen.elements(), dtype=np.int64), minlength=n)
        missing = int((counts == 0).sum())
        repeated = int(np.maximum(counts - 1, 0).sum())
        tail = spec.settings.get("tail", "spread")
        note(f"epoch end: tail={tail}, missing={missing}, repeated={repeated}")
        FINDINGS["epochs"] += 1
        self._check_clock()
        if tail in ("spread", "pad"):
            assert missing == 0, f"tail={tail!r}: {missing} examples never trained this epoch"
        # "spread" repeats only where every micro-batch of a dataset holding one example
        # could not make whole steps: more micro-batches than examples (or a short re-plan)
        examples = collections.Counter(self._part(i) for i in range(n))
        crowded = any(self.batches[part] > size for part, size in examples.items())
        if self.step_ids:  # a schedule that outlasts the epoch: its last level may be crowded
            final = self.step_fraction.get(max(self.step_ids))
            level = [k for k in self.step_ids if self.step_fraction.get(k) == final]
            last = {i for k in level for i in self.step_ids[k]}
            again = {i for i, c in self.seen.items() if c > 1}
            if again <= last and len(last) < len(level) * spec.world * spec.acc:
                crowded = True  # fewer examples left than the level's micro-batches
        if tail == "drop" or (tail == "spread" and not (self.short_remainder or crowded)):
            assert repeated == self.repeats_before, (
                f"tail={tail!r}: {repeated - self.repeats_before} examples trained twice this epoch"
            )
        report = self.driver.report()
        if report is not None:
            assert report == (missing, repeated), (
                f"the library reports (dropped, duplicated)={report} for the epoch, the model "
                f"counted ({missing}, {repeated})"
            )

    def teardown(self) -> None:
        PATHS.add(tuple(self.path))


class ScheduledMachine(LifecycleMachine):
    """The model with every run under a batch-size schedule, on the front ends that take one."""

    kinds = SCHEDULED
    scheduled = True
