"""Run every case of the catalogue: the right error with the right message, or no error."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bad_inputs.case import AREAS, Case
from tests.bad_inputs.catalogue import CASES
from tests.bad_inputs.check import check_case
from tests.bad_inputs.render_table import DOC, render


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_case(case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    check_case(case, tmp_path, monkeypatch)


def test_ids_are_unique_and_areas_known() -> None:
    repeated = [i for i, n in Counter(c.id for c in CASES).items() if n > 1]
    assert not repeated, f"duplicate case ids: {repeated}"
    assert {c.area for c in CASES} <= set(AREAS)
    assert all(c.raises is None or c.match for c in CASES), "an error case names nothing"


def test_every_fix_in_names_a_file_that_exists() -> None:
    """The triage hint (which file owns the check) follows the code when modules move."""
    root = Path(__file__).resolve().parents[2]
    stale = sorted({c.fix_in for c in CASES if c.fix_in and not (root / c.fix_in).is_file()})
    assert not stale, f"fix_in paths that no longer exist: {stale}"


def test_at_least_150_cases() -> None:
    assert len(CASES) >= 150, len(CASES)


def test_doc_table_is_up_to_date() -> None:
    assert DOC.read_text() == render(), (
        "docs/bad-inputs.md is out of date: run python -m tests.bad_inputs.render_table"
    )


def test_silent_case_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.bad_inputs.case import error

    quiet = error(
        "demo-silent", "planner API", "nothing happens", lambda tmp: None, "x", raises=ValueError
    )
    with pytest.raises(pytest.fail.Exception, match="silent"):
        check_case(quiet, tmp_path, monkeypatch)
    vague = error(
        "demo-vague", "planner API", "a short error", _raise_short, "x", raises=ValueError
    )
    with pytest.raises(pytest.fail.Exception, match="vague"):
        check_case(vague, tmp_path, monkeypatch)


def _raise_setting_error(tmp: Path) -> None:
    from lightning_varbatch.checks import check_count

    check_count("max_tokens", 0)


def test_the_exact_type_is_asserted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A subclass or a base class of the expected type is another outcome, and fails."""
    from lightning_varbatch.errors import SettingTypeError, SettingValueError
    from tests.bad_inputs.case import error

    right = error(
        "demo-exact", "planner API", "max_tokens=0", _raise_setting_error, "max_tokens",
        raises=SettingValueError, setting="max_tokens",
    )  # fmt: skip
    check_case(right, tmp_path, monkeypatch)
    for wrong in (ValueError, SettingTypeError):  # the base class; a sibling
        case = error(
            "demo-base", "planner API", "max_tokens=0", _raise_setting_error, "max_tokens",
            raises=wrong,
        )  # fmt: skip
        with pytest.raises(pytest.fail.Exception, match="expected exactly"):
            check_case(case, tmp_path, monkeypatch)
    other_setting = error(
        "demo-setting", "planner API", "max_tokens=0", _raise_setting_error, "max_tokens",
        raises=SettingValueError, setting="max_examples",
    )  # fmt: skip
    with pytest.raises(pytest.fail.Exception, match="expected an error on setting"):
        check_case(other_setting, tmp_path, monkeypatch)
    plain = error(
        "demo-plain", "planner API", "a short error", _raise_short, "x",
        raises=ValueError, setting="x",
    )  # fmt: skip
    with pytest.raises(pytest.fail.Exception, match="expected an error on setting 'x'"):
        check_case(plain, tmp_path, monkeypatch)


def test_an_error_case_has_one_exact_type() -> None:
    from tests.bad_inputs.case import error

    with pytest.raises(TypeError, match="raises must be one exception class"):
        error("demo", "planner API", "x", _raise_short, "x", raises=(ValueError, TypeError))  # type: ignore[arg-type]
    assert all(c.raises is None or isinstance(c.raises, type) for c in CASES)


def test_hang_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from tests.bad_inputs.case import error

    stuck = error(
        "demo-hang",
        "planner API",
        "waits forever",
        lambda tmp: time.sleep(5),
        "x",
        raises=ValueError,
    )
    with pytest.raises(pytest.fail.Exception, match="hang"):
        check_case(stuck, tmp_path, monkeypatch, hang_seconds=1)


def _raise_short(tmp: Path) -> None:
    raise ValueError("bad x")


FAMILY_PREFIX = {
    "PlanConfig": "config",
    "TokenBudgetBatchSampler": "sampler",
    "TokenBudgetDataModule": "dm",
    "DataSource": "source",
    "MixturePlanner": "mix",
    "PaddingCollate": "collate",
    "BatchSizeLRScaler": "lr",
    "TokenThroughputMonitor": "tp",
    "tokenized_lengths": "hf-tokenize",
}
# Settings a class hands unchanged to PlanConfig: their family is config-<name>-*.
PASSED_TO_PLAN_CONFIG = {
    "TokenBudgetBatchSampler": {
        "max_examples",
        "quadratic_coef",
        "flop_attention",
        "batch_size_multiple",
        "pad_to_multiple_of",
        "bucket_width",
        "seed",
        "max_shapes",
    },
}


def test_every_numeric_setting_has_a_family() -> None:
    """A numeric setting added to a public class must get its family of bad values here."""
    import inspect
    import re

    import lightning_varbatch as lv

    ids = {c.id for c in CASES}
    missing = []
    for cls_name, prefix in FAMILY_PREFIX.items():
        params = inspect.signature(getattr(lv, cls_name)).parameters.values()
        for p in params:
            if not re.search(r"\b(int|float)\b", str(p.annotation)):
                continue
            family = prefix
            if p.name in PASSED_TO_PLAN_CONFIG.get(cls_name, ()):
                family = "config"
            members = {i for i in ids if i.startswith(f"{family}-{p.name}-")}
            bad = {f"{family}-{p.name}-negative", f"{family}-{p.name}-nan"} & members
            good = any(m.endswith(("-int64", "-float32")) for m in members)
            if not (bad and good):
                missing.append(f"{cls_name}({p.name}=...): no {family}-{p.name}-* family")
    assert not missing, "\n".join(missing)
