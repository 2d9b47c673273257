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


def test_at_least_150_cases() -> None:
    assert len(CASES) >= 150, len(CASES)


def test_doc_table_is_up_to_date() -> None:
    assert DOC.read_text() == render(), (
        "docs/bad-inputs.md is out of date: run python -m tests.bad_inputs.render_table"
    )


def test_silent_case_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.bad_inputs.case import error

    quiet = error("demo-silent", "planner API", "nothing happens", lambda tmp: None, "x")
    with pytest.raises(pytest.fail.Exception, match="silent"):
        check_case(quiet, tmp_path, monkeypatch)
    vague = error("demo-vague", "planner API", "a short error", _raise_short, "x")
    with pytest.raises(pytest.fail.Exception, match="vague"):
        check_case(vague, tmp_path, monkeypatch)


def test_hang_is_caught(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import time

    from tests.bad_inputs.case import error

    stuck = error("demo-hang", "planner API", "waits forever", lambda tmp: time.sleep(5), "x")
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
