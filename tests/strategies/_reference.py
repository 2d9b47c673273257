"""Single-process reference updates for the records written by tests/scripts/strategy_train.py."""

from __future__ import annotations

from typing import Any

import torch

from tests.scripts.strategy_common import LR, collate, loss_sum, make_model, make_sequences


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
