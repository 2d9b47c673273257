"""The checks of every public setting: one helper per kind of value, used wherever it enters.

The same helper checks a setting everywhere (planner, sampler, collates, DataModules, callbacks,
attention, memory): one bad value, one exception type and message. Helpers raise
:class:`~lightning_varbatch.errors.SettingTypeError` for a wrong type and
:class:`~lightning_varbatch.errors.SettingValueError` for a value out of range, both carrying the
setting's name and the value received. numpy and the standard library only (for the planner).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Literal, TypeVar, overload

import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError

__all__ = ["check_choice", "check_count", "check_flag", "check_real"]

_S = TypeVar("_S", bound=str)


@overload
def check_count(
    name: str,
    value: object,
    *,
    minimum: int = 1,
    allow_none: Literal[False] = False,
    what: str = "",
) -> int: ...


@overload
def check_count(
    name: str,
    value: object,
    *,
    minimum: int = 1,
    allow_none: bool,
    what: str = "",
) -> int | None: ...


def check_count(
    name: str,
    value: object,
    *,
    minimum: int = 1,
    allow_none: bool = False,
    what: str = "",
) -> int | None:
    """Validate an integer setting (Python or numpy; not bool, float, str) as a Python ``int``.

    Args:
        name: the setting's name, as the user wrote it (used in the message).
        value: the value received.
        minimum: the smallest allowed value.
        allow_none: whether ``None`` is allowed (then returned as ``None``).
        what: what the setting means, appended to the message.

    Returns:
        ``int(value)``, or ``None`` when ``value`` is ``None`` and that is allowed.

    Raises:
        SettingTypeError: for a value that is not an integer (also a ``ValueError``).
        SettingValueError: for an integer below ``minimum`` or beyond 64 bits.

    Example:
        >>> check_count("max_tokens", np.int64(1024))
        1024
    """
    if value is None and allow_none:
        return None
    kind = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"
    if minimum == 0:
        kind = "a non-negative integer"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        shown = f"{value!r} ({type(value).__name__})"
        raise SettingTypeError(
            f"{name} must be {kind}, got {shown}{what}; pass a whole number such as "
            f"{max(minimum, 1)}"
            + (" or None" if allow_none else "")
            + " (numpy integers are accepted; floats, bools and strings are not).",
            setting=name,
            value=value,
        )
    if value < minimum:
        raise SettingValueError(
            f"{name} must be {kind}, got {value!r}{what}.", setting=name, value=value
        )
    if int(value) >= 2**63:
        raise SettingValueError(
            f"{name} must fit a 64-bit integer, got {value}{what}.", setting=name, value=value
        )
    return int(value)


def check_flag(name: str, value: object) -> bool:
    """Validate a boolean setting: ``True``/``False`` (or numpy booleans) only.

    Raises:
        SettingTypeError: for anything else (``"false"``, a non-empty string, is not guessed).

    Example:
        >>> check_flag("shuffle", False)
        False
    """
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise SettingTypeError(
        f"{name} must be True or False, got {value!r} ({type(value).__name__}); pass a "
        f"bool, e.g. {name}=False (a string such as 'false' is not read as a bool).",
        setting=name,
        value=value,
    )


def check_choice(name: str, value: object, choices: Sequence[_S], *, what: str = "") -> _S:
    """Validate a setting that takes one of a few names.

    Args:
        name: the setting's name.
        value: the value received.
        choices: the allowed names (the library's tuple, e.g. ``TAIL_POLICIES``).
        what: what the setting means, appended to the message.

    Returns:
        ``value``, one of ``choices``.

    Raises:
        SettingTypeError: for a value that is not a string.
        SettingValueError: for a string that is not one of ``choices``.

    Example:
        >>> check_choice("oversize", "skip", ("error", "skip", "truncate"))
        'skip'
    """
    allowed = ", ".join(repr(c) for c in choices)
    if not isinstance(value, str):
        raise SettingTypeError(
            f"{name} must be one of {allowed}{what}, got {value!r} ({type(value).__name__}).",
            setting=name,
            value=value,
        )
    if value not in choices:
        raise SettingValueError(
            f"{name} must be one of {allowed}{what}, got {value!r}.", setting=name, value=value
        )
    return value  # type: ignore[return-value]


def check_real(
    name: str,
    value: object,
    *,
    minimum: float | None = 0.0,
    maximum: float | None = None,
    strict: bool = True,
    allow_none: bool = False,
    what: str = "",
) -> float:
    """Validate a real setting (Python or numpy; not bool, str, NaN, inf) as a finite ``float``.

    Args:
        name: the setting's name.
        value: the value received.
        minimum: the lower bound (``None``: none).
        maximum: the upper bound, inclusive (``None``: none).
        strict: the lower bound is excluded (``> minimum``) rather than included.
        allow_none: whether ``None`` is allowed (returned as ``nan``: test ``value is None`` first).
        what: what the setting means, appended to the message.

    Raises:
        SettingTypeError: for a value that is not a real number.
        SettingValueError: for NaN, infinity or a value out of range.

    Example:
        >>> check_real("temperature", 0.5)
        0.5
    """
    if value is None and allow_none:
        return math.nan
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise SettingTypeError(
            f"{name} must be a real number, got {value!r} ({type(value).__name__}){what}.",
            setting=name,
            value=value,
        )
    number = float(value)
    low = "" if minimum is None else (f"> {minimum:g}" if strict else f">= {minimum:g}")
    high = "" if maximum is None else f"<= {maximum:g}"
    bounds = " and ".join(b for b in (low, high) if b)
    wanted = f"a finite number {bounds}".rstrip()
    too_low = minimum is not None and (number <= minimum if strict else number < minimum)
    too_high = maximum is not None and number > maximum
    if not math.isfinite(number) or too_low or too_high:
        raise SettingValueError(
            f"{name} must be {wanted}, got {value!r}{what}.", setting=name, value=value
        )
    return number
