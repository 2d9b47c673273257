"""What both DataModules save and restore: a versioned state and the position it gives back.

Both states are ``{"version": 1, ...}`` (:data:`STATE_VERSION`; a state without one is version 1)
and count the micro-batches *trained* this epoch (``trained_this_epoch``, from
:mod:`~.lightning_loop`), never the loader's prefetch. :class:`ResumableState` holds what both do
with a state: read it (a mapping, of a version this release reads), keep it until the training
loader is built, and refuse a mid-epoch resume that gave the DataModule no position.

Example:
    >>> versioned(), versioned(trained=3)
    ({'version': 1}, {'version': 1, 'trained': 3})
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lightning_varbatch.data.lightning_loop import fit_epoch, resumed_mid_epoch, trained_this_epoch
from lightning_varbatch.errors import ResumeMismatchError

__all__ = [
    "STATE_VERSION",
    "ResumableState",
    "read_state_mapping",
    "trained_this_epoch",
    "versioned",
]

#: The version of both DataModules' ``state_dict`` (a state without one is version 1).
STATE_VERSION = 1


def versioned(**entries: Any) -> dict[str, Any]:
    """A DataModule state: the version first, then ``entries``."""
    return {"version": STATE_VERSION, **entries}


def read_state_mapping(owner: str, state_dict: Any) -> Mapping[str, Any]:
    """``state_dict`` if it is a mapping, for ``owner.load_state_dict``.

    Raises:
        TypeError: for anything else, naming ``owner`` and what was given.

    Example:
        >>> read_state_mapping("X", [1])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        TypeError: X.load_state_dict expects the dict returned by its state_dict(), got list: [1].
    """
    if not isinstance(state_dict, Mapping):
        raise TypeError(
            f"{owner}.load_state_dict expects the dict returned by its "
            f"state_dict(), got {type(state_dict).__name__}: {str(state_dict)[:60]}."
        )
    return state_dict


class ResumableState:
    """The resume protocol of both DataModules (a mixin).

    ``load_state_dict`` reads the state (:meth:`_read_state`: each DataModule's keys, version),
    marks the DataModule restored and keeps the position (:meth:`_keep_state`) for the training
    loader; :meth:`_check_restored` refuses a mid-epoch resume without a state of this class.

    Example:
        >>> from lightning_varbatch import TokenBudgetDataModule
        >>> dm = TokenBudgetDataModule([{"tokens": [1]}] * 2, [1, 1], 4)
        >>> dm.load_state_dict({"version": 1}); dm._restored
        True
    """

    _restored: bool  # whether a checkpoint gave this DataModule a state

    def _read_state(self, state_dict: Mapping[str, Any]) -> dict[str, Any] | None:
        """The position a state holds (``None``: none), its keys and version checked."""
        raise NotImplementedError

    def _keep_state(self, state: dict[str, Any]) -> None:
        """Keep (or apply) a position read by :meth:`_read_state`."""
        raise NotImplementedError

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Keep a saved position; it is applied when the training loader is (re)built.

        Raises:
            TypeError: when ``state_dict`` (or its position) is not a mapping.
            ValueError: when it is not a state of this DataModule.
            ResumeMismatchError: for another state version.
        """
        owner = type(self).__name__
        state = self._read_state(read_state_mapping(owner, state_dict))
        self._restored = True
        if state is not None:
            self._keep_state(state)

    def _check_version(self, state_dict: Mapping[str, Any]) -> None:
        """Accept a state of this version or one saved before states had a version."""
        version = state_dict.get("version", STATE_VERSION)
        if version != STATE_VERSION:
            raise ResumeMismatchError(
                f"The {type(self).__name__} state has version {version!r}, but this "
                f"lightning_varbatch reads version {STATE_VERSION} (and states saved before "
                "versions existed): the checkpoint was saved by another release; resume it "
                "with that release.",
                changed=["version"],
            )

    def _check_restored(self) -> None:
        """Refuse a mid-epoch resume whose checkpoint gave this DataModule no position.

        Lightning keeps a DataModule's state under its class name (``__qualname__``) and hands
        it back only to a DataModule of that name: a checkpoint of a subclass, a renamed class
        or the other DataModule would resume the fit loop mid-epoch while the DataModule
        starts the epoch afresh, training part of it twice, silently.
        """
        trainer: Any = getattr(self, "trainer", None)
        if self._restored or not resumed_mid_epoch(trainer):
            return
        raise ResumeMismatchError(
            f"The fit resumes from ckpt_path={trainer.ckpt_path} after "
            f"{trained_this_epoch(trainer)} micro-batches of epoch {fit_epoch(trainer)}, but the "
            f"checkpoint holds no {type(self).__name__} state: Lightning keeps a DataModule's "
            "state under its class name, and this checkpoint was saved by a DataModule of "
            "another class (a subclass, a renamed class, or the other of TokenBudgetDataModule "
            "and StreamingDataModule). Without its position the epoch would start again and "
            "train examples twice. Resume with the class that saved it, or load its position "
            "before fit: dm.load_state_dict(torch.load(ckpt_path, weights_only=True)"
            "['<that class name>']).",
            changed=["datamodule"],
        )
