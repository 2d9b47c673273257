"""Every peer at its best, measured against ours over seeds (issues 33 and 39).

Run from the repository root (installs: benchmarks/RESULTS.md, "Peers over seeds")::

    python -m benchmarks.peers.seeds            # 20,000 pairs, seeds 0-3, budgets 512-2048
    python -m benchmarks.peers.seeds --quick    # smoke test: 2,000 pairs, 1 seed, 1 budget

**Workload.** Per seed ``s``: ``wmt_like_lengths(n, seed=s)``, pairs ``(source, [BOS] +
target)``; the seed seeds every sampler too. Ours gets the ``(n, 2)`` pairs; the peers the key
``max(source, [BOS] + target)`` (:mod:`benchmarks.peers.batches` and
:mod:`benchmarks.peers.sweep` say how each is driven). ``--world`` ranks (2), dealt here.

**Sweep** (plans only): every configuration of every peer (:data:`benchmarks.peers.sweep.GROUPS`)
at every budget ``M`` and seed: ``max_tokens = M``, batch sizes ``B`` = our mean pairs per
micro-batch. The recount, from the ids each rank gets (a micro-batch: ``n`` pairs, longest
source ``S``, longest ``[BOS]+target`` ``T``): dropped / repeated examples; micro-batches over
``M`` (``nS`` or ``nT`` > ``M``); padding fraction ``1 - sum(s + t) / sum(nS + nT)``; slot
efficiency (real slots / (world x per step the larger rank's ``nS + nT``)); counts per rank
(unequal counts would hang the last all-reduce: fairseq's own workaround, a dummy batch with
the loss x 0, or ``hangs``). A peer's **best** configuration at ``M`` is the one with the most
modelled tokens/s (median over seeds; one that never exceeds ``M`` before one that does):
:mod:`benchmarks.peers.model`'s fitted time model ranks, it does not measure.

**Measured** (:mod:`benchmarks.peers.timing`): ours, each peer's best and each peer's default
configuration, in paired blocks of one step each, shuffled per block, wall and CPU time; the
ratio ours / peer with a bootstrap 90 % interval over blocks and seeds; ``ours leads`` only
where the interval excludes 1, ``tie`` otherwise, no verdict from one seed. The model's ratio
is printed beside the measured one as the explanation. The main table takes the faster of the
best and the default by measurement (the model's pick can be wrong).

**Same memory** (``--memory``; measured peaks only): the limit is the measured peak (torch's
CPU allocations over forward + backward, :meth:`benchmarks.peers.model.Bench.peak_bytes`) of
ours' 2 worst micro-batches at ``M`` on the first seed; each peer's best configuration gets the
largest setting (to ``M/32`` for budgets) whose 2 worst micro-batches, by the memory model,
*measure* at or below it; then measured like the rest.
"""

from __future__ import annotations

import argparse
import itertools
import logging
import time
from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

import numpy as np

from benchmarks.harness import command_line, torch_machine_line, uptime
from benchmarks.peers import model as pm
from benchmarks.peers import sweep as sw
from benchmarks.peers import timing as pt
from benchmarks.peers.batches import WORKAROUNDS, preload
from benchmarks.peers.tables import print_measured, print_sweep
from benchmarks.results import Run, result_path

MODULE = "benchmarks.peers.seeds"
Batches = list[list[int]]
TINY = {"d_model": 32, "ffn": 64, "vocab": 500, "layers": 1, "nhead": 2}  # --quick
BENCH_MODULES = ["benchmarks.peers.seeds", "benchmarks.peers.model", "benchmarks.peers.sweep",
                 "benchmarks.peers.timing", "benchmarks.peers.batches",
                 "benchmarks.planning.baselines_libs", "benchmarks.workload"]  # fmt: skip


# -- the recount ----------------------------------------------------------------------------------


def figures(
    row: str, ranks: list[Batches], tl: np.ndarray, m: int, cal: dict[str, Any]
) -> dict[str, Any]:
    """The recount and the modelled figures of one configuration (every rank's batches)."""
    counts = [len(r) for r in ranks]
    steps, equal = max(counts), len(set(counts)) == 1
    base = row.partition(":")[0]
    fix = None if equal else pm.FAIRSEQ_NOTE if base == "fairseq_pkg" else WORKAROUNDS.get(base)
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
    """One seed's workload, its dealt configurations (cached) and its measured peaks."""

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

    def measured_mb(self, ids: list[int]) -> float:
        """The measured peak (MB) of one micro-batch (cached by its shape)."""
        raw = self.raw[np.asarray(ids)]
        key = pm.stats_of(raw)
        if key not in self.peaks:
            self.peaks[key] = self.bench.peak_bytes(self.bench.batch(raw)) / 2**20
        return self.peaks[key]

    def worst_measured(self, row: str, setting: int) -> float:
        """The measured peak (MB) of the 2 micro-batches the memory model puts highest."""
        ranks, _ = self.deal(row, setting)
        f = figures(row, ranks, self.tl, setting, self.cal)
        return max((self.measured_mb(ids) for ids in f.get("worst", [])), default=0.0)

    def setting_under(self, row: str, m: int, b_mean: int, limit: float) -> int | None:
        """The largest setting found whose worst micro-batches measure <= ``limit`` MB."""
        start = b_mean if pm.by_batch_size(row) else m

        def fits(s: int) -> bool:
            try:
                return self.worst_measured(row, s) <= limit
            except Exception:  # e.g. a budget below the longest example
                return False

        res = 1 if pm.by_batch_size(row) else max(1, m // 32)
        try:
            return pm.largest(fits, start, 1, 4 * start, res)
        except RuntimeError:
            return None

    def record(self, row: str, setting: int, m: int, comparison: str, b: int) -> dict[str, Any]:
        ranks, plan_s = self.deal(row, setting)
        f = figures(row, ranks, self.tl, m, self.cal)
        f.pop("worst", None)
        f.update(seed=self.seed, budget=m, comparison=comparison, row=row, setting=setting,
                 plan_s=plan_s, b_mean=b)  # fmt: skip
        return f

    def epoch(self, row: str, setting: int) -> tuple[list[list[list[int]]], int]:
        """(steps: every rank's micro-batch, padded by the workaround; real target tokens)."""
        ranks, _ = self.deal(row, setting)
        steps = max(len(r) for r in ranks)
        padded = [r + [r[0]] * (steps - len(r)) for r in ranks]
        tokens = int(sum(self.raw[np.asarray(b), 1].sum() for r in ranks for b in r))
        return [list(x) for x in zip(*padded, strict=True)], tokens


# -- entry point ----------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="Peers over seeds (see the module docstring).")
    p.add_argument("--quick", action="store_true", help="2,000 pairs, seed 0, M=512, tiny model")
    p.add_argument("--n", type=int, default=20_000, help="pairs")
    p.add_argument("--seeds", default="0-3", help="e.g. 0-3 or 0,3")
    p.add_argument("--budgets", default="512,1024,2048")
    p.add_argument("--blocks", default="12,7,4", help="measured blocks per seed, per budget")
    p.add_argument("--world", type=int, default=2)
    p.add_argument("--peers", default="", help="comma-separated peer groups (default: all)")
    p.add_argument("--memory", default="1024", help="budgets measured at the same memory")
    p.add_argument("--boot", type=int, default=2000, help="bootstrap resamples")
    add_result_option(p)
    a = p.parse_args(argv)
    if a.quick:
        a.n, a.seeds, a.budgets, a.blocks, a.memory = 2000, "0", "512", "3", ""
    lo, _, hi = a.seeds.partition("-")
    a.seeds = list(range(int(lo), int(hi) + 1)) if hi else [int(x) for x in lo.split(",")]
    a.budgets = [int(x) for x in a.budgets.split(",")]
    blocks = [int(x) for x in a.blocks.split(",")]
    a.blocks = dict(zip(a.budgets, blocks + blocks[-1:] * len(a.budgets), strict=False))
    a.memory = [int(x) for x in a.memory.split(",") if x]
    return a


def add_result_option(p: argparse.ArgumentParser) -> None:
    try:
        from benchmarks.results import add_result_option as add
    except ImportError:  # the result files' module is not there (older tree)
        p.add_argument("--result", default=None)
        p.add_argument("--no-result", action="store_true")
        return
    add(p, "peer_seeds")


def configs_of(a: argparse.Namespace) -> dict[str, list[str]]:
    """Per peer group, its configurations that run here (quick: the first few)."""
    groups = a.peers.split(",") if a.peers else list(sw.GROUPS)
    out: dict[str, list[str]] = {}
    for g in ["ours", *[g for g in groups if g != "ours"]]:
        cs = list(sw.GROUPS[g])[: sw.QUICK.get(g, 9) if a.quick else None]
        ok = [c for c in cs if pm.row_status(c, a.n) is None]
        for c in cs:
            if c not in ok:
                print(f"  {pm.label(c):<50} {pm.row_status(c, a.n)}")
        if not ok and g == "fairseq" and pm.row_status("fairseq_alg", a.n) is None:
            ok = ["fairseq_alg"]  # fairseq's algorithm stands in for its package
        if ok:
            out[g] = ok
    return out


def sweep(seeds: list[Seed], a: argparse.Namespace, groups: dict[str, list[str]]) -> list[dict]:
    """Every configuration at every budget on every seed (same budget), recounted and modelled."""
    t0, rounds = time.perf_counter(), []
    for s in seeds:
        for m in a.budgets:
            ours, _ = s.deal("ours", m)
            b_mean = max(1, round(len(s.tl) / sum(len(r) for r in ours)))
            for c in itertools.chain.from_iterable(groups.values()):
                setting = b_mean if pm.by_batch_size(c) else m
                rounds.append(s.record(c, setting, m, "budget", b_mean))
        print(f"  seed {s.seed} swept ({time.perf_counter() - t0:.0f} s)", flush=True)
    return rounds


def model_tps(rounds: list[dict[str, Any]], cal: dict[str, Any]) -> None:
    for f in (f for f in rounds if not f["hangs"]):
        f["model_s"] = f["busy_s"] + f["steps"] * cal["step_s"]
        f["tps_model"] = f["tokens"] / f["model_s"]


def choose(rounds: list[dict], groups: dict[str, list[str]], m: int) -> dict[str, dict[str, str]]:
    """Per peer group at budget ``m``: its default and its best configuration (model-ranked)."""
    out = {}
    for g, cs in groups.items():
        here = {c: [r for r in rounds if r["row"] == c and r["budget"] == m] for c in cs}
        scores = {c: [r["tps_model"] for r in rs] for c, rs in here.items()
                  if rs and not any(r["hangs"] for r in rs)}  # fmt: skip
        over = {c: max(r["over"] for r in rs) for c, rs in here.items()}
        if scores:
            out[g] = {"default": cs[0], "best": sw.pick_best(scores, over)}
    return out


def run(a: argparse.Namespace, argv: Sequence[str] | None = None) -> dict[str, Any]:
    """The whole benchmark; its numbers (also written to the result file)."""
    from benchmarks.workload import DEFAULTS

    t0, load0 = time.perf_counter(), pt.load()
    started = start_result(a)  # the code, commit and load as the run starts
    meta: dict[str, Any] = {"command": command_line(MODULE, argv), "machine": torch_machine_line()}
    print(f"command: {meta['command']}\nmachine: {meta['machine']}\nload before: {load0}")
    print(f"workload: {a.n:,} WMT-like pairs, seeds {a.seeds}, budgets {a.budgets}, "
          f"world {a.world}, blocks {a.blocks}")  # fmt: skip
    groups = configs_of(a)
    for c in itertools.chain.from_iterable(groups.values()):
        preload(c.partition(":")[0] if c.partition(":")[0] in pm.BY_NAME else "ours")
    logging.getLogger().setLevel(logging.WARNING)  # fairseq's import sets the root to DEBUG
    meta["versions"] = {g: pm.row_versions(cs[0]) for g, cs in groups.items()}
    if "deepspeed" in groups:
        sw.check_deepspeed(200 if a.quick else 400)
        print("DeepSpeed: batch_by_seqlens here equals DeepSpeed's own (400 pairs, every order)")
    meta["lhotse_two_sided"] = sw.lhotse_two_sided() if "lhotse" in groups else None
    bench = pm.Bench(replace(DEFAULTS, **(TINY if a.quick else {})))
    seeds = [Seed(x, a, {}, bench) for x in a.seeds]
    real_mb = []
    for m, c in itertools.product(a.budgets, [cs[0] for cs in groups.values()][:3]):
        s = 0 if pm.by_batch_size(c) else m
        mine = seeds[0].deal(c, s or max(1, m // 40))[0][0]
        real_mb += [seeds[0].raw[b] for b in mine[:: max(1, len(mine) // 4)]]
    cal = pm.calibrate(bench, pm.grid(int(seeds[0].tl.max()), a.quick), real_mb, print)
    for s in seeds:
        s.cal = cal
    rounds = sweep(seeds, a, groups)
    model_tps(rounds, cal)
    choice = {m: choose(rounds, groups, m) for m in a.budgets}
    measured: dict[str, Any] = {}
    rng = np.random.default_rng(2026)
    for m in a.budgets:
        todo = {("budget", c) for g in choice[m].values() for c in g.values()}
        settings: dict[tuple[str, str], dict[int, int]] = {}
        if m in a.memory:
            limit = max(seeds[0].measured_mb(ids) for ids in figures(
                "ours", seeds[0].deal("ours", m)[0], seeds[0].tl, m, cal)["worst"])  # fmt: skip
            meta.setdefault("memory_limit_mb", {})[m] = limit
            for g in choice[m].values():
                c = g["best"]
                if c == "ours":
                    continue
                b_mean = rounds_b_mean(rounds, m, seeds[0].seed)
                setting = seeds[0].setting_under(c, m, b_mean, limit)
                if setting is not None:
                    todo.add(("memory", c))
                    settings[("memory", c)] = {s.seed: setting for s in seeds}
        for s in seeds:
            b_mean = rounds_b_mean(rounds, m, s.seed)
            epochs, used = {}, {}
            for comp, c in todo:
                default = b_mean if pm.by_batch_size(c) else m
                used[f"{comp}/{c}"] = settings.get((comp, c), {}).get(s.seed, default)
                epochs[f"{comp}/{c}"] = s.epoch(c, used[f"{comp}/{c}"])
            before = pt.load()
            got = pt.measure(bench, s.raw, epochs, a.blocks[m], rng)
            for key, sample in got.items():
                measured.setdefault(f"{m}/{key}", []).append({"seed": s.seed, "setting": used[key],
                    "load": [before, pt.load()], **asdict(sample)})  # fmt: skip
            print(f"  M={m} seed {s.seed} measured ({time.perf_counter() - t0:.0f} s, load "
                  f"{before} -> {pt.load()})", flush=True)  # fmt: skip
        for comp, c in sorted(todo):
            if comp == "memory":
                for s in seeds:
                    setting = settings[(comp, c)][s.seed]
                    rounds.append(s.record(c, setting, m, "memory", b_mean))
                    rounds[-1]["peak_measured_mb"] = s.worst_measured(c, setting)
    model_tps(rounds, cal)
    print_sweep(rounds, groups, choice)
    verdicts = print_measured(rounds, measured, choice, a)
    meta.update(calibration={k: v for k, v in cal.items() if k != "shapes"}, choice=choice)
    meta.update(verdicts=verdicts, seconds=time.perf_counter() - t0, load=[load0, pt.load()])
    print(f"\n{time.perf_counter() - t0:.0f} s; load before {load0}, after {pt.load()}; "
          f"uptime after: {uptime()}")  # fmt: skip
    out = {"rounds": rounds, "measured": measured, "groups": groups, **meta}
    if started is not None:
        started.write({k: v for k, v in out.items() if k != "command"}, result_path(a))
    return out


def rounds_b_mean(rounds: list[dict[str, Any]], m: int, seed: int) -> int:
    """Our mean pairs per micro-batch at ``m`` on ``seed`` (from ours' round)."""
    ours = next(r for r in rounds if r["row"] == "ours" and r["budget"] == m and r["seed"] == seed)
    return int(ours["b_mean"])


def start_result(a: argparse.Namespace) -> Run | None:
    """The result file's record, begun before anything is measured (``None``: no file)."""
    if result_path(a) is None:
        return None
    settings = {k: v for k, v in vars(a).items() if k not in ("result", "no_result")}
    return Run("peer_seeds", settings=settings, package=["lightning_varbatch"], bench=BENCH_MODULES)


def main(argv: Sequence[str] | None = None) -> int:
    run(parse_args(argv), argv)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
