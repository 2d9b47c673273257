"""The batch sampler as torch and users see it: len, epochs, DataLoader, checkpoints."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_varbatch import EpochPlanner, MicroBatch, PlanConfig, TokenBudgetBatchSampler
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError

LENGTHS = np.random.default_rng(0).integers(1, 50, size=(3000, 2))


def make(**kwargs: object) -> TokenBudgetBatchSampler:
    args: dict[str, object] = {"rank": 0, "world_size": 1, **kwargs}
    return TokenBudgetBatchSampler(LENGTHS, 512, **args)  # type: ignore[arg-type]


def test_len_is_exact_and_batches_carry_their_place() -> None:
    sampler = make(world_size=3, rank=1, accumulate_grad_batches=2)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    assert all(isinstance(b, MicroBatch) for b in batches)
    assert [(b.step, b.micro) for b in batches[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert {b.rank for b in batches} == {1}
    assert all(b.epoch == 0 for b in batches)


def test_set_epoch_reshuffles_and_same_epoch_repeats() -> None:
    sampler = make()
    first = [list(b) for b in sampler]
    again = [list(b) for b in sampler]  # iterating again without set_epoch: the same epoch
    sampler.set_epoch(1)
    second = [list(b) for b in sampler]
    assert first == again
    assert first != second
    assert sorted(i for b in first for i in b) == sorted(i for b in second for i in b)


def test_rank_and_world_size_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "4")
    sampler = TokenBudgetBatchSampler(LENGTHS, 512)
    assert (sampler.rank, sampler.world_size) == (2, 4)
    explicit = TokenBudgetBatchSampler(LENGTHS, 512, rank=2, world_size=4)
    assert [list(b) for b in sampler] == [list(b) for b in explicit]


class ToyDataset(Dataset[torch.Tensor]):
    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((int(self.lengths[i].max()),), i)


def pad_collate(items: list[torch.Tensor]) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence(items, batch_first=True, padding_value=-1)


@pytest.mark.parametrize("workers", [0, 2])
def test_dataloader_batches_respect_the_budget(workers: int) -> None:
    sampler = make(world_size=2, rank=0)
    loader = DataLoader(
        ToyDataset(LENGTHS), batch_sampler=sampler, collate_fn=pad_collate, num_workers=workers
    )
    assert len(loader) == len(sampler)
    seen = 0
    twin = make(world_size=2, rank=0)  # iterating one sampler twice at once would interleave
    for batch, ids in zip(loader, twin, strict=True):
        assert batch.numel() <= 512  # padded tokens within the budget
        assert sorted(batch[:, 0].tolist()) == sorted(ids)
        seen += 1
    assert seen == len(sampler)


def test_state_dict_resumes_mid_epoch_in_a_fresh_process_like_object() -> None:
    sampler = make(world_size=2, rank=1)
    sampler.set_epoch(3)
    it = iter(sampler)
    taken = [list(next(it)) for _ in range(5)]
    state = pickle.loads(pickle.dumps(sampler.state_dict()))  # plain values only
    assert state["consumed"] == 5 and state["epoch"] == 3
    resumed = make(world_size=2, rank=1)
    resumed.load_state_dict(state)
    resumed.set_epoch(3)
    fresh = make(world_size=2, rank=1)
    fresh.set_epoch(3)
    full = [list(b) for b in fresh]
    assert len(resumed) == len(full) - 5
    assert taken + [list(b) for b in resumed] == full
    # the next epoch starts from the beginning
    resumed.set_epoch(4)
    fresh.set_epoch(4)
    assert [list(b) for b in resumed] == [list(b) for b in fresh]


def test_state_dict_with_explicit_trained_count_ignores_prefetch() -> None:
    sampler = make()
    it = iter(sampler)
    batches = [list(next(it)) for _ in range(6)]  # a DataLoader ran ahead by 4
    state = sampler.state_dict(consumed=2)
    resumed = make()
    resumed.load_state_dict(state)
    assert [list(b) for b in resumed][:4] == batches[2:]


def test_resume_with_a_finished_epoch_yields_nothing_until_next_epoch() -> None:
    sampler = make()
    total = len(list(sampler))
    state = sampler.state_dict()
    assert state["consumed"] == total
    resumed = make()
    resumed.load_state_dict(state)
    assert len(resumed) == 0 and list(resumed) == []
    assert len(list(resumed)) == total  # iterating once more starts the epoch over


def test_resume_with_a_new_world_size_replans_the_rest() -> None:
    old = [make(world_size=4, rank=r, accumulate_grad_batches=2) for r in range(4)]
    consumed = []
    for s in old:
        it = iter(s)
        consumed += [i for _ in range(6) for i in next(it)]
    state = old[0].state_dict()
    new = [make(world_size=3, rank=r) for r in range(3)]
    for s in new:
        s.load_state_dict(state)
    rest = [[list(b) for b in s] for s in new]
    assert len({len(r) for r in rest}) == 1
    everything = consumed + [i for r in rest for b in r for i in b]
    assert sorted(everything) == list(range(len(LENGTHS)))
    # a second checkpoint of the re-planned epoch resumes too (history is kept)
    it = iter(new[0])
    next(it)
    twice = new[0].state_dict()
    assert twice["history"] == [[4, 2, 6, [512] * 4]] and twice["consumed"] == 1
    again = make(world_size=3, rank=0)
    again.load_state_dict(twice)
    assert [list(b) for b in again] == rest[0][1:]


def test_set_distributed_mid_epoch_replans() -> None:
    sampler = make(world_size=2, rank=0)
    it = iter(sampler)
    head = [list(next(it)) for _ in range(3)]
    sampler.set_distributed(0, 1)
    assert sampler.state_dict()["history"] == [[2, 1, 3, [512, 512]]]
    assert all(set(b).isdisjoint(h) for b in sampler for h in head)


@pytest.mark.parametrize(
    ("change", "match", "changed"),
    [
        ({"seed": 1}, "seed: saved 1, now 0", ["seed"]),
        ({"num_examples": 7}, "num_examples: saved 7, now 3000", ["num_examples"]),
        ({"fingerprint": "abc"}, "fingerprint: saved 'abc'", ["fingerprint"]),
        ({"fingerprint": "abc", "settings": None}, "fingerprint: saved 'abc'", ["fingerprint"]),
    ],
)
def test_load_state_dict_rejects_other_data_or_settings(
    change: dict[str, object], match: str, changed: list[str]
) -> None:
    state = {**make().state_dict(), **change}
    with pytest.raises(ResumeMismatchError, match=match) as caught:
        make().load_state_dict(state)
    assert type(caught.value) is ResumeMismatchError and caught.value.changed == changed


def test_load_state_dict_refuses_an_unknown_version() -> None:
    state = {**make().state_dict(), "version": 9}
    with pytest.raises(ValueError, match="version 9; this version of lightning_varbatch") as e:
        make().load_state_dict(state)
    assert type(e.value) is ValueError  # a damaged state, not data that changed


def test_load_state_dict_lists_every_mismatch() -> None:
    state = {**make().state_dict(), "seed": 5, "num_examples": 1}
    with pytest.raises(
        ResumeMismatchError, match="seed: saved 5, now 0; num_examples: saved 1"
    ) as e:
        make().load_state_dict(state)
    assert e.value.changed == ["seed", "num_examples"]


def test_load_state_dict_is_strict_about_keys() -> None:
    state = make().state_dict()
    del state["history"]
    state["extra"] = 1
    with pytest.raises(ValueError, match=r"missing keys \['history'\], unknown keys \['extra'\]"):
        make().load_state_dict(state)


def test_settings_change_the_fingerprint() -> None:
    state = make().state_dict()
    with pytest.raises(ResumeMismatchError, match="max_tokens: saved 512, now 1024") as e:
        TokenBudgetBatchSampler(LENGTHS, 1024, rank=0, world_size=1).load_state_dict(state)
    assert e.value.changed == ["max_tokens"]  # named from the saved settings, not the hash
    other = TokenBudgetBatchSampler(LENGTHS, 1024, seed=3, tail="pad", rank=0, world_size=1)
    with pytest.raises(ResumeMismatchError) as e:
        other.load_state_dict(state)
    assert e.value.changed == ["seed", "max_tokens", "tail"]


def test_consumed_out_of_range() -> None:
    sampler = make()
    with pytest.raises(SettingValueError, match=r"consumed must be in \[0, ") as e:
        sampler.state_dict(consumed=10**6)
    assert (e.value.setting, e.value.value) == ("consumed", 10**6)
    state = {**sampler.state_dict(), "consumed": 10**6}
    with pytest.raises(ResumeMismatchError, match="1000000 micro-batches of epoch 0") as e:
        make().load_state_dict(state)
    assert e.value.changed == ["consumed"]


# -- resume refuses a plan made from other lengths (issue 12, section 3) ---------------------


def _changed_lengths() -> np.ndarray:
    """The same number of examples and settings, but a fifth of the lengths changed."""
    changed = LENGTHS.copy()
    changed[::5] = np.minimum(changed[::5], 20)  # e.g. a lowered max_length after an OOM
    assert (changed != LENGTHS).any()
    return changed


def _half_epoch_state(**kwargs: object) -> tuple[dict[str, object], list[list[int]]]:
    sampler = make(**kwargs)
    sampler.set_epoch(2)
    it = iter(sampler)
    taken = [list(next(it)) for _ in range(len(sampler) // 2)]
    return sampler.state_dict(), taken


def test_resume_with_other_lengths_is_refused_and_says_how_to_restart() -> None:
    state, _ = _half_epoch_state()
    other = TokenBudgetBatchSampler(_changed_lengths(), 512, rank=0, world_size=1)
    with pytest.raises(ResumeMismatchError, match=r"the lengths .* differ") as error:
        other.load_state_dict(state)
    assert error.value.changed == ["lengths"]
    assert "on_mismatch='restart_epoch'" in str(error.value)
    assert "epoch 2" in str(error.value)


def test_resume_with_other_lengths_and_another_world_size_is_refused() -> None:
    state, _ = _half_epoch_state(world_size=2)
    other = TokenBudgetBatchSampler(_changed_lengths(), 512, rank=0, world_size=3)
    with pytest.raises(ResumeMismatchError, match="lengths digest") as error:
        other.load_state_dict(state)
    assert error.value.changed == ["lengths"]


def test_loss_lengths_are_part_of_the_digest() -> None:
    a = TokenBudgetBatchSampler(LENGTHS, 512, rank=0, world_size=1)
    b = TokenBudgetBatchSampler(
        LENGTHS, 512, rank=0, world_size=1, loss_lengths=np.maximum(LENGTHS[:, 1] - 1, 1)
    )
    with pytest.raises(ResumeMismatchError, match="lengths digest") as error:
        b.load_state_dict(a.state_dict())
    assert error.value.changed == ["lengths"]


@pytest.mark.parametrize("world_size", [1, 2])
def test_restart_epoch_keeps_the_epoch_and_trains_every_example_once(world_size: int) -> None:
    state, _ = _half_epoch_state(world_size=world_size)
    counted = int(state["consumed"])  # type: ignore[call-overload]
    ranks = [
        TokenBudgetBatchSampler(_changed_lengths(), 512, rank=r, world_size=world_size)
        for r in range(world_size)
    ]
    for s in ranks:
        with pytest.warns(UserWarning, match="Starting epoch 2 afresh"):
            s.load_state_dict(state, on_mismatch="restart_epoch")
        s.set_epoch(2)  # what Lightning does next: the same epoch keeps the restart
    assert all(s.epoch == 2 for s in ranks)
    batches = [[b for b in s] for s in ranks]
    assert len({len(b) for b in batches}) == 1
    ids = sorted(i for rank in batches for b in rank for i in b)
    assert ids == list(range(len(LENGTHS)))  # every example of the epoch exactly once
    assert all(b.epoch == 2 for rank in batches for b in rank)
    # the loop's restored batch counter plus the fresh plan: Lightning runs all of it
    assert ranks[0].epoch_length == counted + len(batches[0])
    # a checkpoint during the restarted epoch resumes exactly, offset included
    again = TokenBudgetBatchSampler(_changed_lengths(), 512, rank=0, world_size=world_size)
    again.set_epoch(2)
    it = iter(ranks[0])
    mid = ranks[0].state_dict(consumed=counted + 3)  # counted from the epoch's start
    assert mid["restart_offset"] == counted
    fresh = TokenBudgetBatchSampler(_changed_lengths(), 512, rank=0, world_size=world_size)
    fresh.load_state_dict(mid)
    assert [list(b) for b in fresh] == [list(b) for b in batches[0][3:]]
    assert fresh.epoch_length == ranks[0].epoch_length
    assert fresh.consumed_from_epoch_count(counted + 5) == 5
    del it, again
    # the next epoch has no offset
    fresh.set_epoch(3)
    assert fresh.epoch_length == len(fresh)


def test_restart_epoch_with_matching_state_resumes_exactly() -> None:
    state, taken = _half_epoch_state()
    resumed = make()
    resumed.load_state_dict(state, on_mismatch="restart_epoch")
    full = make()
    full.set_epoch(2)
    assert taken + [list(b) for b in resumed] == [list(b) for b in full]


def test_old_state_without_digest_is_accepted_with_a_warning() -> None:
    state, taken = _half_epoch_state()
    old = {
        k: v
        for k, v in state.items()
        if k not in ("lengths_digest", "restart_offset", "settings", "rank_budgets", "ledger")
    }
    old["version"] = 1
    resumed = make()
    with pytest.warns(UserWarning, match="cannot prove that the lengths are unchanged"):
        resumed.load_state_dict(old)
    full = make()
    full.set_epoch(2)
    assert taken + [list(b) for b in resumed] == [list(b) for b in full]
    restarted = make()
    with pytest.warns(UserWarning, match="afresh"):
        restarted.load_state_dict(old, on_mismatch="restart_epoch")
    assert sorted(i for b in restarted for i in b) == list(range(len(LENGTHS)))


@pytest.mark.parametrize("state", [None, [1, 2], "state", 3])
def test_load_state_dict_of_a_non_dict_is_a_type_error(state: object) -> None:
    with pytest.raises(TypeError, match="expects the dict returned by"):
        make().load_state_dict(state)  # type: ignore[arg-type]


def test_load_state_dict_bad_values_and_options() -> None:
    state = make().state_dict()
    with pytest.raises(ValueError, match="damaged: epoch is -1, not an integer >= 0"):
        make().load_state_dict({**state, "epoch": -1})
    with pytest.raises(ValueError, match=r"damaged: history\[0\] has 2 items"):
        make().load_state_dict({**state, "history": [[1, 2]]})
    with pytest.raises(SettingValueError, match="on_mismatch must be one of") as caught:
        make().load_state_dict(state, on_mismatch="restart")  # type: ignore[arg-type]
    assert caught.value.setting == "on_mismatch" and caught.value.value == "restart"


def test_batches_carry_their_planned_lengths() -> None:
    sampler = make(oversize="truncate", max_examples=None)
    for batch in sampler:
        assert batch.planned_lengths == LENGTHS[list(batch)].max(axis=1).tolist()


def test_from_planner_builds_through_init() -> None:
    """from_planner is a normal construction: a subclass's __init__ runs, no __new__ bypass."""
    from lightning_varbatch.planner.epoch_planner import EpochPlanner
    from lightning_varbatch.planner.settings import PlanConfig

    seen: list[str] = []

    class Traced(TokenBudgetBatchSampler):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            seen.append("init")
            super().__init__(*args, **kwargs)

    planner = EpochPlanner(LENGTHS, PlanConfig(max_tokens=512, seed=4))
    s = Traced.from_planner(planner, rank=1, world_size=2, accumulate_grad_batches=2, epoch=3)
    assert seen == ["init"] and s.planner is planner and s.config.seed == 4
    assert (s.rank, s.world_size, s.accumulate_grad_batches, s.epoch) == (1, 2, 2, 3)
    direct = TokenBudgetBatchSampler(
        LENGTHS, 512, seed=4, rank=1, world_size=2, accumulate_grad_batches=2, epoch=3
    )
    assert [list(b) for b in s] == [list(b) for b in direct]
    with pytest.raises(SettingValueError, match="accumulate_grad_batches"):
        TokenBudgetBatchSampler.from_planner(
            planner, rank=0, world_size=1, accumulate_grad_batches=0
        )


def test_sampler_arguments_are_the_plan_settings() -> None:
    """Each PlanConfig field is a sampler keyword with the same default, restated nowhere."""
    import dataclasses
    import inspect

    from lightning_varbatch.planner.settings import PlanConfig

    params = inspect.signature(TokenBudgetBatchSampler.__init__).parameters
    assert params["settings"].kind is inspect.Parameter.VAR_KEYWORD
    restated = {f.name for f in dataclasses.fields(PlanConfig)} & set(params) - {"max_tokens"}
    assert restated == set(), "the sampler forwards PlanConfig's fields, it does not list them"
    sampler = TokenBudgetBatchSampler(LENGTHS, 512, rank=0, world_size=1)
    for setting in dataclasses.fields(PlanConfig):
        if setting.default is not dataclasses.MISSING:
            assert getattr(sampler.config, setting.name) == setting.default, setting.name
    with pytest.raises(SettingTypeError, match="did you mean 'max_examples'"):
        TokenBudgetBatchSampler(LENGTHS, 512, rank=0, world_size=1, max_example=4)


def test_ranks_in_one_process_share_the_planners_plan_and_other_inputs_plan_again() -> None:
    planner = EpochPlanner(np.random.default_rng(0).integers(1, 30, 500), PlanConfig(64))
    ranks = [TokenBudgetBatchSampler.from_planner(planner, rank=r, world_size=4) for r in range(4)]
    assert all(s.plan is ranks[0].plan for s in ranks)  # planned once, not per rank
    again = planner.plan_resumed(0, 4, 1)
    assert again is ranks[0].plan
    other = planner.plan_resumed(1, 4, 1)
    assert other is not again and other.epoch == 1
    fresh = EpochPlanner(planner.prepared.key, PlanConfig(64)).plan_resumed(1, 4, 1)
    assert np.array_equal(fresh.assign, other.assign)  # the cache returns what a plan gives
