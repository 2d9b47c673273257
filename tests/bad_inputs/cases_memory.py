"""Memory tools: ``find_max_tokens`` (probes, plan settings, budgets) and ``WorstBatchCheck``.

Every case has one exact exception type. The probes are plain functions (no model), so the
cases are quick; one case runs a two-step fit to see the advice ``WorstBatchCheck`` gives.

Example:
    >>> len(CASES) > 40
    True
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from lightning_varbatch.errors import SettingTypeError, SettingValueError
from tests.bad_inputs.case import Case, Match, accepted, error

MEM = "lightning_varbatch/memory/settings.py"
WB = "lightning_varbatch/callbacks/worst_batch.py"
#: ``find_max_tokens`` and ``WorstBatchCheck``: the memory tools of the table.
AREA = "memory tools"
LIMIT = 15_000_000
LONGEST = 199


def _lengths() -> np.ndarray:
    lengths = np.random.default_rng(0).integers(1, LONGEST, 500)
    lengths[123] = LONGEST  # the longest example, at a known index
    return lengths


def _memory(examples: int, length: int) -> float:
    return 5e6 + 96.0 * examples * length + 0.75 * examples * length * length


def _find(run_batch: Callable[[int, int], Any] = _memory, **kwargs: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        del tmp
        from lightning_varbatch.memory import find_max_tokens

        args: dict[str, Any] = {"memory_limit_bytes": LIMIT, **kwargs}
        return find_max_tokens(run_batch, _lengths(), **args)

    return run


def _probe_returns(value: Any) -> Callable[[Path], Any]:
    return _find(lambda examples, length: value)


# (member, value, the value as the message shows it, the exact type)
_PROBE_BAD: list[tuple[str, Any, Match, type[BaseException]]] = [
    ("zero", 0, "0", ValueError),
    ("negative", -4096.0, "-4096.0", ValueError),
    ("nan", math.nan, "nan", ValueError),
    ("inf", math.inf, "inf", ValueError),
    ("none", None, "None", TypeError),
    ("str", "12 GB", "'12 GB'", TypeError),
    ("bool", True, "True", TypeError),
]

# exact types of check_count / check_real for each member
_COUNT_BAD: list[tuple[str, Any, Match, type[BaseException]]] = [
    ("zero", 0, "0", SettingValueError),
    ("negative", -3, "-3", SettingValueError),
    ("float", 2.5, "2.5", SettingTypeError),
    ("bool", True, "True", SettingTypeError),
    ("str", "64", "'64'", SettingTypeError),
    ("nan", math.nan, "nan", SettingTypeError),
    ("none", None, "None", SettingTypeError),
]
_MARGIN_BAD: list[tuple[str, Any, Match, type[BaseException]]] = [
    ("negative", -0.5, "-0.5", SettingValueError),
    ("one", 1.0, "1.0", SettingValueError),
    ("above-one", 1.5, "1.5", SettingValueError),
    ("nan", math.nan, "nan", SettingValueError),
    ("inf", math.inf, "inf", SettingValueError),
    ("bool", True, "True", SettingTypeError),
    ("str", "0.1", "'0.1'", SettingTypeError),
]


def _check(**kwargs: Any) -> Callable[[Path], Any]:
    def run(tmp: Path) -> Any:
        del tmp
        from lightning_varbatch.callbacks.worst_batch import WorstBatchCheck

        return WorstBatchCheck(**kwargs)

    return run


def _fit_over_limit(tmp: Path) -> None:
    """A two-step fit whose worst micro-batch is over ``memory_limit_bytes=1``."""
    import torch
    from lightning.pytorch import LightningModule, Trainer

    from lightning_varbatch import TokenBudgetDataModule
    from lightning_varbatch.callbacks.worst_batch import WorstBatchCheck

    class Model(LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(50, 8)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return self.embed(batch["tokens"]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 60)
    items = [{"tokens": rng.integers(1, 50, int(n)).tolist()} for n in lengths]
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=2,
        callbacks=[WorstBatchCheck(kinds=("attention",), memory_limit_bytes=1, verbose=False)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=tmp,
    )
    trainer.fit(Model(), TokenBudgetDataModule(items, lengths, max_tokens=64))


def _probe_cases() -> list[Case]:
    cases = [
        error(
            f"mem-probe-{member}",
            AREA,
            f"find_max_tokens(run_batch returning {value!r})",
            _probe_returns(value),
            "run_batch(examples=1, length=199)",
            shown,
            "peak memory in bytes",
            raises=kind,
            fix_in=MEM,
        )
        for member, value, shown, kind in _PROBE_BAD
    ]
    for member, run_batch in (
        ("flat", lambda b, n: 7e6),
        ("decreasing", lambda b, n: 1e9 - 10.0 * b * n),
    ):
        cases.append(
            error(
                f"mem-probe-{member}",
                AREA,
                f"find_max_tokens(run_batch whose memory is {member} as the batch grows)",
                _find(run_batch),
                "does not grow with the batch",
                "1 x 199 tokens",
                raises=ValueError,
                fix_in=MEM,
            )
        )
    return cases


def _plan_setting_cases() -> list[Case]:
    return [
        error(
            "mem-plan-max_examples-zero",
            AREA,
            "find_max_tokens(..., max_examples=0)",
            _find(max_examples=0),
            "max_examples",
            "0",
            raises=SettingValueError,
            setting="max_examples",
            fix_in=MEM,
            not_blame=("memory_limit_bytes",),
        ),
        error(
            "mem-plan-pad-str",
            AREA,
            "find_max_tokens(..., pad_to_multiple_of='8')",
            _find(pad_to_multiple_of="8"),
            "pad_to_multiple_of",
            "'8'",
            raises=SettingTypeError,
            setting="pad_to_multiple_of",
            fix_in=MEM,
            not_blame=("memory_limit_bytes",),
        ),
        error(
            "mem-plan-typo",
            AREA,
            "find_max_tokens(..., max_example=8) (typo)",
            _find(max_example=8),
            "max_example",
            "did you mean 'max_examples'",
            raises=SettingTypeError,
            setting="max_example",
            fix_in=MEM,
        ),
        error(
            "mem-plan-max_tokens",
            AREA,
            "find_max_tokens(..., max_tokens=4096) (the budget it searches)",
            _find(max_tokens=4096),
            "max_tokens",
            "4096",
            "candidates=",
            raises=SettingValueError,
            setting="max_tokens",
            fix_in=MEM,
        ),
    ]


def _budget_cases() -> list[Case]:
    return [
        error(
            "mem-candidates-below-longest",
            AREA,
            "find_max_tokens(candidates=[64, 128]) with a 199-token example",
            _find(candidates=[64, 128]),
            "example 123 has length 199",
            "max_tokens=199",
            "candidates",
            raises=SettingValueError,
            setting="candidates",
            fix_in=MEM,
            not_blame=("memory_limit_bytes",),
        ),
        error(
            "mem-bounds-below-longest-quadratic",
            AREA,
            "find_max_tokens(bounds=(64, 256), cost='quadratic', quadratic_coef=0.5)",
            _find(bounds=(64, 256), cost="quadratic", quadratic_coef=0.5),
            "example 123 has length 199",
            f"max_tokens={math.ceil(LONGEST + 0.5 * LONGEST**2)}",
            "bounds",
            raises=SettingValueError,
            setting="bounds",
            fix_in=MEM,
            not_blame=("memory_limit_bytes",),
        ),
        error(
            "mem-candidates-empty",
            AREA,
            "find_max_tokens(candidates=[])",
            _find(candidates=[]),
            "candidates",
            raises=SettingValueError,
            setting="candidates",
            fix_in=MEM,
        ),
        error(
            "mem-candidates-int",
            AREA,
            "find_max_tokens(candidates=4096)",
            _find(candidates=4096),
            "candidates",
            "4096",
            raises=SettingTypeError,
            setting="candidates",
            fix_in=MEM,
        ),
        error(
            "mem-bounds-reversed",
            AREA,
            "find_max_tokens(bounds=(4096, 256))",
            _find(bounds=(4096, 256)),
            "bounds",
            "(4096, 256)",
            raises=SettingValueError,
            setting="bounds",
            fix_in=MEM,
        ),
        error(
            "mem-no-budget-fits",
            AREA,
            "find_max_tokens(memory_limit_bytes=1000) (below the fixed memory)",
            _find(memory_limit_bytes=1000, candidates=[256, 512]),
            "memory_limit_bytes=1000",
            "max_tokens=256",
            raises=ValueError,
            fix_in=MEM,
        ),
        accepted(
            "mem-candidates-below-longest-skip",
            AREA,
            "find_max_tokens(candidates=[128, 160], oversize='skip') with a 199-token example",
            _find(candidates=[128, 160], oversize="skip"),
            fix_in=MEM,
            note="accepted: the longest examples are skipped by the plan",
        ),
    ]


def _own_setting_cases() -> list[Case]:
    cases: list[Case] = []
    for member, value, shown, kind in _COUNT_BAD:
        cases.append(
            error(
                f"mem-limit-{member}",
                AREA,
                f"find_max_tokens(memory_limit_bytes={value!r})",
                _find(memory_limit_bytes=value),
                "memory_limit_bytes",
                shown,
                raises=kind,
                setting="memory_limit_bytes",
                fix_in=MEM,
            )
        )
        if value is None:  # None is WorstBatchCheck's default: no limit
            continue
        cases.append(
            error(
                f"worst-limit-{member}",
                AREA,
                f"WorstBatchCheck(memory_limit_bytes={value!r})",
                _check(memory_limit_bytes=value),
                "memory_limit_bytes",
                shown,
                raises=kind,
                setting="memory_limit_bytes",
                fix_in=WB,
            )
        )
    for member, value, shown, kind in _MARGIN_BAD:
        cases.append(
            error(
                f"mem-margin-{member}",
                AREA,
                f"find_max_tokens(margin={value!r})",
                _find(margin=value),
                "margin",
                shown,
                raises=kind,
                setting="margin",
                fix_in=MEM,
            )
        )
    for name, value, kind in (
        ("probes", 2, SettingValueError),
        ("rounds", 0, SettingValueError),
        ("epochs", 1.0, SettingTypeError),
        ("world_size", 0, SettingValueError),
    ):
        cases.append(
            error(
                f"mem-{name}-{value!r}",
                AREA,
                f"find_max_tokens({name}={value!r})",
                _find(**{name: value}),
                name,
                repr(value),
                raises=kind,
                setting=name,
                fix_in=MEM,
            )
        )
    cases.append(
        error(
            "mem-run_batch-not-callable",
            AREA,
            "find_max_tokens(run_batch=5)",
            _find(run_batch=5),
            "run_batch",
            "5",
            raises=SettingTypeError,
            setting="run_batch",
            fix_in=MEM,
        )
    )
    cases.append(
        accepted(
            "worst-limit-none-ok",
            AREA,
            "WorstBatchCheck(memory_limit_bytes=None) (no limit: only out of memory raises)",
            _check(memory_limit_bytes=None),
            fix_in=WB,
        )
    )
    cases.append(
        accepted(
            "worst-limit-int64",
            AREA,
            "WorstBatchCheck(memory_limit_bytes=np.int64(2**30)) (numpy integers are integers)",
            _check(memory_limit_bytes=np.int64(2**30)),
            fix_in=WB,
        )
    )
    return cases


def _worst_batch_cases() -> list[Case]:
    return [
        error(
            "worst-kinds-unknown",
            AREA,
            "WorstBatchCheck(kinds=('tokens',))",
            _check(kinds=("tokens",)),
            "kinds",
            "'tokens'",
            "padded_tokens",
            raises=SettingValueError,
            setting="kinds",
            fix_in=WB,
        ),
        error(
            "worst-kinds-empty",
            AREA,
            "WorstBatchCheck(kinds=())",
            _check(kinds=()),
            "kinds",
            raises=SettingValueError,
            setting="kinds",
            fix_in=WB,
        ),
        error(
            "worst-kinds-int",
            AREA,
            "WorstBatchCheck(kinds=3)",
            _check(kinds=3),
            "kinds",
            "3",
            raises=SettingTypeError,
            setting="kinds",
            fix_in=WB,
        ),
        error(
            "worst-verbose-str",
            AREA,
            "WorstBatchCheck(verbose='yes')",
            _check(verbose="yes"),
            "verbose",
            "'yes'",
            raises=SettingTypeError,
            setting="verbose",
            fix_in=WB,
        ),
        error(
            "worst-advice-attention",
            AREA,
            "WorstBatchCheck(memory_limit_bytes=1): the attention advice",
            _fit_over_limit,
            "lower max_tokens=64",
            "cost='quadratic'",
            raises=RuntimeError,
            fix_in=WB,
            not_blame=("flops",),
        ),
    ]


CASES: list[Case] = [
    *_probe_cases(),
    *_plan_setting_cases(),
    *_budget_cases(),
    *_own_setting_cases(),
    *_worst_batch_cases(),
]
