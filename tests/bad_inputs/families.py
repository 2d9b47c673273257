"""Value families: every numeric setting is tried with each member of its family.

Example:
    >>> [name for name, _, _ in POSITIVE_INT_BAD][:3]
    ['zero', 'negative', 'float']
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tests.bad_inputs.case import BAD_ARG, Case, Match, accepted, error

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
                raises=BAD_ARG,
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
) -> list[Case]:
    """Bad members of a positive real setting, plus a numpy-float good."""
    label = what or f"{setting}="
    cases = [
        error(
            f"{prefix}-{member}",
            area,
            _words(label, repr(value)),
            _bind(call, value),
            setting,
            shown,
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
