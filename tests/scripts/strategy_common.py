"""Data and model shared by the strategy scripts (run per rank) and the single-process checks."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

VOCAB = 16
DIM = 8
NUM_EXAMPLES = 120
MAX_TOKENS = 48
ACCUMULATE = 2
LR = 1.0
SEED = 0
#: The cap at the first step of a length warm-up (``--length-warmup N``): below the longest
#: sequence (16), so that the first steps hold only short ones.
WARMUP_MIN = 4
#: A mixed cluster (``--rank-shares 1.0,0.5 --rank-max-tokens 48,20``): rank 1 half as fast,
#: and its memory (20) binds, so the per-rank budgets are (40, 20) (``b_r = c * s_r``, ``c`` the
#: largest value with every ``b_r`` within its rank's memory); both hold the longest sequence (16).
RANK_SHARES = (1.0, 0.5)
RANK_MAX_TOKENS = (48, 20)
RANK_BUDGETS = (40, 20)


def pop_length_warmup(argv: list[str]) -> int | None:
    """Remove ``--length-warmup N`` from ``argv`` (in place) and return N (default ``None``)."""
    if "--length-warmup" not in argv:
        return None
    at = argv.index("--length-warmup")
    if at + 1 >= len(argv) or not argv[at + 1].isdigit() or int(argv[at + 1]) < 1:
        raise SystemExit("--length-warmup needs a positive number of optimizer steps")
    steps = int(argv[at + 1])
    del argv[at : at + 2]
    return steps


def pop_per_rank(
    argv: list[str], option: str, kind: type[float] | type[int]
) -> tuple[Any, ...] | None:
    """Remove ``OPTION a,b,...`` from ``argv`` (in place) and return the values (default ``None``).

    ``--rank-shares 1.0,0.5`` (floats) and ``--rank-max-tokens 48,20`` (integers): one per rank.
    """
    if option not in argv:
        return None
    at = argv.index(option)
    try:
        values = tuple(kind(v) for v in argv[at + 1].split(","))
    except (IndexError, ValueError):
        raise SystemExit(
            f"{option} needs one {kind.__name__} per rank, e.g. {option} 1,2"
        ) from None
    del argv[at : at + 2]
    return values


def rank_settings(
    shares: tuple[float, ...] | None, max_tokens: tuple[int, ...] | None
) -> dict[str, Any]:
    """The planner settings of ``--rank-shares`` / ``--rank-max-tokens`` (none without them)."""
    out: dict[str, Any] = {}
    if shares is not None:
        out["rank_shares"] = shares
    if max_tokens is not None:
        out["rank_max_tokens"] = max_tokens
    return out


def warmup_settings(length_warmup: int | None) -> dict[str, Any]:
    """The planner settings of ``--length-warmup N`` (none without it)."""
    if length_warmup is None:
        return {}
    return {"length_warmup": length_warmup, "length_warmup_min": WARMUP_MIN}


def make_sequences() -> list[list[int]]:
    """Integer token sequences of very different lengths (pad id 0 is never a token)."""
    rng = np.random.default_rng(SEED)
    lengths = rng.choice([1, 2, 3, 4, 6, 9, 12, 16], size=NUM_EXAMPLES)
    return [rng.integers(1, VOCAB, size=int(n)).tolist() for n in lengths]


def sequence_columns() -> dict[str, list[Any]]:
    """The sequences as the columns of a Hugging Face dataset: row ``i`` is example ``i``."""
    sequences = make_sequences()
    return {"id": list(range(len(sequences))), "tokens": sequences}


def targets(tokens: torch.Tensor) -> torch.Tensor:
    """A fixed token -> token mapping to learn (keeps pad 0 -> 0, masked out anyway)."""
    return torch.where(tokens > 0, (tokens * 5 + 3) % VOCAB, torch.zeros_like(tokens))


class TinyModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, DIM)
        self.out = nn.Linear(DIM, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.embed(tokens)))


def make_model() -> TinyModel:
    torch.manual_seed(SEED)
    return TinyModel()


def collate(examples: list[dict[str, Any]]) -> dict[str, Any]:
    """Pad to the longest sequence; carry the plan's bookkeeping through."""
    width = max(len(e["tokens"]) for e in examples)
    tokens = torch.zeros(len(examples), width, dtype=torch.long)
    for row, e in enumerate(examples):
        tokens[row, : len(e["tokens"])] = torch.tensor(e["tokens"])
    first = examples[0]
    return {
        "tokens": tokens,
        "ids": [e["id"] for e in examples],
        "step": first["step"],
        "micro": first["micro"],
        "ntokens": int((tokens > 0).sum()),
        "step_ntokens": torch.tensor(first["step_ntokens"]),
    }


def loss_sum(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Sum of the per-token cross entropies over the real (non-pad) tokens."""
    logits = model(tokens)
    mask = tokens > 0
    return nn.functional.cross_entropy(logits[mask], targets(tokens)[mask], reduction="sum")
