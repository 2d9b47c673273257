"""Every figure in README.md, docs/*.md and benchmarks/RESULTS.md is its result file's.

A figure sits between ``<!-- fig:... -->`` / ``<!-- table:... -->`` markers and is rendered by
``python -m benchmarks.render`` from ``benchmarks/results/<name>.json``; a result is stale when
code it measured changed since it was written (rule: benchmarks/RESULTS.md, "How figures are
kept current"). Fast: no benchmark runs here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import render, results
from benchmarks.results import Run, fingerprint, import_closure, stale_modules


def test_documents_match_their_result_files() -> None:
    diffs = render.render_all(write=False)
    assert not diffs, (
        "figures differ from their result files (run `python -m benchmarks.render`):\n"
        + "\n".join(str(d) for d in diffs)
    )


def test_documents_quote_figures() -> None:
    text = "".join(p.read_text() for p in render.documents())
    assert render.FIGURE.search(text) and render.TABLE.search(text)


def test_no_result_is_stale() -> None:
    stale = results.stale_results()
    lines = [f"benchmarks/results/{n}.json: {', '.join(m)}" for n, m in stale.items()]
    assert not stale, (
        "results whose measured code changed since they were written (rerun the benchmark, "
        "see benchmarks/RESULTS.md 'How figures are kept current'):\n" + "\n".join(lines)
    )


def test_every_result_records_its_provenance() -> None:
    for name in results.result_names():
        data = results.load_result(name)
        p = data["provenance"]
        for key in ("commit", "started", "machine", "load_before", "settings", "command"):
            assert key in p, f"{name}: provenance lacks {key}"
        assert data["code"], f"{name}: no code fingerprint"


def test_a_changed_module_makes_its_result_stale(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module = tmp_path / "lightning_varbatch" / "fake.py"
    module.parent.mkdir()
    (module.parent / "__init__.py").write_text("")
    module.write_text('"""Doc."""\n\nX = 1  # a comment\n')
    monkeypatch.setattr(results, "ROOT", str(tmp_path))
    record = {"code": {"lightning_varbatch.fake": fingerprint("lightning_varbatch.fake")}}
    module.write_text('"""Other doc."""\n\n\nX = 1\n')  # docs, comments, layout: not stale
    assert stale_modules(record) == []
    module.write_text("X = 2\n")
    assert stale_modules(record) == ["lightning_varbatch.fake"]


def test_the_closure_follows_reexports_not_unrelated_modules() -> None:
    closure = import_closure(["lightning_varbatch.planner.synthetic"])
    assert "lightning_varbatch.planner.synthetic" in closure
    assert "lightning_varbatch.data.sampler" not in closure
    assert "lightning_varbatch.callbacks.throughput" not in closure


def test_render_text_rewrites_between_markers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(results, "RESULTS_DIR", tmp_path)
    run = Run("toy", settings={"n": 3}, package=[], bench=["benchmarks.render"])
    run.write({"time": 0.4712, "rows": [{"pad": 0.99461}]}, "")
    data = json.loads((tmp_path / "toy.json").read_text())
    assert data["provenance"]["settings"] == {"n": 3} and "benchmarks.render" in data["code"]
    text = (
        "takes <!-- fig:toy:time:.2f -->0.28<!-- /fig --> s, "
        "<!-- fig:toy:rows.0.pad:.4f -->0.9946<!-- /fig -->"
    )
    new, diffs = render.render_text(text, render.Results(), "doc.md")
    assert "-->0.47<!--" in new and len(diffs) == 1 and diffs[0].found == "0.28"
    _, errors = render.render_text("<!-- fig:toy:nope:.2f -->1<!-- /fig -->", render.Results(), "d")
    assert errors and errors[0].rendered.startswith("error:")
