"""Value families: every numeric setting is tried with each member of its family.

Each bad member has one exact outcome, the settings vocabulary's: a value of the wrong type
(a float, bool, string, NaN, infinity or ``None`` for an integer; a bool, string or ``None`` for
a real number) raises :class:`~lightning_varbatch.errors.SettingTypeError`, a value of the
right type out of range (0, negative; NaN and infinity for a real number) raises
:class:`~lightning_varbatch.errors.SettingValueError`, and the error's ``.setting`` is the
family's setting.

Example:
    >>> [name for name, _, _ in POSITIVE_INT_BAD][:3]
    ['zero', 'negative', 'float']
    >>> int_kind(2.5).__name__, int_kind(0).__name__, real_kind(math.nan).__name__
    ('SettingTypeError', 'SettingValueError', 'SettingValueError')
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingError, SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, Match, accepted, error

# (member, value, the value as the message must show it)
POSITIVE_INT_BAD: list[tuple[str, Any, Match]] = [
    ("zero", 0, "0"),
    ("negative", -3, "-3"),
    ("float", 2.5, "2.5"),
    ("bool", True, "True"),
    ("str", "64", ("'64'", '"64"', "str")),
    ("nan", math.nan, "nan"),
    ("inf", math.inf, "inf"),
]
NONE_BAD: tuple[str, Any, Match] = ("none", None, ("None", "required", "needs", "missing"))
NON_NEGATIVE_INT_BAD: list[tuple[str, Any, Match]] = [m for m in POSITIVE_INT_BAD if m[0] != "zero"]
POSITIVE_REAL_BAD: list[tuple[str, Any, Match]] = [
    ("zero", 0.0, "0"),
    ("negative", -0.5, "-0.5"),
    ("bool", True, "True"),
    ("str", "0.5", ("'0.5'", '"0.5"', "str")),
    ("nan", math.nan, "nan"),
    ("inf", math.inf, "inf"),
]


def int_kind(value: Any) -> type[SettingError]:
    """The error an integer setting gives for ``value``: a wrong type, or out of range."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return SettingTypeError
    return SettingValueError


def real_kind(value: Any) -> type[SettingError]:
    """The error a real setting gives for ``value`` (NaN and infinity are out of range)."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        return SettingTypeError
    return SettingValueError


def int_family(
    prefix: str,
    area: str,
    setting: str,
    call: Callable[[Any], Any],
    *,
    required: bool = True,
    zero_ok: bool = False,
    good: Any = 8,
    what: str = "",
    extra_match: tuple[Match, ...] = (),
    fix_in: str = "",
    not_blame: tuple[str, ...] = (),
    error_setting: str | None = "",
) -> list[Case]:
    """Bad members of a positive (or non-negative) integer setting, plus numpy-int goods.

    Args:
        prefix: id prefix.
        area: the area.
        setting: the setting's name (must be in the message).
        call: performs the call with the value.
        required: whether ``None`` is bad (else it is accepted).
        zero_ok: a non-negative setting (0 is accepted).
        good: a valid value, tried as ``np.int64`` and ``np.int32``.
        what: the call in words, e.g. ``"PlanConfig({setting}=...)"``.
        extra_match: more pieces every message must contain (e.g. a dataset's name).
        fix_in: the library file owning the check.
        not_blame: what no message of the family may say (another setting's fix).
        error_setting: the ``.setting`` every error must carry (default: ``setting``;
            ``None``: not checked).
    """
    label = what or f"{setting}="
    cases: list[Case] = []
    members = NON_NEGATIVE_INT_BAD if zero_ok else POSITIVE_INT_BAD
    if required:
        members = [*members, NONE_BAD]
    for member, value, shown in members:
        cases.append(
            error(
                f"{prefix}-{member}",
                area,
                _words(label, repr(value)),
                _bind(call, value),
                setting,
                shown,
                *extra_match,
                raises=int_kind(value),
                setting=setting if error_setting == "" else error_setting,
                fix_in=fix_in,
                not_blame=not_blame,
            )
        )
    for np_type in (np.int64, np.int32):
        cases.append(
            accepted(
                f"{prefix}-{np_type.__name__}",
                area,
                _words(label, f"np.{np_type.__name__}({good})") + " (numpy integers are integers)",
                _bind(call, np_type(good)),
                fix_in=fix_in,
            )
        )
    if zero_ok:
        cases.append(
            accepted(f"{prefix}-zero-ok", area, _words(label, "0"), _bind(call, 0), fix_in=fix_in)
        )
    if not required:
        cases.append(
            accepted(
                f"{prefix}-none-ok", area, _words(label, "None"), _bind(call, None), fix_in=fix_in
            )
        )
    return cases


def real_family(
    prefix: str,
    area: str,
    setting: str,
    call: Callable[[Any], Any],
    *,
    good: float = 0.5,
    what: str = "",
    members: list[tuple[str, Any, Match]] | None = None,
    fix_in: str = "",
    error_setting: str | None = "",
) -> list[Case]:
    """Bad members of a positive real setting, plus a numpy-float good.

    ``error_setting``: the ``.setting`` every error must carry (default: ``setting``;
    ``None``: not checked).
    """
    label = what or f"{setting}="
    cases = [
        error(
            f"{prefix}-{member}",
            area,
            _words(label, repr(value)),
            _bind(call, value),
            setting,
            shown,
            raises=real_kind(value),
            setting=setting if error_setting == "" else error_setting,
            fix_in=fix_in,
        )
        for member, value, shown in (members or POSITIVE_REAL_BAD)
    ]
    cases.append(
        accepted(
            f"{prefix}-float32",
            area,
            _words(label, f"np.float32({good})") + " (numpy floats are numbers)",
            _bind(call, np.float32(good)),
            fix_in=fix_in,
        )
    )
    return cases


def _words(label: str, value: str) -> str:
    """``PlanConfig(max_tokens=`` + ``0`` -> ``PlanConfig(max_tokens=0)``."""
    return f"{label}{value}" + (")" if label.count("(") > label.count(")") else "")


def _bind(call: Callable[[Any], Any], value: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        del tmp
        return call(value)

    return run
