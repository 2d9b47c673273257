"""Figures, tables and the PNG of :mod:`benchmarks.peers.training` (from its ranks' reports).

:func:`summarize` turns every run's per-rank reports into figures (counted from the ids each
rank trained, not from the plan), :func:`print_report` prints one table per comparison and the
margin of ours over the best peer, :func:`draw` the PNG.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

from benchmarks.harness import fmt, print_table
from benchmarks.peers.batches import BY_NAME, WORKAROUNDS
from benchmarks.peers.rank import RankRun, RunSpec
from benchmarks.workload import slots_and_real


def round_figures(ranks: Sequence[RankRun]) -> dict[str, Any]:
    """One round of one configuration: throughput, waits, step times, memory, planning."""
    tokens = sum(sum(x.tokens) for x in ranks)
    tps = tokens / max(1e-9, max(x.wall_s for x in ranks))
    ar = np.array([x.allreduce_s for x in ranks])
    wait = (ar - ar.min(axis=0, keepdims=True)).sum(axis=1) if ar.size else np.zeros(len(ranks))
    steps = np.array([x.step_s for x in ranks]).max(axis=0) if ar.size else np.zeros(1)
    peaks = [x.peak_mb for x in ranks if x.peak_mb is not None]
    return {
        "tps": tps,
        "tps_cpu": tokens / max(1e-9, statistics.mean(x.cpu_s for x in ranks)),
        "wait_s": [float(w) for w in wait],
        "step_p50_ms": float(np.percentile(steps, 50) * 1000),
        "step_p90_ms": float(np.percentile(steps, 90) * 1000),
        "peak_mb": max(peaks) if peaks else None,
        "plan_s": max(x.plan_s for x in ranks),
        "wall_s": max(x.wall_s for x in ranks),
    }


def counted(
    ranks: Sequence[RankRun], key: np.ndarray, lengths: np.ndarray, m: int
) -> dict[str, Any]:
    """What was trained, from the ids every rank trained with weight > 0."""
    batches = [np.asarray(b, dtype=np.int64) for x in ranks for b in x.batches]
    ids = np.concatenate(batches) if batches else np.zeros(0, dtype=np.int64)
    c = np.bincount(ids, minlength=key.size)
    costs = np.array([len(b) * int(key[b].max()) for b in batches]) if batches else np.zeros(1)
    slots, real = slots_and_real(batches, lengths) if batches else (1, 1)
    return {
        "examples": int(key.size),
        "trained": int((c > 0).sum()),
        "dropped": int((c == 0).sum()),
        "repeated": int(c.sum() - (c > 0).sum()),
        "micro_batches": len(batches),
        "over_budget": int((costs > m).sum()),
        "worst_cost": int(costs.max()),
        "pad_fraction": 1 - real / slots,
        "per_rank": [x.planned for x in ranks],
        "dummy": sum(x.dummy for x in ranks),
        "steps": max(len(x.batches) + x.dummy for x in ranks),
    }


def summarize(
    specs: Sequence[RunSpec],
    runs: dict[str, list[list[RankRun]]],
    key: np.ndarray,
    lengths: np.ndarray,
    m: int,
) -> dict[str, Any]:
    """Per configuration: its setting, counts, hang status and per-round / median figures."""
    out: dict[str, Any] = {}
    for spec in specs:
        rounds = runs[spec.key]
        first = rounds[0]
        counts = first[0].counts
        entry: dict[str, Any] = {
            "peer": spec.peer,
            "label": BY_NAME[spec.peer].label,
            "setting_name": BY_NAME[spec.peer].setting,
            "setting": spec.setting,
            "tag": spec.tag,
            "counts": counts,
            "unequal_counts": len(set(counts)) > 1,
            "workaround": WORKAROUNDS.get(spec.peer) if len(set(counts)) > 1 else None,
            "trained": all(x.trained for x in first),
        }
        if entry["trained"]:
            entry.update(counted(first, key, lengths, m))
            per_round = [round_figures(r) for r in rounds]
            entry["rounds"] = per_round
            entry["tps_median"] = statistics.median(x["tps"] for x in per_round)
            entry["tps_cpu_median"] = statistics.median(x["tps_cpu"] for x in per_round)
            for name in ("step_p50_ms", "step_p90_ms", "plan_s", "wall_s"):
                entry[name] = statistics.median(x[name] for x in per_round)
            entry["wait_s"] = [
                statistics.median(x["wait_s"][r] for x in per_round) for r in range(len(first))
            ]
            peaks = [x["peak_mb"] for x in per_round if x["peak_mb"] is not None]
            entry["peak_mb"] = max(peaks) if peaks else None
        out[spec.key] = entry
    return out


def print_report(numbers: dict[str, Any]) -> dict[str, Any]:
    """One table per comparison, and ours' margin over the best peer in each; the margins."""
    runs, m = numbers["runs"], numbers["limit"]
    margins: dict[str, Any] = {}
    titles = {
        "budget": f"same token budget (max_tokens {m}, or B = {numbers['b_mean']})",
        "memory": f"same memory limit (worst micro-batch padded cost <= {m})",
    }
    for comparison, title in titles.items():
        keys = numbers["comparisons"][comparison]
        ours = runs.get(keys.get("ours", ""), {}).get("tps_median")
        ours_cpu = runs.get(keys.get("ours", ""), {}).get("tps_cpu_median")
        print(f"\n{title}; median of {numbers['rounds']} round(s)")
        headers = [
            "configuration",
            "setting",
            "mb/rank",
            "tgt tok/s",
            "x ours",
            "tok/CPU-s",
            "x ours",
            "wait s r0/r1",
            "step p50/p90 ms",
            "peak MB",
            "trained/drop/rep",
            "over M (worst)",
            "pad frac",
            "plan ms",
        ]
        rows = []
        for spec_key in keys.values():
            e = runs[spec_key]
            label = e["label"] + (" *" if e["unequal_counts"] else "")
            if not e["trained"]:
                rows.append(
                    [
                        label,
                        str(e["setting"]),
                        "/".join(map(str, e["counts"])),
                        "hangs",
                        *["-"] * 10,
                    ]
                )
                continue
            rows.append(
                [
                    label,
                    f"{'B=' if e['setting_name'] == 'batch_size' else ''}{e['setting']}",
                    "/".join(map(str, e["per_rank"])),
                    f"{e['tps_median']:,.0f}",
                    fmt(e["tps_median"] / ours, ".2f") if ours else "-",
                    f"{e['tps_cpu_median']:,.0f}",
                    fmt(e["tps_cpu_median"] / ours_cpu, ".2f") if ours_cpu else "-",
                    "/".join(f"{w:.2f}" for w in e["wait_s"]),
                    f"{e['step_p50_ms']:.0f}/{e['step_p90_ms']:.0f}",
                    fmt(e["peak_mb"], ".0f"),
                    f"{e['trained']}/{e['dropped']}/{e['repeated']}",
                    f"{e['over_budget']} ({e['worst_cost'] / m:.2f})",
                    f"{e['pad_fraction']:.3f}",
                    f"{1000 * e['plan_s']:.1f}",
                ]
            )
        for name, why in numbers["status"].items():
            if why != "ok":
                rows.append([BY_NAME[name].label, why, *["-"] * 12])
        print_table(headers, rows)
        margins[comparison] = {}
        for figure, name in (("tps_median", "tok/s"), ("tps_cpu_median", "tok/CPU-s")):
            mine = runs.get(keys.get("ours", ""), {}).get(figure)
            peers = {
                n: runs[k][figure] for n, k in keys.items() if n != "ours" and runs[k].get(figure)
            }
            if mine and peers:
                best = max(peers, key=lambda n: peers[n])
                margins[comparison][figure] = {"best_peer": best, "ratio": mine / peers[best]}
                print(
                    f"{name}: ours / best peer ({BY_NAME[best].label}): {mine / peers[best]:.2f}x"
                )
    for e in runs.values():
        if e["unequal_counts"]:
            print(
                f"* {e['label']} at {e['setting']}: ranks planned {e['counts']} micro-batches "
                f"(the last all-reduce would hang); run with {e['workaround'] or 'no workaround'}"
            )
    return margins


def draw(numbers: dict[str, Any], path: str) -> str:
    """Real target tokens/s per configuration in both comparisons (dots: rounds), with peak MB."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = numbers["runs"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharex=True)
    for ax, comparison in zip(axes, ("budget", "memory"), strict=True):
        keys = [k for k in numbers["comparisons"][comparison].values() if runs[k]["trained"]]
        y = np.arange(len(keys))
        colors = ["#1f77b4" if runs[k]["peer"] == "ours" else "#ff7f0e" for k in keys]
        ax.barh(y - 0.2, [runs[k]["tps_median"] for k in keys], 0.4, color=colors)
        ax.barh(y + 0.2, [runs[k]["tps_cpu_median"] for k in keys], 0.4, color=colors, alpha=0.4)
        for i, k in enumerate(keys):
            ax.plot([r["tps"] for r in runs[k]["rounds"]], [i - 0.2] * len(runs[k]["rounds"]), "k.")
            peak = runs[k]["peak_mb"]
            top = max(runs[k]["tps_median"], runs[k]["tps_cpu_median"])
            ax.text(top, i, f" {fmt(peak, '.0f')} MB", va="center", fontsize=7)
        ax.set_yticks(
            list(y), [f"{runs[k]['label']} ({runs[k]['setting']})" for k in keys], fontsize=7
        )
        ax.invert_yaxis()
        ax.set_xlabel(
            "real target tokens / s (dark, dots: rounds) and per CPU-second (light); peak MB",
            fontsize=8,
        )
        limit = numbers["limit"]
        ax.set_title(
            {
                "budget": f"same token budget ({limit})",
                "memory": f"same memory limit (padded cost <= {limit})",
            }[comparison],
            fontsize=9,
        )
    fig.suptitle("CPU training, 2 gloo ranks, every peer's batches", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
