"""The tables of :mod:`benchmarks.peers.seeds`: the sweep (plans) and the measured ratios."""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from typing import Any

from benchmarks.harness import print_table
from benchmarks.peers import model as pm
from benchmarks.peers import sweep as sw
from benchmarks.peers import timing as pt
from benchmarks.render_tables import Result, markdown


def span(xs: Sequence[float], f: str) -> str:
    """``median [min-max]`` (or the one value)."""
    med = format(statistics.median(xs), f) if xs else "-"
    return med if not xs or min(xs) == max(xs) else f"{med} [{min(xs):{f}}-{max(xs):{f}}]"


def print_sweep(
    rounds: list[dict[str, Any]], groups: dict[str, list[str]], choice: dict[int, Any]
) -> None:
    """Per budget, every configuration's recount and modelled tokens/s (median over seeds)."""
    head = ["peer", "configuration", "setting", "tok/s (model)", "ours/it (model)", "pad frac",
            "slot eff", "drop/rep/over", "counts", "plan ms", "pick"]  # fmt: skip
    for m, picked in choice.items():
        here = [r for r in rounds if r["budget"] == m and r["comparison"] == "budget"]
        ours = {r["seed"]: r["tps_model"] for r in here if r["row"] == "ours"}
        print(f"\nsweep, same token budget M = {m} (plans; tok/s by the time model), "
              f"seeds {sorted(ours)}")  # fmt: skip
        table = []
        for g, cs in groups.items():
            for c in cs:
                rs = [r for r in here if r["row"] == c]
                ok = [r for r in rs if not r["hangs"]]
                pick = [k for k in ("default", "best") if picked.get(g, {}).get(k) == c]
                ratio = [ours[r["seed"]] / r["tps_model"] for r in ok]
                table.append([
                    sw.NAMES.get(g, g), sw.knob_text(c) or "-",
                    span([r["setting"] for r in rs], ".0f"),
                    span([r["tps_model"] for r in ok], ",.0f"),
                    span(ratio, ".3f") if g != "ours" else "-",
                    span([r["pad_fraction"] for r in rs], ".3f"),
                    span([r["slot_efficiency"] for r in ok], ".3f"),
                    "/".join(str(max(r[k] for r in rs)) for k in ("dropped", "repeated", "over")),
                    "equal" if all(r["equal_counts"] for r in rs)
                    else "hangs" if len(ok) < len(rs) else "workaround",
                    span([1000 * r["plan_s"] for r in rs], ".0f"), "+".join(pick) or "",
                ])  # fmt: skip
        print_table(head, table)


TITLES = {
    "best": "each peer at its best (the faster of its best and its default, measured)",
    "default": "each peer at its defaults",
    "memory": "same memory (measured peaks): each peer's best at the largest setting that fits",
}


def print_measured(
    rounds: list[dict[str, Any]], measured: dict[str, list[dict]], choice: dict[int, Any],
    a: Any,
) -> dict[str, Any]:  # fmt: skip
    """The measured tables; returns every ratio with its interval and verdict."""
    out: dict[str, Any] = {}
    head = ["peer", "configuration", "setting", "steps", "tok/s ours", "tok/s peer",
            "ours/peer wall [90%]", "wall", "ours/peer CPU [90%]", "CPU", "model", "pad frac",
            "over M", "peak MB"]  # fmt: skip
    for m, picked in choice.items():
        ours = [pt.Sample(**_fields(x)) for x in measured.get(f"{m}/budget/ours", [])]
        if not ours:
            continue
        loads = [x["load"] for x in measured[f"{m}/budget/ours"]]
        for table, title in TITLES.items():
            rows, comp = [], "memory" if table == "memory" else "budget"
            for g, pick in picked.items():
                if g == "ours":
                    continue
                cands = (
                    [pick["best"], pick["default"]]
                    if table == "best"
                    else [pick["default" if table == "default" else "best"]]
                )
                got = []
                for c in dict.fromkeys(cands):
                    entries = measured.get(f"{m}/{comp}/{c}")
                    if entries:
                        peer = [pt.Sample(**_fields(x)) for x in entries]
                        got.append((c, entries, {k: pt.paired_ratio(ours, peer, k, a.boot)
                                                 for k in ("wall", "cpu")}))  # fmt: skip
                if not got:
                    continue
                c, entries, r = min(got, key=lambda x: x[2]["cpu"]["ratio"])
                rs = [x for x in rounds if x["row"] == c and x["budget"] == m
                      and x["comparison"] == comp and not x["hangs"]]  # fmt: skip
                mine = {x["seed"]: x["tps_model"] for x in rounds if x["row"] == "ours"
                        and x["budget"] == m and x["comparison"] == "budget"}  # fmt: skip
                model = [mine[x["seed"]] / x["tps_model"] for x in rs]
                verdicts = {k: pt.verdict(v) for k, v in r.items()}
                out[f"{table}/{m}/{g}"] = {"config": c, **{k: {**v, "verdict": verdicts[k]}
                                           for k, v in r.items()}, "model": model}  # fmt: skip
                peaks = [x["peak_measured_mb"] for x in rs if "peak_measured_mb" in x]
                rows.append([
                    sw.NAMES.get(g, g), sw.knob_text(c) or "-",
                    span([x["setting"] for x in entries], ".0f"),
                    span([x["steps"] for x in entries], ".0f"),
                    f"{_rate(ours, 'wall'):,.0f}", f"{_rate(entries, 'wall'):,.0f}",
                    pt.cell(r["wall"]), verdicts["wall"], pt.cell(r["cpu"]), verdicts["cpu"],
                    span(model, ".3f"), span([x["pad_fraction"] for x in rs], ".3f"),
                    str(max((x["over"] for x in rs), default=0)), span(peaks, ".0f") or "-",
                ])  # fmt: skip
            if rows:
                seeds = sorted({x["seed"] for x in measured[f"{m}/budget/ours"]})
                print(f"\n{title}; M = {m}; seeds {seeds}, {len(ours[0].wall)} paired blocks "
                      f"each; load {loads[0][0]} ... {loads[-1][1]}")  # fmt: skip
                print_table(head, rows)
    return out


def _fields(x: dict[str, Any]) -> dict[str, Any]:
    return {k: x[k] for k in ("steps", "tokens", "wall", "cpu", "positions")}


def _rate(samples: Sequence[Any], kind: str) -> float:
    """Total tokens / total estimated epoch time over the seeds."""
    get = (lambda s, k: getattr(s, k)) if isinstance(samples[0], pt.Sample) else (
        lambda s, k: s[k])  # fmt: skip
    tokens = sum(get(s, "tokens") for s in samples)
    return tokens / sum(get(s, "steps") * statistics.mean(get(s, kind)) for s in samples)


def label(c: str) -> str:
    return pm.label(c)


def peer_verdicts(result: Result) -> str:
    """Every measured comparison: ours / peer in CPU and wall time, 90 % interval, verdict."""
    rows = []
    for key, v in result["results"]["verdicts"].items():
        table, budget, peer = key.split("/")
        model = sorted(v["model"])
        cells = [table, budget, peer, f"`{v['config']}`"]
        for kind in ("cpu", "wall"):
            r = v[kind]
            cells += [f"{r['ratio']:.3f} [{r['lo']:.3f}-{r['hi']:.3f}]", r["verdict"]]
        cells.append(f"{model[len(model) // 2]:.3f}" if model else "-")
        rows.append(cells)
    headers = ["comparison", "M", "peer", "configuration", "ours/peer CPU [90 %]", "CPU",
               "ours/peer wall [90 %]", "wall", "model"]  # fmt: skip
    return markdown(headers, rows, "lrll" + "rlrlr")


def peer_sweep(result: Result) -> str:
    """The sweep of every peer's knobs per budget (recount and modelled tok/s), as text."""
    import contextlib
    import io

    r = result["results"]
    choice = {int(m): picked for m, picked in r["choice"].items()}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print_sweep(r["rounds"], r["groups"], choice)
    return "```\n" + out.getvalue().strip("\n") + "\n```\n"


TABLES: dict[str, Callable[[Result], str]] = {
    "peer_verdicts": peer_verdicts,
    "peer_sweep": peer_sweep,
}
