"""Shape-budget benchmark, Part 2's workload: settings, micro-batches and the TinyLM model.

What every arm of Part 2 of :mod:`benchmarks.training.compile_shapes` trains (its docstring
describes the workload): :class:`CompileSettings` and the workload's :data:`DEFAULTS` (the GPU
script :mod:`benchmarks.gpu.compile_shapes` takes them too), the documents' collated
micro-batches (free shapes or ``max_shapes`` static shapes), the causal Transformer LM, and the
check of fully masked rows on the eager model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.harness import TrainingSettings

FIRST_TOKEN = 3


@dataclass(kw_only=True)
class CompileSettings(TrainingSettings):
    """Everything a training arm depends on (passed to child processes as JSON)."""

    docs: int = 10_000
    max_shapes: int = 8
    """K of the K-shape arms."""
    storm_steps: int = 3
    """Steps of the static free-shape arm (each one compiles)."""
    paired_steps: int = 40
    """Micro-batches of the eager-against-compiled pass after training."""
    backend: str = "inductor"
    """``torch.compile`` backend."""


DEFAULTS = CompileSettings(
    max_tokens=4096, vocab=1000, d_model=128, nhead=4, layers=2, ffn=512, lr=1e-3, warmup=3
)
"""Part 2's workload: the model and the budget (the GPU script takes these too)."""


def train_lengths(s: CompileSettings) -> np.ndarray:
    """The target side of ``wmt_like_lengths(docs, seed + 1)``, at least 2 tokens."""
    from lightning_varbatch.planner import wmt_like_lengths

    return np.maximum(2, wmt_like_lengths(s.docs, seed=s.seed + 1)[:, 1].astype(np.int64))


def train_batches(s: CompileSettings, shapes: bool) -> list[dict[str, Any]]:
    """The epoch's collated micro-batches: free shapes, or ``max_shapes`` static shapes."""
    import torch

    from lightning_varbatch import PaddingCollate, TokenBudgetBatchSampler
    from lightning_varbatch.data.collate import attach_plan

    lengths = train_lengths(s)
    sampler = TokenBudgetBatchSampler(
        lengths,
        s.max_tokens,
        rank=0,
        world_size=1,
        shuffle=True,
        seed=s.seed,
        max_shapes=s.max_shapes if shapes else None,
        loss_lengths=lengths - 1,
    )
    g = torch.Generator().manual_seed(s.seed)
    tokens = [torch.randint(FIRST_TOKEN, s.vocab, (int(n),), generator=g) for n in lengths]
    collate = PaddingCollate(loss_offset=1)
    out = []
    for mb in sampler:
        batch = collate(attach_plan([{"tokens": tokens[i]} for i in mb], mb))
        out.append({k: batch[k] for k in ("tokens", "tokens_mask", "ntokens")})
    return out


def make_model(s: CompileSettings) -> Any:
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm1 = nn.LayerNorm(s.d_model)
            self.qkv = nn.Linear(s.d_model, 3 * s.d_model)
            self.out = nn.Linear(s.d_model, s.d_model)
            self.norm2 = nn.LayerNorm(s.d_model)
            self.ffn = nn.Sequential(
                nn.Linear(s.d_model, s.ffn), nn.GELU(), nn.Linear(s.ffn, s.d_model)
            )

        def attention(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            b, n, d = x.shape
            qkv = self.qkv(self.norm1(x)).view(b, n, 3, s.nhead, d // s.nhead)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return a.transpose(1, 2).reshape(b, n, d)

        def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            x = x + self.out(self.attention(x, mask))
            return x + self.ffn(self.norm2(x))

    class TinyLM(nn.Module):
        """Causal LM; ``forward(tokens, mask)`` returns the summed next-token loss."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(s.vocab, s.d_model)
            self.blocks = nn.ModuleList(Block() for _ in range(s.layers))
            self.norm = nn.LayerNorm(s.d_model)

        @staticmethod
        def attention_mask(mask: torch.Tensor) -> torch.Tensor:
            """``(B, 1, L, L)``: causal and key is real; a masked row's queries see no key."""
            n = mask.shape[1]
            causal = torch.ones(n, n, dtype=torch.bool, device=mask.device).tril()
            return causal[None, None] & mask[:, None, None, :]

        def forward(self, tokens: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
            am = self.attention_mask(mask)
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x, am)
            logits = F.linear(self.norm(x), self.embed.weight)
            target = tokens[:, 1:].masked_fill(~mask[:, 1:], -100)
            return F.cross_entropy(
                logits[:, :-1].flatten(0, 1), target.flatten(), ignore_index=-100, reduction="sum"
            )

    return TinyLM()


def check_masked_rows(s: CompileSettings) -> dict[str, Any]:
    """On the eager model: fully masked rows get zero attention, finite loss and gradients."""
    import torch

    torch.manual_seed(s.seed)
    model = make_model(s)
    batches = train_batches(s, shapes=True)
    per_batch = [int((~b["tokens_mask"].any(1)).sum()) for b in batches]
    batch = batches[int(np.argmax(per_batch))]
    tokens, mask = batch["tokens"], batch["tokens_mask"]
    dead = ~mask.any(1)
    block = model.blocks[0]
    with torch.no_grad():
        att = block.attention(model.embed(tokens), model.attention_mask(mask))
    loss = model(tokens, mask) / batch["ntokens"]
    loss.backward()
    grads = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters())
    masked = int(dead.sum())
    worst = float(att[dead].abs().max()) if dead.any() else 0.0
    nan = bool(torch.isnan(att).any())
    finite = bool(torch.isfinite(loss))
    return {
        "shape": list(tokens.shape),
        "masked_rows": masked,
        "attention_max_abs_on_masked_rows": worst,
        "attention_nan": nan,
        "loss_finite": finite,
        "grads_finite": grads,
        "ok": masked > 0 and worst == 0.0 and not nan and finite and grads,
    }


def describe_training(s: CompileSettings) -> None:
    lengths = train_lengths(s)
    print(
        f"documents: {lengths.size:,} (target side of wmt_like_lengths, >= 2), "
        f"{int(lengths.sum()):,} tokens; median {float(np.median(lengths)):.0f}, mean "
        f"{float(lengths.mean()):.1f}, max {int(lengths.max())}; budget {s.max_tokens} tokens, "
        f"max_shapes={s.max_shapes} for the K arms"
    )
    print(
        f"model: TinyLM d_model={s.d_model}, {s.layers} layers, {s.nhead} heads, FFN {s.ffn}, "
        f"vocab {s.vocab}; AdamW lr {s.lr}; fp32; torch.set_num_threads({s.threads}); "
        f"torch.compile backend {s.backend!r} (inductor compile_threads=1); warmup {s.warmup} "
        f"steps; static free-shape arm capped at {s.storm_steps} steps"
    )
