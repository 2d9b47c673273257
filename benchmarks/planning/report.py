"""The planning benchmark's tables and targets: rows, headers, PASS/FAIL lines.

A :class:`Perf` is one row of the performance table, a :class:`SizeResult` what
:func:`benchmarks.planning.epoch.run_size` measured at one size; the quality rows come from
:class:`benchmarks.planning.metrics.Quality`.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from benchmarks.harness import fmt
from benchmarks.planning.metrics import Quality
from lightning_varbatch import PlanConfig


@dataclass
class Perf:
    method: str
    n: int
    plan_s: float | None
    rank_s: float | None
    rank_best_s: float | None
    floor_s: float | None
    peak_bpe: float | None = None
    held_bpe: float | None = None
    rss_bpe: float | None = None
    note: str = ""
    ours_s: float | None = None
    x_ours_min: float | None = None
    """The lowest of the row's ratios to ours over paired runs (where it was timed in pairs)."""
    x_ours_max: float | None = None


def perf_rows(perfs: Sequence[Perf]) -> list[list[str]]:
    out = []
    for p in perfs:
        ratio = p.rank_s / p.floor_s if p.rank_s is not None and p.floor_s else None
        vs_ours = p.rank_s / p.ours_s if p.rank_s is not None and p.ours_s else None
        nspe = None if p.rank_s is None else p.rank_s / p.n * 1e9
        out.append(
            [
                p.method,
                f"{p.n:,}",
                fmt(p.plan_s),
                fmt(p.rank_s),
                fmt(p.rank_best_s),
                fmt(ratio, ".2f"),
                fmt(vs_ours, ".2f"),
                fmt(nspe, ".1f"),
                fmt(p.peak_bpe, ".1f"),
                fmt(p.held_bpe, ".1f"),
                fmt(p.rss_bpe, ".1f"),
                p.note,
            ]
        )
    return out


PERF_HEADERS = [
    "method",
    "n",
    "plan all [s]",
    "rank0 [s]",
    "best [s]",
    "x floor",
    "x ours",
    "ns/ex",
    "peak B/ex",
    "held B/ex",
    "RSS B/ex",
    "note",
]
QUAL_HEADERS = [
    "method",
    "n",
    "pad eff",
    "pad both",
    "fill",
    "max cost",
    "over %",
    "imb lin",
    "imb quad",
    "steps (full)",
    "batches/rank",
    "coverage %",
    "dup",
    "d-order",
    "d-comp",
]


def qual_row(method: str, n: int, q: Quality) -> list[str]:
    counts = f"{q.count_min}" if q.count_min == q.count_max else f"{q.count_min}-{q.count_max}"
    return [
        method,
        f"{n:,}",
        fmt(q.pad_eff, ".4f"),
        fmt(q.pad_both, ".4f"),
        fmt(q.fill, ".4f"),
        fmt(q.max_cost, ".4f"),
        fmt(100 * q.over, ".2f"),
        fmt(q.imb_lin, ".4f"),
        fmt(q.imb_quad, ".4f"),
        f"{q.steps} ({q.full_steps})",
        counts,
        fmt(100 * q.coverage, ".3f"),
        str(q.dup),
        fmt(q.d_order, ".3f"),
        fmt(q.d_comp, ".3f"),
    ]


@dataclass
class SizeResult:
    n: int
    floor_s: float
    floor_best_s: float
    ours_plan_s: float
    ours_s: float
    ours_best_s: float
    peak_bpe: float
    held_bpe: float
    floor_peak_bpe: float
    sampler_s: float | None
    sampler_note: str
    quality: Quality
    dropped: int
    rss: dict[str, float]
    floor_all: list[float] = field(default_factory=list)
    ours_all: list[float] = field(default_factory=list)
    argsort_s: float | None = None  # a plain np.argsort of the key (median)


def _mark(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_targets(
    main: SizeResult, big: SizeResult | None, args: argparse.Namespace, info: dict[str, Any]
) -> None:
    q = main.quality
    ratio = main.ours_s / main.floor_s
    print(f"\ntargets (n={main.n:,}; timings are medians of {args.repeats} interleaved repeats)")
    if args.quick:
        print(
            "  (--quick: a smoke test; the targets are set for 4.5M examples, and at this size "
            "fixed costs dominate the time and bytes-per-example ratios)"
        )
    lines: list[tuple[bool, str]] = [
        (
            ratio <= 2.0,
            f"rank-0 epoch planned+iterated <= 2x floor: {main.ours_s:.3f} s vs floor "
            f"{main.floor_s:.3f} s = {ratio:.2f}x "
            f"(best of {args.repeats}: {main.ours_best_s / main.floor_best_s:.2f}x)"
            + (
                ""
                if main.argsort_s is None
                else f"; {main.ours_s / main.argsort_s:.2f}x a plain argsort of the key "
                f"({main.argsort_s:.3f} s)"
            ),
        ),
        (
            main.peak_bpe <= 16.0,
            f"peak extra memory <= 16 B/example (tracemalloc): {main.peak_bpe:.1f} B/ex "
            f"(held after: {main.held_bpe:.1f})",
        ),
    ]
    if "ours" in main.rss:
        lines.append(
            (
                main.rss["ours"] <= 16.0,
                "peak extra memory <= 16 B/example (RSS high-water, sees untraced malloc): "
                f"{main.rss['ours']:.1f} B/ex",
            )
        )
    if big is not None:
        g_ours = (big.ours_s / big.n) / (main.ours_s / main.n)
        g_floor = (big.floor_s / big.n) / (main.floor_s / main.n)
        big_ratio = big.ours_s / big.floor_s
        ok = big_ratio <= 2.0 and g_ours <= 1.25 * max(1.0, g_floor)
        lines.append(
            (
                ok,
                f"time scales linearly to {big.n:,}: {big.ours_s:.2f} s = "
                f"{big.ours_s / big.n * 1e9:.1f} ns/ex vs {main.ours_s / main.n * 1e9:.1f} at "
                f"{main.n:,} (x{g_ours:.2f}; floor x{g_floor:.2f}), {big_ratio:.2f}x floor  "
                "[criterion: <= 2x floor and ns/ex growth <= 1.25x the floor's]",
            )
        )
        lines.append(
            (
                big.peak_bpe <= 16.0,
                f"peak extra memory <= 16 B/example at {big.n:,} (tracemalloc): "
                f"{big.peak_bpe:.1f} B/ex",
            )
        )
        if "ours" in big.rss:
            lines.append(
                (
                    big.rss["ours"] <= 16.0,
                    f"peak extra memory <= 16 B/example at {big.n:,} (RSS high-water): "
                    f"{big.rss['ours']:.1f} B/ex",
                )
            )
    lines += [
        (q.pad_eff >= 0.99, f"padding efficiency >= 0.99: {q.pad_eff:.4f}"),
        (
            (q.d_order or 0) > 0.5 and (q.d_comp or 0) > 0.5,
            "batch order and composition change between epochs 0 and 1 (> half): order "
            f"{100 * (q.d_order or 0):.1f} % of steps, composition "
            f"{100 * (q.d_comp or 0):.1f} % of micro-batches",
        ),
        (
            q.max_cost <= 1.0 and q.over == 0.0,
            f"budget never exceeded: max cost {q.max_cost:.4f} x max_tokens, "
            f"{100 * q.over:.2f} % over",
        ),
        (q.imb_lin <= 1.01, f"mean per-step imbalance <= 1.01 (linear n*L): {q.imb_lin:.4f}"),
        (
            q.imb_quad <= 1.02,
            f"mean per-step imbalance <= 1.02 (quadratic n*L + n*L^2/64): {q.imb_quad:.4f}",
        ),
        (
            q.coverage == 1.0 and q.dup == 0 and q.count_min == q.count_max,
            f"coverage 100 % with the default tail ({PlanConfig(1).tail!r}): "
            f"{100 * q.coverage:.3f} %, {q.dup} duplicated, {main.dropped} dropped; "
            f"equal counts: {q.count_min}..{q.count_max} micro-batches per rank",
        ),
    ]
    for ok, text in lines:
        print(f"  [{_mark(ok)}] {text}")
    if "greedy" in info:
        g = info["greedy"]
        print(
            f"  (greedy sorted, for contrast: {g.count_min}..{g.count_max} batches per rank, "
            f"imbalance lin {g.imb_lin:.3f} / quad {g.imb_quad:.3f}, d-comp {g.d_comp:.3f})"
        )


GROUPS = {
    "fixed": "DistributedSampler",
    "lhotse": "lhotse",
    "hf": "HF LengthGrouped",
    "hf_rebalance": "HF batch_rebalance",
    "fairseq": "fairseq",
    "speechbrain": "SpeechBrain",
    "greedy": "greedy",
    "deepspeed": "DeepSpeed",
}
"""Baselines summarised over their rows (by method-name prefix) in the result file."""


def _floats(rows: Sequence[dict[str, Any]], key: str) -> list[float]:
    out = []
    for row in rows:
        try:
            out.append(float(str(row.get(key)).replace(",", "")))
        except ValueError:
            pass
    return out


def group_summary(
    perf: Sequence[dict[str, Any]], quality: Sequence[dict[str, Any]], prefix: str
) -> dict[str, Any]:
    """Lowest and highest ``x_ours`` and quality figures over a baseline's rows."""
    p = [r for r in perf if r["method"].startswith(prefix) and r.get("x_ours") is not None]
    q = [r for r in quality if str(r["method"]).startswith(prefix)]
    mine = [r for r in perf if r["method"].startswith(prefix)]
    out: dict[str, Any] = {"rows": len(q), "batches_per_rank": [r["batches/rank"] for r in q]}
    for name, values in [
        ("x_ours", [r["x_ours"] for r in p]),
        ("x_ours_pairs_min", [r["x_ours_min"] for r in p if r.get("x_ours_min") is not None]),
        ("x_ours_pairs_max", [r["x_ours_max"] for r in p if r.get("x_ours_max") is not None]),
        ("rank_s", [r["rank_s"] for r in mine if r["rank_s"]]),
        (
            "plan_s",
            [r["plan_s"] for r in mine if r["plan_s"] and "extrapolated" not in r["method"]],
        ),
        ("pad_eff", _floats(q, "pad eff")),
        ("pad_both", _floats(q, "pad both")),
        ("imb_lin", _floats(q, "imb lin")),
        ("imb_quad", _floats(q, "imb quad")),
        ("over_pct", _floats(q, "over %")),
        ("max_cost", _floats(q, "max cost")),
        ("dup", _floats(q, "dup")),
    ]:
        if values:
            out[name] = {"min": min(values), "max": max(values)}
    return out


def _size_record(res: SizeResult) -> dict[str, Any]:
    out = asdict(res)
    out["ratio"] = res.ours_s / res.floor_s
    out["ratio_best"] = res.ours_best_s / res.floor_best_s
    out["ratio_argsort"] = None if res.argsort_s is None else res.ours_s / res.argsort_s
    out["time_target"] = "PASS" if out["ratio"] <= 2.0 else "FAIL"
    out["ours_min_s"], out["ours_max_s"] = min(res.ours_all), max(res.ours_all)
    return out


def result_record(
    results: Sequence[SizeResult],
    perfs: Sequence[Perf],
    quals: Sequence[Sequence[str]],
    info: dict[str, Any],
) -> dict[str, Any]:
    """The figures of a run for its result file: ``main`` (the first size), ``big`` (the
    largest, if larger), the performance rows with ``x_ours``/``x_floor`` and the quality
    rows as printed; the baselines' figures by method name under ``by_method``."""
    rows = []
    for p in perfs:
        row = asdict(p)
        row["x_ours"] = p.rank_s / p.ours_s if p.rank_s is not None and p.ours_s else None
        row["x_floor"] = p.rank_s / p.floor_s if p.rank_s is not None and p.floor_s else None
        rows.append(row)
    big = results[-1] if len(results) > 1 and results[-1].n > results[0].n else None
    quality = [dict(zip(QUAL_HEADERS, row, strict=True)) for row in quals]
    return {
        "groups": {g: group_summary(rows, quality, prefix) for g, prefix in GROUPS.items()},
        "main": _size_record(results[0]),
        "big": None if big is None else _size_record(big),
        "performance": rows,
        "quality": quality,
        "fixed_batch": info.get("fixed_batch"),
        "deepspeed_extrapolated_s": info.get("ds_extrapolated_s"),
        "deepspeed_exponent": info.get("ds_exponent"),
        "library_versions": info.get("versions"),
    }


def size_perfs(res: SizeResult) -> list[Perf]:
    rows = [
        Perf(
            method="floor (perm + radix argsort)",
            n=res.n,
            plan_s=None,
            rank_s=res.floor_s,
            rank_best_s=res.floor_best_s,
            floor_s=res.floor_s,
            ours_s=res.ours_s,
            peak_bpe=res.floor_peak_bpe,
            rss_bpe=res.rss.get("floor"),
        ),
        Perf(
            method="ours: EpochPlanner",
            n=res.n,
            plan_s=res.ours_plan_s,
            rank_s=res.ours_s,
            rank_best_s=res.ours_best_s,
            floor_s=res.floor_s,
            ours_s=res.ours_s,
            peak_bpe=res.peak_bpe,
            held_bpe=res.held_bpe,
            rss_bpe=res.rss.get("ours"),
        ),
    ]
    if res.sampler_s is not None or res.sampler_note:
        rows.append(
            Perf(
                method="ours: list(TokenBudgetBatchSampler)",
                n=res.n,
                plan_s=None,
                rank_s=res.sampler_s,
                rank_best_s=None,
                floor_s=res.floor_s,
                ours_s=res.ours_s,
                note=res.sampler_note or "list() keeps all batches",
            )
        )
    return rows
