"""The record of one bad input (or fault) and the outcome a user needs from it.

A :class:`Case` names the input in words, performs it with a small callable and states the
outcome: an exception of exactly one type (``type(raised) is raises``: a subclass is another
outcome) whose message contains every listed piece (the setting, file, item or environment
variable, and the value received), or "accepted" for inputs that must work (numpy integers,
huge lengths within the budget, ...). A bad setting's case also names the setting, which the
error must carry as ``.setting`` (a :class:`~lightning_varbatch.errors.SettingError`).

Example:
    >>> from lightning_varbatch.errors import SettingValueError
    >>> c = error("demo", "planner API", "max_tokens=0", lambda tmp: None, "max_tokens", "0",
    ...           raises=SettingValueError, setting="max_tokens")
    >>> c.outcome
    'SettingValueError (setting `max_tokens`) naming `max_tokens`, `0`'
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

AREAS = (
    "planner API",
    "lengths",
    "sampler",
    "resume/state",
    "collate",
    "loader",
    "HF datasets",
    "streaming",
    "DataModule",
    "mixing/DataSource",
    "plan CLI",
    "examples",
    "callbacks",
    "memory tools",
    "strategies",
    "environment",
    "multi-process",
)

#: A message shorter than this cannot say what was got, what is allowed and what to change.
MIN_MESSAGE = 30

#: A message says what to do when it holds one of these words (what is allowed, or the fix).
FIX_WORDS = (
    "must",
    "expect",
    "expects",
    "expected",
    "choose",
    "pass",
    "set",
    "use",
    "should",
    "need",
    "needs",
    "allowed",
    "valid",
    "only",
    "give",
    "raise",
    "lower",
    "remove",
    "fix",
    "unset",
    "resume",
    "start",
    "leave",
    "one of",
    "make",
    "convert",
    "check",
    "return",
    "tokenize",
    "required",
    "invalid choice",
    "unrecognized",
    "save",
    "write",
    "drop",
    "rename",
    "call",
    "add",
    "try",
    "instead",
    "either",
    "at least",
    "at most",
)
_FIX = re.compile(r"\b(" + "|".join(re.escape(w) for w in FIX_WORDS) + r")\b")

Match = str | tuple[str, ...]  # a piece the message must contain; a tuple: any one of them


class CliError(Exception):
    """The plan CLI exited non-zero; the message is its stderr."""


@dataclass(frozen=True)
class Case:
    """One bad input or fault and its expected outcome.

    Attributes:
        id: unique, stable id (``area-family-member``).
        area: one of :data:`AREAS`.
        input: the input in words (for the table).
        run: performs it; gets a fresh temporary directory.
        raises: the exact exception type expected (``type(raised) is raises``), ``None`` when
            the input must be accepted.
        match: pieces the message must contain (case-insensitive); a tuple means any one.
        env: environment variables to set (``None``: unset) while it runs.
        warn_ok: a warning whose message contains every piece is also a right outcome.
        fix_in: the library file that most likely owns the check (for triage).
        note: the outcome in words, when the callable itself judges it (shown in the table).
        not_blame: settings the message must not mention (blaming the wrong setting misleads).
        setting: the setting the error must name as ``.setting`` (it must then be a
            :class:`~lightning_varbatch.errors.SettingError`); ``None``: not checked.
    """

    id: str
    area: str
    input: str
    run: Callable[[Path], Any]
    raises: type[BaseException] | None
    match: tuple[Match, ...] = ()
    env: Mapping[str, str | None] = field(default_factory=dict)
    warn_ok: bool = False
    fix_in: str = ""
    note: str = ""
    not_blame: tuple[str, ...] = ()
    setting: str | None = None

    @property
    def outcome(self) -> str:
        """The expected outcome, as the doc table shows it."""
        if self.note:
            return self.note
        if self.raises is None:
            return "accepted"
        names = self.raises.__name__
        if self.setting is not None:
            names += f" (setting `{self.setting}`)"
        pieces = ", ".join(
            " or ".join(f"`{p}`" for p in m) if isinstance(m, tuple) else f"`{m}`"
            for m in self.match
        )
        text = f"{names} naming {pieces}" if pieces else names
        if self.not_blame:
            text += ", not blaming " + ", ".join(f"`{b}`" for b in self.not_blame)
        return text + (" (or a warning saying so)" if self.warn_ok else "")


def error(
    id: str,
    area: str,
    input: str,
    run: Callable[[Path], Any],
    *match: Match,
    raises: type[BaseException],
    setting: str | None = None,
    env: Mapping[str, str | None] | None = None,
    warn_ok: bool = False,
    fix_in: str = "",
    not_blame: tuple[str, ...] = (),
) -> Case:
    """A case that must raise exactly ``raises`` with every piece of ``match`` in its message.

    Args:
        raises: ONE exception class; the raised error's type must be it, not a subclass (a
            tuple of "acceptable" types is refused: each input has one right outcome).
        setting: the setting the error must carry as ``.setting`` (a bad setting's case).

    Raises:
        TypeError: for a tuple or anything but an exception class.
    """
    if not (isinstance(raises, type) and issubclass(raises, BaseException)):
        raise TypeError(
            f"{id}: raises must be one exception class (the exact type expected), got {raises!r}."
        )
    return Case(
        id,
        area,
        input,
        run,
        raises,
        tuple(match),
        env or {},
        warn_ok,
        fix_in,
        "",
        not_blame,
        setting,
    )


def accepted(
    id: str,
    area: str,
    input: str,
    run: Callable[[Path], Any],
    *,
    env: Mapping[str, str | None] | None = None,
    fix_in: str = "",
    note: str = "",
) -> Case:
    """A case that must run without an error (its callable checks the result)."""
    return Case(id, area, input, run, None, (), env or {}, False, fix_in, note)


def message_problems(case: Case, message: str) -> list[str]:
    """What the message lacks: missing pieces, or too short to say what to fix."""
    low = message.lower()
    missing = []
    for piece in case.match:
        options = piece if isinstance(piece, tuple) else (piece,)
        if not any(o.lower() in low for o in options):
            missing.append(" or ".join(repr(o) for o in options))
    problems = [f"the message does not name {m}" for m in missing]
    problems += [
        f"misleading: the message blames {b!r}" for b in case.not_blame if b.lower() in low
    ]
    if len(message.strip()) < MIN_MESSAGE:
        problems.append(f"vague: a message of {len(message.strip())} characters")
    if not _FIX.search(low):
        problems.append("vague: the message says neither what is allowed nor what to change")
    if "Traceback (most recent call last)" in message:
        problems.append("vague: a traceback instead of an error line")
    return problems


def run_plan_cli(argv: list[str]) -> str:
    """Run ``python -m lightning_varbatch.plan`` in-process; raise :class:`CliError` on failure.

    Returns:
        stdout and stderr of a successful run.
    """
    from lightning_varbatch.plan import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse errors
            code = exit_.code if isinstance(exit_.code, int) else 1
    if code:
        raise CliError(f"exit code {code}: {err.getvalue().strip()}")
    return out.getvalue() + err.getvalue()
