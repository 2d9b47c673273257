"""Render docs/bad-inputs.md from the case table.

Usage (from the repository root)::

    python -m tests.bad_inputs.render_table          # rewrite docs/bad-inputs.md
    python -m tests.bad_inputs.render_table --check  # exit 1 when it is out of date
    python -m tests.bad_inputs.render_table --report # run every case, list failures by file

Example:
    >>> "| id | area | input | outcome |" in render()
    True
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from tests.bad_inputs.case import AREAS, MIN_MESSAGE, Case

DOC = Path(__file__).resolve().parents[2] / "docs" / "bad-inputs.md"

INTRO = f"""\
# Bad inputs and faults: what a user gets

Every bad input gets an error that names the argument, file, item or environment variable,
the value received, what is allowed, and the fix. It is raised before training starts wherever
the information exists then (settings when an object is built, lengths against the dataset when
a loader is built, a checkpoint when it is loaded). Inputs that only look unusual (numpy
integers, huge lengths within the budget, a resume on another number of ranks) are accepted.
Nothing is silently dropped, ignored or reinterpreted, and nothing hangs.

This table is generated from the executable catalogue in `tests/bad_inputs/` (one record per
row) and checked by `python -m pytest -q tests/bad_inputs`: each case is run and its outcome
asserted. An "error" row passes only when exactly that exception type is raised (not a
subclass or a base class: `type(error) is X`; a bad setting raises `SettingTypeError` or
`SettingValueError`, a checkpoint that does not match the run `ResumeMismatchError`, see
`lightning_varbatch.errors`), with, where the row names a setting, that setting as the error's
`.setting`, and its message contains every piece listed (case-insensitive; "`a` or `b`":
either), is at least {MIN_MESSAGE} characters long and says what is allowed or what to
change (one of a list of words such as "must", "expected", "choose", "pass", "set"), and it
must not mention a setting listed after "not blaming" (the wrong fix). A case that raises nothing
fails as *silent*, one that runs over the time limit fails as a *hang*. An "accepted" row
must run without an error, and its callable checks the result (every example exactly once,
the right rank, the figure where the CLI says it wrote it). A numeric setting of a public
class without its family of cases (0, negative, float, bool, str, NaN, inf, None, numpy)
fails a test, so new settings cannot slip past the catalogue. The examples' own checks of
their Hydra settings are tested in `tests/examples/`; the `examples` rows here are library
errors an example names by the Hydra key the user overrode (`data.rank_shares`).

## Adding a case

1. Add a record to the `CASES` list of the area's module in `tests/bad_inputs/` (`cases_*.py`):
   `error(id, area, input in words, callable, *pieces, raises=OneExactType, setting=...)` or
   `accepted(id, area, input, callable)`; for a numeric setting use `int_family` /
   `real_family` from `families.py`, which add 0, negative, float, bool, str, NaN, inf and
   `None` members and the numpy-integer goods.
2. The callable gets a fresh temporary directory; set environment variables with `env=`.
3. Run `python -m tests.bad_inputs.render_table` to regenerate this file (a test fails when it
   is out of date), then `python -m pytest -q tests/bad_inputs`.
4. `python -m tests.bad_inputs.render_table --report` runs every case and lists the failing
   ones grouped by the library file that owns the check (`fix_in=`).

"""


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def render(cases: list[Case] | None = None) -> str:
    """The whole document for ``cases`` (default: the catalogue)."""
    if cases is None:
        from tests.bad_inputs.catalogue import CASES

        cases = CASES
    counts = Counter(c.area for c in cases)
    lines = [INTRO, f"## The table ({len(cases)} cases)", ""]
    lines += ["| area | cases |", "|---|---|"]
    lines += [f"| {area} | {counts[area]} |" for area in AREAS if counts[area]]
    lines += ["", "| id | area | input | outcome |", "|---|---|---|---|"]
    lines += [f"| `{c.id}` | {c.area} | {_cell(c.input)} | {_cell(c.outcome)} |" for c in cases]
    return "\n".join(lines) + "\n"


def report() -> int:
    """Run every case; print the failures grouped by the library file that owns the check."""
    import tempfile

    import pytest

    from tests.bad_inputs.catalogue import CASES
    from tests.bad_inputs.check import check_case

    failures: dict[str, list[str]] = {}
    for case in CASES:
        with tempfile.TemporaryDirectory() as tmp, pytest.MonkeyPatch.context() as mp:
            try:
                check_case(case, Path(tmp), mp)
            except pytest.fail.Exception as failed:
                first = str(failed).splitlines()[0]
                failures.setdefault(case.fix_in or "?", []).append(f"- {first}")
    print(f"{len(CASES)} cases, {sum(map(len, failures.values()))} fail")
    for owner in sorted(failures):
        print(f"\n{owner} ({len(failures[owner])})", *failures[owner], sep="\n")
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check`` compare) docs/bad-inputs.md; returns the exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail when the doc is stale")
    parser.add_argument("--report", action="store_true", help="run the cases, list failures")
    args = parser.parse_args(argv)
    if args.report:
        return report()
    text = render()
    if args.check:
        current = DOC.read_text() if DOC.exists() else ""
        if current != text:
            print(f"{DOC} is out of date: run python -m tests.bad_inputs.render_table")
            return 1
        return 0
    DOC.write_text(text)
    print(f"wrote {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
