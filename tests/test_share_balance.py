"""balanced_shares: convergence to the speed ratio, no oscillation, the dead band, bad input."""

from __future__ import annotations

import itertools
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner import balanced_shares, smoothed_speeds
from lightning_varbatch.planner.share_balance import rank_speeds


def period(speeds: list[float], shares: tuple[float, ...]) -> tuple[list[float], list[float]]:
    """One period on ranks of the given true speeds: work follows the shares, time = work/speed."""
    work = [1000.0 * s / sum(shares) for s in shares]
    return [w / v for w, v in zip(work, speeds, strict=True)], work


def run(speeds: list[float], epochs: int, **kwargs: Any) -> list[tuple[float, ...]]:
    """Shares over ``epochs`` periods, as the balancer runs them (smoothed speeds carried)."""
    shares: tuple[float, ...] = (1.0,) * len(speeds)
    history = [shares]
    previous = None
    for _ in range(epochs):
        seconds, work = period(speeds, shares)
        shares = balanced_shares(seconds, work, shares, previous=previous, **kwargs)
        previous = smoothed_speeds(seconds, work, previous, **kwargs_smoothing(kwargs))
        history.append(shares)
    return history


def kwargs_smoothing(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in kwargs.items() if k == "smoothing"}


def test_the_first_measurement_sets_the_shares_at_once() -> None:
    history = run([2.0, 1.0], epochs=4)  # rank 1 half as fast
    # Speeds do not depend on the shares: the second period already runs at the right shares,
    # and they stay there.
    assert history[1:] == [pytest.approx((1.0, 0.5))] * 4
    assert run([3.0, 1.0, 1.5], epochs=1, smoothing=0.9)[-1] == pytest.approx((1.0, 1 / 3, 0.5))


def test_one_noisy_period_moves_part_way_and_never_overshoots() -> None:
    speeds = [2.0, 1.0]
    shares = (1.0, 0.5)
    previous = smoothed_speeds(*period(speeds, shares))  # balanced: (1, 0.5)
    # Rank 0 is slowed 4x during one period only: it looks half as fast as rank 1.
    seconds, work = period([0.5, 1.0], shares)
    noisy = balanced_shares(seconds, work, shares, previous=previous)
    previous = smoothed_speeds(seconds, work, previous)
    # Half the way in ratio from 1:0.5 to 0.5:1 is 1:1; smoothing=0 would have jumped to 0.5:1.
    assert noisy == pytest.approx((1.0, 1.0))
    assert balanced_shares(seconds, work, shares, smoothing=0.0) == pytest.approx((0.5, 1.0))
    # Back to normal: the shares return towards (1, 0.5) without crossing it.
    ratios = []
    current = noisy
    for _ in range(6):
        seconds, work = period(speeds, current)
        current = balanced_shares(seconds, work, current, previous=previous)
        previous = smoothed_speeds(seconds, work, previous)
        ratios.append(current[1] / current[0])
    assert all(r >= 0.5 - 1e-12 for r in ratios)  # never past the target
    assert all(b <= a + 1e-12 for a, b in itertools.pairwise(ratios))  # monotone
    assert abs(ratios[-1] / 0.5 - 1) < 0.05


def test_dead_band_keeps_the_shares_in_force() -> None:
    current = (1.0, 0.5)
    seconds, work = period([2.0, 1.04], current)  # within 4 %: noise
    assert balanced_shares(seconds, work, current) == (1.0, 0.5)
    assert balanced_shares(seconds, work, current, tolerance=0.0) != (1.0, 0.5)
    # Any positive scale of the shares in force: the result has its largest share 1.
    assert balanced_shares(seconds, work, (4.0, 2.0)) == (1.0, 0.5)


def test_min_share_floor() -> None:
    shares = balanced_shares([1.0, 10.0], [10.0, 10.0], [1.0, 1.0], min_share=0.25)
    assert shares == (1.0, 0.25)


def test_speeds_are_work_per_second() -> None:
    assert rank_speeds(np.array([2.0, 4.0]), [10, 10]) == (5.0, 2.5)


@pytest.mark.parametrize(
    ("kwargs", "error", "setting"),
    [
        ({"seconds": [1.0, 0.0]}, SettingValueError, "seconds"),
        ({"seconds": [1.0, math.nan]}, SettingValueError, "seconds"),
        ({"seconds": 3.0}, SettingTypeError, "seconds"),
        ({"work": [1.0, -2.0]}, SettingValueError, "work"),
        ({"work": [1.0, "2"]}, SettingTypeError, "work"),
        ({"work": [1.0]}, SettingValueError, "work"),
        ({"current": [1.0, 0.0]}, SettingValueError, "rank_shares"),
        ({"current": [1.0, 1.0, 1.0]}, SettingValueError, "rank_shares"),
        ({"smoothing": 1.0}, SettingValueError, "smoothing"),
        ({"smoothing": -0.1}, SettingValueError, "smoothing"),
        ({"smoothing": "0.5"}, SettingTypeError, "smoothing"),
        ({"tolerance": 1.0}, SettingValueError, "tolerance"),
        ({"min_share": 0.0}, SettingValueError, "min_share"),
        ({"min_share": 1.5}, SettingValueError, "min_share"),
    ],
)
def test_bad_input_names_the_setting(
    kwargs: dict[str, object], error: type[Exception], setting: str
) -> None:
    args: dict[str, object] = {"seconds": [1.0, 2.0], "work": [5.0, 5.0], "current": [1.0, 1.0]}
    args.update(kwargs)
    with pytest.raises(error, match=setting) as caught:
        balanced_shares(**args)  # type: ignore[arg-type]
    assert caught.value.setting == setting  # type: ignore[attr-defined]


speeds_st = st.lists(st.floats(0.05, 20.0), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None)
@given(
    speeds=speeds_st,
    slow=st.lists(st.floats(0.05, 20.0), min_size=8, max_size=8),
    smoothing=st.floats(0.0, 0.9),
    tolerance=st.floats(0.0, 0.2),
)
def test_property_one_slow_period_then_back_converges_without_overshoot(
    speeds: list[float], slow: list[float], smoothing: float, tolerance: float
) -> None:
    target = np.asarray(speeds) / max(speeds)
    shares: tuple[float, ...] = (1.0,) * len(speeds)
    previous = None
    band = 2 * -math.log(1.0 - tolerance)  # the dead band, as a spread of log ratios
    last = math.inf
    for epoch in range(40):
        truth = slow[: len(speeds)] if epoch == 1 else speeds  # period 1: other speeds
        seconds, work = period(truth, shares)
        shares = balanced_shares(
            seconds, work, shares, smoothing=smoothing, tolerance=tolerance, previous=previous
        )
        previous = smoothed_speeds(seconds, work, previous, smoothing=smoothing)
        assert max(shares) == 1.0 and min(shares) > 0
        # The imbalance the shares leave: the spread of log(share / right share) over ranks
        # (0 = every rank finishes together; independent of the shares' scale).
        ratio = np.log(np.asarray(shares) / target)
        spread = float(ratio.max() - ratio.min())
        if epoch == 0:  # the first measurement: at the target, or within the dead band
            assert spread <= band + 1e-9
        if epoch >= 2:  # back to the true speeds: never worse than before (no oscillation)
            assert spread <= last + 1e-9
        last = spread
    # Geometric convergence of the smoothed speeds until the dead band holds.
    assert last <= band + smoothing**38 * 10 + 1e-9
