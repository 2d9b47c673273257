"""The planning benchmarks' tables (plan time and quality, pairs, warm-up) for the documents.

Each function takes a whole result file and returns markdown; :data:`TABLES` names them for
:mod:`benchmarks.render`.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.planning.tables_libraries import TABLES as LIBRARY_TABLES
from benchmarks.render_tables import TIMES, Result, cell, markdown, provenance_line


def planning_targets(result: Result) -> str:
    """The planning benchmark's targets at its main size, as a text block."""
    r = result["results"]
    main, big = r["main"], r.get("big")
    q = main["quality"]

    def mark(ok: bool) -> str:
        return "PASS" if ok else "FAIL"

    lines = [
        f"targets (n={main['n']:,}; medians of {len(main['ours_all'])} interleaved repeats; "
        + provenance_line(result)
        + ")",
        f"  [{mark(main['ratio'] <= 2)}] rank-0 epoch planned+iterated <= 2x floor: "
        f"{main['ours_s']:.3f} s vs floor {main['floor_s']:.3f} s = {main['ratio']:.2f}x "
        f"(repeats {main['ours_min_s']:.3f}-{main['ours_max_s']:.3f} s; "
        f"best-of ratio {main['ratio_best']:.2f}x)",
        f"  [{mark(main['peak_bpe'] <= 16)}] peak extra memory <= 16 B/example (tracemalloc): "
        f"{main['peak_bpe']:.1f} B/ex (held after: {main['held_bpe']:.1f})",
    ]
    if "ours" in main["rss"]:
        lines.append(
            f"  [{mark(main['rss']['ours'] <= 16)}] peak extra memory <= 16 B/example "
            f"(RSS high-water): {main['rss']['ours']:.1f} B/ex"
        )
    if big:
        ratio = big["ours_s"] / big["floor_s"]
        lines.append(
            f"  [{mark(ratio <= 2)}] at {big['n']:,}: {big['ours_s']:.2f} s, "
            f"{big['ours_s'] / big['n'] * 1e9:.1f} ns/ex, {ratio:.2f}x floor; "
            f"peak {big['peak_bpe']:.1f} B/ex"
        )
    lines += [
        f"  [{mark(q['pad_eff'] >= 0.99)}] padding efficiency >= 0.99 (max(source, target)): "
        f"{q['pad_eff']:.4f}; both padded tensors: {cell(q.get('pad_both'), '.4f')}",
        f"  [{mark(q['max_cost'] <= 1)}] budget never exceeded: max cost "
        f"{q['max_cost']:.4f} x max_tokens, {100 * q['over']:.2f} % over",
        f"  [{mark(q['imb_lin'] <= 1.01)}] mean per-step imbalance <= 1.01 (linear n*L): "
        f"{q['imb_lin']:.4f}",
        f"  [{mark(q['imb_quad'] <= 1.02)}] mean per-step imbalance <= 1.02 (quadratic): "
        f"{q['imb_quad']:.4f}",
        f"  [{mark(q['coverage'] == 1 and q['dup'] == 0)}] coverage "
        f"{100 * q['coverage']:.3f} %, {q['dup']} duplicated; "
        f"{q['count_min']}..{q['count_max']} micro-batches per rank",
    ]
    return "```text\n" + "\n".join(lines) + "\n```\n"


def planning_performance(result: Result) -> str:
    """The planning benchmark's performance rows (one rank's epoch) as a markdown table."""
    rows = [
        [
            p["method"],
            f"{p['n']:,}",
            cell(p["plan_s"], ".3g"),
            cell(p["rank_s"], ".3f"),
            cell(p.get("x_floor"), ".2f"),
            cell(p.get("x_ours"), ".2f"),
            cell(p.get("peak_bpe"), ".1f"),
            cell(p.get("rss_bpe"), ".1f"),
            p.get("note", ""),
        ]
        for p in result["results"]["performance"]
    ]
    headers = ["method", "n", "plan all (s)", "rank 0 (s)", "x floor", "x ours", "peak B/ex"]
    headers += ["RSS B/ex", "note"]
    return markdown(headers, rows, "lrrrrrrrl")


def planning_quality(result: Result) -> str:
    """The planning benchmark's quality rows as a markdown table."""
    keys = ["method", "n", "pad eff", "pad both", "imb lin", "imb quad", "batches/rank", "over %"]
    rows = [[row.get(k, "-") for k in keys] for row in result["results"]["quality"]]
    return markdown(keys, rows, "lrrrrrrr")


def pair_plan_padding(result: Result) -> str:
    """(a) of the pair benchmark: padding of both tensors by budget, every order."""
    rows = []
    for r in result["results"]["table"]:
        mbs = r["mbs"]
        rows.append(
            [
                f"{r['budget']:,}",
                f"{r['max']:.4f}",
                f"{r['b0.02']:.4f}",
                f"{r['b0.05']:.4f}",
                f"{r['b0.1']:.4f}",
                f"**{r['two_sided']:.4f}**",
                f"{r['ratio']:.2f}",
                "yes" if r["wins_every_seed"] else "**no**",
                f"{mbs['two_sided']:.0f} / {mbs['max']:.0f} / {mbs['b0.05']:.0f}",
            ]
        )
    headers = [
        "budget",
        "max order",
        "buckets 2 %",
        "buckets 5 %",
        "buckets 10 %",
        "ours",
        "ours / better",
        "≤ every seed",
        "micro-batches ours / max / 5 %",
    ]
    return markdown(headers, rows, "rrrrrrrlr")


def pair_plan_optimum(result: Result) -> str:
    """(b) of the pair benchmark: padded slots over the exact optimum on small inputs."""
    rows = [
        [
            name,
            f"{o['two_sided_mean']:.3f}",
            f"{o['two_sided_max']:.3f}",
            f"{o['max_mean']:.3f}",
            f"{o['max_max']:.3f}",
            f"{o['ours_optimal']:.0%}",
        ]
        for name, o in result["results"]["optimum"].items()
    ]
    headers = ["inputs", "ours mean", "ours max", "max order mean", "max order max", "ours optimal"]
    return markdown(headers, rows)


def pair_plan_time(result: Result) -> str:
    """(c) of the pair benchmark: planning time of both orders."""
    t = result["results"]["planning_s"]
    rows = [[o, f"{t[f'{o}_first']:.3f}", f"{t[f'{o}_later']:.3f}"] for o in ("max", "two_sided")]
    return markdown(["order", "first plan (s)", "later epoch (s)"], rows)


def length_warmup(result: Result) -> str:
    """The warm-up benchmark's three tables (plan, padding per stage, truncating warm-ups)."""
    out = [
        "| workload | steps (warm-up) | tokens/step warm-up / none | min step / budget (none) "
        "| tokens cut | advanced | plan time (ratio) |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = result["results"]["rows"]
    for r in rows:
        out.append(
            f"| {r['name']} {r['layout']}, {r['examples']:,} | {r['steps']:,} ({r['warmup']}) | "
            f"{r['tokens_ratio']:.4f} | {r['min_step']:.3f} ({r['min_step_none']:.3f}) | 0 | "
            f"{r['advanced']} (max +{r['advanced_by']}) | "
            f"{r['t_base']:.2f} s ({r['time_ratio']:.2f}{TIMES}) |"
        )
    out += [
        "",
        "| workload | padding per warm-up quarter → after | without schedule | "
        "examples/step per quarter → after |",
        "|---|---|---|---|",
    ]
    for r in rows:
        pads = " / ".join(f"{s[1]:.4f}" for s in r["stages"])
        ex = " / ".join(f"{s[2]:,.0f}" for s in r["stages"])
        out.append(f"| {r['name']} {r['layout']} | {pads} | {r['base_padding']:.4f} | {ex} |")
    out += [
        "",
        "| workload | warm-up | tokens discarded | padding | examples seen | tokens/step |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        t = r["truncating"]
        seen = "n/a (rows)" if t["examples"] != t["examples"] else f"{t['examples']:,.0f}"
        warm = [s[1] for s in r["stages"] if s[0] != "after"]
        out.append(
            f"| {r['name']} {r['layout']} | truncating | {100 * t['discarded']:.1f} % | "
            f"{t['padding']:.4f} | {seen} | {t['tokens_per_step']:,.0f} |"
        )
        out.append(
            f"| {r['name']} {r['layout']} | this planner | 0 % | {min(warm):.4f}-{max(warm):.4f} "
            f"| {r['examples_in_warmup']:,.0f} | {r['tokens_ratio']:.4f}{TIMES} of none |"
        )
    return "\n".join(out) + "\n"


def pair_shapes(result: Result) -> str:
    """Every distribution and budget: each order's padding, ours over the best, the verdict."""
    r = result["results"]
    orders = ["ours", "max", "max, source, target", "source, target", "target, source"]
    rows = []
    for dist, d in r.items():
        if "rows" not in d:  # the summary and the tiny-input check
            continue
        for row in d["rows"]:
            best = row["best_other"]
            rows.append(
                [f"{dist} ({d['correlation']:.2f})", f"{row['budget']:,}"]
                + [f"{row['padding'][o]:.4f}" for o in orders]
                + [
                    f"{row['ours_over_best']:.4f}",
                    f"{row['micro_batches']['ours']:.0f} / {row['micro_batches'][best]:.0f}",
                    cell(row.get("bound_padding"), ".4f"),
                    cell(row.get("distance"), ".4f"),
                    row["verdict"],
                ]
            )
    headers = ["data (corr.)", "budget", *orders, "ours / best", "mbs ours / best"]
    headers += ["bound pad", "ours / bound - 1", "verdict"]
    return markdown(headers, rows, "lr" + "r" * 9 + "l")


GUARD_ROWS = {
    "fresh": "fresh plan of a later epoch (sort and cut cached)",
    "replan": "elastic re-plan: {world} ranks ran half the epoch, the rest on {resumed} "
    "(guard included)",
    "guard_elastic": "guard of that remainder",
    "guard_same": "guard at a same-topology resume (what `load_state_dict` runs)",
    "guard_shares": "the same, ranks of their own budgets (`rank_shares`)",
    "ledger": "the ledger at a checkpoint (`state_dict`)",
}
GUARD_RATIOS = {
    "guard_elastic": "guard_over_replan",
    "guard_same": "guard_over_fresh",
    "guard_shares": "shares_over_fresh",
    "ledger": "ledger_over_fresh",
}


def _span(s: dict[str, float], spec: str) -> str:
    """``median (min-max)`` of a spread."""
    return f"{s['median']:{spec}} ({s['min']:{spec}}-{s['max']:{spec}})"


def remainder_guard(result: Result) -> str:
    """What the remainder guard costs: seconds per row and its ratio to what it guards."""
    r = result["results"]
    rows = []
    for key, what in GUARD_ROWS.items():
        ratio = GUARD_RATIOS.get(key)
        over = "re-plan" if ratio == "guard_over_replan" else "fresh plan"
        rows.append(
            [
                what.format(world=r["world_size"], resumed=r["resumed_world_size"]),
                _span(r["seconds"][key], ".3f"),
                "" if ratio is None else f"{_span(r['ratios'][ratio], '.2f')} of the {over}",
            ]
        )
    return markdown(["what", "seconds, median (range)", "ratio, median (range)"], rows, "lrl")


def batch_schedule_time(result: Result) -> str:
    """The batch-size schedule's plan time against no schedule, with per-repeat ranges."""
    r = result["results"]
    rows = []
    for name, seconds in r["seconds"].items():
        label = "none" if name == "none" else f'{name}: `"{r["schedules"][name]}"`'
        cells = [label, f"{r['steps'][name]:,}"]
        for row in ("first", "cached", "later"):
            text = f"{seconds[row]:.3f}"
            if name in r["ratios"]:
                span = r["ratio_range"][name][row]
                text += (
                    f" ({r['ratios'][name][row]:.2f}{TIMES}, {span['min']:.2f}-{span['max']:.2f})"
                )
            cells.append(text)
        rows.append(cells)
    headers = ["schedule", "steps, epoch 0", "first plan (s)", "epoch 0, cached (s)"]
    return markdown([*headers, "later epoch (s)"], rows)


def batch_schedule_stages(result: Result) -> str:
    """Each stage of epoch 0 under each schedule: steps, budget, tokens per step, fill."""
    rows = []
    for name, stages in result["results"]["stages"].items():
        for s in stages:
            low, high = s["budget_min"], s["budget_max"]
            rows.append(
                [
                    name,
                    s["label"],
                    f"{s['num_steps']:,}",
                    f"{low:,}" if low == high else f"{low:,}-{high:,}",
                    f"{s['tokens_per_step']:,.0f}",
                    f"{100 * s['fill']:.1f} %",
                    f"{100 * s['min_fill']:.1f} %",
                ]
            )
    headers = ["schedule", "fraction", "steps", "budget per rank", "tokens/step", "fill mean"]
    return markdown([*headers, "fill min"], rows, "llrrrrr")


TABLES: dict[str, Callable[[Result], str]] = {
    **LIBRARY_TABLES,
    "planning_targets": planning_targets,
    "planning_performance": planning_performance,
    "planning_quality": planning_quality,
    "pair_plan_padding": pair_plan_padding,
    "pair_plan_optimum": pair_plan_optimum,
    "pair_plan_time": pair_plan_time,
    "length_warmup": length_warmup,
    "pair_shapes": pair_shapes,
    "remainder_guard": remainder_guard,
    "batch_schedule_time": batch_schedule_time,
    "batch_schedule_stages": batch_schedule_stages,
}
