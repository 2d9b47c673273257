"""The planner's settings, validated once.

Example:
    >>> from lightning_varbatch.config import PlanConfig
    >>> PlanConfig(max_tokens=4096, max_examples=128).max_examples
    128
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from typing import Literal, TypeAlias

from lightning_varbatch.costs import COST_NAMES, CostFn, CostName, resolve_cost

TailPolicy: TypeAlias = Literal["spread", "drop", "pad"]
OversizePolicy: TypeAlias = Literal["error", "skip", "truncate"]
TAIL_POLICIES: tuple[str, ...] = ("spread", "drop", "pad")
OVERSIZE_POLICIES: tuple[str, ...] = ("error", "skip", "truncate")


def _positive_int(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}.")


@dataclass(frozen=True)
class PlanConfig:
    """How to cut an epoch into token-budgeted micro-batches.

    Args:
        max_tokens: the budget of one micro-batch on one rank, in the units of ``cost``
            (for ``"padded"``: examples × longest padded length, fairseq's ``--max-tokens``).
        max_examples: at most this many examples per micro-batch (``None``: no cap).
        cost: ``"padded"`` (default), ``"sum"``, ``"quadratic"`` or a callable
            ``(num_examples, longest, total) -> cost``; see :mod:`lightning_varbatch.costs`.
        quadratic_coef: ``c`` in the quadratic model ``n * (L + c * L**2)``.
        batch_size_multiple: round the number of examples of a micro-batch down to a multiple
            of this (e.g. 8 for tensor cores) when it holds at least that many.
        pad_to_multiple_of: lengths are padded up to a multiple of this; the cost model sees
            the padded length.
        bucket_width: examples whose lengths fall in the same ``bucket_width``-wide bucket are
            mixed freely (1: exact length sorting, the tightest padding; larger values add
            randomness at the price of padding, budgeted with the bucket's longest example).
        shuffle: shuffle examples of equal bucket and the order of optimizer steps each epoch.
        seed: the plan depends only on ``seed`` and the epoch.
        tail: what to do when the number of micro-batches is not a multiple of
            ``world_size * accumulate_grad_batches``: ``"spread"`` (default) re-cuts the
            examples of the last, partial optimizer step into exactly that many even
            micro-batches, so nothing is lost and its ranks stay balanced (only when there are
            fewer examples than micro-batches needed does it repeat some, counted);
            ``"drop"`` drops randomly chosen
            micro-batches (counted); ``"pad"`` repeats randomly chosen micro-batches (counted).
        oversize: what to do with an example that does not fit the budget on its own:
            ``"error"`` (default), ``"skip"`` (counted) or ``"truncate"`` (to the longest length
            that fits; the collate cuts the tokens).

    Raises:
        ValueError: for a setting out of range; the message names it.

    Example:
        >>> PlanConfig(max_tokens=16384, cost="quadratic", tail="drop").tail
        'drop'
    """

    max_tokens: int
    max_examples: int | None = None
    cost: CostName | CostFn = "padded"
    quadratic_coef: float = 1 / 64
    batch_size_multiple: int = 1
    pad_to_multiple_of: int = 1
    bucket_width: int = 1
    shuffle: bool = True
    seed: int = 0
    tail: TailPolicy = "spread"
    oversize: OversizePolicy = "error"

    def __post_init__(self) -> None:
        if isinstance(self.max_tokens, bool) or not isinstance(self.max_tokens, int):
            raise ValueError(
                f"max_tokens must be a positive integer token budget, got {self.max_tokens!r}."
            )
        if self.max_tokens < 1:
            raise ValueError(
                f"max_tokens must be > 0, got {self.max_tokens}; set max_tokens to the number "
                "of (padded) tokens one micro-batch may hold on one device."
            )
        _positive_int("max_examples", self.max_examples, allow_none=True)
        _positive_int("batch_size_multiple", self.batch_size_multiple)
        _positive_int("pad_to_multiple_of", self.pad_to_multiple_of)
        _positive_int("bucket_width", self.bucket_width)
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}.")
        if self.tail not in TAIL_POLICIES:
            raise ValueError(
                f"Unknown tail={self.tail!r}; choose one of {', '.join(TAIL_POLICIES)}."
            )
        if self.oversize not in OVERSIZE_POLICIES:
            raise ValueError(
                f"Unknown oversize={self.oversize!r}; choose one of {', '.join(OVERSIZE_POLICIES)}."
            )
        if isinstance(self.cost, str) and self.cost not in COST_NAMES:
            resolve_cost(self.cost)  # raises with the list of valid names
        resolve_cost(self.cost, quadratic_coef=self.quadratic_coef)

    @property
    def cost_fn(self) -> CostFn:
        """The resolved, vectorised cost function."""
        return resolve_cost(self.cost, quadratic_coef=self.quadratic_coef)

    def fingerprint(self) -> str:
        """A short hash of every setting that changes the plan (for checkpoint checks).

        Example:
            >>> PlanConfig(8).fingerprint() == PlanConfig(8).fingerprint()
            True
        """
        fields = asdict(self)
        if callable(self.cost):
            fields["cost"] = getattr(self.cost, "__qualname__", repr(self.cost))
        blob = json.dumps(fields, sort_keys=True, default=str).encode()
        return hashlib.sha1(blob).hexdigest()[:16]
