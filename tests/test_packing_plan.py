"""layout="packed": budgets of packed rows, ranks balanced by FLOPs, and the FLOP model itself.

References are independent: the FLOP model against torch's own FLOP counter on a real layer;
every rank's compute recomputed from the plan's example ids and the raw lengths; the budget
recomputed per micro-batch from the lengths.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from lightning_varbatch import DataSource, EpochPlanner, MixturePlanner, PlanConfig
from lightning_varbatch.planner import diagnose, rank_loads
from lightning_varbatch.planner.flops import transformer_flops

RNG = np.random.default_rng(0)
SFT = np.clip(RNG.lognormal(5.5, 1.0, 40_000).astype(np.int64), 2, 8192)


class Layer(nn.Module):
    """One Transformer layer with the attention written as matmuls (counted by torch)."""

    def __init__(self, d: int, heads: int, ffn: int, causal: bool) -> None:
        super().__init__()
        self.d, self.heads, self.causal = d, heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.up, self.down = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        length, hd = x.shape[0], self.d // self.heads
        q, k, v = (
            f(x).view(length, self.heads, hd).transpose(0, 1) for f in (self.q, self.k, self.v)
        )
        scores = q @ k.transpose(1, 2) / hd**0.5
        out = (F.softmax(scores, -1) @ v).transpose(0, 1).reshape(length, self.d)
        x = x + self.o(out)
        return x + self.down(F.gelu(self.up(x)))


def counted(layer: nn.Module, length: int) -> float:
    with FlopCounterMode(display=False) as counter:
        layer(torch.randn(length, layer.d))
    return float(counter.get_total_flops())


@pytest.mark.parametrize("d, heads, ffn", [(64, 4, 256), (96, 3, 200)])
def test_the_flop_model_matches_torchs_flop_counter(d: int, heads: int, ffn: int) -> None:
    layer = Layer(d, heads, ffn, causal=False)
    a, b = counted(layer, 16), counted(layer, 40)
    per_pair = (b - a * 40 / 16) / (40 * 40 - 16 * 40)  # solve a = t·16 + p·16², b = t·40 + p·40²
    per_token = (a - per_pair * 256) / 16
    model = transformer_flops(d, 1, ffn_dim=ffn, causal=False)
    assert model.per_token == pytest.approx(per_token)
    assert model.per_pair == pytest.approx(per_pair)
    assert transformer_flops(d, 3, ffn_dim=ffn).per_pair == pytest.approx(3 * per_pair / 2)


def rank_flops(planner: EpochPlanner, plan, fa: float) -> np.ndarray:
    """Every rank's compute per step, from the plan's example ids and the raw lengths."""
    lengths = planner.prepared.key.astype(np.float64)
    out = np.zeros(plan.assign.shape[:2])
    for s in range(plan.num_steps):
        for r in range(plan.world_size):
            for t in plan.assign[s, r]:
                ids = plan.micro_batch_ids(int(t))
                m = planner.config.pad_to_multiple_of
                slots = -(-int(lengths[ids].sum()) // m) * m
                out[s, r] += slots + fa * float((lengths[ids] ** 2).sum())
    return out


def imbalance(loads: np.ndarray) -> np.ndarray:
    return loads.max(axis=1) / loads.mean(axis=1)


@pytest.mark.slow
@pytest.mark.parametrize("acc", [1, 4])
def test_ranks_carry_equal_compute_not_just_equal_tokens(acc: int) -> None:
    fa = transformer_flops(1024).flop_attention
    config = PlanConfig(16384, layout="packed", flop_attention=fa, pad_to_multiple_of=8)
    planner = EpochPlanner(SFT, config)
    plan = planner.plan(epoch=1, world_size=8, accumulate_grad_batches=acc)
    loads = rank_flops(planner, plan, fa)
    assert np.allclose(loads, rank_loads(planner, plan, "flops"))
    ratio = imbalance(loads)
    assert ratio.mean() <= 1.02 and np.percentile(ratio, 95) <= 1.05
    diag = diagnose(planner, plan)
    assert diag.imbalance_flops_mean == pytest.approx(ratio.mean())
    # Dealing by tokens (flop_attention=0) balances tokens, not compute: never better.
    by_tokens = EpochPlanner(
        SFT, PlanConfig(16384, layout="packed", flop_attention=0.0, pad_to_multiple_of=8)
    )
    token_plan = by_tokens.plan(epoch=1, world_size=8, accumulate_grad_batches=acc)
    assert imbalance(rank_flops(by_tokens, token_plan, fa)).mean() >= ratio.mean() - 1e-9


def test_packed_rows_fill_the_budget_without_padding() -> None:
    config = PlanConfig(8192, layout="packed", pad_to_multiple_of=64)
    planner = EpochPlanner(SFT[:5000], config)
    plan = planner.plan(epoch=0, world_size=4)
    diag = diagnose(planner, plan)
    slots = 0
    for t in plan.assign.reshape(-1):
        tokens = int(SFT[plan.micro_batch_ids(int(t))].sum())
        aligned = -(-tokens // 64) * 64
        assert aligned <= 8192
        slots += aligned
    assert diag.padded_tokens == slots and diag.real_tokens == int(SFT[:5000].sum())
    assert diag.padding_efficiency > 0.98  # alignment only
    assert diag.budget_fill > 0.9
    padded = diagnose(
        *(lambda p: (p, p.plan(epoch=0, world_size=4)))(
            EpochPlanner(SFT[:5000], PlanConfig(8192, pad_to_multiple_of=64))
        )
    )
    assert diag.num_steps < padded.num_steps  # fewer, fuller micro-batches than padding


def test_packed_layout_refuses_pairs_and_other_costs() -> None:
    with pytest.raises(ValueError, match="one length per example"):
        EpochPlanner(np.array([[3, 4], [5, 6]]), PlanConfig(16, layout="packed"))
    with pytest.raises(ValueError, match="cost='quadratic' cannot apply"):
        PlanConfig(16, layout="packed", cost="quadratic")


def test_zero_loss_tokens_are_allowed_for_one_token_documents() -> None:
    lengths = np.array([1, 5, 3, 1, 7])
    planner = EpochPlanner(lengths, PlanConfig(16, layout="packed"), lengths - 1)
    plan = planner.plan(epoch=0)
    assert int(plan.step_tokens.sum()) == int((lengths - 1).sum())


@pytest.mark.parametrize("mixing", ["per_step", "per_batch"])
def test_mixtures_pack_every_dataset_and_balance_compute(mixing: str) -> None:
    fa = 1 / 1024
    config = PlanConfig(8192, layout="packed", flop_attention=fa)
    sources = [
        DataSource(SFT[:3000], name="long"),
        DataSource(SFT[3000:6000] // 4 + 1, name="short"),
    ]
    planner = MixturePlanner(sources, config, mixing=mixing)
    plan = planner.plan(epoch=0, world_size=4, accumulate_grad_batches=2)
    assert plan.micro_batch_work is not None
    seen = np.concatenate([plan.micro_batch_ids(int(t)) for t in plan.assign.reshape(-1)])
    assert np.array_equal(np.sort(seen), np.arange(6000))
    key = planner.prepared.key
    for t in plan.assign.reshape(-1):
        assert int(key[plan.micro_batch_ids(int(t))].sum()) <= 8192
    flops = diagnose(planner, plan).imbalance_flops_mean
    if mixing == "per_step":  # a step's micro-batches come from one dataset: neighbours
        assert flops <= 1.05
    by_tokens = MixturePlanner(
        sources, PlanConfig(8192, layout="packed", flop_attention=0.0), mixing=mixing
    )
    token_plan = by_tokens.plan(epoch=0, world_size=4, accumulate_grad_batches=2)
    assert flops <= imbalance(rank_flops(by_tokens, token_plan, fa)).mean() + 1e-9
