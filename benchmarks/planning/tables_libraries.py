"""The planning benchmark's comparison with other libraries, for the documents.

Each function takes the planning result file (``benchmarks/results/planning.json``) and returns
markdown; :data:`TABLES` names them, and :mod:`benchmarks.planning.tables` adds them to its own.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.render_tables import TIMES, Result, cell, markdown

LIBRARIES = ("ours: EpochPlanner", "lhotse", "HF", "fairseq", "SpeechBrain", "DeepSpeed")
"""Method-name prefixes of the rows :func:`planning_libraries` shows."""


def planning_libraries(result: Result) -> str:
    """Our planner against every library the run found installed: one rank's epoch (DeepSpeed:
    the whole plan) with its ratio to ours at the same size in the same run, and the quality."""
    r = result["results"]
    quality = {(q["method"], q["n"]): q for q in r["quality"]}
    rows = []
    for p in r["performance"]:
        if not p["method"].startswith(LIBRARIES) or "extrapolated" in p["method"]:
            continue
        if p["n"] > r["main"]["n"]:  # the linearity check, not a comparison
            continue
        q = quality.get((p["method"], f"{p['n']:,}"), {})
        seconds = p["rank_s"] if p["rank_s"] is not None else p["plan_s"]
        what = "" if p["rank_s"] is not None or p["plan_s"] is None else " (all ranks)"
        rows.append(
            [p["method"], f"{p['n']:,}", cell(seconds, ".3g") + what, cell(p.get("x_ours"), ".2f")]
            + [q.get(k, "-") for k in ("pad eff", "pad both", "over %", "max cost")]
            + [q.get(k, "-") for k in ("imb lin", "imb quad", "batches/rank", "dup")]
            + [p.get("note", "")]
        )
    headers = ["method", "n", "one rank's epoch (s)", "x ours", "pad eff", "pad both", "over %"]
    headers += ["max cost", "imb lin", "imb quad", "batches/rank", "dup", "note"]
    return markdown(headers, rows, "lrrrrrrrrrrrl")


LIBRARY_GROUPS = {
    "lhotse": "lhotse `DynamicBucketingSampler`",
    "hf": "Hugging Face `group_by_length` + accelerate",
    "hf_rebalance": "Hugging Face `batch_rebalance`",
    "fairseq": "fairseq's package (`batch_by_size` + `EpochBatchIterator`)",
    "speechbrain": "SpeechBrain `DynamicBatchSampler`",
    "deepspeed": "DeepSpeed `batch_by_seqlens`",
}
"""The libraries' groups of the planning result (``groups``), as the summary names them."""


def _range(g: dict[str, dict[str, float]], key: str, spec: str, scale: float = 1) -> str:
    low, high = g[key]["min"] * scale, g[key]["max"] * scale
    return f"{low:{spec}}" if f"{low:{spec}}" == f"{high:{spec}}" else f"{low:{spec}}-{high:{spec}}"


def _speed(g: dict[str, dict[str, float]]) -> str:
    """The ratio to ours (medians over the library's rows) and a verdict only where it holds
    for every paired run (or every run of the library against every run of ours)."""
    low, high = g["x_ours"]["min"], g["x_ours"]["max"]
    text = f"one rank's epoch {_range(g, 'x_ours', '.2f')}{TIMES} ours"
    if "x_ours_pairs_min" in g:
        low, high = g["x_ours_pairs_min"]["min"], g["x_ours_pairs_max"]["max"]
        text += f" (every run against ours {low:.2f}-{high:.2f})"
    else:
        return f"{text} (no paired runs recorded: no verdict)"
    if high < 1:
        return f"{text}: **faster than ours**"
    if low > 1:
        return f"{text}: slower than ours"
    return f"{text}: no clear order"


def planning_libraries_summary(result: Result) -> str:
    """One bullet per library the run measured: speed against ours, padding, budget, balance."""
    r = result["results"]
    q = r["main"]["quality"]
    machine = result["provenance"].get("machine", {})
    versions = r.get("library_versions") or {
        k: v
        for k, v in machine.items()
        if k in ("lhotse", "transformers", "accelerate", "deepspeed")
    }
    lines = [
        "- installed for this run: " + ", ".join(f"{k} {v}" for k, v in versions.items()) + ".",
        f"- **ours** at {r['main']['n']:,}: padding efficiency {q['pad_eff']:.4f} (both padded "
        f"tensors {cell(q.get('pad_both'), '.4f')}), never over the budget, imbalance "
        f"{q['imb_lin']:.4f} linear / {q['imb_quad']:.4f} quadratic, every example once.",
    ]
    for name, label in LIBRARY_GROUPS.items():
        g = r["groups"].get(name)
        if not g or not g.get("rows"):
            continue
        parts = []
        if "x_ours" in g:
            parts.append(_speed(g))
        elif name == "deepspeed" and r.get("deepspeed_extrapolated_s"):
            days = r["deepspeed_extrapolated_s"] / 86400
            parts.append(
                f"the whole plan super-linear in n (t ~ n^{r['deepspeed_exponent']:.2f}; "
                f"{days:,.0f} days extrapolated to {r['main']['n']:,})"
            )
        if "pad_eff" in g:
            parts.append(f"padding efficiency {_range(g, 'pad_eff', '.4f')}")
        if "over_pct" in g:
            parts.append(
                f"{_range(g, 'over_pct', '.2f')} % of micro-batches over the budget (largest "
                f"{_range(g, 'max_cost', '.2f')}{TIMES} it)"
            )
        if "imb_lin" in g:
            parts.append(
                f"imbalance {_range(g, 'imb_lin', '.3f')} linear / "
                f"{_range(g, 'imb_quad', '.3f')} quadratic"
            )
        if "dup" in g and g["dup"]["max"] > 0:
            parts.append(f"{_range(g, 'dup', ',.0f')} examples twice in an epoch")
        counts = sorted({str(c) for c in g.get("batches_per_rank", [])})
        if any("-" in c for c in counts):
            parts.append("ranks get different micro-batch counts (" + ", ".join(counts) + ")")
        lines.append(f"- **{label}**: " + "; ".join(parts) + ".")
    return "\n".join(lines) + "\n"


TABLES: dict[str, Callable[[Result], str]] = {
    "planning_libraries": planning_libraries,
    "planning_libraries_summary": planning_libraries_summary,
}
