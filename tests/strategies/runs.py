"""The strategies' launches: one per strategy, holding every run its checks read.

A launch starts ``tests/scripts/strategy_phases.py`` once on ``WORLD_SIZE`` ranks; inside, one
phase after another trains the same sequences in another configuration (a new ``Trainer``,
model and data each). The phases, by name:

- ``list``: the sequences as a Python list, padded micro-batches (``strategy_train.py``);
- ``hf``: the same as a Hugging Face dataset (``--source hf``, each micro-batch one Arrow read);
- ``stream``: the same as parquet shards, streamed (``--source stream:DIR``);
- ``packed``: padding-free packed rows (``--layout packed``) and a causal attention model;
- ``shares``: a mixed cluster (``--rank-shares``/``--rank-max-tokens``) under a length warm-up
  over every step (``--length-warmup STEPS``);
- ``schedule``: a batch-size schedule over two epochs (``schedule_train.py``; the DDP launch
  also checkpoints inside a stage);
- ``user_config`` / ``bad_config``: DeepSpeed from a user's ``config=`` dict, a consistent one
  with a torch optimizer and one whose ``train_batch_size`` contradicts the trainer;
- ``callbacks_fn``, ``callbacks_keys``, ``callbacks_keys_hf``: ``BatchSizeLRScaler`` and
  ``TokenThroughputMonitor`` counting through functions or the batch keys, from the list or
  the Hugging Face dataset (``callbacks_train.py``).

A phase ``KIND:STRATEGY`` runs phase ``KIND`` under another strategy than the launch's (the
DeepSpeed launch runs every ZeRO stage so: DeepSpeed's first initialisation in a process is
its costly part).

:class:`Launches` (a session fixture, ``tests/strategies/conftest.py``) starts each launch the
first time a test asks for it and keeps its records, a failure too. Each strategy's tests sit in
one file, so that ``--dist loadfile`` runs its launch on one worker, once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.launch import launch
from tests.scripts.hf_source import save_shards
from tests.scripts.strategy_common import RANK_MAX_TOKENS, RANK_SHARES, sequence_columns

WORLD_SIZE = 2
#: Optimizer steps of a ``strategy_train.py`` run.
STEPS = 3
#: Seconds a launch may take: the start, then each phase (a loaded 2-core machine took up to
#: 120 s to start the ranks and up to 30 s for a phase).
START_TIMEOUT = 180.0
PHASE_TIMEOUT = 60.0
#: The batch-size schedule of the ``schedule`` phase, as the tests read it.
THRESHOLDS = ((0, 0.375), (150, 0.5), (300, 0.75), (450, 1.0))
SCHEDULE = " ".join(f"{t}:{f:g}" for t, f in THRESHOLDS)
GAMMA = 0.9
SCHEDULE_ARGS = ("--schedule", SCHEDULE, "--gamma", str(GAMMA))
#: The DDP launch's ``schedule`` phase checkpoints after this step (inside a stage).
CHECKPOINT_STEP = 3
USER_CONFIG = {"zero_optimization": {"stage": 2}}
BAD_CONFIG = {
    "zero_optimization": {"stage": 2},
    "train_micro_batch_size_per_gpu": 2,
    "train_batch_size": 10,
}
#: The phases that train plainly (the parameter and token-mean checks read each of them).
TRAINING = ("list", "hf", "stream", "packed")
#: The phases of the callbacks' checks.
CALLBACKS = ("callbacks_fn", "callbacks_keys", "callbacks_keys_hf")


def kind_of(phase: str) -> str:
    """``KIND`` of a phase ``KIND`` or ``KIND:STRATEGY``."""
    return phase.partition(":")[0]


@dataclass(frozen=True)
class Launch:
    """One launch: its key (a folder name), ranks, strategy and phases, in order."""

    key: str
    strategy: str
    phases: tuple[str, ...]
    world_size: int = WORLD_SIZE
    #: ``schedule`` phase only: resume from this checkpoint instead of training from scratch.
    resume: Path | None = None


def phase_args(launch: Launch, phase: str, shards: Path | None) -> list[Any]:
    """``[name, script, args]`` of one phase for ``strategy_phases.py``."""
    kind = kind_of(phase)
    strategy = phase.partition(":")[2] or launch.strategy
    if kind.startswith("callbacks_"):
        mode, _, source = kind.removeprefix("callbacks_").partition("_")
        return [phase, "callbacks", [strategy, mode, *(("--source", source) if source else ())]]
    if kind == "schedule":
        extra: tuple[str, ...] = ()
        if launch.resume is not None:
            extra = ("--resume", str(launch.resume))
        elif strategy == "ddp":
            extra = ("--checkpoint-every", str(CHECKPOINT_STEP))
        return [phase, "schedule", [strategy, *SCHEDULE_ARGS, *extra]]
    options = {
        "list": (),
        "hf": ("--source", "hf"),
        "stream": ("--source", f"stream:{shards}"),
        "packed": ("--layout", "packed"),
        "shares": (
            *("--length-warmup", str(STEPS)),
            *("--rank-shares", ",".join(map(str, RANK_SHARES))),
            *("--rank-max-tokens", ",".join(map(str, RANK_MAX_TOKENS))),
        ),
        "user_config": ("unused", json.dumps(USER_CONFIG)),
        "bad_config": ("unused", json.dumps(BAD_CONFIG)),
    }[kind]
    if kind.endswith("_config"):
        return [phase, "strategy", list(options)]
    return [phase, "strategy", [strategy, *options]]


@dataclass
class Run:
    """Every rank's records of one launch, by phase."""

    out: Path
    ranks: list[dict[str, Any]]

    def phase(self, name: str) -> list[dict[str, Any]]:
        """Every rank's record of phase ``name``, rank by rank."""
        return [r["phases"][name] for r in self.ranks]


class Launches:
    """Every launch of the test session, started once on first use (a failure is kept too)."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self.tmp = tmp_path_factory
        self.runs: dict[Launch, Run | AssertionError] = {}

    def get(self, spec: Launch) -> Run:
        if spec not in self.runs:
            try:
                self.runs[spec] = self.start(spec)
            except AssertionError as error:  # a rank failed or hung: every test says so
                self.runs[spec] = error
        run = self.runs[spec]
        if isinstance(run, AssertionError):
            raise run
        return run

    def start(self, spec: Launch) -> Run:
        out = self.tmp.mktemp(spec.key)
        shards = None
        kinds = {kind_of(p) for p in spec.phases}
        if "stream" in kinds:
            shards = out / "shards"
            save_shards(sequence_columns(), shards)
        if any(k.endswith("hf") for k in kinds):
            import datasets  # noqa: F401  (the hf extra is part of the test install)
        phases = [phase_args(spec, p, shards) for p in spec.phases]
        timeout = START_TIMEOUT + PHASE_TIMEOUT * len(phases)
        ranks = launch(
            "strategy_phases.py", spec.world_size, out, json.dumps(phases), timeout=timeout
        )
        # Every rank finished every phase, in order.
        assert [r["rank"] for r in ranks] == list(range(spec.world_size))
        for r in ranks:
            assert list(r["phases"]) == list(spec.phases), (r["rank"], list(r["phases"]))
        return Run(out, ranks)
