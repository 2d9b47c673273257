"""The settings a shape budget (``max_shapes``) cannot go with.

Example:
    >>> from lightning_varbatch.planner.settings import PlanConfig
    >>> PlanConfig(64, max_shapes=4).max_shapes
    4
"""

from __future__ import annotations

from typing import Any

from lightning_varbatch.errors import SettingValueError

__all__ = ["check_shape_settings"]


def check_shape_settings(config: Any) -> None:
    """Refuse the settings of a ``PlanConfig`` that a shape budget cannot keep.

    Raises:
        SettingValueError: (``.setting``: ``"max_shapes"``) naming the clashing setting.
    """
    clashes = {
        "layout": (config.layout != "padded", "a packed row already has one shape"),
        "cost": (
            config.cost not in ("padded", "quadratic"),
            "a shape's rows are priced by their count, so the cost must be 'padded' or 'quadratic'",
        ),
        "bucket_width": (config.bucket_width != 1, "the shapes are the buckets"),
        "batch_size_multiple": (
            config.batch_size_multiple != 1,
            "each shape's rows are fixed at the most that fit; pick max_tokens so they "
            "are the multiple you want",
        ),
    }
    for name, (clash, why) in clashes.items():
        if clash:
            raise SettingValueError(
                f"max_shapes={config.max_shapes} cannot be combined with {name}="
                f"{getattr(config, name)!r}: {why}. Leave {name} at its default or unset "
                "max_shapes.",
                setting="max_shapes",
                value=config.max_shapes,
            )
