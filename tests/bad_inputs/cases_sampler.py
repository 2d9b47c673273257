"""TokenBudgetBatchSampler: its own arguments, and resuming from saved states.

Example:
    >>> len(CASES) > 40
    True
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch import PlanConfig, TokenBudgetBatchSampler
from lightning_varbatch.errors import ResumeMismatchError, SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, accepted, error
from tests.bad_inputs.families import int_family

L = np.array([3, 5, 2, 7, 4, 6, 1, 8, 2, 3, 5, 4])
SAMPLER = "lightning_varbatch/data/sampler.py"
RANKS = "lightning_varbatch/data/micro_batch.py"


def _sampler(lengths: Any = L, max_tokens: Any = 16, **kwargs: Any) -> TokenBudgetBatchSampler:
    kwargs.setdefault("rank", 0)
    kwargs.setdefault("world_size", 1)
    return TokenBudgetBatchSampler(lengths, max_tokens, **kwargs)


def _with(name: str, **base: Any) -> Any:
    def call(value: Any) -> Any:
        sampler = _sampler(**{**base, name: value})
        return len(sampler)

    return call


def _max_tokens(value: Any) -> Any:
    sampler = _sampler(max_tokens=value)
    assert sorted(i for b in sampler for i in b) == list(range(len(L)))


def _set_epoch(value: Any) -> None:
    _sampler().set_epoch(value)


def _set_distributed_rank(value: Any) -> None:
    _sampler().set_distributed(value, 2)


def _set_distributed_acc(value: Any) -> None:
    _sampler().set_distributed(0, 1, value)


def _saved(consume: int = 2, **kwargs: Any) -> dict[str, Any]:
    sampler = _sampler(**kwargs)
    it = iter(sampler)
    for _ in range(consume):
        next(it)
    return sampler.state_dict()


def _load(state: Any, **kwargs: Any) -> TokenBudgetBatchSampler:
    sampler = _sampler(**kwargs)
    sampler.load_state_dict(state)
    return sampler


def _load_none(tmp: Path) -> None:
    _load(None)


def _load_str(tmp: Path) -> None:
    _load("checkpoint.ckpt")


def _load_empty(tmp: Path) -> None:
    _load({})


def _load_extra_key(tmp: Path) -> None:
    _load({**_saved(), "bogus": 1})


def _load_missing_key(tmp: Path) -> None:
    state = _saved()
    del state["consumed"]
    _load(state)


def _load_other_count(tmp: Path) -> None:
    _load(_saved(), lengths=L[:-1])


def _load_other_seed(tmp: Path) -> None:
    _load(_saved(seed=1), seed=2)


def _load_other_budget(tmp: Path) -> None:
    _load(_saved(max_tokens=16), max_tokens=20)


def _load_other_tail(tmp: Path) -> None:
    _load(_saved(tail="pad"), tail="drop")


def _load_changed_lengths(tmp: Path) -> None:
    changed = L.copy()
    changed[[0, 3]] = [8, 1]  # same count, same multiset size, different lengths
    _load(_saved(), lengths=changed)


def _load_changed_lengths_same_total(tmp: Path) -> None:
    changed = L[::-1].copy()  # same lengths, other order: other examples would be skipped
    _load(_saved(), lengths=changed)


def _load_consumed_too_many(tmp: Path) -> None:
    _load({**_saved(), "consumed": 999})


def _load_consumed_negative(tmp: Path) -> None:
    _load({**_saved(), "consumed": -1})


def _load_consumed_str(tmp: Path) -> None:
    _load({**_saved(), "consumed": "2"})


def _load_version(tmp: Path) -> None:
    _load({**_saved(), "version": 99})


def _load_epoch_negative(tmp: Path) -> None:
    _load({**_saved(), "epoch": -1})


def _load_history_garbage(tmp: Path) -> None:
    _load({**_saved(), "history": [[2]]})


def _load_from_mixture(tmp: Path) -> None:
    mixed = TokenBudgetBatchSampler.from_sources([L[:6], L[6:]], 16, rank=0, world_size=1)
    next(iter(mixed))
    _load(mixed.state_dict())


def _cost_times(k: int) -> Any:
    """A custom cost whose name is the same for every ``k`` (its values are not)."""

    def cost(n: Any, longest: Any, total: Any) -> Any:
        return n * longest * k

    return cost


def _load_cost_replaced(tmp: Path) -> None:
    # the same __qualname__, other values: only the epoch's ledger can tell
    state = _saved(consume=3, cost=_cost_times(1), max_tokens=32)
    _load(state, cost=_cost_times(2), max_tokens=32)


def _load_damaged_budgets(tmp: Path) -> None:
    _load({**_saved(), "rank_budgets": [16, "x"]})


def _load_damaged_ledger(tmp: Path) -> None:
    _load({**_saved(), "ledger": {"examples": 3}})


def _consumed_before_the_plan(tmp: Path) -> None:
    sampler = _load(_saved(consume=2), world_size=2)  # 2 micro-batches ran on 1 rank before
    sampler.state_dict(consumed=1)


def _shares_of_another_length(tmp: Path) -> None:
    _sampler(world_size=3, rank_shares=[1.0, 0.5])


def _resume_with_lower_memory(tmp: Path) -> None:
    lengths = np.full(60, 4)
    state = TokenBudgetBatchSampler(lengths, 16, rank=0, world_size=2).state_dict()
    ranks = [
        TokenBudgetBatchSampler(lengths, 16, rank=r, world_size=2, rank_max_tokens=[16, 8])
        for r in (0, 1)
    ]
    for s in ranks:
        s.load_state_dict(state)
    assert all(len(b) * 4 <= 8 for b in ranks[1]), "rank 1 ran over its new memory budget"
    assert sorted(i for s in ranks for b in s for i in b) == list(range(60))


def _step_without_loss_tokens(tmp: Path) -> None:
    len(_sampler(lengths=[1, 1, 5, 6], max_tokens=6, loss_offset=1, shuffle=False))


def _state_consumed(value: Any) -> None:
    _sampler().state_dict(consumed=value)


def _call_consumed(value: Any, tmp: Path) -> None:
    _state_consumed(value)


def _resume_other_world(tmp: Path) -> None:
    state = _saved(consume=2)
    ranks = [_sampler(rank=r, world_size=2) for r in (0, 1)]
    for s in ranks:
        s.load_state_dict(state)
    first = _sampler()
    consumed = [i for b in list(first)[:2] for i in b]
    rest = [i for s in ranks for b in s for i in b]
    assert sorted(consumed + rest) == list(range(len(L))), "resume lost or repeated examples"


def _resume_same(tmp: Path) -> None:
    state = _saved(consume=2)
    sampler = _load(state)
    rest = [i for b in sampler for i in b]
    first = [i for b in list(_sampler())[:2] for i in b]
    assert sorted(first + rest) == list(range(len(L)))


CASES: list[Case] = [
    *int_family(
        "sampler-max_tokens",
        "sampler",
        "max_tokens",
        _max_tokens,
        good=16,
        what="TokenBudgetBatchSampler(lengths, max_tokens=",
        fix_in=SAMPLER,
    ),
    *int_family(
        "sampler-accumulate_grad_batches",
        "sampler",
        "accumulate_grad_batches",
        _with("accumulate_grad_batches"),
        good=2,
        what="TokenBudgetBatchSampler(accumulate_grad_batches=",
        fix_in=SAMPLER,
    ),
    *int_family(
        "sampler-world_size",
        "sampler",
        "world_size",
        _with("world_size"),
        required=False,
        good=2,
        what="TokenBudgetBatchSampler(rank=0, world_size=",
        fix_in=RANKS,
    ),
    *int_family(
        "sampler-rank",
        "sampler",
        "rank",
        _with("rank", world_size=4),
        required=False,
        zero_ok=True,
        good=1,
        what="TokenBudgetBatchSampler(world_size=4, rank=",
        fix_in=RANKS,
    ),
    error(
        "sampler-rank-equals-world",
        "sampler",
        "rank=2 with world_size=2",
        lambda tmp: _sampler(rank=2, world_size=2),
        "rank",
        "2",
        "world_size",
        fix_in=RANKS,
        raises=SettingValueError,
        setting="rank",
    ),
    *int_family(
        "sampler-epoch",
        "sampler",
        "epoch",
        _with("epoch"),
        zero_ok=True,
        good=3,
        what="TokenBudgetBatchSampler(epoch=",
        fix_in=SAMPLER,
    ),
    *int_family(
        "sampler-set_epoch",
        "sampler",
        "epoch",
        _set_epoch,
        zero_ok=True,
        good=3,
        what="sampler.set_epoch(",
        fix_in=SAMPLER,
    ),
    error(
        "sampler-set_distributed-rank",
        "sampler",
        "sampler.set_distributed(rank=3, 2)",
        lambda tmp: _set_distributed_rank(3),
        "rank",
        "3",
        "world_size",
        fix_in=SAMPLER,
        raises=SettingValueError,
        setting="rank",
    ),
    error(
        "sampler-set_distributed-acc-zero",
        "sampler",
        "sampler.set_distributed(0, 1, accumulate_grad_batches=0)",
        lambda tmp: _set_distributed_acc(0),
        "accumulate_grad_batches",
        "0",
        fix_in=SAMPLER,
        raises=SettingValueError,
        setting="accumulate_grad_batches",
    ),
    accepted(
        "sampler-set_distributed-np",
        "sampler",
        "sampler.set_distributed(np.int64(1), np.int64(2), np.int64(2))",
        lambda tmp: _sampler().set_distributed(np.int64(1), np.int64(2), np.int64(2)),
        fix_in=SAMPLER,
    ),
    error(
        "sampler-unknown-kwarg",
        "sampler",
        "TokenBudgetBatchSampler(..., max_token=16)",
        lambda tmp: TokenBudgetBatchSampler(L, 16, max_token=16, rank=0, world_size=1),
        "max_token",
        setting="max_token",
        raises=SettingTypeError,
        fix_in=SAMPLER,
    ),
    error(
        "sampler-from_sources-unknown-setting",
        "sampler",
        "TokenBudgetBatchSampler.from_sources(..., bucket_widht=4)",
        lambda tmp: TokenBudgetBatchSampler.from_sources(
            [L], 16, rank=0, world_size=1, bucket_widht=4
        ),
        "bucket_widht",
        setting="bucket_widht",
        raises=SettingTypeError,
        fix_in=SAMPLER,
    ),
    *int_family(
        "sampler-loss_offset",
        "sampler",
        "loss_offset",
        _with("loss_offset"),
        zero_ok=True,
        good=1,
        what="TokenBudgetBatchSampler(loss_offset=",
        fix_in=SAMPLER,
    ),
    error(
        "sampler-loss_offset-with-loss_lengths",
        "sampler",
        "TokenBudgetBatchSampler(..., loss_lengths=lengths - 1, loss_offset=1)",
        lambda tmp: _sampler(loss_lengths=L - 1, loss_offset=1),
        "loss_offset=1",
        "loss_lengths",
        "pass one of them",
        setting="loss_offset",
        raises=SettingValueError,
        fix_in=SAMPLER,
    ),
    error(
        "sampler-config-and-keywords",
        "sampler",
        "TokenBudgetBatchSampler(lengths, config=PlanConfig(16), seed=3)",
        lambda tmp: _sampler(max_tokens=None, config=PlanConfig(16), seed=3),
        "seed",
        "config",
        "not both",
        setting="seed",
        raises=SettingValueError,
        fix_in=SAMPLER,
    ),
    # -- resume / state ------------------------------------------------------------------
    error(
        "state-none",
        "resume/state",
        "load_state_dict(None)",
        _load_none,
        "None",
        ("state", "load_state_dict"),
        fix_in=SAMPLER,
        raises=TypeError,
    ),
    error(
        "state-str",
        "resume/state",
        "load_state_dict('checkpoint.ckpt') (a path)",
        _load_str,
        "checkpoint.ckpt",
        ("state", "load_state_dict"),
        fix_in=SAMPLER,
        raises=TypeError,
    ),
    error(
        "state-empty",
        "resume/state",
        "load_state_dict({})",
        _load_empty,
        "missing",
        "consumed",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-extra-key",
        "resume/state",
        "a saved state with an extra key 'bogus'",
        _load_extra_key,
        "bogus",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-missing-key",
        "resume/state",
        "a saved state without 'consumed'",
        _load_missing_key,
        "consumed",
        "missing",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-other-data",
        "resume/state",
        "a state saved for 12 examples, loaded with 11",
        _load_other_count,
        "num_examples",
        "12",
        "11",
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-other-seed",
        "resume/state",
        "a state saved with seed=1, loaded with seed=2",
        _load_other_seed,
        "seed",
        "1",
        "2",
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-other-budget",
        "resume/state",
        "a state saved with max_tokens=16, loaded with max_tokens=20",
        _load_other_budget,
        "max_tokens",
        "16",
        "20",
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-other-tail",
        "resume/state",
        "a state saved with tail='pad', loaded with 'drop'",
        _load_other_tail,
        "tail",
        "pad",
        "drop",
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-changed-lengths",
        "resume/state",
        "same number of examples and settings, two lengths changed",
        _load_changed_lengths,
        "lengths",
        ("afresh", "start", "reset"),
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-permuted-lengths",
        "resume/state",
        "same lengths in another order (a re-sorted corpus)",
        _load_changed_lengths_same_total,
        "lengths",
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-from-mixture",
        "resume/state",
        "a state saved by a two-dataset sampler, loaded into a one-dataset sampler",
        _load_from_mixture,
        ("dataset", "mixture", "sources"),
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-consumed-too-many",
        "resume/state",
        "a state with consumed=999",
        _load_consumed_too_many,
        "consumed",
        "999",
        fix_in=SAMPLER,
        raises=ResumeMismatchError,
    ),
    error(
        "state-consumed-negative",
        "resume/state",
        "a state with consumed=-1",
        _load_consumed_negative,
        "consumed",
        "-1",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-consumed-str",
        "resume/state",
        "a state with consumed='2'",
        _load_consumed_str,
        "consumed",
        "'2'",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-version",
        "resume/state",
        "a state with version=99",
        _load_version,
        "version",
        "99",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-epoch-negative",
        "resume/state",
        "a state with epoch=-1",
        _load_epoch_negative,
        "epoch",
        "-1",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    error(
        "state-history-garbage",
        "resume/state",
        "a state with history=[[2]]",
        _load_history_garbage,
        "history",
        fix_in=SAMPLER,
        raises=ValueError,
    ),
    *[
        error(
            f"state_dict-consumed-{name}",
            "resume/state",
            f"sampler.state_dict(consumed={v!r})",
            partial(_call_consumed, v),
            "consumed",
            shown,
            raises=kind,
            setting="consumed",
            fix_in=SAMPLER,
        )
        for name, v, shown, kind in (
            ("negative", -1, "-1", SettingValueError),
            ("too-many", 10_000, "10000", SettingValueError),
            ("float", 1.5, "1.5", SettingTypeError),
        )
    ],
    accepted(
        "state_dict-consumed-np",
        "resume/state",
        "sampler.state_dict(consumed=np.int64(1))",
        lambda tmp: _state_consumed(np.int64(1)),
        fix_in=SAMPLER,
    ),
    accepted(
        "state-resume-same",
        "resume/state",
        "resume with the same data and settings",
        _resume_same,
        fix_in=SAMPLER,
    ),
    accepted(
        "state-resume-other-world",
        "resume/state",
        "resume a 1-rank state on 2 ranks (elastic)",
        _resume_other_world,
        fix_in=SAMPLER,
    ),
    error(
        "state-ledger-custom-cost-replaced",
        "resume/state",
        "a state saved with a custom cost, resumed with another function of the same name",
        _load_cost_replaced,
        "other examples",
        "consumed",
        "custom cost",
        raises=ResumeMismatchError,
        fix_in="lightning_varbatch/data/sampler_resume.py",
    ),
    error(
        "state-damaged-rank_budgets",
        "resume/state",
        "a state with rank_budgets=[16, 'x']",
        _load_damaged_budgets,
        "damaged",
        "rank_budgets",
        raises=ValueError,
        fix_in="lightning_varbatch/data/sampler_state.py",
    ),
    error(
        "state-damaged-ledger",
        "resume/state",
        "a state whose ledger lost its digest",
        _load_damaged_ledger,
        "damaged",
        "ledger",
        raises=ValueError,
        fix_in="lightning_varbatch/data/sampler_state.py",
    ),
    error(
        "state_dict-consumed-before-the-current-plan",
        "resume/state",
        "state_dict(consumed=1) after a resume whose history ran 2 micro-batches",
        _consumed_before_the_plan,
        "consumed",
        "since its start",
        raises=SettingValueError,
        setting="consumed",
        fix_in="lightning_varbatch/data/sampler_resume.py",
    ),
    error(
        "sampler-rank_shares-wrong-length-at-build",
        "sampler",
        "TokenBudgetBatchSampler(world_size=3, rank_shares=[1.0, 0.5]), nothing planned yet",
        _shares_of_another_length,
        "rank_shares has 2 entries",
        "world_size=3",
        raises=SettingValueError,
        setting="rank_shares",
        fix_in=SAMPLER,
    ),
    accepted(
        "state-resume-lower-rank_max_tokens",
        "resume/state",
        "a state of equal ranks resumed with rank_max_tokens=[16, 8] (rank 1's memory lower)",
        _resume_with_lower_memory,
        fix_in="lightning_varbatch/data/sampler_resume.py",
    ),
    error(
        "sampler-step-without-loss-tokens",
        "sampler",
        "lengths [1, 1, 5, 6], max_tokens=6, loss_offset=1: a step of one-token examples",
        _step_without_loss_tokens,
        "no loss tokens",
        "loss_offset=1",
        "divide by zero",
        raises=SettingValueError,
        setting="loss_offset",
        fix_in=RANKS,
    ),
]
