"""Run one case of the catalogue and judge its outcome (shared by the test and the report)."""

from __future__ import annotations

import signal
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from lightning_varbatch.errors import SettingError
from tests.bad_inputs.case import Case, message_problems

HANG_SECONDS = 60  # far above any case's time: reaching it means a hang


class Hang(BaseException):
    """Raised by the alarm; a BaseException so that no library ``except Exception`` eats it."""


@contextmanager
def _no_hang(case: Case, seconds: int) -> Iterator[None]:
    def alarm(signum: int, frame: object) -> None:
        raise Hang(f"hang: {case.id} ran over {seconds} s")

    previous = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def check_case(
    case: Case,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    hang_seconds: int = HANG_SECONDS,
) -> None:
    """Run ``case`` and fail with what is wrong about its outcome."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in case.env.items():
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    with warnings.catch_warnings(record=True) as caught, _no_hang(case, hang_seconds):
        warnings.simplefilter("always")
        try:
            case.run(tmp_path)
        except Hang as hang:
            pytest.fail(str(hang))
        except Exception as err:
            raised: Exception | None = err
        else:
            raised = None
    if case.raises is None:
        if raised is not None:
            pytest.fail(f"{case.id}: a good input was rejected: {type(raised).__name__}: {raised}")
        return
    if raised is None:
        if case.warn_ok:
            texts = [str(w.message) for w in caught]
            if any(not message_problems(case, t) for t in texts):
                return
            pytest.fail(f"silent: {case.id} raised nothing and warned {texts or 'nothing'}")
        pytest.fail(f"silent: {case.id} ({case.input}) was accepted without an error")
    if type(raised) is not case.raises:
        pytest.fail(
            f"{case.id}: expected exactly {case.raises.__name__}, got "
            f"{type(raised).__name__}: {raised}"
        )
    if case.setting is not None:
        got = raised.setting if isinstance(raised, SettingError) else None
        if got != case.setting:
            pytest.fail(
                f"{case.id}: expected an error on setting {case.setting!r} (.setting), got "
                f"{got!r}: {raised}"
            )
    problems = message_problems(case, str(raised))
    if problems:
        pytest.fail(f"{case.id}: {'; '.join(problems)}. The message: {raised}")
