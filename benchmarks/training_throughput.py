"""Training throughput: token-budget batches against fixed-size batches, same data, same steps.

Run from the repository root (``-m`` puts the root on ``sys.path``)::

    python -m benchmarks.training_throughput            # default: about 3 min on 2 CPU cores
    python -m benchmarks.training_throughput --quick    # smoke test, < 20 s

Workload: the translation model of ``examples/translation/model.py`` (``TranslationModel``:
pre-norm encoder-decoder, tied embeddings), by default ``d_model=128``, 4 heads, 2 + 2 layers,
FFN 512, vocabulary 8000, dropout 0.1, trained with Adam (lr 1e-4) on the summed cross
entropy over real target tokens divided by their count. Data: random token ids with WMT14
en-de-like (source, target) lengths (:func:`lightning_varbatch.synthetic.wmt_like_lengths`)
multiplied by ``--length-scale`` (default 0.5: median 12, p99 55, longest 128; the shape of the
long tail, p99 / median = 4.6, is kept) and rounded, at least 1; the target tensor is
``[BOS] + target`` (the model reads ``target[:, :-1]`` and predicts ``target[:, 1:]``). The
examples are the first ``n`` of that generator where ``n`` is the smallest count with at least
``--target-tokens`` (default 40k) real target tokens: **every configuration trains on exactly
the same examples, once**, so on the same number of real tokens.

Configurations (batches built before timing; padding to the longest member of each batch):

* **(a) ours**: :class:`lightning_varbatch.TokenBudgetBatchSampler` (``max_tokens`` =
  ``--max-tokens``, padded cost ``n * max(src, tgt)``, ``world_size=1``, one epoch).
* **(b) random fixed**: a random permutation cut into batches of ``B`` examples, ``B`` = the
  mean number of examples per batch of (a) rounded (so (b) has as many optimizer steps as (a),
  give or take one).
* **(c) sorted fixed**: examples sorted by ``max(src, tgt)``, cut into batches of ``B``, batch
  order shuffled (the best case of length grouping with a fixed batch size: a global sort,
  tighter than Hugging Face's mega-batches of 50).

Measurements, each configuration in a **fresh subprocess** (``torch.set_num_threads(--threads)``,
default 1; default allocator settings), configurations interleaved ``a b c``, ``c b a``, ... for
``--rounds`` rounds (default 2):

* **step time**: ``perf_counter`` around forward + loss + backward + optimizer step + zero_grad
  (``torch.cuda.synchronize`` around it on a GPU); the first ``--warmup`` steps of each run are
  left out of the timing and of the token counts.
* **real tokens/sec**: real target tokens (the loss tokens) of the timed steps / their summed
  step time; the table shows the median over rounds, and the **speed-up** of (a) over (b) and
  over (c) (ratio of medians).
* **padded fraction**: 1 - real / allocated slots, over the whole epoch, where slots are the
  padded source and target tensors (``B * S + B * T``) and real their non-pad tokens.
* **padding-predicted speed-up** of (a) over (b): (b)'s slots per real token / (a)'s (the same
  examples, so the ratio of total slots). **realised fraction** = measured speed-up /
  predicted speed-up.
* **peak memory**: on CPU, the rise of the process resident-set high-water mark (VmHWM,
  reset through ``/proc/self/clear_refs``) over the training loop, above the resident set just
  before the first step (the model and the pre-built batches are already resident; Adam's state,
  created at the first step, is included, the same in every configuration). ``tracemalloc``
  does not see torch's CPU tensors, hence RSS. It is the process's footprint with the default
  glibc allocator, which keeps some freed memory for reuse, so it is an upper bound of the live
  tensors. On CUDA, ``torch.cuda.max_memory_allocated`` over the loop. The table shows the
  largest over rounds.

Target (issue 6): (a) at least 2.5x the real tokens/sec of (b).

:mod:`benchmarks.gpu_throughput` runs the same measurements with Transformer-base sizes in
bf16 on one CUDA GPU.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from benchmarks.planning import print_table

CONFIGS = ("a", "b", "c")
NAMES = {
    "a": "(a) ours: token budget",
    "b": "(b) random, fixed B",
    "c": "(c) sorted, fixed B",
}
TARGET_SPEEDUP = 2.5
PAD_ID, BOS_ID, FIRST_WORD = 0, 1, 3


# -- the workload --------------------------------------------------------------------------------


@dataclass
class Settings:
    """Everything a run depends on; the parent passes it to each child as JSON."""

    target_tokens: int = 40_000
    length_scale: float = 0.5
    max_tokens: int = 1024
    vocab: int = 8000
    d_model: int = 128
    nhead: int = 4
    layers: int = 2
    ffn: int = 512
    dropout: float = 0.1
    lr: float = 1e-4
    warmup: int = 2
    threads: int = 1
    seed: int = 0
    device: str = "cpu"
    bf16: bool = False
    max_steps: int | None = None  # only for smoke tests: stop each run early


def workload_lengths(s: Settings) -> np.ndarray:
    """(n, 2) int64 (source, target) lengths: WMT-like, scaled, enough real target tokens."""
    from lightning_varbatch.synthetic import wmt_like_lengths

    n = max(16, int(2 * s.target_tokens / max(1.0, 26.0 * s.length_scale)))
    while True:
        raw = wmt_like_lengths(n, seed=s.seed).astype(np.float64)
        lengths = np.maximum(1, np.rint(raw * s.length_scale)).astype(np.int64)
        total = np.cumsum(lengths[:, 1])
        if total[-1] >= s.target_tokens:
            m = int(np.searchsorted(total, s.target_tokens)) + 1
            return lengths[:m]
        n *= 2


def plan_lengths(lengths: np.ndarray) -> np.ndarray:
    """Tensor lengths (source, [BOS] + target) that the planner and the padding see."""
    out = lengths.copy()
    out[:, 1] += 1
    return out


def make_batches(kind: str, lengths: np.ndarray, s: Settings) -> tuple[list[np.ndarray], int]:
    """(batches of example ids, fixed batch size B derived from (a)) for configuration ``kind``."""
    from lightning_varbatch import TokenBudgetBatchSampler

    tensor_lengths = plan_lengths(lengths)
    ours = [
        np.asarray(b, dtype=np.int64)
        for b in TokenBudgetBatchSampler(
            tensor_lengths, s.max_tokens, rank=0, world_size=1, seed=s.seed
        )
    ]
    n = lengths.shape[0]
    fixed = max(1, round(n / len(ours)))
    if kind == "a":
        return ours, fixed
    rng = np.random.default_rng([s.seed, 7])
    if kind == "b":
        order = rng.permutation(n)
        return [order[i : i + fixed] for i in range(0, n, fixed)], fixed
    if kind == "c":
        key = tensor_lengths.max(axis=1)
        order = np.argsort(key, kind="stable")
        batches = [order[i : i + fixed] for i in range(0, n, fixed)]
        return [batches[i] for i in rng.permutation(len(batches))], fixed
    raise ValueError(f"unknown configuration {kind!r}; expected one of {CONFIGS}")


def collate(ids: np.ndarray, lengths: np.ndarray, vocab: int, seed: int) -> dict[str, Any]:
    """Padded random-token batch in the layout ``TranslationModel`` reads."""
    import torch

    g = torch.Generator()
    g.manual_seed(seed)
    src = torch.from_numpy(lengths[ids, 0])
    tgt = torch.from_numpy(lengths[ids, 1] + 1)  # [BOS] + target
    batch: dict[str, Any] = {}
    for name, lens in (("source", src), ("target", tgt)):
        width = int(lens.max())
        mask = torch.arange(width)[None, :] < lens[:, None]
        tokens = torch.randint(FIRST_WORD, vocab, (len(ids), width), generator=g)
        tokens = tokens.masked_fill(~mask, PAD_ID)
        batch[name] = tokens
        batch[f"{name}_mask"] = mask
    batch["target"][:, 0] = BOS_ID
    return batch


def slots_and_real(batches: Sequence[np.ndarray], lengths: np.ndarray) -> tuple[int, int]:
    """(allocated source + target slots, real source + target tokens) over the batches."""
    tl = plan_lengths(lengths)
    slots = real = 0
    for ids in batches:
        sub = tl[ids]
        slots += len(ids) * int(sub[:, 0].max() + sub[:, 1].max())
        real += int(sub.sum())
    return slots, real


# -- one run (child process) ---------------------------------------------------------------------


def _proc_kib(field_name: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            match = re.search(rf"^{field_name}:\s+(\d+) kB", f.read(), re.MULTILINE)
    except OSError:
        return None
    return int(match.group(1)) if match else None


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        return False
    return True


@dataclass
class RunResult:
    kind: str
    steps: int
    fixed_batch: int
    timed_steps: int
    timed_s: float
    timed_real_tgt: int
    total_s: float
    real_tgt: int
    slots: int
    real: int
    mean_examples: float
    max_examples: int
    max_slots: int
    peak_mb: float | None
    rss_before_mb: float | None
    step_s: list[float] = field(default_factory=list)


def build_model(s: Settings) -> Any:
    from examples.translation.model import TranslationModel

    return TranslationModel(
        vocab_size=s.vocab,
        d_model=s.d_model,
        nhead=s.nhead,
        num_encoder_layers=s.layers,
        num_decoder_layers=s.layers,
        dim_feedforward=s.ffn,
        dropout=s.dropout,
        max_positions=512,
        decode_batches=0,
    )


def run_child(kind: str, s: Settings) -> RunResult:
    """Train one configuration for one epoch of the workload; measure it."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(s.threads)
    torch.manual_seed(s.seed)
    device = torch.device(s.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch.cuda.is_available() is False")
    lengths = workload_lengths(s)
    batches, fixed = make_batches(kind, lengths, s)
    if s.max_steps is not None:
        batches = batches[: s.max_steps]
    data = [collate(ids, lengths, s.vocab, s.seed + i) for i, ids in enumerate(batches)]
    slots, real = slots_and_real(batches, lengths)
    model = build_model(s).to(device)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=s.lr)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(batch: dict[str, Any]) -> int:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=s.bf16):
            logits = model(batch)
        labels = batch["target"][:, 1:]
        real_mask = batch["target_mask"][:, 1:]
        ntok = int(real_mask.sum())
        loss = F.cross_entropy(logits[real_mask].float(), labels[real_mask], reduction="sum")
        (loss / ntok).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return ntok

    moved = [{k: v.to(device, non_blocking=True) for k, v in b.items()} for b in data]
    del data
    sync()
    rss_before = _proc_kib("VmRSS")
    hwm_ok = device.type == "cpu" and _reset_hwm()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
    times: list[float] = []
    toks: list[int] = []
    t_start = time.perf_counter()
    for batch in moved:
        sync()
        t0 = time.perf_counter()
        ntok = step(batch)
        sync()
        times.append(time.perf_counter() - t0)
        toks.append(ntok)
    total = time.perf_counter() - t_start
    peak_mb: float | None = None
    if device.type == "cuda":
        peak_mb = (torch.cuda.max_memory_allocated(device) - base) / 2**20
    elif hwm_ok and rss_before is not None:
        hwm = _proc_kib("VmHWM")
        peak_mb = None if hwm is None else (hwm - rss_before) / 1024
    w = min(s.warmup, max(0, len(times) - 1))
    sizes = [len(b) for b in batches]
    tl = plan_lengths(lengths)
    return RunResult(
        kind=kind,
        steps=len(times),
        fixed_batch=fixed,
        timed_steps=len(times) - w,
        timed_s=sum(times[w:]),
        timed_real_tgt=sum(toks[w:]),
        total_s=total,
        real_tgt=sum(toks),
        slots=slots,
        real=real,
        mean_examples=float(np.mean(sizes)),
        max_examples=max(sizes),
        max_slots=max(len(b) * int(tl[b, 0].max() + tl[b, 1].max()) for b in batches),
        peak_mb=peak_mb,
        rss_before_mb=None if rss_before is None else rss_before / 1024,
        step_s=times,
    )


# -- the parent: interleaved runs in fresh processes ---------------------------------------------


def spawn(module: str, kind: str, s: Settings) -> RunResult:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", str(s.threads))
    cmd = [sys.executable, "-m", module, "--child", kind, "--settings", json.dumps(asdict(s))]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=root, check=False)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return RunResult(**json.loads(line[7:]))
    raise RuntimeError(f"run {kind} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")


@dataclass
class Summary:
    kind: str
    tps: list[float]
    runs: list[RunResult]

    @property
    def tps_median(self) -> float:
        return statistics.median(self.tps)


def run_all_configs(
    module: str, s: Settings, rounds: int, in_process: bool = False
) -> dict[str, Summary]:
    """Run every configuration ``rounds`` times, interleaved; each in a fresh process unless
    ``in_process`` (the smoke test: no imports per run, memory figures then less clean)."""
    out = {k: Summary(k, [], []) for k in CONFIGS}
    for r in range(rounds):
        order = CONFIGS if r % 2 == 0 else tuple(reversed(CONFIGS))
        for kind in order:
            res = run_child(kind, s) if in_process else spawn(module, kind, s)
            tps = res.timed_real_tgt / res.timed_s
            out[kind].tps.append(tps)
            out[kind].runs.append(res)
            print(
                f"  round {r} {NAMES[kind]:<24} {res.steps:4d} steps, "
                f"{res.timed_s:7.2f} s timed, {tps:8.0f} real tgt tok/s, "
                f"peak {_fmt(res.peak_mb, '.0f')} MB",
                flush=True,
            )
    return out


def _fmt(x: object, spec: str = ".2f") -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "-"
    return format(x, spec)


def report(
    results: dict[str, Summary], s: Settings, peak_label: str, smoke: bool = False
) -> dict[str, Any]:
    """Print the table and the target; return the numbers (for RESULTS.md and plots)."""
    a = results["a"]
    headers = [
        "configuration",
        "steps",
        "B mean",
        "B max",
        "max slots",
        "tgt tok/s",
        "min..max",
        "x (b)",
        "pad frac",
        "slots/real",
        peak_label,
        "epoch s",
    ]
    rows = []
    out: dict[str, Any] = {"configs": {}}
    for kind in CONFIGS:
        summ = results[kind]
        r0 = summ.runs[0]
        ratio = summ.tps_median / results["b"].tps_median
        peaks = [r.peak_mb for r in summ.runs if r.peak_mb is not None]
        pad = 1 - r0.real / r0.slots
        rows.append(
            [
                NAMES[kind],
                str(r0.steps),
                f"{r0.mean_examples:.1f}",
                str(r0.max_examples),
                f"{r0.max_slots:,}",
                f"{summ.tps_median:,.0f}",
                f"{min(summ.tps):,.0f}..{max(summ.tps):,.0f}",
                f"{ratio:.2f}",
                f"{pad:.3f}",
                f"{r0.slots / r0.real:.3f}",
                _fmt(max(peaks) if peaks else None, ".0f"),
                f"{statistics.median(r.total_s for r in summ.runs):.1f}",
            ]
        )
        out["configs"][kind] = {
            "tps_median": summ.tps_median,
            "tps": summ.tps,
            "speedup_vs_b": ratio,
            "pad_fraction": pad,
            "slots_per_real": r0.slots / r0.real,
            "peak_mb": max(peaks) if peaks else None,
            "steps": r0.steps,
            "mean_examples": r0.mean_examples,
            "epoch_s": [r.total_s for r in summ.runs],
        }
    print_table(headers, rows)
    b, c = results["b"], results["c"]
    measured = a.tps_median / b.tps_median
    predicted = (b.runs[0].slots / b.runs[0].real) / (a.runs[0].slots / a.runs[0].real)
    vs_c = a.tps_median / c.tps_median
    pred_c = (c.runs[0].slots / c.runs[0].real) / (a.runs[0].slots / a.runs[0].real)
    per_round = [ta / tb for ta, tb in zip(a.tps, b.tps, strict=True)]
    print(
        f"\nspeed-up of (a) over (b): {measured:.2f}x (per round: "
        + ", ".join(f"{x:.2f}" for x in per_round)
        + f"); padding predicts {predicted:.2f}x; realised fraction {measured / predicted:.2f}"
    )
    print(
        f"speed-up of (a) over (c): {vs_c:.2f}x; padding predicts {pred_c:.2f}x; "
        f"realised fraction {vs_c / pred_c:.2f}"
    )
    ok = measured >= TARGET_SPEEDUP
    verdict = "smoke test, not judged" if smoke else ("PASS" if ok else "FAIL")
    print(f"  [{verdict}] (a) >= {TARGET_SPEEDUP}x the real tokens/sec of (b): {measured:.2f}x")
    out.update(
        speedup=measured,
        predicted=predicted,
        realised_fraction=measured / predicted,
        speedup_vs_c=vs_c,
        predicted_vs_c=pred_c,
        passed=ok,
        settings=asdict(s),
    )
    return out


def machine_line() -> str:
    import torch

    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        rev = "?"
    try:
        load = "load average " + ", ".join(f"{x:.2f}" for x in os.getloadavg())
    except OSError:
        load = "load average ?"
    return (
        f"{datetime.now(timezone.utc).isoformat(timespec='seconds')}; {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {load}; Python {platform.python_version()}, torch "
        f"{torch.__version__}; git {rev}"
    )


def describe(s: Settings) -> None:
    lengths = workload_lengths(s)
    print(
        f"workload: {lengths.shape[0]:,} examples, {int(lengths[:, 1].sum()):,} real target tokens "
        f"(wmt_like_lengths x {s.length_scale}; source median {np.median(lengths[:, 0]):.0f}, "
        f"p99 {np.percentile(lengths[:, 0], 99):.0f}, max {lengths.max()}); "
        f"max_tokens={s.max_tokens}; model d_model={s.d_model}, {s.layers}+{s.layers} layers, "
        f"{s.nhead} heads, FFN {s.ffn}, vocab {s.vocab}; device {s.device}"
        + (", bf16 autocast" if s.bf16 else ", fp32")
        + f"; {s.threads} thread(s) per run"
    )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    d = Settings()
    p = argparse.ArgumentParser(description="Training throughput benchmark (module docstring).")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke test (< 20 s): tiny model, 1 round, all runs in this process",
    )
    p.add_argument("--rounds", type=int, default=2, help="interleaved rounds (a b c, c b a, ...)")
    p.add_argument("--target-tokens", type=int, default=d.target_tokens)
    p.add_argument("--length-scale", type=float, default=d.length_scale)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--d-model", type=int, default=d.d_model)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--ffn", type=int, default=d.ffn)
    p.add_argument("--threads", type=int, default=d.threads)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    p.add_argument("--child", choices=CONFIGS, default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def settings_from_args(args: argparse.Namespace) -> Settings:
    s = Settings(
        target_tokens=args.target_tokens,
        length_scale=args.length_scale,
        max_tokens=args.max_tokens,
        vocab=args.vocab,
        d_model=args.d_model,
        layers=args.layers,
        ffn=args.ffn,
        threads=args.threads,
        seed=args.seed,
    )
    if args.quick:
        s.target_tokens, s.d_model, s.ffn, s.vocab, s.layers, s.nhead = 3000, 32, 64, 500, 1, 2
        s.max_tokens = 512
        args.rounds = 1
    return s


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child is not None:
        s = Settings(**json.loads(args.settings))
        print("RESULT " + json.dumps(asdict(run_child(args.child, s))), flush=True)
        return 0
    s = settings_from_args(args)
    shown = " ".join(sys.argv[1:] if argv is None else argv)
    print(f"command: python -m benchmarks.training_throughput {shown}".rstrip())
    print("machine:", machine_line())
    describe(s)
    results = run_all_configs("benchmarks.training_throughput", s, args.rounds, args.quick)
    print(
        f"\ntraining throughput (median of {args.rounds} interleaved rounds; tok/s = real "
        "target tokens per second of step time; pad frac = 1 - real / padded source+target "
        "slots; peak = RSS high-water rise over the loop, max over rounds)"
    )
    numbers = report(results, s, "peak MB", smoke=args.quick)
    print("machine after:", machine_line())
    if args.json:
        with open(args.json, "w") as f:
            json.dump(numbers, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
