"""What the three parts of the Hugging Face ``datasets`` benchmark share: children and ratios.

Each part (:mod:`~benchmarks.sources.hf_lengths`, :mod:`~benchmarks.sources.hf_tokens`,
:mod:`~benchmarks.sources.hf_loader`) runs every measurement in a fresh
``python -m benchmarks.sources.<part> --child SPEC`` process (:func:`measure`), or in this
process under ``--quick``. Timing ratios are paired: each round measures the baseline and ours,
and a ratio is taken within a round (:func:`paired`), its median and range over the rounds
reported.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.harness import child_command, child_env, emit_result, run_child

Spec = dict[str, Any]


def measure(
    module: str, child_run: Callable[[Spec], Spec], spec: Spec, in_process: bool = False
) -> Spec:
    """Run ``child_run(spec)`` in a fresh ``python -m <module> --child SPEC`` process.

    ``in_process`` (``--quick``): in this process instead, the result passed through JSON as
    a child's would be (no start-up per measurement; the figures then less clean).
    """
    if in_process:
        result: Spec = json.loads(json.dumps(child_run(spec)))
        return result
    cmd = child_command(module, "--child", json.dumps(spec))
    found: Spec = run_child(cmd, env=child_env(TOKENIZERS_PARALLELISM="true"), timeout=900)[-1]
    return found


def child_main(child_run: Callable[[Spec], Spec], argv: Sequence[str] | None = None) -> int:
    """The ``--child SPEC`` entry point of a part module: run one measurement, print it."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or args[0] != "--child":
        raise SystemExit("usage: python -m benchmarks.sources.<part> --child SPEC (internal)")
    emit_result(child_run(json.loads(args[1])))
    return 0


def paired(ratios: Sequence[float]) -> dict[str, Any]:
    """Median and range of per-round ratios: ``{"all", "median", "min", "max"}``.

    Example:
        >>> paired([2.0, 1.0, 4.0])["median"], paired([2.0, 1.0, 4.0])["min"]
        (2.0, 1.0)
    """
    return {
        "all": list(ratios),
        "median": statistics.median(ratios),
        "min": min(ratios),
        "max": max(ratios),
    }


def ratio_text(r: dict[str, Any], spec: str = ".2f") -> str:
    """``median (min-max)`` of a :func:`paired` ratio."""
    return f"{r['median']:{spec}} ({r['min']:{spec}}-{r['max']:{spec}})"


def versions() -> str:
    """The versions of the libraries the Hugging Face benchmark measures."""
    import datasets
    import numpy
    import pyarrow
    import tokenizers
    import torch

    return (
        f"numpy {numpy.__version__}, torch {torch.__version__}, datasets {datasets.__version__}, "
        f"pyarrow {pyarrow.__version__}, tokenizers {tokenizers.__version__}"
    )
