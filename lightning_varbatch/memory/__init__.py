"""Pick ``max_tokens`` for a memory limit from a few measured probes.

:func:`find_max_tokens` fits the memory model ``a + b·B·L + c·B·L²`` (``B`` examples padded to
length ``L``: fixed memory, activations, attention scores) to a few probes (forward and backward on
a synthetic batch of one shape, measured by ``peak_memory.measure_peak``), picks the largest
``max_tokens`` whose planned micro-batches all fit under ``memory_limit_bytes * (1 - margin)`` as
predicted, and verifies it by probing the predicted worst shape (modules: ``docs/architecture.md``).

Example:
    >>> import numpy as np
    >>> def run_batch(examples: int, length: int) -> int:  # a model's peak bytes, known exactly
    ...     return 1000 + 8 * examples * length + examples * length**2 / 16
    >>> result = find_max_tokens(run_batch, np.arange(8, 129).repeat(20), 200_000,
    ...                          candidates=range(1024, 16385, 1024))
    >>> result.max_tokens, result.overrides(), (result.worst_examples, result.worst_longest)
    (10240, ['data.max_tokens=10240'], (80, 128))
    >>> [round(c, 4) for c in result.coefficients], result.measured_bytes <= 180_000
    ([1000.0, 8.0, 0.0625], True)
"""

from lightning_varbatch.memory.model import Probe, fit_memory_model
from lightning_varbatch.memory.per_rank import gather_rank_max_tokens
from lightning_varbatch.memory.probes import OUT_OF_MEMORY
from lightning_varbatch.memory.result import BudgetResult
from lightning_varbatch.memory.search import find_max_tokens

__all__ = [
    "OUT_OF_MEMORY",
    "BudgetResult",
    "Probe",
    "find_max_tokens",
    "fit_memory_model",
    "gather_rank_max_tokens",
]
