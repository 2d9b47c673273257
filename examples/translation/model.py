"""A pre-norm encoder-decoder Transformer for translation on token-budgeted batches.

Batches come from :class:`~lightning_varbatch.TokenBudgetDataModule` with
:class:`~lightning_varbatch.PaddingCollate`: ``source``/``target`` (B, S)/(B, T) long tensors,
``source_mask``/``target_mask`` bool (True on real tokens) and ``step_ntokens``, the number of
loss tokens of the whole optimizer step over all ranks and micro-batches. The training loss is
the label-smoothed cross entropy summed over real target tokens and normalised with
:func:`~lightning_varbatch.loss.step_token_mean`, so the gradient is the exact token mean of
the optimizer step under DDP, FSDP and DeepSpeed.

Logged metrics:

===================== ========================================================================
``train/loss``        token-mean label-smoothed loss of the micro-batch
``train/<name>/loss`` the same, logged only for micro-batches of dataset ``<name>``
``val/loss``          token-mean label-smoothed loss over the whole validation set
``val/<name>/loss``   the same over the validation examples of dataset ``<name>``
``val/nll``           token-mean cross entropy (no smoothing) over the validation set
``val/bleu``          SacreBLEU (0-100) of greedy decodes of the first validation batches
``val/chrf``          chrF (0-100) of the same decodes
===================== ========================================================================

The ``<name>`` keys are logged when the model is given ``dataset_names`` (a mixture of
datasets: ``batch["dataset"]`` indexes the names); ``test/`` keys mirror the ``val/`` ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, cast

import numpy as np
import torch
import torch.nn.functional as F
from lightning.pytorch import LightningModule
from lightning.pytorch.utilities import rank_zero_info
from torch import Tensor, nn
from torchmetrics import MeanMetric
from torchmetrics.text import CHRFScore, SacreBLEUScore

from lightning_varbatch import step_token_mean

__all__ = ["DecoderCache", "FSDPNormClipping", "TranslationModel"]

PAD_ID, BOS_ID, EOS_ID = 0, 1, 2


def sinusoidal_positions(length: int, dim: int) -> Tensor:
    """The (length, dim) sinusoidal position table of Vaswani et al. (2017)."""
    position = torch.arange(length, dtype=torch.float32).unsqueeze(1)
    freq = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    table = torch.zeros(length, dim)
    table[:, 0::2] = torch.sin(position * freq)
    table[:, 1::2] = torch.cos(position * freq[: dim // 2])
    return table


def _split_heads(x: Tensor, nhead: int) -> Tensor:
    """(B, L, nhead * head_dim) -> (B, nhead, L, head_dim)."""
    batch, length, width = x.shape
    return x.view(batch, length, nhead, width // nhead).transpose(1, 2)


def _merge_heads(x: Tensor) -> Tensor:
    """(B, nhead, L, head_dim) -> (B, L, nhead * head_dim)."""
    batch, nhead, length, head_dim = x.shape
    return x.transpose(1, 2).reshape(batch, length, nhead * head_dim)


# The cached decoding below reads parameters directly (functional ops, no module calls): under
# DeepSpeed ZeRO-3 a module call gathers its parameters with a collective, and the ranks run
# different numbers of decoding steps. Decoding is inference only: no dropout.


def _linear(linear: nn.Linear, x: Tensor) -> Tensor:
    return F.linear(x, linear.weight, linear.bias)


def _layer_norm(norm: nn.LayerNorm, x: Tensor) -> Tensor:
    return F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)


def _in_projection(attn: nn.MultiheadAttention, x: Tensor, part: int) -> Tensor:
    """Query (``part`` 0), key (1) or value (2) projection of ``x`` by ``attn``'s packed weights."""
    width = attn.embed_dim
    rows = slice(part * width, (part + 1) * width)
    bias = attn.in_proj_bias[rows] if attn.in_proj_bias is not None else None
    return F.linear(x, attn.in_proj_weight[rows], bias)


def _attend(
    attn: nn.MultiheadAttention, query: Tensor, keys: Tensor, values: Tensor, mask: Tensor | None
) -> Tensor:
    """``attn`` (inference) for input ``query`` (B, L, D) over projected ``keys``/``values``."""
    q = _split_heads(_in_projection(attn, query, 0), attn.num_heads)
    out = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    return _linear(attn.out_proj, _merge_heads(out))


@dataclass
class DecoderCache:
    """What incremental greedy decoding keeps between steps (one source batch).

    Attributes:
        memory_keys: per decoder layer, the cross-attention keys of the encoder memory,
            (B, nhead, S, head_dim): computed once per batch instead of once per step.
        memory_values: the matching cross-attention values.
        memory_mask: (B, 1, 1, S), True on real source tokens.
        keys: per decoder layer, a (B, nhead, max_length, head_dim) buffer of the
            self-attention keys of the target positions decoded so far.
        values: the matching self-attention values.
        length: target positions decoded so far (filled buffer rows).
    """

    memory_keys: list[Tensor]
    memory_values: list[Tensor]
    memory_mask: Tensor
    keys: list[Tensor]
    values: list[Tensor]
    length: int = 0


class FSDPNormClipping:
    """Gradient-norm clipping that also works under FSDP (mix into a LightningModule).

    Lightning's FSDP precision plugin refuses norm clipping; FSDP's own ``clip_grad_norm_``
    computes the norm over all shards. Other strategies use Lightning's clipping.
    """

    trainer: Any

    def configure_gradient_clipping(
        self,
        optimizer: torch.optim.Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        wrapped: Any = getattr(self.trainer.strategy, "model", None)
        if gradient_clip_val and callable(getattr(wrapped, "clip_grad_norm_", None)):
            if gradient_clip_algorithm not in (None, "norm"):
                raise ValueError(
                    f"gradient_clip_algorithm={gradient_clip_algorithm!r} is not supported "
                    "under FSDP; use 'norm'."
                )
            wrapped.clip_grad_norm_(gradient_clip_val)
            return
        super().configure_gradient_clipping(  # type: ignore[misc]
            optimizer, gradient_clip_val, gradient_clip_algorithm
        )


class TranslationModel(FSDPNormClipping, LightningModule):
    """Encoder-decoder Transformer (pre-norm, tied embeddings) trained on token budgets.

    Args:
        vocab_size: size of the shared source/target vocabulary.
        d_model: model width.
        nhead: attention heads.
        num_encoder_layers: encoder layers.
        num_decoder_layers: decoder layers.
        dim_feedforward: width of the feed-forward layers.
        dropout: dropout rate.
        positions: ``"sinusoidal"`` or ``"learned"`` position embeddings.
        max_positions: longest sequence the position table covers.
        label_smoothing: label smoothing of the training loss.
        lr: peak learning rate (reached after ``warmup_steps``).
        warmup_steps: linear warmup steps, then inverse square-root decay.
        betas: Adam betas.
        weight_decay: Adam weight decay.
        decode_batches: greedy-decode (for BLEU/chrF) only the first N validation batches of
            each rank; 0 turns decoding off.
        max_decode_extra: decode at most (source length + this) tokens.
        max_decode_length: and never more than this many.
        num_samples: sample translations printed (rank 0) at each validation.
        decode_fn: ``ids -> text`` (the tokenizer's decode); without it BLEU is not computed.
        seed: dropout masks of a training micro-batch are drawn from
            ``(seed, global_step, batch_idx, rank)`` alone (see :meth:`training_step`), so a run
            resumed from a checkpoint trains exactly like an uninterrupted one.
        dataset_names: the datasets of a mixture, in the order ``batch["dataset"]`` indexes
            them: the loss is then also logged per dataset (``train/<name>/loss``,
            ``val/<name>/loss``, ``test/<name>/loss``).

    Attributes:
        flops_per_token: about 6 x parameters, for ``TokenThroughputMonitor``.

    Raises:
        ValueError: for a bad ``positions``, ``d_model`` not divisible by ``nhead`` or a
            non-positive size.
    """

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 128,
        nhead: int = 4,
        num_encoder_layers: int = 2,
        num_decoder_layers: int = 2,
        dim_feedforward: int = 256,
        dropout: float = 0.1,
        positions: Literal["sinusoidal", "learned"] = "sinusoidal",
        max_positions: int = 512,
        label_smoothing: float = 0.1,
        lr: float = 1e-3,
        warmup_steps: int = 100,
        betas: Sequence[float] = (0.9, 0.98),
        weight_decay: float = 0.0,
        decode_batches: int = 2,
        max_decode_extra: int = 20,
        max_decode_length: int = 128,
        num_samples: int = 3,
        decode_fn: Callable[[list[int]], str] | None = None,
        seed: int = 0,
        dataset_names: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        if positions not in ("sinusoidal", "learned"):
            raise ValueError(f"positions must be 'sinusoidal' or 'learned', got {positions!r}.")
        if d_model % nhead:
            raise ValueError(f"d_model={d_model} must be divisible by nhead={nhead}.")
        for name, value in (
            ("vocab_size", vocab_size),
            ("d_model", d_model),
            ("max_positions", max_positions),
            ("warmup_steps", warmup_steps),
        ):
            if value < 1:
                raise ValueError(f"{name} must be positive, got {value}.")
        self.save_hyperparameters(ignore=["decode_fn"])
        self.decode_fn = decode_fn
        self.embed = nn.Embedding(vocab_size, d_model, padding_idx=PAD_ID)
        nn.init.normal_(self.embed.weight, std=d_model**-0.5)
        with torch.no_grad():
            self.embed.weight[PAD_ID].zero_()
        self.learned_positions = (
            nn.Embedding(max_positions, d_model) if positions == "learned" else None
        )
        self.register_buffer(
            "sinusoids", sinusoidal_positions(max_positions, d_model), persistent=False
        )
        self.dropout = nn.Dropout(dropout)
        self.encoder = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(
                d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True
            ),
            num_encoder_layers,
            norm=nn.LayerNorm(d_model),
            enable_nested_tensor=False,
        )
        self.decoder = nn.TransformerDecoder(
            nn.TransformerDecoderLayer(
                d_model, nhead, dim_feedforward, dropout, batch_first=True, norm_first=True
            ),
            num_decoder_layers,
            norm=nn.LayerNorm(d_model),
        )
        self.val_loss = MeanMetric()
        self.val_nll = MeanMetric()
        self.dataset_names = list(dataset_names or [])
        self.dataset_loss = nn.ModuleList(MeanMetric() for _ in self.dataset_names)
        self.bleu = SacreBLEUScore()
        self.chrf = CHRFScore()
        self.samples: list[tuple[str, str, str]] = []
        self.flops_per_token = 6.0 * sum(p.numel() for p in self.parameters())
        self._compiled_forward: Callable[[dict[str, Any]], Tensor] | None = None
        self.compiled_shapes: set[tuple[int, ...]] = set()

    def compile_forward(self, backend: str = "inductor") -> None:
        """Run the teacher-forced forward of the training steps through ``torch.compile``.

        Compiled with ``dynamic=False``: one graph per distinct ``(rows, length)`` of the
        batches, so use it with a shape budget (``data.max_shapes``, see
        :mod:`examples.translation.compiling`). Validation, test and greedy decoding stay eager.
        The shapes the compiled forward ran are collected in :attr:`compiled_shapes`.

        Args:
            backend: the ``torch.compile`` backend (``"inductor"``; ``"aot_eager"`` compiles
                the graphs without generating code, for quick checks).
        """
        self._compiled_forward = torch.compile(self.forward, dynamic=False, backend=backend)

    # -- network ---------------------------------------------------------------------------

    def _embed(self, tokens: Tensor, offset: int = 0) -> Tensor:
        """Scaled token embeddings plus the positions ``offset, offset + 1, ...``."""
        length = offset + tokens.shape[1]
        if length > self.hparams["max_positions"]:
            raise ValueError(
                f"Sequence of {length} tokens exceeds max_positions="
                f"{self.hparams['max_positions']}: raise model.max_positions or lower "
                "data.max_length."
            )
        x = self.embed(tokens) * math.sqrt(self.hparams["d_model"])
        return self.dropout(x + self._positions(offset, length).to(x.dtype))

    def _positions(self, start: int, stop: int) -> Tensor:
        """Position embeddings (stop - start, d_model) of positions ``start, ..., stop - 1``."""
        if self.learned_positions is not None:
            return self.learned_positions.weight[start:stop]
        sinusoids: Tensor = self.sinusoids  # type: ignore[assignment]
        return sinusoids[start:stop]

    def encode(self, source: Tensor, source_mask: Tensor) -> Tensor:
        """Encoder states (B, S, d_model); ``source_mask`` is True on real tokens."""
        return self.encoder(self._embed(source), src_key_padding_mask=~source_mask)

    def decode_step(
        self, memory: Tensor, source_mask: Tensor, prefix: Tensor, prefix_mask: Tensor
    ) -> Tensor:
        """Logits (B, T, vocab) for every position of the target ``prefix``."""
        length = prefix.shape[1]
        causal = torch.triu(
            torch.ones(length, length, dtype=torch.bool, device=prefix.device), diagonal=1
        )
        hidden = self.decoder(
            self._embed(prefix),
            memory,
            tgt_mask=causal,
            tgt_key_padding_mask=~prefix_mask,
            memory_key_padding_mask=~source_mask,
            # What torch would detect from the mask, said up front: its check compares the
            # mask's values, a data-dependent branch and so a graph break under torch.compile.
            tgt_is_causal=True,
        )
        return hidden @ self.embed.weight.t()  # tied output projection

    def init_cache(self, memory: Tensor, source_mask: Tensor, max_length: int) -> DecoderCache:
        """An empty :class:`DecoderCache` for up to ``max_length`` target positions."""
        batch, source_length, _ = memory.shape
        nhead = self.hparams["nhead"]
        head_dim = self.hparams["d_model"] // nhead
        memory_keys, memory_values, keys, values = [], [], [], []
        for layer in self.decoder.layers:
            attn = layer.multihead_attn
            memory_keys.append(_split_heads(_in_projection(attn, memory, 1), nhead))
            memory_values.append(_split_heads(_in_projection(attn, memory, 2), nhead))
            keys.append(memory.new_empty(batch, nhead, max_length, head_dim))
            values.append(memory.new_empty(batch, nhead, max_length, head_dim))
        mask = source_mask.view(batch, 1, 1, source_length)
        return DecoderCache(memory_keys, memory_values, mask, keys, values)

    def decode_next(self, cache: DecoderCache, token: Tensor) -> Tensor:
        """Logits (B, vocab) after feeding one more target token (B,); updates ``cache``.

        The computation of the decoder's (pre-norm) layers in :meth:`decode_step`, in eval mode,
        for the newest position only: its self-attention reads the cached keys/values of the
        earlier positions (causal by construction), its cross-attention the cached memory
        keys/values.
        """
        t = cache.length
        if t >= cache.keys[0].shape[2]:
            raise RuntimeError(f"The decoder cache holds {t} positions and is full.")
        if t + 1 > self.hparams["max_positions"]:
            raise ValueError(f"Position {t} is beyond max_positions: raise model.max_positions.")
        x = F.embedding(token.unsqueeze(1), self.embed.weight) * math.sqrt(self.hparams["d_model"])
        x = x + self._positions(t, t + 1).to(x.dtype)  # (B, 1, D)
        nhead = self.hparams["nhead"]
        for i, layer in enumerate(self.decoder.layers):
            attn = layer.self_attn
            h = _layer_norm(layer.norm1, x)
            cache.keys[i][:, :, t : t + 1] = _split_heads(_in_projection(attn, h, 1), nhead)
            cache.values[i][:, :, t : t + 1] = _split_heads(_in_projection(attn, h, 2), nhead)
            keys, values = cache.keys[i][:, :, : t + 1], cache.values[i][:, :, : t + 1]
            x = x + _attend(attn, h, keys, values, None)
            h = _layer_norm(layer.norm2, x)
            memory_keys, memory_values = cache.memory_keys[i], cache.memory_values[i]
            x = x + _attend(layer.multihead_attn, h, memory_keys, memory_values, cache.memory_mask)
            h = _layer_norm(layer.norm3, x)
            x = x + _linear(layer.linear2, layer.activation(_linear(layer.linear1, h)))
        cache.length = t + 1
        hidden = _layer_norm(self.decoder.norm, x)[:, 0]
        return hidden @ self.embed.weight.t()  # tied output projection

    @contextmanager
    def _gathered_parameters(self) -> Iterator[None]:
        """Under DeepSpeed ZeRO-3 (parameters partitioned over ranks), the full parameters."""
        partitioned = [p for p in self.parameters() if hasattr(p, "ds_id")]
        if not partitioned:
            yield
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(partitioned):  # a collective: on every rank
            yield

    def forward(self, batch: dict[str, Any]) -> Tensor:
        """Teacher-forced logits (B, T-1, vocab) predicting ``target[:, 1:]``."""
        memory = self.encode(batch["source"], batch["source_mask"])
        return self.decode_step(
            memory, batch["source_mask"], batch["target"][:, :-1], batch["target_mask"][:, :-1]
        )

    def _losses(
        self, batch: dict[str, Any], smoothing: float, compiled: bool = False
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(smoothed loss sum, plain NLL sum, loss-token count) over real target tokens.

        ``compiled``: through the compiled forward when :meth:`compile_forward` was called.
        """
        if compiled and self._compiled_forward is not None:
            self.compiled_shapes.add(tuple(batch["source"].shape))
            logits = self._compiled_forward(batch).float()
        else:
            logits = self(batch).float()
        labels = batch["target"][:, 1:]
        real = batch["target_mask"][:, 1:]
        flat_logits, flat_labels = logits[real], labels[real]
        loss_sum = F.cross_entropy(
            flat_logits, flat_labels, reduction="sum", label_smoothing=smoothing
        )
        nll_sum = F.cross_entropy(flat_logits.detach(), flat_labels, reduction="sum")
        return loss_sum, nll_sum, real.sum()

    # -- training --------------------------------------------------------------------------

    def seed_dropout(self, batch_idx: int) -> None:
        """Seed torch's RNG from ``(seed, global_step, batch_idx, global_rank)``.

        Lightning's checkpoints do not hold RNG states, so a run resumed from a checkpoint
        would otherwise draw other dropout masks than the uninterrupted run. With the masks a
        function of the position in training, resuming is exact (every rank, any strategy).
        """
        key = (self.hparams["seed"], self.global_step, batch_idx, self.global_rank)
        torch.manual_seed(int(np.random.SeedSequence(key).generate_state(1)[0]))

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        self.seed_dropout(batch_idx)
        loss_sum, _, ntokens = self._losses(batch, self.hparams["label_smoothing"], compiled=True)
        loss = loss_sum.detach() / ntokens.clamp(min=1)
        self.log("train/loss", loss, prog_bar=True, batch_size=int(ntokens))
        if self.dataset_names:
            name = self.dataset_names[int(batch["dataset"])]
            self.log(f"train/{name}/loss", loss, batch_size=int(ntokens))
        return step_token_mean(loss_sum, batch, self.trainer)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.Adam(
            self.parameters(),
            lr=self.hparams["lr"],
            betas=tuple(self.hparams["betas"]),
            weight_decay=self.hparams["weight_decay"],
        )
        warmup = self.hparams["warmup_steps"]

        def inverse_sqrt(step: int) -> float:
            step += 1
            return min(step / warmup, math.sqrt(warmup / step))

        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, inverse_sqrt)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    # -- evaluation ------------------------------------------------------------------------

    @torch.no_grad()
    def greedy_decode(
        self, source: Tensor, source_mask: Tensor, max_extra: int, use_cache: bool = True
    ) -> list[list[int]]:
        """Greedy translations (token ids without BOS/EOS) of a padded source batch.

        Args:
            source: (B, S) source ids.
            source_mask: (B, S), True on real tokens.
            max_extra: decode at most (longest source + ``max_extra``) tokens.
            use_cache: decode incrementally with a :class:`DecoderCache` (one position per
                step); ``False`` re-runs the decoder on the whole prefix at every step (the
                reference the cache is tested against; quadratic in the length).

        Raises:
            RuntimeError: for ``use_cache=False`` under DeepSpeed ZeRO-3: its per-module
                parameter gathers are collectives, and ranks stop decoding after different
                numbers of steps.
        """
        if not use_cache and any(hasattr(p, "ds_id") for p in self.parameters()):
            raise RuntimeError("greedy_decode(use_cache=False) cannot run under ZeRO stage 3.")
        memory = self.encode(source, source_mask)
        limit = min(
            int(source_mask.sum(1).max()) + max_extra,
            self.hparams["max_decode_length"],
            self.hparams["max_positions"] - 1,
        )
        batch = source.shape[0]
        token = torch.full((batch,), BOS_ID, dtype=torch.long, device=source.device)
        prefix = token.unsqueeze(1)
        done = torch.zeros(batch, dtype=torch.bool, device=source.device)
        with self._gathered_parameters():
            cache = self.init_cache(memory, source_mask, limit) if use_cache else None
            for _ in range(limit):
                if cache is not None:
                    logits = self.decode_next(cache, token)
                else:
                    prefix_mask = torch.ones_like(prefix, dtype=torch.bool)
                    logits = self.decode_step(memory, source_mask, prefix, prefix_mask)[:, -1]
                token = logits.argmax(-1).masked_fill(done, PAD_ID)
                prefix = torch.cat([prefix, token.unsqueeze(1)], dim=1)
                done |= token == EOS_ID
                if bool(done.all()):
                    break
        outputs = []
        for row in prefix[:, 1:].tolist():
            ids = [t for t in row if t != PAD_ID]
            outputs.append(ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids)
        return outputs

    def _evaluate(self, batch: dict[str, Any], batch_idx: int) -> None:
        loss_sum, nll_sum, ntokens = self._losses(batch, self.hparams["label_smoothing"])
        count = ntokens.clamp(min=1).float()
        self.val_loss.update(loss_sum / count, weight=count)
        self.val_nll.update(nll_sum / count, weight=count)
        if self.dataset_names:
            metric = cast(MeanMetric, self.dataset_loss[int(batch["dataset"])])
            metric.update(loss_sum / count, weight=count)
        if self.decode_fn is None or batch_idx >= self.hparams["decode_batches"]:
            return
        # Under a shape budget (data.max_shapes) the rows after the real ones are all padding:
        # decode and score the real rows only.
        rows = int(batch.get("nexamples", batch["source"].shape[0]))
        source, source_mask = batch["source"][:rows], batch["source_mask"][:rows]
        hyps = self.greedy_decode(source, source_mask, self.hparams["max_decode_extra"])
        refs = [
            self._strip(row, mask)
            for row, mask in zip(batch["target"][:rows], batch["target_mask"][:rows], strict=True)
        ]
        hyp_text = [self.decode_fn(h) for h in hyps]
        ref_text = [self.decode_fn(r) for r in refs]
        self.bleu.update(hyp_text, [[r] for r in ref_text])
        self.chrf.update(hyp_text, [[r] for r in ref_text])
        if batch_idx == 0:
            sources = [
                self.decode_fn(self._strip(row, mask))
                for row, mask in zip(source, source_mask, strict=True)
            ]
            self.samples = list(zip(sources, hyp_text, ref_text, strict=True))[
                : self.hparams["num_samples"]
            ]

    @staticmethod
    def _strip(row: Tensor, mask: Tensor) -> list[int]:
        return [t for t in row[mask].tolist() if t not in (BOS_ID, EOS_ID)]

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, batch_idx)

    def _epoch_end(self, stage: str) -> None:
        # compute() all-reduces the metric states: every rank takes part and gets the same value.
        self.log(f"{stage}/loss", self.val_loss.compute(), prog_bar=True)
        self.log(f"{stage}/nll", self.val_nll.compute())
        self.val_loss.reset()
        self.val_nll.reset()
        for name, module in zip(self.dataset_names, self.dataset_loss, strict=True):
            metric = cast(MeanMetric, module)
            self.log(f"{stage}/{name}/loss", metric.compute())
            metric.reset()
        if self.decode_fn is not None and self.hparams["decode_batches"] > 0:
            bleu = 100.0 * cast(Tensor, self.bleu.compute())
            chrf = 100.0 * cast(Tensor, self.chrf.compute())
            self.log(f"{stage}/bleu", bleu, prog_bar=True)
            self.log(f"{stage}/chrf", chrf)
            self.bleu.reset()
            self.chrf.reset()
            lines = [f"[{stage} step {self.global_step}] BLEU {bleu:.2f} chrF {chrf:.2f}"]
            for src, hyp, ref in self.samples:
                lines.append(f"  src: {src}\n  hyp: {hyp}\n  ref: {ref}")
            rank_zero_info("\n".join(lines))

    def on_validation_epoch_end(self) -> None:
        self._epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._epoch_end("test")
