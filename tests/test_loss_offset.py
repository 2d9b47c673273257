"""The planner's loss offset: loss tokens derived exactly, also after truncation.

The reference is independent of the planner: every example is collated on its own by the
library's collates (``PaddingCollate(loss_offset=k)`` cuts then shifts; ``PackingCollate``
labels the kept tokens with the next token of the whole example), and its real loss-token
count is what the plan must count, for single sequences and (source, target) pairs, padded
and packed layouts, with and without ``oversize="truncate"``.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch

from lightning_varbatch import (
    EpochPlanner,
    PackingCollate,
    PaddingCollate,
    PlanConfig,
    TokenBudgetBatchSampler,
    TokenBudgetDataModule,
    token_budget_dataloader,
)
from lightning_varbatch.errors import SettingValueError

RNG = np.random.default_rng(7)
SINGLE = RNG.integers(2, 40, 60)  # a step of one-token examples has no loss token
SINGLE[::9] = 120  # over the budget below: truncated under oversize="truncate"
PAIRS = np.stack([SINGLE, np.clip(SINGLE + RNG.integers(-5, 6, SINGLE.size), 1, None)], 1)
BUDGET = 64


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the oversize warning
        yield


def _items(lengths: np.ndarray) -> list[dict[str, list[int]]]:
    if lengths.ndim == 2:
        return [
            {"source": list(range(1, int(s) + 1)), "target": list(range(1, int(t) + 1))}
            for s, t in lengths
        ]
    return [{"tokens": list(range(1, int(n) + 1))} for n in lengths]


def _reference(lengths: np.ndarray, layout: str, offset: int, cut: int | None) -> list[int]:
    """Each example's real loss tokens, counted by collating it on its own."""
    if layout == "packed":
        collate: Any = PackingCollate(truncate_to=cut)
        assert offset == 1  # PackingCollate's labels are shifted by one
    else:
        collate = PaddingCollate(loss_offset=offset, truncate_to=cut)
    return [int(collate([item])["ntokens"]) for item in _items(lengths)]


CASES = [
    (lengths, layout, offset, oversize)
    for lengths, layout in ((SINGLE, "padded"), (PAIRS, "padded"), (SINGLE, "packed"))
    for offset in ((1,) if layout == "packed" else (1, 3))
    for oversize in ("error", "truncate")
]


@pytest.mark.parametrize(
    ("lengths", "layout", "offset", "oversize"),
    CASES,
    ids=[f"{'pairs' if c[0].ndim == 2 else 'single'}-{c[1]}-k{c[2]}-{c[3]}" for c in CASES],
)
def test_planned_loss_tokens_are_the_collates_real_count(
    lengths: np.ndarray, layout: str, offset: int, oversize: str
) -> None:
    budget = BUDGET if oversize == "truncate" else 4 * int(lengths.max())
    config = PlanConfig(budget, loss_offset=offset, oversize=oversize, layout=layout)  # type: ignore[arg-type]
    planner = EpochPlanner(lengths, config)
    assert (planner.truncate_to is not None) == (oversize == "truncate")
    expected = _reference(lengths, layout, offset, planner.truncate_to)
    assert planner.prepared.loss.tolist() == expected
    plan = planner.plan(0, 2, 2)
    assert int(plan.step_tokens.sum()) == sum(expected) + _repeated(plan, expected)


def _repeated(plan: Any, loss: list[int]) -> int:
    """Loss tokens of the examples a tail policy repeated (none with the default spread)."""
    counts = np.bincount(plan.order[: int(plan.micro_batch_size.sum())], minlength=len(loss))
    return int(((counts - 1).clip(min=0) * np.array(loss)).sum()) if plan.num_duplicated else 0


@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_truncated_teacher_forcing_trains_with_the_ntokens_check_on(layout: str) -> None:
    """The case that failed before: loss_lengths = lengths - 1 miscounted cut examples."""
    sampler = TokenBudgetBatchSampler(
        SINGLE, BUDGET, rank=0, world_size=1, oversize="truncate", layout=layout, loss_offset=1
    )
    loader = token_budget_dataloader(_items(SINGLE), sampler)  # the plan's collate, checked
    counted = sum(int(batch["ntokens"]) for batch in loader)
    assert counted == sum(_reference(SINGLE, layout, 1, sampler.truncate_to))
    if layout == "padded":  # the old way counted min(L - 1, T) for a cut example, not T - 1
        assert sampler.truncate_to is not None
        old = np.minimum(SINGLE - 1, sampler.truncate_to)
        assert counted < int(old.sum())


def test_the_sampler_takes_a_plan_config_or_its_fields() -> None:
    config = PlanConfig(BUDGET, loss_offset=1, oversize="truncate", seed=3)
    by_config = TokenBudgetBatchSampler(SINGLE, config=config, rank=0, world_size=1)
    by_keywords = TokenBudgetBatchSampler(
        SINGLE, BUDGET, loss_offset=1, oversize="truncate", seed=3, rank=0, world_size=1
    )
    assert by_config.config == by_keywords.config == config

    def batches(sampler: TokenBudgetBatchSampler) -> list[tuple[list[int], int]]:
        return [(list(b), b.ntokens) for b in sampler]  # type: ignore[attr-defined]

    assert batches(by_config) == batches(by_keywords)
    with pytest.raises(SettingValueError, match="not both") as error:
        TokenBudgetBatchSampler(SINGLE, config=config, seed=4, rank=0, world_size=1)
    assert error.value.setting == "seed"


def test_loss_lengths_and_a_loss_offset_are_refused_together() -> None:
    with pytest.raises(SettingValueError, match="pass one of them") as error:
        TokenBudgetBatchSampler(
            SINGLE, 4 * 120, loss_lengths=SINGLE - 1, loss_offset=1, rank=0, world_size=1
        )
    assert error.value.setting == "loss_offset"
    data = _items(SINGLE)
    with pytest.raises(SettingValueError, match="pass one of them") as error:
        TokenBudgetDataModule(data, SINGLE, 4 * 120, train_loss_lengths=SINGLE - 1, loss_offset=1)
    assert error.value.setting == "loss_offset"


def test_the_default_offset_leaves_fingerprints_and_states_unchanged() -> None:
    assert PlanConfig(BUDGET).fingerprint() == PlanConfig(BUDGET, loss_offset=0).fingerprint()
    assert "loss_offset" not in PlanConfig(BUDGET).plain()
    assert PlanConfig(BUDGET, loss_offset=1).fingerprint() != PlanConfig(BUDGET).fingerprint()
    plain = TokenBudgetBatchSampler(SINGLE, 4 * 120, rank=0, world_size=1)
    assert "loss_offset" not in plain.state_dict()["settings"]
    shifted = TokenBudgetBatchSampler(SINGLE, 4 * 120, rank=0, world_size=1, loss_offset=1)
    state = shifted.state_dict()
    assert state["settings"]["loss_offset"] == 1
    with pytest.raises(ValueError, match="loss_offset: saved 1, now 0"):
        plain.load_state_dict(state)


@pytest.mark.parametrize(("lengths", "layout"), [(SINGLE, "padded"), (PAIRS, "padded"),
                                                 (SINGLE, "packed")])  # fmt: skip
def test_the_datamodule_gives_its_collate_the_plans_offset(
    lengths: np.ndarray, layout: str
) -> None:
    dm = TokenBudgetDataModule(
        _items(lengths), lengths, BUDGET, oversize="truncate", layout=layout, loss_offset=1,
        val_dataset=_items(lengths[:20]), val_lengths=lengths[:20], val_max_tokens=4 * 120,
    )  # fmt: skip
    collate = dm.collate_for("train")
    assert getattr(collate, "loss_offset", 1) == 1 and dm.loss_offset == 1
    counted = sum(int(b["ntokens"]) for b in dm.train_dataloader())  # ntokens checked
    truncate_to = dm.planner("train").truncate_to
    assert counted == sum(_reference(lengths, layout, 1, truncate_to))
    val = sum(int(b["ntokens"]) for b in dm.val_dataloader())
    assert val == sum(_reference(lengths[:20], layout, 1, None))
    if layout == "padded":
        with pytest.raises(SettingValueError, match="loss_offset=1") as error:
            TokenBudgetDataModule(
                _items(lengths), lengths, BUDGET, oversize="truncate", loss_offset=1,
                collate=PaddingCollate(),
            )  # fmt: skip
        assert error.value.setting == "collate"


def test_token_mean_gradient_is_exact_with_a_loss_offset() -> None:
    """float64: the step's token mean over micro-batches equals one full-batch token mean."""
    torch.manual_seed(0)
    weight = torch.randn(8, dtype=torch.float64, requires_grad=True)
    sampler = TokenBudgetBatchSampler(
        SINGLE, BUDGET, rank=0, world_size=1, accumulate_grad_batches=3, oversize="truncate",
        loss_offset=1, shuffle=False,
    )  # fmt: skip
    loader = token_budget_dataloader(_items(SINGLE), sampler)
    batches = list(loader)[:3]  # optimizer step 0: 3 micro-batches of the one rank

    def token_losses(batch: dict[str, Any]) -> torch.Tensor:
        tokens = batch["tokens"][:, 1:]  # teacher forcing: predict tokens[1:]
        mask = batch["tokens_mask"][:, 1:]
        return (weight[tokens % 8] * mask).sum()

    total = sum(token_losses(b) / b["step_ntokens"] for b in batches)
    assert isinstance(total, torch.Tensor)
    (grad,) = torch.autograd.grad(total, weight)
    everything = torch.stack([token_losses(b) for b in batches]).sum()
    count = sum(int(b["ntokens"]) for b in batches)
    assert count == int(batches[0]["step_ntokens"])
    (reference,) = torch.autograd.grad(everything / count, weight)
    torch.testing.assert_close(grad, reference, rtol=0, atol=1e-12)
