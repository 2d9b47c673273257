"""The compute of a micro-batch: a linear term per token plus an attention term per (query, key).

Packed rows of equal tokens can differ in compute (one 4096-token document: ``4096²`` attention
pairs; sixteen of 256: 16x fewer), so ranks get them by ``work = Σ L + flop_attention · Σ L²``
(:func:`work`); :func:`transformer_flops` derives ``flop_attention`` from a model's shape.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lightning_varbatch.checks import check_count

__all__ = ["FlopModel", "attention_term", "transformer_flops", "work"]


@dataclass(frozen=True)
class FlopModel:
    """Forward FLOPs of a Transformer: per token (linear layers) and per (query, key) pair.

    Attributes:
        per_token: forward FLOPs of one token through every linear layer (projections, MLP).
        per_pair: forward FLOPs of one (query, key) pair, every attention layer (scores, sum).
    """

    per_token: float
    per_pair: float

    @property
    def flop_attention(self) -> float:
        """``per_pair / per_token``: the planner's ``flop_attention`` setting."""
        return self.per_pair / self.per_token

    def flops(self, lengths: np.ndarray) -> float:
        """Forward FLOPs of examples of these lengths (each attends within itself).

        Example:
            >>> FlopModel(per_token=10.0, per_pair=1.0).flops(np.array([3, 4]))
            95.0
        """
        lengths = np.asarray(lengths, dtype=np.float64)
        return float(self.per_token * lengths.sum() + self.per_pair * (lengths**2).sum())


def transformer_flops(
    d_model: int,
    num_layers: int = 1,
    *,
    ffn_dim: int | None = None,
    causal: bool = True,
    kv_dim: int | None = None,
) -> FlopModel:
    """The FLOP model of a standard Transformer stack (multiply-adds count 2).

    Per token and layer the linear layers do ``2·(2·d² + 2·d·kv + 2·d·ffn)`` FLOPs; per
    (query, key) pair attention does ``4·d``, half when causal. The embedding and output
    layers are outside the stack (add them to ``per_token`` for a large vocabulary).

    Args:
        d_model: the model width.
        num_layers: Transformer layers.
        ffn_dim: the MLP's hidden width (default ``4 * d_model``).
        causal: causal self-attention (decoder-only) or full.
        kv_dim: the width of keys and values (grouped-query attention; default ``d_model``).

    Returns:
        The model; ``.flop_attention`` is the planner setting.

    Raises:
        SettingTypeError: for a width or layer count that is not an integer.
        SettingValueError: for a width or layer count below 1.

    Example:
        >>> round(transformer_flops(256, 4).flop_attention * 12 * 256, 6)
        1.0
    """
    d_model = check_count("d_model", d_model, what=" (the model's width)")
    num_layers = check_count("num_layers", num_layers, what=" (the number of layers)")
    ffn = 4 * d_model if ffn_dim is None else ffn_dim
    kv = d_model if kv_dim is None else kv_dim
    per_token = 2.0 * (2 * d_model * d_model + 2 * d_model * kv + 2 * d_model * ffn)
    per_pair = (2.0 if causal else 4.0) * d_model
    return FlopModel(per_token=per_token * num_layers, per_pair=per_pair * num_layers)


def work(total: np.ndarray, squares: np.ndarray, flop_attention: float) -> np.ndarray:
    """Relative compute of micro-batches: ``total + flop_attention * squares``.

    Example:
        >>> work(np.array([8, 8]), np.array([64, 16]), 0.5).tolist()
        [40.0, 16.0]
    """
    return np.asarray(total, dtype=np.float64) + flop_attention * np.asarray(
        squares, dtype=np.float64
    )


def attention_term(
    rows: np.ndarray, longest: np.ndarray, squares: np.ndarray, *, packed: bool
) -> np.ndarray:
    """The attention term of micro-batches: the (query, key) pairs attention computes.

    A packed row attends within each example: ``Σ L²`` (``squares``); a padded batch over
    its padded length on every row: ``rows · longest²``. The one place this is computed.

    Example:
        >>> rows, longest, squares = np.array([2, 1]), np.array([8, 16]), np.array([80, 100])
        >>> attention_term(rows, longest, squares, packed=False).tolist()
        [128.0, 256.0]
        >>> attention_term(rows, longest, squares, packed=True).tolist()
        [80.0, 100.0]
    """
    if packed:
        return np.asarray(squares, dtype=np.float64)
    length = np.asarray(longest, dtype=np.float64)
    return rows * length * length
