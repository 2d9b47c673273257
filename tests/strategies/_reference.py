"""Single-process reference updates for the records written by tests/scripts/strategy_train.py."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from tests.scripts.packed_model import PackedModel, make_packed_model
from tests.scripts.strategy_common import (
    DIM,
    LR,
    MAX_TOKENS,
    SEED,
    VOCAB,
    collate,
    loss_sum,
    make_model,
    make_sequences,
)


def params_of(record: dict[str, list[Any]]) -> dict[str, torch.Tensor]:
    return {n: torch.tensor(v, dtype=torch.float64) for n, v in record.items()}


def step_micro_batches(records: list[dict[str, Any]], step: int) -> list[list[int]]:
    """Example ids of every micro-batch of optimizer step ``step``, over all ranks."""
    return [m["ids"] for r in records for m in r["micro_batches"] if m["step"] == step]


def reference_update(
    init: dict[str, list[Any]], micro_batches: list[list[int]], *, naive: bool = False
) -> dict[str, torch.Tensor]:
    """Parameters after one SGD step, in float64, from the union of the step's micro-batches.

    ``naive=False``: the token mean over every real token of the step (what token_mean_loss
    promises). ``naive=True``: the usual recipe, each micro-batch's own token mean, averaged
    over micro-batches (accumulation and ranks).
    """
    sequences = make_sequences()
    model = make_model().double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(init[name], dtype=torch.float64))
    batches = [
        collate(
            [
                {"id": i, "tokens": sequences[i], "step": 0, "micro": 0, "step_ntokens": 1}
                for i in ids
            ]
        )
        for ids in micro_batches
    ]
    sums = [loss_sum(model, b["tokens"]) for b in batches]
    if naive:
        loss = sum(s / b["ntokens"] for s, b in zip(sums, batches, strict=True)) / len(batches)
    else:
        loss = sum(sums) / sum(b["ntokens"] for b in batches)
    model.zero_grad()
    loss.backward()
    return {n: (p - LR * p.grad).detach() for n, p in model.named_parameters()}


def _causal_logits(
    model: PackedModel, ids: torch.Tensor, positions: torch.Tensor, allowed: torch.Tensor
) -> torch.Tensor:
    """:class:`PackedModel`'s logits written out: explicit softmax attention under ``allowed``.

    ``allowed[i, j]``: token ``i`` may attend to token ``j``. Independent of
    ``document_attention`` and of ``PackingCollate``.
    """
    h = model.embed(ids) + model.position(positions)
    total, dim = h.shape
    q, k, v = model.qkv(h).view(total, 3, model.heads, dim // model.heads).unbind(1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(dim // model.heads)
    weights = scores.masked_fill(~allowed, float("-inf")).softmax(-1)
    mixed = torch.einsum("hqk,khd->qhd", weights, v).reshape(total, dim)
    return model.out(h + torch.tanh(mixed))


def document_loss_sum(model: PackedModel, tokens: list[int]) -> torch.Tensor:
    """One document alone: the sum of its next-token losses (``len - 1`` predictions)."""
    ids = torch.tensor(tokens)
    n = len(tokens)
    causal = torch.ones(n, n, dtype=torch.bool).tril()
    logits = _causal_logits(model, ids, torch.arange(n), causal)
    return nn.functional.cross_entropy(logits[:-1], ids[1:], reduction="sum")


def leaky_row_loss_sum(model: PackedModel, documents: list[list[int]]) -> torch.Tensor:
    """A packed row whose attention ignores the document boundaries (causal over the row).

    Positions and labels are still per document: only the attention leaks, the mistake a
    model that drops ``cu_seqlens`` makes.
    """
    ids = torch.tensor([t for doc in documents for t in doc])
    positions = torch.cat([torch.arange(len(doc)) for doc in documents])
    labels = torch.tensor([t for doc in documents for t in [*doc[1:], -100]])
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    logits = _causal_logits(model, ids, positions, causal)
    return nn.functional.cross_entropy(logits, labels, ignore_index=-100, reduction="sum")


def packed_reference_update(
    init: dict[str, list[Any]], micro_batches: list[list[int]], *, mode: str = "documents"
) -> dict[str, torch.Tensor]:
    """Parameters after one SGD step of :class:`PackedModel`, in float64, for packed records.

    ``mode="documents"``: every document of the step run alone, next-token losses summed and
    divided by the step's loss tokens (``sum(len - 1)``), what packing with
    ``document_attention`` and ``step_token_mean`` promise. The controls, which the packed
    runs must *not* match: ``"naive"`` (each micro-batch's own token mean, averaged over
    micro-batches) and ``"leak"`` (each micro-batch's row with attention across documents).
    """
    if mode not in ("documents", "naive", "leak"):
        raise ValueError(f"unknown mode {mode!r}")
    sequences = make_sequences()
    model = make_packed_model(VOCAB, DIM, MAX_TOKENS, SEED).double()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.tensor(init[name], dtype=torch.float64))
    rows = [[sequences[i] for i in ids] for ids in micro_batches]
    counts = [sum(len(doc) - 1 for doc in row) for row in rows]
    if mode == "leak":
        sums = [leaky_row_loss_sum(model, row) for row in rows]
    else:
        sums = [sum(document_loss_sum(model, doc) for doc in row) for row in rows]
    if mode == "naive":
        loss = sum(s / n for s, n in zip(sums, counts, strict=True)) / len(rows)
    else:
        loss = sum(sums) / sum(counts)
    model.zero_grad()
    loss.backward()
    return {n: (p - LR * p.grad).detach() for n, p in model.named_parameters()}
