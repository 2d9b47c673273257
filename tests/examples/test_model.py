"""The translation model's incremental (KV-cached) greedy decoding against the uncached path."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from examples.translation.model import BOS_ID, EOS_ID, PAD_ID, TranslationModel

VOCAB = 12


def small_model(seed: int, positions: str = "sinusoidal") -> TranslationModel:
    torch.manual_seed(seed)
    return TranslationModel(
        VOCAB,
        d_model=32,
        nhead=4,
        num_encoder_layers=1,
        num_decoder_layers=2,
        dim_feedforward=64,
        dropout=0.0,
        positions=positions,  # type: ignore[arg-type]
        max_decode_length=40,
    )


def copy_batch(lengths: list[int], seed: int) -> dict[str, Any]:
    """Random sources padded to the longest; targets are BOS + source + EOS (a copy task)."""
    generator = torch.Generator().manual_seed(seed)
    n, longest = len(lengths), max(lengths)
    length = torch.tensor(lengths)
    source_mask = torch.arange(longest) < length[:, None]
    source = torch.randint(4, VOCAB, (n, longest), generator=generator)
    source = source.masked_fill(~source_mask, PAD_ID)
    target = torch.full((n, longest + 2), PAD_ID, dtype=torch.long)
    target[:, 0] = BOS_ID
    target[:, 1 : longest + 1] = source
    target[torch.arange(n), length + 1] = EOS_ID
    target_mask = torch.arange(longest + 2) < (length + 2)[:, None]
    return {
        "source": source,
        "source_mask": source_mask,
        "target": target,
        "target_mask": target_mask,
    }


PADDED = [3, 9, 1, 10, 6, 10, 2, 7]  # source lengths of the test batch (padded to 10)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_logits_match_full_decoder(positions: str) -> None:
    """Each cached step gives the logits the full decoder gives for the last prefix position."""
    model = small_model(0, positions).eval()
    batch = copy_batch(PADDED, seed=1)
    with torch.no_grad():
        memory = model.encode(batch["source"], batch["source_mask"])
        prefix = torch.randint(
            4, VOCAB, (len(PADDED), 15), generator=torch.Generator().manual_seed(2)
        )
        prefix[:, 0] = BOS_ID
        cache = model.init_cache(memory, batch["source_mask"], max_length=15)
        full = model.decode_step(
            memory, batch["source_mask"], prefix, torch.ones_like(prefix, dtype=torch.bool)
        )
        for t in range(15):
            step = model.decode_next(cache, prefix[:, t])
            torch.testing.assert_close(step, full[:, t], rtol=1e-5, atol=1e-5)
        assert cache.length == 15
        with pytest.raises(RuntimeError, match="full"):
            model.decode_next(cache, prefix[:, 0])


@pytest.mark.parametrize("positions", ["sinusoidal", "learned"])
def test_cached_greedy_equals_uncached_random_model(positions: str) -> None:
    model = small_model(3, positions).eval()
    batch = copy_batch(PADDED, seed=4)
    cached = model.greedy_decode(batch["source"], batch["source_mask"], max_extra=10)
    plain = model.greedy_decode(
        batch["source"], batch["source_mask"], max_extra=10, use_cache=False
    )
    assert cached == plain
    assert all(len(ids) > 0 for ids in cached)


def test_cached_greedy_equals_uncached_with_early_stops() -> None:
    """A briefly trained copy model ends rows at different steps (EOS), unlike a random one."""
    model = small_model(0)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    generator = torch.Generator().manual_seed(5)
    for step in range(30):
        lengths = torch.randint(1, 11, (16,), generator=generator).tolist()
        loss_sum, _, ntokens = model._losses(copy_batch(lengths, seed=100 + step), 0.0)
        optimizer.zero_grad()
        (loss_sum / ntokens).backward()
        optimizer.step()
    model.eval()
    batch = copy_batch(PADDED, seed=6)
    cached = model.greedy_decode(batch["source"], batch["source_mask"], max_extra=10)
    plain = model.greedy_decode(
        batch["source"], batch["source_mask"], max_extra=10, use_cache=False
    )
    assert cached == plain
    limit = max(PADDED) + 10
    decoded = sorted({len(ids) for ids in cached})
    # The comparison covers rows that ended early, at different steps (finished rows keep
    # being fed PAD while the others go on).
    assert len(decoded) >= 3 and decoded[0] < limit, decoded
