"""The parts both DataModules share, each tested directly: settings, state, splits, loaders."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from lightning_varbatch.data import (
    datamodule_settings,
    datamodule_state,
    rank_agreement,
    split_inputs,
    split_loaders,
    splits,
)
from lightning_varbatch.data.sampler import TokenBudgetBatchSampler
from lightning_varbatch.data.streaming_datamodule import StreamingDataModule
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.sources.shards import ShardedSource


class _Shard:
    def __init__(self, name: str, rows: list[list[int]]) -> None:
        self.name, self.rows = name, rows

    @property
    def num_rows(self) -> int:
        return len(self.rows)

    def lengths(self) -> np.ndarray:
        return np.array([len(r) for r in self.rows])

    def read(self, rows):
        return ({"tokens": np.array(self.rows[i])} for i in rows)


def _source() -> ShardedSource:
    return ShardedSource([_Shard("a", [[1, 2], [3], [4, 5, 6]])])


def test_settings_are_checked_once_for_both() -> None:
    assert datamodule_settings.check_budgets(8, 4) == (8, 4, False)
    with pytest.raises(SettingTypeError) as bad:
        datamodule_settings.check_loader_settings(3, 0, False, "error")
    assert bad.value.setting == "collate"
    with pytest.raises(SettingTypeError, match="Unknown planner setting"):
        datamodule_settings.check_sampler_kwargs({"max_token": 3})
    assert "loss_offset" not in datamodule_settings.SAMPLER_KWARGS
    with pytest.raises(SettingValueError) as refused:
        datamodule_settings.check_stream_arguments(_source(), {"weights": [1.0, 2.0]})
    assert refused.value.setting == "weights"
    # at their defaults (a shared config's train_loss_lengths: null) they change nothing
    datamodule_settings.check_stream_arguments(_source(), dict(datamodule_settings.DEFAULTS))


def test_the_refused_settings_defaults_are_the_map_style_datamodules() -> None:
    """A setting one DataModule refuses is accepted at the default the other one has."""
    from lightning_varbatch import TokenBudgetDataModule

    defaults = inspect.signature(TokenBudgetDataModule).parameters
    assert set(datamodule_settings.DEFAULTS) == set(datamodule_settings.REFUSED)
    for name, value in datamodule_settings.DEFAULTS.items():
        assert defaults[name].default == value, name


def test_state_helpers() -> None:
    assert datamodule_state.versioned(a=1) == {"version": datamodule_state.STATE_VERSION, "a": 1}
    assert splits.STAGES == ("train", "val", "test")
    assert datamodule_state.trained_this_epoch(None) == 0
    with pytest.raises(TypeError, match="got int"):
        datamodule_state.read_state_mapping("X", 3)


def test_split_inputs_and_plan_split() -> None:
    assert split_inputs.read_split("val", None, None) == (None, None)
    with pytest.raises(SettingValueError) as missing:
        split_inputs.read_split("val", [{"tokens": [1]}], None)
    assert missing.value.setting == "val_lengths"
    with pytest.raises(SettingValueError) as count:
        split_inputs.read_stream_split("test", [{"tokens": [1]}], [1, 2], None)
    assert count.value.setting == "test_lengths"
    planner = split_loaders.plan_split(
        "val", 8, {"shuffle": True}, np.array([3, 4]), None, budget_default=False
    )
    assert planner.config.shuffle is False and planner.config.tail == "spread"
    with pytest.raises(SettingValueError) as over:
        split_loaders.plan_split("val", 2, {}, np.array([3]), None, budget_default=True)
    assert (over.value.setting, over.value.stage) == ("val_max_tokens", "val")
    with pytest.raises(SettingValueError):
        split_loaders.check_stages(("valid",))
    sampler = TokenBudgetBatchSampler([3, 4], 8, rank=0, world_size=1)
    assert rank_agreement.plan_digest(sampler) == rank_agreement.plan_digest(sampler)


def test_both_datamodules_share_the_split_loaders() -> None:
    dm = StreamingDataModule(_source(), 4, val_dataset=[{"tokens": [1]}] * 2, val_lengths=[1, 1])
    assert isinstance(dm, split_loaders.SplitLoaders)
    assert isinstance(dm, datamodule_state.ResumableState)
    loader = dm.val_dataloader()
    assert dm.val_sampler is dm.samplers["val"] is loader.batch_sampler
    with pytest.raises(ValueError, match="StreamingDataModule has no test_dataset"):
        dm.test_dataloader()


@pytest.mark.filterwarnings("ignore:oversize")
@pytest.mark.parametrize("layout", ["padded", "packed"])
def test_streaming_evaluation_counts_loss_tokens_after_truncation(layout: str) -> None:
    """loss_offset with oversize="truncate": the closed form of each layout, not length - k."""
    lengths = np.array([2, 5, 9, 12, 3, 7])
    items = [{"tokens": list(range(1, n + 1))} for n in lengths]
    budget, k = 8, 1
    dm = StreamingDataModule(
        _source(), 16, val_max_tokens=budget, val_dataset=items, val_lengths=lengths,
        loss_offset=k, oversize="truncate", layout=layout,
    )  # fmt: skip
    planner = dm.planner("val")
    cut = planner.truncate_to
    assert cut is not None and cut < lengths.max()
    if layout == "padded":  # the collate cuts first, then drops k labels
        expected = [max(min(n, cut) - k, 0) for n in lengths]
    else:  # a packed row keeps a label on its last kept token
        expected = [max(min(n - k, cut), 0) for n in lengths]
    plan = dm.check(stages=("val",))["val"]
    assert int(plan.step_tokens.sum()) == sum(expected)
    assert int(plan.step_tokens.sum()) != int(np.maximum(lengths - k, 0).sum())
