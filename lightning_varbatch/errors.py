"""The exceptions of lightning_varbatch: one vocabulary for every bad setting and bad state.

Every public class checks its settings with :mod:`lightning_varbatch.checks`, so a bad value
raises one exception type with one message wherever it enters. The types subclass the built-in
ones users catch and carry what went wrong as attributes (no code need read an error's text):

============================  ================================  ==================================
exception                     also an instance of               raised for
============================  ================================  ==================================
:class:`SettingValueError`    ``ValueError``                    a value out of range or not a choice
:class:`SettingTypeError`     ``TypeError`` and ``ValueError``  the wrong type (``"4"`` for an int)
:class:`ResumeMismatchError`  ``ValueError``                    a checkpoint of other data/settings
:class:`RemainderError`       ``RuntimeError``                  an epoch's rest that would lose,
                                                                repeat or overspend
============================  ================================  ==================================

Example:
    >>> from lightning_varbatch.checks import check_count
    >>> try:
    ...     check_count("pad_to_multiple_of", "4")
    ... except SettingError as error:
    ...     print(type(error).__name__, error.setting, repr(error.value))
    SettingTypeError pad_to_multiple_of '4'
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "RemainderError",
    "ResumeMismatchError",
    "SettingError",
    "SettingTypeError",
    "SettingValueError",
]


class SettingError(Exception):
    """A setting the user gave cannot work; ``setting`` names it, ``value`` is what was given.

    Not raised itself: catch it to handle every bad setting, whatever its kind.

    Attributes:
        setting: the name as the user wrote it (``"val_max_tokens"``, ``"data.max_tokens"``, ...).
        value: the value received (its ``repr`` is in the message).
        stage: the split, when one DataModule setting serves several (``"val"``...); else ``None``.

    Example:
        >>> error = SettingValueError("max_tokens must be >= 1, got 0.", setting="max_tokens",
        ...                           value=0)
        >>> isinstance(error, ValueError), error.setting, error.value
        (True, 'max_tokens', 0)
    """

    def __init__(self, message: str, *, setting: str, value: Any, stage: str | None = None):
        super().__init__(message)
        self.setting = setting
        self.value = value
        self.stage = stage

    def __reduce__(self) -> Any:
        # keyword-only attributes survive pickling (DataLoader workers, multiprocessing)
        return _rebuild, (type(self), str(self), self.setting, self.value, self.stage)

    def renamed(
        self, setting: str, message: str, *, value: Any = ..., stage: str | None = None
    ) -> SettingError:
        """The same kind of error for the name the user wrote (raise it ``from`` this one).

        Args:
            setting: the name the user gave (``"val_max_tokens"`` for the planner's ``max_tokens``).
            message: the whole message, naming ``setting``.
            value: the value under that name (default: this error's value).
            stage: the split the setting was used for.

        Example:
            >>> inner = SettingValueError("max_tokens ...", setting="max_tokens", value=4)
            >>> outer = inner.renamed("val_max_tokens", "val_max_tokens ...", stage="val")
            >>> type(outer).__name__, outer.setting, outer.value, outer.stage
            ('SettingValueError', 'val_max_tokens', 4, 'val')
        """
        return type(self)(
            message,
            setting=setting,
            value=self.value if value is ... else value,
            stage=stage if stage is not None else self.stage,
        )


def _rebuild(kind: type[SettingError], message: str, setting: str, value: Any, stage: Any) -> Any:
    return kind(message, setting=setting, value=value, stage=stage)


class SettingValueError(SettingError, ValueError):
    """A setting out of its range, or not one of its choices.

    Example:
        >>> issubclass(SettingValueError, ValueError)
        True
    """


class SettingTypeError(SettingError, TypeError, ValueError):
    """A setting of the wrong type (a string, float or bool where an integer is needed).

    Both a ``TypeError`` and a ``ValueError`` (as numpy's ``AxisError`` is two): a wrong type
    raised either before the vocabulary was shared, so both ``except`` clauses keep working.

    Example:
        >>> issubclass(SettingTypeError, TypeError), issubclass(SettingTypeError, ValueError)
        (True, True)
    """


class ResumeMismatchError(ValueError):
    """A checkpoint's data or settings differ from the run's, and ``on_resume_mismatch="error"``.

    Attributes:
        changed: what differs, one entry each (``"seed"``, ``"lengths"``, ``"shards"``, ...).

    Example:
        >>> error = ResumeMismatchError("the checkpoint ...", changed=["seed"])
        >>> isinstance(error, ValueError), error.changed
        (True, ['seed'])
    """

    def __init__(self, message: str, *, changed: list[str] | tuple[str, ...] = ()):
        super().__init__(message)
        self.changed = list(changed)

    def __reduce__(self) -> Any:
        return type(self), (str(self),), {"changed": self.changed}


class RemainderError(RuntimeError):
    """The rest of an epoch would lose, repeat or overspend: refused, never run.

    Raised by :func:`~.remainder_guard.guard_remainder` (every resumed or re-planned epoch
    passes it first). It means a bug, not bad input: report it with the settings.

    Attributes:
        cause: ``"repeated"``, ``"lost"``, ``"over budget"`` or ``"unplanned"``.

    Example:
        >>> RemainderError("the rest of epoch 0 ...", cause="lost").cause
        'lost'
    """

    def __init__(self, message: str, cause: str) -> None:
        super().__init__(message)
        self.cause = cause

    def __reduce__(self) -> Any:
        return type(self), (str(self), self.cause)
