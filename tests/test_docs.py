"""Every code block of README.md and docs/*.md runs (or is checked), and every link resolves.

How blocks are run and annotated: see ``tests/docs_runner.py``. The second half of this file
tests the runner itself, so that a wrong name in a doc snippet does fail.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.docs_runner import (
    DOC_FILES,
    ROOT,
    DocError,
    Session,
    check_bash,
    parse,
    run_block,
    run_file,
)


@pytest.mark.slow
@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_doc_blocks_run(path: Path, tmp_path: Path) -> None:
    session = run_file(path, tmp_path)
    assert session.ran or not parse(path), f"{path}: no block was run"


def test_docs_folder_is_linked_from_the_index() -> None:
    index = (ROOT / "docs" / "index.md").read_text()
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"({page.name})" in index, f"docs/index.md does not link {page.name}"
    assert "(docs/index.md)" in (ROOT / "README.md").read_text()


_LINK = re.compile(r"(?<!!)\[[^\]]+\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#+\s+(.*)$", text, flags=re.M)}


@pytest.mark.parametrize("path", DOC_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in _LINK.findall(text):
        if re.match(r"[a-z]+://", target) or target.startswith("mailto:"):
            continue
        file_part, _, anchor = target.partition("#")
        dest = (path.parent / file_part).resolve() if file_part else path
        assert dest.exists(), f"{path.name}: broken link {target}"
        if anchor and dest.suffix == ".md":
            assert anchor in _anchors(dest), f"{path.name}: no heading #{anchor} in {dest.name}"


# -- the runner itself -------------------------------------------------------------------------


def _run_text(text: str, tmp_path: Path) -> Session:
    tmp_path.mkdir(exist_ok=True)
    doc = tmp_path / "doc.md"
    doc.write_text(text)
    work = tmp_path / "work"
    work.mkdir()
    return run_file(doc, work)


def test_a_wrong_api_name_fails(tmp_path: Path) -> None:
    text = "```python\nfrom lightning_varbatch import TokenBudgetSampler\n```\n"
    with pytest.raises(DocError, match=r"doc.md:2: .*ImportError"):
        _run_text(text, tmp_path)


def test_python_blocks_share_a_namespace_and_output_is_compared(tmp_path: Path) -> None:
    ok = "```python\nx = 2\n```\n\n```python\nprint('x is', x * 21)\n```\n"
    good = ok + "<!-- doctest: output -->\n```text\nx is ...\n```\n"
    assert len(_run_text(good, tmp_path).ran) == 3
    bad = ok + "<!-- doctest: output -->\n```text\nx is 41\n```\n"
    with pytest.raises(DocError, match="no output line matches"):
        _run_text(bad, tmp_path / "bad")


@pytest.mark.parametrize(
    "text",
    [
        "```bash\necho hi\n```\n",
        "```\nplain\n```\n",
        "```yaml\na: 1\n```\n",
        "```text\nsome output\n```\n",
        "<!-- doctest: skip-run -->\n```bash\ntorchrun x.py\n```\n",
        "<!-- doctest: runn -->\n```python\nx = 1\n```\n",
    ],
)
def test_blocks_without_a_valid_annotation_are_refused(text: str, tmp_path: Path) -> None:
    with pytest.raises(DocError):
        parse(tmp_path / "doc.md", text)


def test_skip_run_checks_overrides_flags_and_files(tmp_path: Path) -> None:
    def problems(code: str) -> list[str]:
        return [p for p in check_bash(code, tmp_path) if p]

    assert problems("python examples/translation/train.py strategy=fsdp data.max_tokens=8") == []
    assert problems("python examples/translation/train.py -m data.max_tokens=2048,4096") == []
    assert problems("python examples/translation/train.py data.max_tokenz=8")
    assert problems("python examples/translation/train.py strategy=nosuch")
    torchrun = "torchrun --nnodes 2 --nproc-per-node 8 --node-rank $R"
    assert problems(f"{torchrun} examples/translation/train.py trainer.num_nodes=2") == []
    assert problems("torchrun --nodes 2 examples/translation/train.py")
    assert problems("python -m lightning_varbatch.plan --max-tokens 8 --synthetic wmt") == []
    assert problems("python -m lightning_varbatch.plan --max-tokenz 8 --synthetic wmt")
    assert problems("python my_missing_script.py")
    assert problems("pip install torch==1.0.0")
    assert problems('pip install -e ".[nosuchextra]"')
    assert problems("rm -rf /")


def test_quote_must_be_a_string_of_the_module(tmp_path: Path) -> None:
    session = Session(tmp_path)
    quote = "<!-- doctest: quote lightning_varbatch.loss -->\n```text\n{}\n```\n"
    good = parse(tmp_path / "d.md", quote.format("must be > 0, got"))[0]
    run_block(good, session)
    bad = parse(tmp_path / "d.md", quote.format("must be a negative integer"))[0]
    with pytest.raises(DocError, match="not a string"):
        run_block(bad, session)


def test_bash_run_must_exit_zero(tmp_path: Path) -> None:
    with pytest.raises(DocError, match="exited with 3"):
        _run_text("<!-- doctest: run -->\n```bash\nexit 3\n```\n", tmp_path)
