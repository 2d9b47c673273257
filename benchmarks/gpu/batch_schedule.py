"""Training at equal tokens with and without a batch-size schedule on one CUDA GPU (issue 32).

The grid of :mod:`benchmarks.training.batch_schedule` (read its docstring: schedules ``none``
and ``ramp:0.25:T``, the example's peak learning rate and 3x it, seeds 0-2, the learning rate
by tokens, ``BatchSizeLRScaler(rule="sqrt")``, every run stopped at the same token count) at a
larger scale, bf16 autocast, one run after the other in this process. Not part of CI.

Run from the repository root on a machine with one CUDA GPU (venv active, a CUDA build of
torch)::

    python -m benchmarks.gpu.batch_schedule --json gpu_batch_schedule.json   # ~2-3 min, H100
    python -m benchmarks.gpu.batch_schedule --device cpu --tiny               # the code path

Defaults: the LM example's model 4 layers, 256 wide (4 heads, FFN 1024, vocabulary 1000),
100,000 embedded documents (2,000 held out) cut to 128 tokens, packed rows of 4,096 tokens
(SDPA with the document mask: no compile), 2M tokens per run (about 490 full steps), the ramp
over the first 30 % of them. Seeds run one after the other (each seed's four runs together);
no run starts once ``--budget-s`` seconds have passed, and the JSON is rewritten after every
run, so a session cut short keeps the seeds it finished.

Without CUDA it refuses (exit code 2) unless ``--device cpu`` is given.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Sequence
from dataclasses import replace

from benchmarks.harness import command_line, gpu_line, refuse_device, torch_machine_line
from benchmarks.training.batch_schedule import FULL, QUICK, Scale, describe, report, run_grid

MODULE = "benchmarks.gpu.batch_schedule"
GPU = replace(
    FULL,
    num_docs=100_000,
    valid=2000,
    max_tokens=4096,
    d_model=256,
    nhead=4,
    num_layers=4,
    dim_feedforward=1024,
    tokens=2_000_000,
    threads=4,
    attention="sdpa",
)


def scale_for(args: argparse.Namespace) -> Scale:
    """The grid's sizes: :data:`GPU`, or the CPU script's quick ones with ``--tiny``."""
    scale = replace(QUICK if args.tiny else GPU, device=args.device)
    if args.tokens is not None:
        scale = replace(scale, tokens=args.tokens)
    if args.seeds is not None:
        scale = replace(scale, seeds=tuple(args.seeds))
    return scale


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --tiny)")
    p.add_argument("--tiny", action="store_true", help="the CPU script's quick sizes")
    p.add_argument("--tokens", type=int, default=None, help="planning tokens per run")
    p.add_argument("--seeds", type=int, nargs="+", default=None)
    p.add_argument("--budget-s", type=float, default=math.inf, help="start no run after this")
    p.add_argument("--json", default=None, help="write the runs and the table here")
    args = p.parse_args(argv)
    if refuse_device(
        MODULE, args.device, args.tiny, "this grid", "benchmarks.training.batch_schedule"
    ):
        return 2
    started = time.perf_counter()
    scale = scale_for(args)
    print("command:", command_line(MODULE, argv))
    print("machine:", torch_machine_line())
    if scale.device.startswith("cuda"):
        print("gpu:", gpu_line())
    describe(scale)
    runs = run_grid(scale, args.json, deadline=started + args.budget_s)
    report(scale, runs, args.json, started)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
