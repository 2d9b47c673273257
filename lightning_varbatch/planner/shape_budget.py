"""The shape budget of one dataset's planner: its static shapes, chosen once.

:class:`ShapeBudget` is the part of the epoch planner that holds the ``max_shapes`` static
shapes (:mod:`~.shapes`): chosen once from the planned examples (or given by a mixture), so
resumed and re-planned epochs keep them, and the shape each micro-batch of a cut runs at.

Example:
    >>> from lightning_varbatch.planner import EpochPlanner, PlanConfig
    >>> planner = EpochPlanner(np.array([3, 3, 4, 9, 10]), PlanConfig(max_tokens=40, max_shapes=2))
    >>> planner.shapes.tolist()  # (rows, length)
    [[10, 4], [4, 10]]
"""

from __future__ import annotations

import numpy as np

from lightning_varbatch.errors import SettingValueError
from lightning_varbatch.planner.lengths import PreparedLengths
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.shapes import choose_shape_lengths, shape_rows
from lightning_varbatch.planner.sorted_cut import SortedCut, SortedGroups

__all__ = ["ShapeBudget"]


class ShapeBudget:
    """The static shapes of a planner with ``max_shapes`` (``None`` everywhere without it).

    Needs the planner's ``config`` and ``prepared``; new shape lengths reset its cached cuts.
    """

    config: PlanConfig
    prepared: PreparedLengths
    _shape_lengths: np.ndarray | None
    _groups: SortedGroups | None
    _cuts: dict[tuple[int, int], SortedCut]

    @property
    def shape_lengths(self) -> np.ndarray | None:
        """The shape budget's padded lengths, ascending (``None`` without ``max_shapes``)."""
        if self.config.max_shapes is None:
            return None
        if self._shape_lengths is None:
            self._shape_lengths = choose_shape_lengths(
                self.prepared.planned_key, self.config.max_shapes, self.config.pad_to_multiple_of
            )
        return self._shape_lengths

    def use_shape_lengths(self, lengths: np.ndarray) -> None:
        """Plan with these shape lengths (a mixture chooses them over all its datasets).

        Raises:
            ValueError: without ``max_shapes``, for too many lengths or an example over the longest.
        """
        limit = self.config.max_shapes
        lengths = np.unique(np.asarray(lengths, dtype=np.int64))
        if limit is None or lengths.size > limit or lengths.size == 0:
            raise SettingValueError(
                f"use_shape_lengths needs PlanConfig(max_shapes=...) and 1 to max_shapes="
                f"{limit} lengths, got {lengths.size}.",
                setting="shape lengths",
                value=lengths,
            )
        key = self.prepared.planned_key
        if key.size and int(key.max()) > int(lengths[-1]):
            raise ValueError(
                f"An example of length {int(key.max())} does not fit the longest shape "
                f"length {int(lengths[-1])}."
            )
        self._shape_lengths = lengths
        self._groups = None
        self._cuts = {}

    @property
    def shapes(self) -> np.ndarray | None:
        """``(k, 2)`` ``(rows, length)`` of every shape, by length (``None``: free shapes)."""
        lengths = self.shape_lengths
        if lengths is None:
            return None
        return np.stack([shape_rows(lengths, self.config), lengths], axis=1)

    def _micro_batch_shapes(self, groups: SortedGroups, cut: SortedCut) -> np.ndarray | None:
        """``(m, 2)`` the static ``(rows, length)`` of every micro-batch (``None``: free shapes)."""
        shapes = self.shapes
        if shapes is None:
            return None
        longest = groups.longest[groups.group_of(cut.starts)]
        out = shapes[np.searchsorted(shapes[:, 1], longest)]
        assert (cut.sizes <= out[:, 0]).all(), "a micro-batch has more examples than its shape"
        return out
