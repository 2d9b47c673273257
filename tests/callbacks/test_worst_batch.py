"""WorstBatchCheck: the plan's worst micro-batches run first, change nothing, fail clearly."""

from __future__ import annotations

import copy
import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from lightning.pytorch import Callback, LightningModule, Trainer, seed_everything
from torch import nn

from lightning_varbatch import PlanConfig, TokenBudgetBatchSampler, TokenBudgetDataModule
from lightning_varbatch.callbacks.worst_batch import (
    KINDS,
    WorstBatchCheck,
    advice,
    measure_peak,
    worst_micro_batches,
)
from lightning_varbatch.errors import SettingTypeError, SettingValueError
from lightning_varbatch.planner.costs import COST_NAMES
from lightning_varbatch.planner.settings import LAYOUTS

VOCAB = 50
MAX_TOKENS = 96


def _data(n: int = 120, seed: int = 0) -> tuple[list[dict[str, Any]], np.ndarray]:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, n)
    items = [{"tokens": rng.integers(1, VOCAB, int(k)).tolist()} for k in lengths]
    return items, lengths


def _datamodule(**settings: Any) -> TokenBudgetDataModule:
    items, lengths = _data()
    return TokenBudgetDataModule(items, lengths, max_tokens=MAX_TOKENS, seed=3, **settings)


class Model(LightningModule):
    """Dropout (RNG) and BatchNorm (buffers): the check must leave both as they were."""

    def __init__(self, oom_above: int | None = None) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 16)
        self.norm = nn.BatchNorm1d(16)
        self.drop = nn.Dropout(0.3)
        self.out = nn.Linear(16, VOCAB)
        self.oom_above = oom_above
        self.logged: list[str] = []

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        tokens, mask = batch["tokens"], batch["tokens_mask"]
        if self.oom_above is not None and tokens.numel() > self.oom_above:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        h = self.embed(tokens)
        h = self.norm(h.transpose(1, 2)).transpose(1, 2)
        logits = self.out(self.drop(h))
        loss = nn.functional.cross_entropy(logits[mask], tokens[mask])
        self.log("train/loss", loss, on_step=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.Adam(self.parameters(), lr=1e-2)


class Snapshot(Callback):
    """Record weights, buffers, grads, optimizer state and RNG in ``on_train_start``."""

    def __init__(self) -> None:
        self.state: dict[str, Any] = {}

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.state = {
            "model": copy.deepcopy(pl_module.state_dict()),
            "grads": [p.grad for p in pl_module.parameters()],
            "optimizer": copy.deepcopy(trainer.optimizers[0].state_dict()),
            "torch_rng": torch.get_rng_state(),
            "numpy_rng": np.random.get_state()[1].copy(),  # noqa: NPY002
            "python_rng": random.getstate(),
        }


def _trainer(callbacks: list[Callback], max_steps: int = 3, accumulate: int = 1) -> Trainer:
    return Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        accumulate_grad_batches=accumulate,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )


def _independent_worst(rank: int = 0, world_size: int = 1) -> dict[str, tuple[int, int]]:
    """Scan every micro-batch the sampler yields (first of ties), without the plan's figures."""
    _, lengths = _data()
    sampler = TokenBudgetBatchSampler(lengths, MAX_TOKENS, rank=rank, world_size=world_size, seed=3)
    best: dict[str, tuple[int, tuple[int, int]]] = {}
    for batch in sampler:
        n, longest = len(batch), int(lengths[list(batch)].max())
        for kind, score in (
            ("padded_tokens", n * longest),
            ("examples", n),
            ("attention", n * longest * longest),
        ):
            if kind not in best or score > best[kind][0]:
                best[kind] = (score, (n, longest))
    return {kind: shape for kind, (_, shape) in best.items()}


def test_report_lists_the_plans_worst_shapes(capsys: pytest.CaptureFixture[str]) -> None:
    seed_everything(0)
    check = WorstBatchCheck()
    _trainer([check], max_steps=1).fit(Model(), _datamodule())
    expected = _independent_worst()
    found = {r["kind"]: (r["examples"], r["longest"]) for r in check.report}
    assert found == expected
    for r in check.report:
        assert r["padded_tokens"] == r["examples"] * r["longest"] <= MAX_TOKENS
        assert r["attention"] == r["examples"] * r["longest"] ** 2
        assert r["peak_bytes"] > 0 and r["memory"].startswith("cpu") and r["rank"] == 0
    assert "worst micro-batches (rank 0" in capsys.readouterr().out


@pytest.mark.parametrize("accumulate", [1, 2])
def test_state_unchanged_and_training_identical(accumulate: int) -> None:
    seed_everything(0)
    plain, before = Model(), Snapshot()
    _trainer([before], accumulate=accumulate).fit(plain, _datamodule())

    seed_everything(0)
    checked, first, after = Model(), Snapshot(), Snapshot()
    check = WorstBatchCheck()
    _trainer([first, check, after], accumulate=accumulate).fit(checked, _datamodule())

    assert len(check.report) == 3
    a, b = first.state, after.state
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name  # weights and BN buffers
    assert all(g is None for g in b["grads"])
    assert a["optimizer"] == b["optimizer"]
    assert torch.equal(a["torch_rng"], b["torch_rng"])
    assert np.array_equal(a["numpy_rng"], b["numpy_rng"]) and a["python_rng"] == b["python_rng"]
    # The run with the check starts from what the run without it started from ...
    for name in a["model"]:
        assert torch.equal(before.state["model"][name], a["model"][name]), name
    # ... and trains to the same weights (dropout, BatchNorm statistics and Adam included).
    for (name, p), q in zip(plain.state_dict().items(), checked.state_dict().values(), strict=True):
        assert torch.equal(p, q), name


def test_memory_limit_below_the_peak_raises_naming_the_shape() -> None:
    seed_everything(0)
    check = WorstBatchCheck(kinds=("padded_tokens",), memory_limit_bytes=1, verbose=False)
    expected = _independent_worst()["padded_tokens"]
    with pytest.raises(RuntimeError) as info:
        _trainer([check], max_steps=1).fit(Model(), _datamodule())
    text = str(info.value)
    assert f"{expected[0]} examples x {expected[1]} tokens" in text
    assert "rank 0" in text and "memory_limit_bytes=1" in text
    assert f"lower max_tokens={MAX_TOKENS}" in text
    assert not _unknown_names(text), _unknown_names(text)


def test_out_of_memory_is_translated() -> None:
    seed_everything(0)
    check = WorstBatchCheck(kinds=("examples",), verbose=False)
    n, longest = _independent_worst()["examples"]
    with pytest.raises(RuntimeError, match="ran out of memory") as info:
        _trainer([check], max_steps=1).fit(Model(oom_above=1), _datamodule())
    text = str(info.value)
    assert f"{n} examples x {longest} tokens" in text
    assert f"lower max_tokens={MAX_TOKENS}, or cap the examples with max_examples" in text
    assert type(info.value.__cause__) is torch.OutOfMemoryError
    assert not _unknown_names(text), _unknown_names(text)


@pytest.mark.parametrize(
    ("kwargs", "error", "setting"),
    [
        ({"kinds": ("tokens",)}, SettingValueError, "kinds"),
        ({"kinds": ()}, SettingValueError, "kinds"),
        ({"kinds": 3}, SettingTypeError, "kinds"),
        ({"kinds": ("examples", None)}, SettingTypeError, "kinds"),
        ({"memory_limit_bytes": 0}, SettingValueError, "memory_limit_bytes"),
        ({"memory_limit_bytes": -1}, SettingValueError, "memory_limit_bytes"),
        ({"memory_limit_bytes": "1e9"}, SettingTypeError, "memory_limit_bytes"),
        ({"memory_limit_bytes": 1e9}, SettingTypeError, "memory_limit_bytes"),
        ({"memory_limit_bytes": True}, SettingTypeError, "memory_limit_bytes"),
        ({"verbose": "yes"}, SettingTypeError, "verbose"),
        ({"verbose": 1}, SettingTypeError, "verbose"),
    ],
    ids=lambda v: None if isinstance(v, (dict, type)) else v,
)
def test_arguments_use_the_shared_checks(kwargs: dict[str, Any], error: type, setting: str) -> None:
    with pytest.raises(error) as info:
        WorstBatchCheck(**kwargs)
    assert type(info.value) is error and info.value.setting == setting
    assert setting in str(info.value)


def test_good_arguments() -> None:
    assert WorstBatchCheck(kinds="attention").kinds == ("attention",)
    check = WorstBatchCheck(memory_limit_bytes=np.int64(2**30), verbose=np.bool_(False))
    assert check.memory_limit_bytes == 2**30 and type(check.memory_limit_bytes) is int
    assert check.verbose is False


def _valid_names() -> set[str]:
    """Every name a user can set: PlanConfig's fields, the DataModule's and the check's own."""
    import dataclasses
    import inspect

    names = {f.name for f in dataclasses.fields(PlanConfig)}
    names |= set(inspect.signature(TokenBudgetDataModule.__init__).parameters) - {"self"}
    names |= set(inspect.signature(WorstBatchCheck.__init__).parameters) - {"self"}
    return names


def _unknown_names(text: str) -> list[str]:
    """Settings or setting values the text names that do not exist.

    A setting is any ``snake_case`` word (``max_tokens``) or any ``name=`` in the text; a
    ``cost=`` or ``layout=`` value must be one of the library's names.
    """
    import re

    words = set(re.findall(r"\b[a-z]+(?:_[a-z]+)+\b", text))
    words |= set(re.findall(r"\b([a-z]\w*)=", text))
    sources = {"cpu_vmhwm", "cpu_vmhwm_unreset", "cpu_ru_maxrss", "cuda_max_allocated"}
    known = _valid_names() | set(KINDS) | sources | {"find_max_tokens"}  # not settings, named
    bad = sorted(words - known)
    for name, choices in (("cost", COST_NAMES), ("layout", LAYOUTS)):
        bad += [f"{name}={v!r}" for v in re.findall(name + r"='(\w+)'", text) if v not in choices]
    return bad


ADVICE_CONFIGS = [
    PlanConfig(max_tokens=4096),
    PlanConfig(max_tokens=4096, max_examples=64),
    PlanConfig(max_tokens=4096, cost="quadratic", quadratic_coef=0.01),
    PlanConfig(max_tokens=4096, cost="sum"),
    PlanConfig(max_tokens=4096, cost=lambda n, longest, total: n * longest),
    PlanConfig(max_tokens=4096, layout="packed"),
    PlanConfig(max_tokens=4096, max_shapes=4),
    PlanConfig(max_tokens=4096, max_shapes=4, cost="quadratic"),
]


@pytest.mark.parametrize("config", ADVICE_CONFIGS, ids=lambda c: str(c.plain()))
@pytest.mark.parametrize("kind", [*KINDS, "shape 4x256"])
def test_every_advice_names_only_settings_that_exist(kind: str, config: PlanConfig) -> None:
    text = advice(kind, config)
    assert not _unknown_names(text), (text, _unknown_names(text))
    assert f"max_tokens={config.max_tokens}" in text  # the budget is always one way out
    # every setting it names with a value is shown with the value it has now
    import re

    for name, value in re.findall(r"\b([a-z]\w*)=('?[\w.]+'?)", text):
        if name == "cost" and value == "'quadratic'" and config.cost != "quadratic":
            continue  # the value to set, with the current one shown next to it
        now = getattr(config, name)
        assert value.strip("'") in (str(now), f"{now:g}" if isinstance(now, float) else ""), (
            name,
            value,
            now,
        )
    # a setting it suggests changing also takes the value it suggests
    for value in re.findall(r"cost='(\w+)'", text):
        PlanConfig(max_tokens=4096, cost=value)  # type: ignore[arg-type]


def test_a_fake_setting_would_be_caught() -> None:
    """The checker itself: today's bug (cost='flops') and a made-up name are found."""
    assert _unknown_names("or cost='quadratic' / cost='flops'") == ["cost='flops'"]
    assert _unknown_names("lower max_token=8") == ["max_token"]
    assert not _unknown_names("lower max_tokens=8 or max_examples=4")


def test_other_errors_keep_their_type_with_a_note() -> None:
    """A CPU allocation failure (a plain RuntimeError) is not read from its text: it keeps its
    type and gains a note naming the micro-batch and the settings."""

    class CpuAllocationFailure(Model):
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            torch.empty(2**40, dtype=torch.uint8)  # what torch's CPU allocator raises
            return super().training_step(batch, batch_idx)

    seed_everything(0)
    check = WorstBatchCheck(kinds=("padded_tokens",), verbose=False)
    n, longest = _independent_worst()["padded_tokens"]
    with pytest.raises(RuntimeError) as info:
        _trainer([check], max_steps=1).fit(CpuAllocationFailure(), _datamodule())
    assert type(info.value) is RuntimeError
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert f"{n} examples x {longest} tokens" in notes and f"max_tokens={MAX_TOKENS}" in notes
    assert not _unknown_names(notes), _unknown_names(notes)


def test_memory_error_is_out_of_memory() -> None:
    class PythonOom(Model):
        def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
            raise MemoryError

    seed_everything(0)
    check = WorstBatchCheck(kinds=("attention",), verbose=False)
    with pytest.raises(RuntimeError, match="ran out of memory") as info:
        _trainer([check], max_steps=1).fit(PythonOom(), _datamodule())
    assert type(info.value.__cause__) is MemoryError
    text = str(info.value)
    assert "cost='quadratic'" in text and not _unknown_names(text)


def test_manual_optimization_is_refused() -> None:
    class Manual(Model):
        def __init__(self) -> None:
            super().__init__()
            self.automatic_optimization = False

    with pytest.raises(RuntimeError, match="automatic optimization"):
        _trainer([WorstBatchCheck()], max_steps=1).fit(Manual(), _datamodule())


def test_deepspeed_is_refused() -> None:
    from types import SimpleNamespace

    from lightning.pytorch.strategies import DeepSpeedStrategy

    trainer = SimpleNamespace(strategy=DeepSpeedStrategy.__new__(DeepSpeedStrategy))
    with pytest.raises(RuntimeError, match="does not support DeepSpeed"):
        WorstBatchCheck().setup(trainer, Model(), "fit")  # type: ignore[arg-type]


def test_worst_micro_batches_per_rank_and_measure_peak() -> None:
    _, lengths = _data()
    for rank in (0, 1):
        sampler = TokenBudgetBatchSampler(lengths, MAX_TOKENS, rank=rank, world_size=2, seed=3)
        batches = list(sampler)
        worst = worst_micro_batches(sampler)
        for w in worst:
            ids = batches[w.position]
            assert (len(ids), int(lengths[ids].max())) == (w.examples, w.longest)
            assert w.rank == rank
    _, peak, source = measure_peak(lambda: torch.zeros(1 << 22).add_(1).sum())
    assert peak > 16 << 20 and source.startswith("cpu")


def _same_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return (
        all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
        and all(g is None for g in b["grads"])
        and a["optimizer"] == b["optimizer"]
        and torch.equal(a["torch_rng"], b["torch_rng"])
    )


def _ddp_rank(out: Path) -> None:
    """One rank of the 2-process DDP run (gloo on CPU): write ``out/rank<r>.json``."""
    seed_everything(0, verbose=False)
    first, check, after = Snapshot(), WorstBatchCheck(), Snapshot()
    trainer = Trainer(
        accelerator="cpu",
        devices=int(os.environ["WORLD_SIZE"]),
        strategy="ddp",
        max_steps=2,
        callbacks=[first, check, after],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Model(), _datamodule())
    record = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "report": check.report,
        "all_reports": check.all_reports,
        "unchanged": _same_state(first.state, after.state),
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


@pytest.mark.multiprocess
def test_ddp_every_rank_checks_its_own_worst_batches(tmp_path: Path) -> None:
    from tests.launch import start_ranks, wait_ranks

    world = 2
    procs = start_ranks([sys.executable, __file__, str(tmp_path)], world)
    logs = wait_ranks(procs, "test_worst_batch.py", 120)
    records: list[dict[str, Any]] = []
    for rank, (p, log) in enumerate(zip(procs, logs, strict=True)):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{log[-3000:]}"
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["rank"] == rank and record["global_step"] == 2
        assert record["unchanged"]
        found = {r["kind"]: (r["examples"], r["longest"]) for r in record["report"]}
        assert found == _independent_worst(rank, world)
        assert {r["rank"] for r in record["report"]} == {rank}
        records.append(record)
    for record in records:  # every rank holds every rank's report (one all-gather)
        assert [
            {(x["kind"], x["examples"], x["longest"], x["peak_bytes"]) for x in rows}
            for rows in record["all_reports"]
        ] == [
            {(x["kind"], x["examples"], x["longest"], x["peak_bytes"]) for x in r["report"]}
            for r in records
        ]
    assert "worst micro-batches (rank 0" in logs[0] and "  rank 1: padded_tokens" in logs[0]


if __name__ == "__main__":  # a rank of test_ddp_every_rank_checks_its_own_worst_batches
    _ddp_rank(Path(sys.argv[1]))
