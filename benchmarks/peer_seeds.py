"""Every peer's batches over seeds 0-7, recounted, modelled and set at measured memory (issue 33).

Run from the repository root (installs: benchmarks/RESULTS.md, "Peers over seeds")::

    python -m benchmarks.peer_seeds            # 20,000 pairs, seeds 0-7, budgets 512-2048
    python -m benchmarks.peer_seeds --quick    # smoke test: 2,000 pairs, 1 seed, 1 budget

**Workload.** Per seed ``s``: ``wmt_like_lengths(n, seed=s)``, pairs ``(source, [BOS] +
target)``; the seed seeds every sampler too. Ours gets the ``(n, 2)`` pairs; the peers the key
``max(source, [BOS] + target)`` (:mod:`benchmarks.peer_batches` says how each is driven);
extra rows in :mod:`benchmarks.peer_model`. ``--world`` ranks (2), dealt in this process.

**Recount** from the ids each rank gets (a micro-batch: ``n`` pairs, longest source ``S``,
longest ``[BOS]+target`` ``T``): dropped / repeated examples; micro-batches *over* ``M`` (``nS``
or ``nT`` > ``M``); padding fraction ``1 - sum(s + t) / sum(nS + nT)``; critical-path slots
(per step the larger rank's ``nS + nT``; ``slot eff`` = ``sum(s + t)`` / (world x those),
issue 33's load-independent measure); counts per rank. Unequal counts would hang the last
all-reduce: the row gets its peer's workaround (fairseq's: the short rank re-runs its first
batch with the loss x 0) or ``hangs``.

**Tokens/s (modelled)**: time = sum over steps of (the slowest rank's micro-batch in the
measured time model of :mod:`benchmarks.peer_model` + the per-step cost ``c``, all-reduce
included); tokens/s = real target tokens trained (repeats included) / time. Load-independent.

**Ceiling** of a configuration: its micro-batches each costed *unpadded* (the model's sum with
every feature per pair: ``c0 + sum_i (c1 + c2 s_i + c3 t_i + c4 s_i^2 + c5 t_i^2 + c6 s_i t_i)
+ c7 R + c8 (sum_i s_i)^1.5 + c9 (sum_i t_i)^1.5``), each step's ranks *perfectly balanced*
(their mean, not their max; a dummy batch costs 0), plus ``c`` per step. ``x ceiling`` =
ceiling time / modelled time, in (0, 1]: what padding and imbalance leave at this batch count.

**Comparisons** at each ``M``: *same budget* (``max_tokens = M``, batch sizes ``B`` = our mean
pairs per micro-batch); *same memory (measured)*: the limit is the measured peak (torch's CPU
allocations over forward + backward) of ours' 2 worst micro-batches at ``M`` by the memory
model; every other row gets the largest setting (to ``M/32`` for budgets; a galloping search
from the proportional guess) whose worst micro-batch the model puts at or below it; that
micro-batch is measured and shown; *same memory (proxy)*: the largest setting whose worst
padded cost ``n x max(S, T)`` is <= ``M`` (:mod:`benchmarks.training_peers`' rule).

**Real runs.** ``--real-seeds`` at ``--real-budget``, the same-budget rows, the first
``--real-steps`` micro-batches of each rank trained by :func:`benchmarks.peer_training.run_rank`
on ``world`` gloo processes: their wall-clock tokens/s against the model's for those steps.
Every round goes to ``--out``/rounds.jsonl, the rest to calibration.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from benchmarks import peer_model as pm
from benchmarks.harness import command_line, print_table, torch_machine_line, uptime
from benchmarks.peer_batches import BY_NAME, PEERS, WORKAROUNDS, preload

MODULE = "benchmarks.peer_seeds"
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results_peer_seeds")
Batches = list[list[int]]
TINY = {"d_model": 32, "ffn": 64, "vocab": 500, "layers": 1, "nhead": 2}  # --quick


# -- the recount ----------------------------------------------------------------------------------


def figures(
    row: str, ranks: list[Batches], tl: np.ndarray, m: int, cal: dict[str, Any]
) -> dict[str, Any]:
    """The recount and the modelled figures of one configuration (every rank's batches)."""
    counts = [len(r) for r in ranks]
    steps, equal = max(counts), len(set(counts)) == 1
    fix = None if equal else pm.FAIRSEQ_NOTE if row == "fairseq_pkg" else WORKAROUNDS.get(row)
    out: dict[str, Any] = {"counts": counts, "equal_counts": equal, "workaround": fix}
    out["hangs"] = not equal and fix is None
    weights = [[1.0] * c + [0.0] * (0 if out["hangs"] else steps - c) for c in counts]
    if not out["hangs"]:  # the workaround: a short rank re-runs its first batch, loss x 0
        ranks = [r + [r[0]] * (steps - len(r)) for r in ranks]
    stats = [pm.per_batch(r, tl) for r in ranks]
    real = [np.array(w) > 0 for w in weights]
    flat = itertools.chain.from_iterable
    ids = [b for b, w in zip(flat(ranks), flat(weights), strict=True) if w]
    c = np.bincount(np.concatenate(ids).astype(np.int64), minlength=len(tl))
    n, s_, t_, sums = (np.concatenate([x[k][ok] for x, ok in zip(stats, real, strict=True)])
                       for k in ("n", "S", "T", "unpadded"))  # fmt: skip
    out.update(
        micro_batches=int(n.size),
        dummy=int(sum((~ok).sum() for ok in real)),
        dropped=int((c == 0).sum()),
        repeated=int(c.sum() - (c > 0).sum()),
        over=int(((n * s_ > m) | (n * t_ > m)).sum()),
        worst_side=float((n * np.maximum(s_, t_)).max() / m),
        pad_fraction=float(1 - (sums[:, 2].sum() + sums[:, 3].sum()) / (n * (s_ + t_)).sum()),
        tokens=int(sums[:, 7].sum()),
    )
    if out["hangs"]:
        return out
    padded = [pm.padded_features(x["n"], x["S"], x["T"], x["R"]) for x in stats]
    crit = int(np.array([x["n"] * (x["S"] + x["T"]) for x in stats]).max(0).sum())
    busy = np.array([f @ cal["time_coef"] for f in padded])  # (world, steps)
    ideal = np.array(
        [(x["unpadded"] @ cal["time_coef"]) * ok for x, ok in zip(stats, real, strict=True)]
    )
    mem = np.array([f @ cal["mem_coef"] for f in padded])
    top = np.unravel_index(np.argsort(-mem, axis=None)[:2], mem.shape)
    out.update(
        steps=steps,
        busy_s=float(busy.max(axis=0).sum()),
        balanced_s=float(busy.mean(axis=0).sum()),
        ideal_s=float(ideal.mean(axis=0).sum()),
        critical_slots=crit,
        slot_efficiency=float((sums[:, 2].sum() + sums[:, 3].sum()) / len(ranks) / crit),
        peak_model_mb=float(mem.max() / 2**20),
        worst=[ranks[r][j] for r, j in zip(*top, strict=True)],
    )
    return out


# -- one seed -------------------------------------------------------------------------------------


class Seed:
    """One seed's workload, its dealt configurations (cached) and its peak measurements."""

    def __init__(self, seed: int, a: argparse.Namespace, cal: dict[str, Any], bench: Any) -> None:
        self.seed, self.world, self.cal, self.bench = seed, a.world, cal, bench
        self.raw, self.tl = pm.workload(a.n, seed)
        self.dealt: dict[tuple[str, int], tuple[list[Batches], float]] = {}
        self.peaks: dict[tuple[int, ...], float] = {}

    def deal(self, row: str, setting: int) -> tuple[list[Batches], float]:
        """Every rank's batches and the slowest rank's planning seconds (cached)."""
        if (row, setting) not in self.dealt:
            ranks, secs = [], []
            for r in range(self.world):
                t0 = time.perf_counter()
                ranks.append(pm.deal_row(row, self.tl, setting, r, self.world, self.seed))
                secs.append(time.perf_counter() - t0)
            self.dealt[(row, setting)] = (ranks, max(secs))
        return self.dealt[(row, setting)]

    def worst(self, row: str, setting: int, key: str) -> float:
        """The worst micro-batch by ``key``: the memory model's peak (MB) or the padded cost."""
        ranks, _ = self.deal(row, setting)
        stats = [pm.per_batch(r, self.tl) for r in ranks if r]
        if key == "cost":
            return max(float((x["n"] * np.maximum(x["S"], x["T"])).max()) for x in stats)
        mcoef = np.array(self.cal["mem_coef"])
        mem = [pm.padded_features(x["n"], x["S"], x["T"], x["R"]) @ mcoef for x in stats]
        return max(float(x.max()) for x in mem) / 2**20

    def measured_mb(self, ids: list[int]) -> float:
        """The measured peak (MB) of one micro-batch (cached by its shape)."""
        raw = self.raw[np.asarray(ids)]
        key = pm.stats_of(raw)
        if key not in self.peaks:
            self.peaks[key] = self.bench.peak_bytes(self.bench.batch(raw)) / 2**20
        return self.peaks[key]

    def setting_under(self, row: str, m: int, b_mean: int, key: str, limit: float) -> int | None:
        """The largest setting of ``row`` found whose worst micro-batch (``key``) is <= ``limit``
        (a setting the row refuses does not fit); ``None`` if none does."""
        if key == "cost" and row in BY_NAME and BY_NAME[row].fixed_size:
            return max(1, m // int(self.tl.max()))  # fixed sizes: room for the longest pair
        start = b_mean if pm.by_batch_size(row) else m
        guess = max(1, int(start * limit / self.worst(row, start, key)))

        def fits(s: int) -> bool:
            try:
                return self.worst(row, s, key) <= limit
            except Exception:  # e.g. a budget below the longest example
                return False

        try:
            return pm.largest(fits, guess, 1, 8 * start, 1 if pm.by_batch_size(row) else m // 32)
        except RuntimeError:
            return None

    def budget(self, m: int, rows: Sequence[str]) -> list[dict[str, Any]]:
        """Every row at budget ``m`` in the three comparisons, as round records."""
        ours, _ = self.deal("ours", m)
        b_mean = max(1, round(len(self.tl) / sum(len(r) for r in ours)))
        out: list[dict[str, Any]] = []
        ours_fig = figures("ours", ours, self.tl, m, self.cal)
        limit = max(self.measured_mb(ids) for ids in ours_fig["worst"])
        for comparison in ("budget", "memory", "proxy"):
            for row in rows:
                if comparison == "budget" or row == "ours":
                    setting = b_mean if pm.by_batch_size(row) else m
                else:
                    key = "cost" if comparison == "proxy" else "mem"
                    setting = self.setting_under(row, m, b_mean, key, m if key == "cost" else limit)
                if setting is None:
                    print(f"  seed {self.seed}, M = {m}, {comparison}: no setting of {row} fits")
                    continue
                ranks, plan_s = self.deal(row, setting)
                f = figures(row, ranks, self.tl, m, self.cal)
                worst = f.pop("worst", [])
                if comparison == "memory" and worst:
                    f["peak_measured_mb"] = self.measured_mb(worst[0])
                f.update(seed=self.seed, budget=m, comparison=comparison, row=row)
                f.update(setting=setting, b_mean=b_mean, plan_s=plan_s, limit_mb=limit)
                out.append(f)
        return out


# -- the real runs against the model --------------------------------------------------------------


def real_check(a: argparse.Namespace, rows: Sequence[str], cal: dict[str, Any]) -> list[dict]:
    """Seeds ``--real-seeds`` at ``--real-budget``: tokens/s of the first steps, real (the
    better of 2 rounds: the least disturbed by other jobs) and modelled, the same steps."""
    from benchmarks.training_workload import DEFAULTS

    out = []
    for seed in a.real_seeds:
        s = replace(DEFAULTS, **(TINY if a.quick else {}), max_tokens=a.real_budget, seed=seed)
        _, tl = pm.workload(a.n, seed)
        ours = pm.deal_row("ours", tl, a.real_budget, 0, a.world, seed)
        b_mean = max(1, round(len(tl) / (len(ours) * a.world)))
        todo = [(r, b_mean if pm.by_batch_size(r) else a.real_budget) for r in rows]
        runs = pm.real_runs(todo, a.n, a.world, a.real_steps, s, 900)
        for (row, setting), both in zip(todo, runs, strict=True):
            if not both[0][0].trained:
                continue
            timed = [pm.per_batch(x.batches[x.warmup :], tl) for x in both[0]]
            feats = [pm.padded_features(x["n"], x["S"], x["T"], x["R"]) for x in timed]
            busy = np.array([f @ cal["time_coef"] for f in feats]).max(axis=0)
            ar = np.concatenate([np.array([x.allreduce_s for x in r]).min(axis=0) for r in both])
            tokens = sum(sum(x.tokens) for x in both[0])
            out.append(
                dict(seed=seed, row=row, setting=setting, steps=len(busy), tokens=tokens,
                     busy_s=float(busy.sum()), allreduce_s=float(np.median(ar)),
                     tps_real=max(tokens / max(x.wall_s for x in r) for r in both),
                     tps_cpu=max(tokens / statistics.mean(x.cpu_s for x in r) for r in both))
            )  # fmt: skip
            print(f"  real runs seed {seed} {pm.label(row):<30} {out[-1]['tps_real']:8.0f} tok/s")
    return out


# -- tables ---------------------------------------------------------------------------------------

TITLES = {"budget": "same token budget", "memory": "same memory (measured peak)",
          "proxy": "same memory (padded-cost proxy)"}  # fmt: skip
HEADERS = ["configuration", "setting", "tok/s (model)", "ours/peer by seed", "ours leads"]
HEADERS += ["x ceiling", "slot eff", "pad frac", "drop/rep/over", "counts", "plan ms", "peak MB"]


def span(xs: Sequence[float], f: str) -> str:
    """``median [min-max]`` (or the one value)."""
    med = format(statistics.median(xs), f) if xs else "-"
    return med if not xs or min(xs) == max(xs) else f"{med} [{min(xs):{f}}-{max(xs):{f}}]"


def verdict(ratio: list[float]) -> str:
    """``beyond spread``: the smallest lead over seeds exceeds the ratio's range over seeds."""
    lo, hi = min(ratio), max(ratio)
    return "beyond spread" if lo - 1 > hi - lo else "every seed" if lo > 1 else "no"


def report(rounds: list[dict[str, Any]], rows: Sequence[str]) -> dict[str, Any]:
    """One table per comparison and budget (median [min-max] over seeds); the leads."""
    leads: dict[str, Any] = {}
    for comparison, title in TITLES.items():
        for m in sorted({r["budget"] for r in rounds}):
            here = [r for r in rounds if r["comparison"] == comparison and r["budget"] == m]
            ours = {r["seed"]: r["tps"] for r in here if r["row"] == "ours"}
            print(f"\n{title}, M = {m}, seeds {sorted(ours)}")
            table = []
            for row in rows:
                rs = [r for r in here if r["row"] == row]
                ok = [r for r in rs if not r["hangs"]]
                ratio = [ours[r["seed"]] / r["tps"] for r in ok]
                lead = verdict(ratio) if ratio and row != "ours" else "-"
                leads[f"{comparison}/{m}/{row}"] = {"per_seed": ratio, "lead": lead}
                equal = all(r["equal_counts"] for r in rs)
                worst = [r.get("peak_measured_mb", r["peak_model_mb"]) for r in ok]
                table.append([
                    pm.label(row), span([r["setting"] for r in rs], ".0f"),
                    span([r["tps"] for r in ok], ",.0f"),
                    " ".join(f"{x:.3f}" for x in ratio) if row != "ours" else "-", lead,
                    span([r["ceiling_fraction"] for r in ok], ".3f"),
                    span([r["slot_efficiency"] for r in ok], ".3f"),
                    span([r["pad_fraction"] for r in rs], ".3f"),
                    "/".join(str(max(r[k] for r in rs)) for k in ("dropped", "repeated", "over")),
                    "equal" if equal else "hangs" if len(ok) < len(rs) else "workaround",
                    span([1000 * r["plan_s"] for r in rs], ".0f"), span(worst, ".0f"),
                ])  # fmt: skip
            print_table(HEADERS, table)
    return leads


# -- entry point ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Peers over seeds (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="2,000 pairs, seed 0, M=512, tiny model")
    p.add_argument("--n", type=int, default=20_000, help="pairs")
    p.add_argument("--seeds", default="0-7", help="e.g. 0-7 or 0,3")
    p.add_argument("--budgets", default="512,1024,2048")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--peers", default="", help="comma-separated rows (default: all)")
    p.add_argument("--real-seeds", default="0,1", help="seeds of the real runs ('': none)")
    p.add_argument("--real-budget", type=int, default=1024)
    p.add_argument("--real-steps", type=int, default=12, help="per rank, 2 of them untimed")
    p.add_argument("--out", default=OUT, help="folder of rounds.jsonl and calibration.json")
    p.add_argument("--rank-child", nargs=3, default=None, help=argparse.SUPPRESS)
    p.add_argument("--settings", default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.seeds, a.budgets, a.real_seeds, a.real_steps, a.real_budget = (
            2000, "0", "512", a.real_seeds and "0", 5, 512
        )  # fmt: skip
        a.peers = (
            a.peers or "ours,ours_max,lhotse,hf_rebalance,fairseq_alg,fairseq_pkg,fixed_sorted"
        )
        a.out = a.out if a.out != OUT else os.path.join(tempfile.gettempdir(), "peer_seeds_quick")
    lo, _, hi = a.seeds.partition("-")
    a.seeds = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in lo.split(",")]
    a.budgets = [int(x) for x in a.budgets.split(",")]
    a.real_seeds = [int(x) for x in a.real_seeds.split(",") if x]
    return a


def run(a: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The whole benchmark; its numbers (also written to ``a.out``)."""
    from benchmarks.training_workload import DEFAULTS

    names = [x for x in (a.peers or ",".join([p.name for p in PEERS] + list(pm.EXTRA))).split(",")]
    status = {r: pm.row_status(r, a.n) for r in names if r}
    rows = [r for r in status if status[r] is None]
    meta: dict[str, Any] = {"command": command_line(MODULE, argv), "machine": torch_machine_line()}
    meta["versions"] = {r: pm.row_versions(r) for r in rows}
    print(f"command: {meta['command']}\nmachine: {meta['machine']}")
    print(
        f"workload: {a.n:,} WMT-like pairs, seeds {a.seeds}, budgets {a.budgets}, world {a.world}"
    )
    for r in status:
        print(f"  {pm.label(r):<32} {status[r] or meta['versions'][r]}")
        preload("ours" if r in pm.EXTRA or status[r] else r)
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets the root to DEBUG
    t0 = time.perf_counter()
    bench = pm.Bench(replace(DEFAULTS, **(TINY if a.quick else {})))
    first = Seed(a.seeds[0], a, {}, bench)
    sample = [r for r in ("ours", "fairseq_alg", "lhotse", "speechbrain") if r in rows]
    real_mb = []
    for m, row in itertools.product(a.budgets, sample):
        mine = first.deal(row, m)[0][0]
        real_mb += [first.raw[b] for b in mine[:: max(1, len(mine) // 4)]]
    cal = pm.calibrate(bench, pm.grid(int(first.tl.max()), a.quick), real_mb, print)
    first.cal = cal
    checked = ["ours", *[r for r in rows if r != "ours"][: 1 if a.quick else None]]
    real = real_check(a, checked, cal)
    cal["allreduce_s"] = statistics.median(x["allreduce_s"] for x in real) if real else 0.0
    rounds: list[dict[str, Any]] = []
    for seed in a.seeds:
        s = first if seed == a.seeds[0] else Seed(seed, a, cal, bench)
        for m in a.budgets:
            rounds += s.budget(m, rows)
        print(f"  seed {seed} dealt and recounted ({time.perf_counter() - t0:.0f} s)", flush=True)
    step_s = cal["step_s"] + cal["allreduce_s"]
    for f in (f for f in rounds if not f["hangs"]):  # the modelled time, once c is known
        f.update(
            model_s=f["busy_s"] + f["steps"] * step_s, ceiling_s=f["ideal_s"] + f["steps"] * step_s
        )
        f.update(tps=f["tokens"] / f["model_s"], ceiling_fraction=f["ceiling_s"] / f["model_s"])
    for x in real:
        x["tps_model"] = x["tokens"] / (x["busy_s"] + x["steps"] * step_s)
        x["real_over_model"] = x["tps_real"] / x["tps_model"]
    meta.update(status=status, calibration=cal, real=real, leads=report(rounds, rows))
    pm.print_real(real, cal)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "rounds.jsonl"), "w") as fh:
        fh.writelines(json.dumps(r) + "\n" for r in rounds)
    meta["seconds"] = time.perf_counter() - t0
    with open(os.path.join(a.out, "calibration.json"), "w") as fh:
        json.dump(meta, fh, indent=1)
    print(f"\n{len(rounds)} rounds in {a.out}; {meta['seconds']:.0f} s; uptime after: {uptime()}")
    return {"rounds": rounds, "rows": rows, **meta}


def main(argv: Sequence[str] | None = None) -> int:
    a = parse_args(argv)
    if a.rank_child is not None:
        return pm.child_main(*a.rank_child, a.settings)
    run(a, argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
