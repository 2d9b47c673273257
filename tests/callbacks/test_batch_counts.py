"""What both callbacks read from a micro-batch and from the Trainer (``batch_counts``)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any
from unittest import mock

import numpy as np
import pytest
import torch

from lightning_varbatch import keys
from lightning_varbatch.callbacks.batch_counts import (
    as_number,
    check_positive,
    is_step_boundary,
    log_rank_zero,
    read_count,
)
from lightning_varbatch.callbacks.loop_context import TrainerContext
from lightning_varbatch.errors import SettingTypeError, SettingValueError


def test_counts_come_from_the_function_else_from_the_batch_entry() -> None:
    batch = {keys.NTOKENS: torch.tensor(7), "n": np.int32(3)}
    assert read_count(batch, keys.NTOKENS, None, "tokens_fn", "M") == 7.0
    assert read_count(batch, keys.NTOKENS, lambda b: b["n"], "tokens_fn", "M") == 3.0
    assert read_count([1, 2], keys.NTOKENS, lambda b: len(b), "tokens_fn", "M") == 2.0


def test_a_batch_without_the_entry_names_the_argument_to_pass() -> None:
    with pytest.raises(TypeError, match=r"got a dict with keys \['x'\]\. Pass M\(tokens_fn=fn\)"):
        read_count({"x": 1}, keys.NTOKENS, None, "tokens_fn", "M")
    with pytest.raises(TypeError, match="got a tuple"):
        read_count((1, 2), keys.NTOKENS, None, "examples_fn", "M")


@pytest.mark.parametrize("bad", [float("nan"), -1, float("inf")])
def test_a_count_must_be_finite_and_not_negative(bad: float) -> None:
    with pytest.raises(ValueError, match="finite numbers >= 0"):
        read_count({}, keys.NTOKENS, lambda b: bad, "tokens_fn", "M")


@pytest.mark.parametrize("bad", [torch.ones(2), "3", True, None])
def test_as_number_takes_numbers_and_one_element_tensors(bad: Any) -> None:
    assert as_number(torch.tensor([2.5]), "x") == 2.5
    assert as_number(np.float32(1.5), "x") == 1.5
    with pytest.raises(TypeError, match="must be a number or a 1-element tensor"):
        as_number(bad, "x")


def test_positive_settings_use_the_shared_checks() -> None:
    assert check_positive("peak_flops", None) is None
    assert check_positive("peak_flops", 2) == 2.0
    assert check_positive("every", 3, integer=True) == 3
    with pytest.raises(SettingValueError, match="peak_flops"):
        check_positive("peak_flops", 0.0)
    with pytest.raises(SettingTypeError, match="every"):
        check_positive("every", 2.5, integer=True)


@pytest.mark.parametrize(
    ("automatic", "accumulating", "boundary"),
    [(True, True, False), (True, False, True), (False, True, True)],
)
def test_step_boundary_follows_lightnings_accumulation(
    automatic: bool, accumulating: bool, boundary: bool
) -> None:
    trainer = SimpleNamespace(
        lightning_module=SimpleNamespace(automatic_optimization=automatic),
        fit_loop=SimpleNamespace(
            epoch_loop=SimpleNamespace(_should_accumulate=lambda: accumulating)
        ),
    )
    assert is_step_boundary(trainer) is boundary  # type: ignore[arg-type]


@pytest.mark.parametrize("rank_zero", [True, False])
def test_metrics_go_to_every_logger_from_rank_zero_only(rank_zero: bool) -> None:
    loggers = [mock.Mock(), mock.Mock()]
    trainer = SimpleNamespace(is_global_zero=rank_zero, loggers=loggers)
    log_rank_zero(trainer, {"a": 1.0}, step=4)  # type: ignore[arg-type]
    for logger in loggers:
        assert logger.log_metrics.call_args_list == (
            [mock.call({"a": 1.0}, step=4)] if rank_zero else []
        )


def test_a_trainer_is_a_loop_context_through_its_strategy() -> None:
    calls: list[tuple[str, Any]] = []
    strategy = SimpleNamespace(
        root_device=torch.device("cpu"),
        reduce=lambda t, reduce_op: calls.append(("reduce", reduce_op)) or t * 2,
        all_gather=lambda t: calls.append(("gather", None)) or torch.stack([t, t]),
    )
    module = SimpleNamespace(flops_per_token=6.0)
    trainer = SimpleNamespace(
        strategy=strategy, lightning_module=module, world_size=2, is_global_zero=False
    )
    loop = TrainerContext(trainer)
    assert (loop.world_size, loop.is_global_zero, loop.flops_per_token) == (2, False, 6.0)
    assert float(loop.sum_over_ranks(torch.tensor(3.0))) == 6.0
    assert loop.gather(torch.tensor([1.0])).tolist() == [[1.0], [1.0]]
    assert calls == [("reduce", "sum"), ("gather", None)]
