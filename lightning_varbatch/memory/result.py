"""What :func:`~lightning_varbatch.memory.find_max_tokens` returns: :class:`BudgetResult`.

Example:
    >>> result = BudgetResult(max_tokens=8192, memory_limit_bytes=2**30, margin=0.1,
    ...                       coefficients=(1e8, 2e3, 10.0), worst_examples=16,
    ...                       worst_longest=512, predicted_bytes=9e8, measured_bytes=8.8e8)
    >>> result.overrides(), result.predict(16, 512) == 1e8 + 2e3 * 16 * 512 + 10 * 16 * 512**2
    (['data.max_tokens=8192'], True)
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lightning_varbatch.memory.model import Probe

__all__ = ["BudgetResult"]


@dataclass(frozen=True)
class BudgetResult:
    """The chosen budget, the fitted memory model and the probes it came from.

    Attributes:
        max_tokens: the chosen budget of one micro-batch.
        memory_limit_bytes: the limit it was chosen for.
        margin: the share of the limit kept free when predicting.
        coefficients: ``(a, b, c)`` of ``peak ≈ a + b·B·L + c·B·L²``.
        worst_examples: examples of the plan's micro-batch predicted to need most memory.
        worst_longest: its longest padded length.
        predicted_bytes: the model's prediction for it.
        measured_bytes: what the final probe of that shape measured.
        probes: every probe, in the order they ran.

    Example:
        >>> BudgetResult(4096, 10**9, 0.1, (0.0, 1.0, 0.0), 8, 512, 4096.0, 4100.0).max_tokens
        4096
    """

    max_tokens: int
    memory_limit_bytes: int
    margin: float
    coefficients: tuple[float, float, float]
    worst_examples: int
    worst_longest: int
    predicted_bytes: float
    measured_bytes: float
    probes: tuple[Probe, ...] = field(default_factory=tuple)

    def predict(self, examples: int, length: int) -> float:
        """Predicted peak bytes of ``examples`` sequences padded to ``length``."""
        a, b, c = self.coefficients
        return a + b * examples * length + c * examples * length * length

    def overrides(self, prefix: str = "data") -> list[str]:
        """Hydra-style overrides that set the budget, e.g. ``["data.max_tokens=12288"]``."""
        return [f"{prefix}.max_tokens={self.max_tokens}"]

    def to_dict(self) -> dict[str, Any]:
        """Every field as plain Python values (probes as a list of dicts)."""
        d = asdict(self)
        d["coefficients"] = list(self.coefficients)
        d["probes"] = [asdict(p) for p in self.probes]
        return d

    def save(self, path: str | Path) -> None:
        """Write :meth:`to_dict` as JSON to ``path``."""
        Path(path).write_text(json.dumps(self.to_dict(), indent=2) + "\n")
