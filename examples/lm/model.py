"""A tiny pre-norm causal Transformer language model for packed or padded token budgets.

One model serves both layouts of :class:`~lightning_varbatch.TokenBudgetDataModule`; it tells
them apart by the batch's entries:

``packed`` (:class:`~lightning_varbatch.PackingCollate`)
    one row ``input_ids`` ``(1, T)`` of whole documents laid end to end, ``position_ids``
    restarting at 0 in every document, ``cu_seqlens``/``max_seqlen`` and the already shifted
    ``labels`` (``-100`` at each document's last token and on the alignment padding).
    Attention is :func:`~lightning_varbatch.attention.document_attention`: causal and kept
    inside each document, so a packed row computes exactly what the documents alone would.
``padded`` (:class:`~lightning_varbatch.PaddingCollate` with ``loss_offset=1``)
    ``tokens`` ``(B, L)`` right-padded with ``tokens_mask``; the model reads
    ``tokens[:, :-1]`` and predicts ``tokens[:, 1:]`` where the mask is set. Attention is
    plain :func:`~torch.nn.functional.scaled_dot_product_attention` with the causal mask:
    padding sits after every real token of its row, so the causal mask alone keeps real
    queries off padding keys (no extra key-padding mask is needed, and the padding rows'
    outputs are never read).

Positions are rotary (RoPE) from the position ids, so a packed document sees the same
positions ``0, 1, ...`` as when it is padded. Both layouts sum the token cross entropy over
the real predictions and normalise it with :func:`~lightning_varbatch.loss.step_token_mean`
(the exact token mean of the optimizer step under DDP, FSDP and DeepSpeed).

Logged metrics: ``train/loss`` and ``train/ppl`` (the micro-batch's token mean and its
exponential), ``val/loss`` and ``val/ppl`` (over the whole validation split).

Example:
    >>> import torch
    >>> from lightning_varbatch import PackingCollate, PaddingCollate
    >>> docs = [{"tokens": [1, 5, 6, 2]}, {"tokens": [1, 7, 2]}]
    >>> model = CausalLM(vocab_size=10, d_model=16, nhead=2, num_layers=1,
    ...                  dim_feedforward=32).double()
    >>> packed, _ = model.loss_sum(PackingCollate()(docs))
    >>> padded, _ = model.loss_sum(PaddingCollate(loss_offset=1)(docs))
    >>> bool(torch.allclose(packed, padded))
    True
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from torch import Tensor, nn
from torchmetrics import MeanMetric

from examples.translation.model import FSDPNormClipping
from lightning_varbatch import document_attention, step_token_mean
from lightning_varbatch.attention import BACKENDS

__all__ = ["Block", "CausalLM", "rotary"]

PAD_ID = 0
IGNORE_INDEX = -100


def rotary(x: Tensor, positions: Tensor, base: float = 10000.0) -> Tensor:
    """Rotate the channel pairs of ``x`` (..., T, H, D) by the angles of ``positions`` (..., T).

    The rotary position embedding of Su et al. (2021), "rotate half" form: channel ``i`` and
    ``i + D/2`` are rotated by ``position * base ** (-2i / D)``.

    Example:
        >>> x = torch.randn(1, 3, 2, 4)
        >>> torch.allclose(rotary(x, torch.zeros(1, 3)), x)
        True
    """
    half = x.shape[-1] // 2
    freq = base ** (-torch.arange(half, device=x.device, dtype=x.dtype) / half)
    angle = positions.to(x.dtype).unsqueeze(-1) * freq  # (..., T, D/2)
    cos, sin = angle.cos().unsqueeze(-2), angle.sin().unsqueeze(-2)  # (..., T, 1, D/2)
    first, second = x[..., :half], x[..., half:]
    return torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)


class Block(nn.Module):
    """One pre-norm Transformer layer: causal self-attention and a GELU MLP, with residuals.

    Args:
        d_model: width.
        nhead: attention heads (``d_model`` divisible by it, an even head width).
        dim_feedforward: the MLP's hidden width.
        dropout: dropout on the attention and MLP outputs.
        backend: :func:`~lightning_varbatch.attention.document_attention`'s backend for
            packed rows.
    """

    def __init__(
        self, d_model: int, nhead: int, dim_feedforward: int, dropout: float, backend: str
    ) -> None:
        super().__init__()
        self.nhead = nhead
        self.backend = backend
        self.norm1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.norm2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, dim_feedforward)
        self.fc2 = nn.Linear(dim_feedforward, d_model)
        self.dropout = nn.Dropout(dropout)

    def attention(self, x: Tensor, positions: Tensor, packed: dict[str, Any] | None) -> Tensor:
        """Causal self-attention of ``x`` (B, T, D); ``packed`` holds ``cu_seqlens``/``max_seqlen``
        of a packed row (B = 1), ``None`` for a right-padded batch."""
        batch, length, width = x.shape
        q, k, v = self.qkv(x).view(batch, length, 3, self.nhead, width // self.nhead).unbind(2)
        q, k = rotary(q, positions), rotary(k, positions)  # (B, T, H, Dh)
        if packed is not None:
            out = document_attention(
                q,
                k,
                v,
                packed["cu_seqlens"],
                packed["max_seqlen"],
                causal=True,
                backend=self.backend,
            )
        else:
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True
            ).transpose(1, 2)
        return self.proj(out.reshape(batch, length, width))

    def forward(self, x: Tensor, positions: Tensor, packed: dict[str, Any] | None) -> Tensor:
        """The layer's output (B, T, D)."""
        x = x + self.dropout(self.attention(self.norm1(x), positions, packed))
        return x + self.dropout(self.fc2(F.gelu(self.fc1(self.norm2(x)))))


class CausalLM(FSDPNormClipping, LightningModule):
    """Decoder-only Transformer LM (pre-norm, RoPE, tied embeddings) on token budgets.

    Args:
        vocab_size: vocabulary size.
        d_model: model width.
        nhead: attention heads.
        num_layers: Transformer layers.
        dim_feedforward: the MLP's hidden width.
        dropout: dropout rate (masks drawn from ``(seed, step, micro-batch, rank)``, so a
            resumed run trains exactly like an uninterrupted one).
        lr: peak learning rate, reached after ``warmup_steps``, then a cosine decay to 10 %
            of it at the trainer's ``max_steps`` (constant after warmup without one).
        warmup_steps: linear warmup steps.
        betas: AdamW betas.
        weight_decay: AdamW weight decay (matrices only).
        attention_backend: ``"auto"``, ``"flash"``, ``"flex"`` or ``"sdpa"`` for packed rows
            (see :mod:`lightning_varbatch.attention`; ``"auto"`` is ``"sdpa"`` on CPU).
        seed: the dropout seed.

    Attributes:
        flops_per_token: about 6 x parameters, for ``TokenThroughputMonitor``.

    Raises:
        ValueError: for a width not divisible into heads of even width, a non-positive size
            or an unknown attention backend.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        nhead: int = 4,
        num_layers: int = 2,
        dim_feedforward: int = 512,
        dropout: float = 0.0,
        lr: float = 3e-3,
        warmup_steps: int = 30,
        betas: Sequence[float] = (0.9, 0.95),
        weight_decay: float = 0.1,
        attention_backend: str = "auto",
        seed: int = 0,
    ) -> None:
        super().__init__()
        for name, value in (
            ("vocab_size", vocab_size),
            ("d_model", d_model),
            ("nhead", nhead),
            ("num_layers", num_layers),
            ("dim_feedforward", dim_feedforward),
            ("warmup_steps", warmup_steps),
        ):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"model.{name} must be an integer >= 1, got {value!r}.")
        if d_model % nhead or (d_model // nhead) % 2:
            raise ValueError(
                f"model.d_model={d_model} must split into model.nhead={nhead} heads of even "
                "width (rotary positions rotate channel pairs)."
            )
        if attention_backend not in BACKENDS:
            raise ValueError(
                f"model.attention_backend must be one of {BACKENDS}, got {attention_backend!r}."
            )
        self.save_hyperparameters()
        self.embed = nn.Embedding(vocab_size, d_model)
        nn.init.normal_(self.embed.weight, std=0.02)
        self.layers = nn.ModuleList(
            Block(d_model, nhead, dim_feedforward, dropout, attention_backend)
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(d_model)
        self.val_loss = MeanMetric()
        self.flops_per_token = 6.0 * sum(p.numel() for p in self.parameters())

    # -- network ---------------------------------------------------------------------------

    def forward(
        self, input_ids: Tensor, positions: Tensor, packed: dict[str, Any] | None = None
    ) -> Tensor:
        """Logits (B, T, vocab) of the next token at every position of ``input_ids`` (B, T)."""
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, positions, packed)
        return self.norm(x) @ self.embed.weight.t()  # tied output projection

    def loss_sum(self, batch: dict[str, Any]) -> tuple[Tensor, Tensor]:
        """(summed token cross entropy, number of predicted tokens) of one micro-batch.

        A packed batch (it has ``cu_seqlens``) is run as one row with document attention and
        its shifted ``labels``; a padded one (``tokens``/``tokens_mask``) as ``tokens[:, :-1]``
        predicting the real tokens of ``tokens[:, 1:]``. For the same documents both give the
        same sum (up to float rounding).
        """
        if "cu_seqlens" in batch:
            packed = {"cu_seqlens": batch["cu_seqlens"], "max_seqlen": batch["max_seqlen"]}
            logits = self(batch["input_ids"], batch["position_ids"], packed)
            labels = batch["labels"]
        else:
            tokens, mask = batch["tokens"], batch["tokens_mask"]
            inputs = tokens[:, :-1]
            positions = torch.arange(inputs.shape[1], device=inputs.device).expand_as(inputs)
            logits = self(inputs, positions)
            labels = tokens[:, 1:].masked_fill(~mask[:, 1:], IGNORE_INDEX)
        flat = labels.reshape(-1)
        real = flat != IGNORE_INDEX
        scores = logits.reshape(-1, logits.shape[-1])[real]
        if scores.dtype in (torch.float16, torch.bfloat16):
            scores = scores.float()  # the loss in float32 under mixed precision
        return F.cross_entropy(scores, flat[real], reduction="sum"), real.sum()

    # -- training --------------------------------------------------------------------------

    def seed_dropout(self, batch_idx: int) -> None:
        """Seed torch's RNG from ``(seed, global_step, batch_idx, global_rank)`` (exact resume)."""
        key = (self.hparams["seed"], self.global_step, batch_idx, self.global_rank)
        torch.manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        if self.hparams["dropout"] > 0:
            self.seed_dropout(batch_idx)
        loss_sum, ntokens = self.loss_sum(batch)
        mean = loss_sum.detach() / ntokens.clamp(min=1)
        self.log("train/loss", mean, prog_bar=True, batch_size=int(ntokens))
        self.log("train/ppl", mean.exp(), batch_size=int(ntokens))
        return step_token_mean(loss_sum, batch, self.trainer)

    def configure_optimizers(self) -> Any:
        decay = [p for p in self.parameters() if p.dim() >= 2]
        no_decay = [p for p in self.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW(
            [
                {"params": decay, "weight_decay": self.hparams["weight_decay"]},
                {"params": no_decay, "weight_decay": 0.0},
            ],
            lr=self.hparams["lr"],
            betas=tuple(self.hparams["betas"]),
        )
        warmup = self.hparams["warmup_steps"]
        total = int(self.trainer.max_steps) if self._trainer is not None else -1

        def schedule(step: int) -> float:
            if step < warmup:
                return (step + 1) / warmup
            if total <= warmup:
                return 1.0
            done = min(1.0, (step - warmup) / (total - warmup))
            return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * done))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    # -- evaluation ------------------------------------------------------------------------

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss_sum, ntokens = self.loss_sum(batch)
        count = ntokens.clamp(min=1).float()
        self.val_loss.update(loss_sum / count, weight=count)

    def on_validation_epoch_end(self) -> None:
        # compute() all-reduces the metric state: every rank takes part and gets the same value.
        loss = self.val_loss.compute()
        self.log("val/loss", loss, prog_bar=True)
        self.log("val/ppl", loss.exp())
        self.val_loss.reset()
