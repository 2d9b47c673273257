"""PackingCollate (issue 16): packed rows against a plain-loop reference, plan checks, the loader
end to end, and the exactness of the token-mean loss over packed rows."""

from __future__ import annotations

import math
import pickle
import warnings
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import datasets
import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.utils.data import DataLoader

from lightning_varbatch import keys
from lightning_varbatch.data.collate import attach_plan
from lightning_varbatch.data.columnar import fetch_rows
from lightning_varbatch.data.loader import _BatchInfoDataset, token_budget_dataloader
from lightning_varbatch.data.micro_batch import MicroBatch
from lightning_varbatch.data.packed_collate import PackingCollate
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.loss import step_token_mean

IGNORE = -100
FEATURES = datasets.Features(
    {
        "tokens": datasets.List(datasets.Value("int32")),
        "id": datasets.Value("int64"),
        "name": datasets.Value("string"),
    }
)


def reference(
    seqs: list[list[int]], multiple: int = 1, limit: int = 0, pad_id: int = 0
) -> dict[str, Any]:
    """The packed row built plainly, token by token."""
    ids: list[int] = []
    positions: list[int] = []
    owner: list[int] = []
    labels: list[int] = []
    cu = [0]
    longest = 0
    for i, seq in enumerate(seqs):
        kept = seq[:limit] if limit else seq
        longest = max(longest, len(kept))
        for p, token in enumerate(kept):
            ids.append(token)
            positions.append(p)
            owner.append(i)
            labels.append(seq[p + 1] if p + 1 < len(seq) else IGNORE)  # never the next example
        cu.append(cu[-1] + len(kept))
    real = len(ids)
    width = real
    while width % multiple:
        width += 1
    pad = width - real
    return {
        "input_ids": [ids + [pad_id] * pad],
        "position_ids": [positions + [0] * pad],
        "seq_idx": [owner + [-1] * pad],
        "labels": [labels + [IGNORE] * pad],
        "cu_seqlens": cu,
        "max_seqlen": longest,
        keys.NTOKENS: sum(1 for x in labels if x != IGNORE),
        keys.NEXAMPLES: len(seqs),
        keys.PADDED_TOKENS: width,
        keys.INPUT_TOKENS: real,
    }


def micro(
    ids: list[int],
    ntokens: int,
    planned: list[int] | None = None,
    truncate_to: int | None = None,
    step_ntokens: int = 500,
) -> MicroBatch:
    return MicroBatch(
        ids,
        epoch=3,
        step=4,
        micro=1,
        rank=0,
        ntokens=ntokens,
        step_ntokens=step_ntokens,
        step_nexamples=99,
        truncate_to=truncate_to,
        planned_lengths=planned,
    )


def hf_dataset(seqs: list[list[int]]) -> datasets.Dataset:
    return datasets.Dataset.from_dict(
        {
            "tokens": seqs,
            "id": list(range(len(seqs))),
            "name": [f"n{i}" for i in range(len(seqs))],
        },
        features=FEATURES,
    )


def as_items(seqs: list[list[int]], kind: str, mb: MicroBatch | None = None) -> Any:
    """The micro-batch's items: dicts (varied containers) or Arrow rows of a HF dataset."""
    indices = list(range(len(seqs))) if mb is None else mb
    if kind == "arrow":
        return attach_plan(fetch_rows(hf_dataset(seqs), indices, columnar=True), indices)
    containers: list[Callable[[list[int]], Any]] = [
        list,
        np.array,
        torch.tensor,
        lambda s: torch.tensor(s, dtype=torch.int32),
    ]
    items = [
        {"tokens": containers[i % 4](seq), "id": i, "name": f"n{i}"} for i, seq in enumerate(seqs)
    ]
    return items if mb is None else attach_plan(items, mb)


def check_against_reference(batch: dict[str, Any], expected: dict[str, Any]) -> None:
    for name in ("input_ids", "position_ids", "seq_idx", "labels"):
        assert batch[name].dtype == torch.long, name
        assert batch[name].tolist() == expected[name], name
    assert batch["cu_seqlens"].dtype == torch.int32
    assert batch["cu_seqlens"].tolist() == expected["cu_seqlens"]
    assert isinstance(batch["max_seqlen"], int) and batch["max_seqlen"] == expected["max_seqlen"]
    for name in (keys.NTOKENS, keys.NEXAMPLES, keys.PADDED_TOKENS, keys.INPUT_TOKENS):
        assert batch[name].dim() == 0 and int(batch[name]) == expected[name], name
    assert int((batch["labels"] != IGNORE).sum()) == int(batch[keys.NTOKENS])


token_lists = st.lists(
    st.lists(st.integers(0, 50_000), min_size=0, max_size=12), min_size=1, max_size=7
)


@settings(max_examples=60, deadline=None)
@given(
    seqs=token_lists,
    kind=st.sampled_from(["list", "arrow"]),
    multiple=st.sampled_from([1, 3, 8]),
    own_limit=st.sampled_from([0, 1, 4, 9]),
    plan_limit=st.sampled_from([0, 2, 6]),
    with_plan=st.booleans(),
)
def test_matches_plain_reference(
    seqs: list[list[int]],
    kind: str,
    multiple: int,
    own_limit: int,
    plan_limit: int,
    with_plan: bool,
) -> None:
    limit = min((x for x in (own_limit, plan_limit if with_plan else 0) if x), default=0)
    expected = reference(seqs, multiple, limit, pad_id=7)
    collate = PackingCollate(pad_id=7, pad_to_multiple_of=multiple, truncate_to=own_limit or None)
    mb = None
    if with_plan:  # a plan that agrees with the data: what the sampler makes
        planned = [min(len(s), limit) if limit else len(s) for s in seqs]
        mb = micro(list(range(len(seqs))), expected[keys.NTOKENS], planned, plan_limit or None)
    batch = collate(as_items(seqs, kind, mb))
    check_against_reference(batch, expected)
    assert batch["id"].tolist() == list(range(len(seqs)))
    assert batch["name"] == [f"n{i}" for i in range(len(seqs))]
    assert (keys.STEP_NTOKENS in batch) == with_plan
    if with_plan:
        assert int(batch[keys.STEP_NTOKENS]) == 500 and int(batch[keys.STEP_NEXAMPLES]) == 99


@pytest.mark.parametrize("kind", ["list", "arrow"])
def test_labels_never_cross_an_example_boundary(kind: str) -> None:
    seqs = [[100, 101, 102], [200], [300, 301], [400, 401, 402, 403]]
    batch = PackingCollate(pad_to_multiple_of=4)(as_items(seqs, kind))
    assert batch["labels"].tolist() == [
        [101, 102, IGNORE, IGNORE, 301, IGNORE, 401, 402, 403, IGNORE, IGNORE, IGNORE]
    ]
    labels, owner = batch["labels"][0], batch["seq_idx"][0]
    real = labels != IGNORE
    assert torch.equal(labels[real] // 100 - 1, owner[real])  # the label is of the same example
    ends = batch["cu_seqlens"][1:].long() - 1
    assert (labels[ends] == IGNORE).all()  # every example's last token predicts nothing
    assert batch["cu_seqlens"].tolist() == [0, 3, 4, 6, 10] and batch["max_seqlen"] == 4
    assert int(batch[keys.NTOKENS]) == 2 + 0 + 1 + 3


def test_truncation_keeps_the_next_token_of_the_cut_example() -> None:
    batch = PackingCollate(truncate_to=2)([{"tokens": [1, 2, 3, 4]}, {"tokens": [5, 6]}])
    assert batch["input_ids"].tolist() == [[1, 2, 5, 6]]
    assert batch["labels"].tolist() == [[2, 3, 6, IGNORE]]  # 3 is example 0's own next token
    assert int(batch[keys.NTOKENS]) == 3  # min(len - 1, truncate_to) per example


@pytest.mark.parametrize("kind", ["list", "arrow"])
def test_ntokens_must_match_the_plan(kind: str) -> None:
    seqs = [[1, 2, 3], [4, 5]]
    good = as_items(seqs, kind, micro([0, 1], ntokens=3, planned=[3, 2]))
    assert int(PackingCollate()(good)[keys.NTOKENS]) == 3
    wrong = as_items(seqs, kind, micro([0, 1], ntokens=5, planned=[3, 2]))  # lengths, not -1
    with pytest.raises(ValueError, match=r"has 3 loss tokens .* plan counted 5: .*loss_lengths"):
        PackingCollate()(wrong)
    assert int(PackingCollate(check_ntokens=False)(wrong)[keys.NTOKENS]) == 3


@pytest.mark.parametrize("kind", ["list", "arrow"])
def test_width_must_fit_the_plan(kind: str) -> None:
    seqs = [[1, 2, 3], [4, 5, 6]]  # 6 tokens, 4 labels
    under = as_items(seqs, kind, micro([0, 1], ntokens=4, planned=[3, 2]))  # item 1 understated
    with pytest.raises(ValueError, match=r"dataset item 1 .* has 3 tokens .* budgeted .* of 2"):
        PackingCollate()(under)
    assert int(PackingCollate(check_widths=False)(under)[keys.PADDED_TOKENS]) == 6
    # The budget is the row: planned 5 tokens rounded up to 4 -> 8 slots; 6 tokens -> 8 fit.
    assert int(PackingCollate(pad_to_multiple_of=4)(under)[keys.PADDED_TOKENS]) == 8
    many = as_items([*seqs, [7, 8, 9]], kind, micro([0, 1, 2], ntokens=6, planned=[3, 3, 2]))
    with pytest.raises(ValueError, match=r"12 token slots where the plan allowed 8"):
        PackingCollate(pad_to_multiple_of=4)(many)
    # Truncation (the plan's) happens before the check.
    cut = as_items(seqs, kind, micro([0, 1], ntokens=4, planned=[2, 2], truncate_to=2))
    assert PackingCollate()(cut)["input_ids"].tolist() == [[1, 2, 4, 5]]


def test_bad_items_and_settings() -> None:
    with pytest.raises(ValueError, match="empty micro-batch"):
        PackingCollate()([])
    with pytest.raises(ValueError, match=r"expects a 'tokens' field .* item 1 "):
        PackingCollate()([{"tokens": [1]}, {"text": [2]}])
    with pytest.raises(TypeError, match="mapping"):
        PackingCollate()([[1, 2]])
    with pytest.raises(ValueError, match="1-D"):
        PackingCollate()([{"tokens": [[1, 2]]}])
    with pytest.raises(TypeError, match="integer token ids"):
        PackingCollate()([{"tokens": [1.5, 2.0]}])
    with pytest.raises(ValueError, match="packed batch's own entries"):
        PackingCollate()([{"tokens": [1, 2], "labels": [2, 3]}])
    with pytest.raises(ValueError, match="expects a 'ids' column"):
        PackingCollate(field="ids")(as_items([[1]], "arrow"))
    assert PackingCollate(field="ids")([{"ids": [4, 5]}])["labels"].tolist() == [[5, IGNORE]]
    assert PackingCollate(ignore_index=-1)([{"tokens": [4]}])["labels"].tolist() == [[-1]]
    for bad in (
        {"pad_to_multiple_of": 0},
        {"truncate_to": 0},
        {"field": "labels"},
        {"check_ntokens": "yes"},
        {"pad_id": 1.0},
        {"pad_id": True},
    ):
        with pytest.raises((TypeError, ValueError)):
            PackingCollate(**bad)
    collate = pickle.loads(pickle.dumps(PackingCollate(pad_to_multiple_of=8).with_truncation(5)))
    assert (collate.pad_to_multiple_of, collate.truncate_to) == (8, 5)
    assert PackingCollate(truncate_to=3).with_truncation(5).truncate_to == 3


def test_check_item() -> None:
    PackingCollate().check_item({"tokens": [1, 2, 3]}, 4, planned_length=3)
    PackingCollate().check_item({"tokens": [1, 2, 3]}, 4, planned_length=2, truncate_to=2)
    with pytest.raises(ValueError, match="dataset item 4 has 3 tokens"):
        PackingCollate().check_item({"tokens": [1, 2, 3]}, 4, planned_length=2)
    with pytest.raises(TypeError, match="dataset item 4"):
        PackingCollate().check_item({"tokens": "abc"}, 4)


def random_corpus(n: int, seed: int, low: int = 2, high: int = 24) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 50, size=int(k)).tolist() for k in rng.integers(low, high, size=n)]


@pytest.mark.parametrize("source", ["list", "hf", "hf-columnar"])
def test_loader_end_to_end_every_example_once(source: str) -> None:
    seqs = random_corpus(120, seed=1)
    lengths = np.array([len(s) for s in seqs])
    max_tokens = 64
    sampler = TokenBudgetBatchSampler(
        lengths, max_tokens, layout="packed", pad_to_multiple_of=8, loss_lengths=lengths - 1,
        rank=0, world_size=1, accumulate_grad_batches=2,
    )  # fmt: skip
    collate = PackingCollate(pad_to_multiple_of=8)
    if source == "list":
        data: Any = [{"tokens": s, "id": i} for i, s in enumerate(seqs)]
        loader: Any = token_budget_dataloader(data, sampler, collate_fn=collate)
    else:
        data = hf_dataset(seqs).remove_columns(["name"])
        if source == "hf":
            loader = token_budget_dataloader(data, sampler, collate_fn=collate)
        else:  # the Arrow path the loader gives PaddingCollate, wired by hand
            wrapped = _BatchInfoDataset(data, columnar=True)
            loader = DataLoader(wrapped, batch_sampler=sampler, collate_fn=collate)
    seen: list[int] = []
    step_tokens = 0
    for batch in loader:
        ids = batch["id"].tolist()
        seen += ids
        assert batch["input_ids"].shape == (1, int(batch[keys.PADDED_TOKENS]))
        assert int(batch[keys.INPUT_TOKENS]) <= max_tokens
        assert int(batch[keys.PADDED_TOKENS]) <= max_tokens  # max_tokens is a multiple of 8
        expected = reference([seqs[i] for i in ids], multiple=8)
        check_against_reference(batch, expected)
        step_tokens += int(batch[keys.NTOKENS])
    assert sorted(seen) == list(range(len(seqs)))
    assert step_tokens == int((lengths - 1).sum())


def test_loader_with_planner_truncation_counts_agree() -> None:
    """oversize='truncate' cuts loss_lengths to min(len - 1, cut): the packed labels agree."""
    seqs = [*random_corpus(100, seed=2, high=12), list(range(40)), list(range(30))]
    lengths = np.array([len(s) for s in seqs])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the planner warns that it truncates
        sampler = TokenBudgetBatchSampler(
            lengths, 24, layout="packed", loss_lengths=lengths - 1, rank=0, world_size=1,
            oversize="truncate",
        )  # fmt: skip
    assert sampler.truncate_to == 24
    data = [{"tokens": s, "id": i} for i, s in enumerate(seqs)]
    batches = list(token_budget_dataloader(data, sampler, collate_fn=PackingCollate()))
    cut = [b for b in batches if {100, 101} & set(b["id"].tolist())]
    assert all(int(b[keys.PADDED_TOKENS]) <= 24 for b in batches)
    assert [int(b[keys.NTOKENS]) for b in cut] == [24, 24]  # min(len - 1, 24), checked vs plan


class TinyLM(nn.Module):
    """One causal attention layer that sees only tokens of the same example (seq_idx)."""

    def __init__(self, vocab: int = 50, dim: int = 16, max_len: int = 64) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.position = nn.Embedding(max_len, dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, vocab)

    def forward(
        self, ids: torch.Tensor, position_ids: torch.Tensor, seq_idx: torch.Tensor
    ) -> torch.Tensor:
        h = self.embed(ids[0]) + self.position(position_ids[0])
        q, k, v = self.qkv(h).chunk(3, dim=-1)
        t = torch.arange(ids.shape[1])
        allowed = (seq_idx[0, :, None] == seq_idx[0, None, :]) & (t[None, :] <= t[:, None])
        scores = (q @ k.T / math.sqrt(q.shape[-1])).masked_fill(~allowed, -math.inf)
        return self.out(h + scores.softmax(-1) @ v)  # (T, vocab)


@pytest.fixture
def one_thread() -> Any:
    """Tiny matmuls: one intra-op thread (several contend badly on a busy machine)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_token_mean_loss_over_packed_rows_is_exact() -> None:
    torch.manual_seed(0)
    model = TinyLM().double()
    seqs = random_corpus(60, seed=3)
    lengths = np.array([len(s) for s in seqs])
    acc = 2
    sampler = TokenBudgetBatchSampler(
        lengths, 64, layout="packed", pad_to_multiple_of=8, loss_lengths=lengths - 1,
        rank=0, world_size=1, accumulate_grad_batches=acc,
    )  # fmt: skip
    plan = [mb for mb in sampler if isinstance(mb, MicroBatch)]
    data = [{"tokens": s, "id": i} for i, s in enumerate(seqs)]
    loader = token_budget_dataloader(data, sampler, collate_fn=PackingCollate(pad_to_multiple_of=8))
    trainer = SimpleNamespace(world_size=1, accumulate_grad_batches=acc)
    packed: dict[int, torch.Tensor] = {}
    with torch.no_grad():
        for batch, mb in zip(loader, plan, strict=True):
            assert batch["id"].tolist() == list(mb)
            cu = batch["cu_seqlens"].long()
            segments = torch.repeat_interleave(torch.arange(len(cu) - 1), cu.diff())
            assert torch.equal(batch["seq_idx"][0, : int(cu[-1])], segments)
            logits = model(batch["input_ids"], batch["position_ids"], batch["seq_idx"])
            loss_sum = F.cross_entropy(logits, batch["labels"][0], ignore_index=IGNORE,
                                       reduction="sum")  # fmt: skip
            # Lightning divides each micro-batch's loss by the accumulation: the step's loss.
            value = step_token_mean(loss_sum, batch, trainer) / acc
            packed[mb.step] = packed.get(mb.step, torch.zeros((), dtype=torch.float64)) + value
        for step in sorted(packed):
            members = [i for mb in plan if mb.step == step for i in mb]
            total = torch.zeros((), dtype=torch.float64)
            for i in members:  # each example alone: its own positions, no neighbours
                ids = torch.tensor([seqs[i]])
                logits = model(ids, torch.arange(len(seqs[i]))[None], torch.zeros_like(ids))
                total += F.cross_entropy(logits[:-1], ids[0, 1:], reduction="sum")
            expected = total / sum(len(seqs[i]) - 1 for i in members)
            assert packed[step].dtype == torch.float64
            torch.testing.assert_close(packed[step], expected, rtol=1e-12, atol=1e-12)
    assert len(packed) == len(plan) // acc
