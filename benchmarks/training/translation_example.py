"""The README's example result: run the main command once and write its final metrics.

Run from the repository root (venv active)::

    python -m benchmarks.training.translation_example            # ~3-5 min on 2 CPU cores
    python -m benchmarks.training.translation_example cpu_threads=1   # extra Hydra overrides

It runs ``python examples/translation/train.py`` (the README's main command, its defaults)
with ``output_dir`` set to ``outputs/translation_example/<start time>`` (kept), reads the
run's ``metrics.json`` and its CSV log, and writes
``benchmarks/results/translation_example.json``: the final validation BLEU and chrF, the
BLEU at every validation, the training time the script reports, the wall time of the command
and the last value of every logged metric. The README's figures are rendered from that file.
The script's output goes to ``<output_dir>.log``.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from benchmarks.harness import ROOT, run_program
from benchmarks.results import Run

SCRIPT = "examples/translation/train.py"


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def read_log(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every metric of the CSV log as ``(step, value)`` pairs, in the order logged."""
    out: dict[str, list[tuple[int, float]]] = {}
    for path in sorted(log_dir.rglob("metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                step = int(float(row.get("step") or 0))
                for key, text in row.items():
                    value = _number(text) if key != "step" and text else None
                    if value is not None:
                        out.setdefault(key, []).append((step, value))
    return out


def summarise(metrics: dict[str, Any], log: dict[str, list[tuple[int, float]]]) -> dict[str, Any]:
    """The figures the README quotes, from ``metrics.json`` and the CSV log."""
    scalars = {k: v for k, v in metrics.items() if isinstance(v, int | float)}
    bleu_by_step = {str(step): value for step, value in log.get("val/bleu", [])}
    last = {key: values[-1][1] for key, values in log.items()}
    return {
        "log_last": last,
        "val_bleu": metrics.get("val/bleu"),
        "val_chrf": metrics.get("val/chrf"),
        "bleu_by_step": bleu_by_step,
        "global_step": metrics.get("global_step"),
        "train_seconds": metrics.get("seconds"),
        "scalars": scalars,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("overrides", nargs="*", help="Hydra overrides added to the main command")
    p.add_argument("--out", default="", help="result file (default benchmarks/results/...)")
    args = p.parse_args(argv)
    run = Run(
        "translation_example",
        settings={"script": SCRIPT, "overrides": args.overrides},
        package=["examples.translation.train"],
        bench=["benchmarks.training.translation_example"],
    )
    out_dir = Path(ROOT, "outputs", "translation_example", run.started.replace(":", "-"))
    command = [sys.executable, SCRIPT, *args.overrides, f"output_dir={out_dir}"]
    t0 = time.perf_counter()
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    print(f"running {' '.join(command[1:])}; output in {out_dir}.log", flush=True)
    run_program(command, f"{out_dir}.log")
    wall = time.perf_counter() - t0
    metrics = json.loads((out_dir / "metrics.json").read_text())
    results = summarise(metrics, read_log(out_dir))
    results["wall_seconds"] = wall
    run.write(results, args.out)
    print(json.dumps({k: v for k, v in results.items() if k != "scalars"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
