"""Both planners keep the written contract with the sampler (:class:`Planner`).

The assignments below are checked statically too: ``mypy tests/test_planner_protocol.py``.
"""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from lightning_varbatch.planner import DataSource, EpochPlanner, MixturePlanner, PlanConfig, Planner
from lightning_varbatch.planner.diagnostics import diagnose

CONFIG = PlanConfig(max_tokens=64)


def _epoch_planner() -> Planner:
    planner: Planner = EpochPlanner(np.arange(1, 41), CONFIG)  # mypy: EpochPlanner is a Planner
    return planner


def _mixture_planner() -> Planner:
    planner: Planner = MixturePlanner(  # mypy: MixturePlanner is a Planner
        [DataSource(np.arange(1, 31), name="a"), DataSource(np.full(9, 20), name="b")], CONFIG
    )
    return planner


def _members() -> list[str]:
    return [
        name
        for name in dir(Planner)
        if not name.startswith("_") and name not in dir(object) and name != "mro"
    ]


def test_protocol_lists_the_contract() -> None:
    assert sorted(_members()) == sorted(
        [
            "config",
            "dataset_truncate_to",
            "fingerprint",
            "names",
            "num_examples",
            "num_planned",
            "num_skipped",
            "num_truncated",
            "offsets",
            "plan",
            "plan_resumed",
            "prepared",
            "truncate_to",
        ]
    )


@pytest.mark.parametrize("make", [_epoch_planner, _mixture_planner])
def test_both_planners_satisfy_it(make: object) -> None:
    planner = make()  # type: ignore[operator]
    assert isinstance(planner, Planner)
    for name in _members():
        assert hasattr(planner, name), name
    for name in ("plan", "plan_resumed", "dataset_truncate_to", "fingerprint"):
        wanted = inspect.signature(getattr(Planner, name)).parameters
        got = inspect.signature(getattr(planner, name)).parameters
        assert list(got)[: len(wanted) - 1] == [p for p in wanted if p != "self"], name


@pytest.mark.parametrize("make", [_epoch_planner, _mixture_planner])
def test_members_agree_with_the_plans(make: object) -> None:
    planner: Planner = make()  # type: ignore[operator]
    n = planner.num_examples
    assert planner.offsets[0] == 0 and planner.offsets[-1] == n
    assert len(planner.names) == planner.offsets.size - 1
    assert planner.prepared.key.shape == (n,)
    assert planner.num_planned == n - planner.num_skipped
    assert planner.dataset_truncate_to(0) == planner.truncate_to
    assert isinstance(planner.fingerprint(), str)
    plan = planner.plan(0, 2, 1)
    assert np.array_equal(planner.plan_resumed(0, 2, 1).assign, plan.assign)
    assert diagnose(planner, plan).num_examples == n


def test_a_plain_object_is_not_a_planner() -> None:
    assert not isinstance(object(), Planner)
    assert not isinstance(CONFIG, Planner)


def test_one_dataset_named_like_a_mixture_would_name_it() -> None:
    single = EpochPlanner(np.arange(1, 11), CONFIG)
    mixture = MixturePlanner([np.arange(1, 11)], CONFIG)
    assert single.names == mixture.names == ["0"]
    assert single.offsets.tolist() == mixture.offsets.tolist() == [0, 10]
