"""The source benchmarks' tables (Hugging Face datasets, streaming) for the documents.

Each function takes a whole result file and returns markdown; :data:`TABLES` names them for
:mod:`benchmarks.render`. A paired ratio (``{"median", "min", "max"}``) is shown as
``median (min-max)`` over the rounds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from benchmarks.render_tables import TIMES, Result, cell, markdown, provenance_line

LENGTH_CASES = {"a": "(a) int32 column", "b": "(b) list<int16> ids", "c": "(c) ids, shuffled"}
LENGTH_METHODS = {
    "ours": "**ours: `column_lengths`**",
    "loop": "per-row Python loop",
    "map": "`ds.map(batched=True)`",
    "numpy": "`ds.with_format('numpy')['n'][:]`",
}
TOKEN_METHODS = {
    "loop": "baseline: `[len(tok.encode(t).ids) for t in texts]`",
    "encode_batch": "reference: `tok.encode_batch(texts)`",
    "ours": "**ours: `tokenized_lengths`**, `num_proc=None`",
    "ours_np2": "**ours**, `num_proc=2`",
    "ours_first": "**ours**, cache on, first call (writes it)",
    "ours_cached": "**ours**, cache on, second call (reads it)",
}
LOADER_KINDS = {
    "list": "list of dicts (item path)",
    "hf": "`datasets.Dataset.from_dict` (in memory)",
    "disk": "`save_to_disk` + `load_from_disk` (memory-mapped)",
}


def ratio(r: dict[str, Any] | None, spec: str = ".2f") -> str:
    """``median (min-max)`` of a paired ratio, with the multiplication sign."""
    if r is None:
        return "-"
    return f"{r['median']:{spec}}{TIMES} ({r['min']:{spec}}-{r['max']:{spec}})"


def _rounds(result: Result) -> str:
    return f"{result['provenance']['settings'].get('rounds', '?')} interleaved rounds"


def hf_lengths_table(result: Result) -> str:
    """Part 1 of the Hugging Face benchmark: lengths of many rows, ours and the baselines."""
    c = result["results"]["configs"]
    rows = []
    for case, case_name in LENGTH_CASES.items():
        for method, name in LENGTH_METHODS.items():
            r = c.get(f"lengths/{case}/{method}")
            if r is None:
                continue
            rows.append(
                [
                    f"{case_name}: {name}",
                    f"{r['rows']:,}",
                    f"{r['seconds']:.3f}",
                    f"{r['ns_per_row']:,.1f}",
                    "1" if method == "ours" else ratio(r["x_ours"], ",.0f"),
                    f"{r['bytes_per_row']:.1f}",
                    "yes" if r["agrees"] else "**no**",
                ]
            )
    headers = ["case: method", "rows run", "s (median)", "ns/row", "x ours per row (range)"]
    headers += ["peak B/row", "equals `n`"]
    note = f"\n{_rounds(result)}; {provenance_line(result)}.\n"
    return markdown(headers, rows, "lrrrrrl") + note


def hf_tokens_table(result: Result) -> str:
    """Part 2 of the Hugging Face benchmark: token counts, ours and the per-row loop."""
    c = result["results"]["configs"]
    rows = [
        [
            name,
            f"{c[f'tokens/{m}']['seconds']:.3f}",
            f"{c[f'tokens/{m}']['texts_per_s']:,.0f}",
            "1" if m == "loop" else ratio(c[f"tokens/{m}"]["x_loop"]),
            "yes" if c[f"tokens/{m}"]["agrees"] else "**no**",
        ]
        for m, name in TOKEN_METHODS.items()
        if f"tokens/{m}" in c
    ]
    loop = c["tokens/loop"]
    headers = ["method", "s (median)", "texts/s", "speed x loop (range)", "counts agree"]
    note = (
        f"\n{loop['rows']:,} texts, {loop['tokens']:,} tokens; {_rounds(result)}; "
        f"{provenance_line(result)}.\n"
    )
    return markdown(headers, rows, "lrrrl") + note


def hf_loader_table(result: Result) -> str:
    """Part 3 of the Hugging Face benchmark: collated examples/s by dataset kind."""
    c = result["results"]["configs"]
    rows = []
    for workers in (0, 2):
        for kind, name in LOADER_KINDS.items():
            r = c[f"loader/{kind}/w{workers}"]
            rows.append(
                [
                    f"{name}, `num_workers={workers}`",
                    f"{r['seconds']:.2f}",
                    f"{r['examples_per_s']:,.0f}",
                    "1" if kind == "list" else ratio(r["x_list"]),
                ]
            )
    first = c["loader/list/w0"]
    identical = all(r.get("identical_batches") for k, r in c.items() if k.startswith("loader/"))
    settings = result["provenance"]["settings"]
    note = (
        f"\n{first['examples']:,} pairs, {first['batches']:,} micro-batches of at most "
        f"{settings.get('max_tokens', '?'):,} tokens per epoch; batches of all three kinds "
        f"identical: {'yes' if identical else '**no**'}; {_rounds(result)}; "
        f"{provenance_line(result)}.\n"
    )
    headers = ["dataset", "epoch s (median)", "examples/s", "x list (range)"]
    return markdown(headers, rows, "lrrr") + note


def streaming_plans(result: Result) -> str:
    """(a) of the streaming benchmark: padding, balance and budget of every plan."""
    rows = result["results"]["plans"]["rows"]
    base = rows[0]["pad_eff"]
    body = []
    for r in rows:
        over = str(r["over"])
        if r.get("over_max_cost", 0) > 1:
            over += f" (up to {r['over_max_cost']:.2f}{TIMES})"
        body.append(
            [
                r["name"].replace("EpochPlanner", "`EpochPlanner`"),
                f"{r['pad_eff']:.4f}",
                f"{r['pad_eff'] / base:.3f}",
                over,
                f"{r['imb_mean']:.4f}",
                cell(r["imb_max"], ".4f"),
                r["counts"],
                f"{r['coverage']:.4f}",
                f"{max(r['rank_tokens']) / min(r['rank_tokens']):.3f}",
            ]
        )
    headers = ["plan", "padding efficiency", "x offline", "over budget", "mean step imbalance"]
    headers += ["worst step", "micro-batches per rank", "coverage", "rank tokens max/min"]
    return markdown(headers, body, "lrrrrrrrr") + f"\n{provenance_line(result)}.\n"


MEMORY_NAMES = {
    "planner": "ours: `WindowedPlanner`, every window",
    "stream": "ours: `shards_from_files` + `StreamingBatches`",
    "offline": "baseline: all lengths + `EpochPlanner`",
}


def streaming_memory(result: Result) -> str:
    """(b) of the streaming benchmark: peak RSS rise at two dataset sizes."""
    m = result["results"]["memory"]
    small, large = min(m["sizes"]), max(m["sizes"])
    rows = []
    for mode, name in MEMORY_NAMES.items():
        a, b = m["configs"].get(f"{mode}/{small}"), m["configs"].get(f"{mode}/{large}")
        if a is None or b is None:
            continue
        diff = (b["rise_kib"] - a["rise_kib"]) / 1024
        rows.append(
            [
                name,
                f"{a['rise_kib'] / 1024:.1f}",
                f"{b['rise_kib'] / 1024:.1f}",
                f"{diff:.1f}",
                f"{diff * 2**20 / (large - small):.2f}",
                f"{a['seconds']:.1f}",
                f"{b['seconds']:.1f}",
            ]
        )
    headers = ["configuration", f"MiB at {small:,}", f"MiB at {large:,}", "difference MiB"]
    headers += ["B per extra example", f"s at {small:,}", f"s at {large:,}"]
    return markdown(headers, rows) + f"\n{provenance_line(result)}.\n"


def streaming_reads(result: Result) -> str:
    """(c) of the streaming benchmark: what the readers opened, read and decoded."""
    reads = result["results"]["reads"]
    settings = result["provenance"]["settings"]
    shards = -(-settings["read_pairs"] // settings["shard_rows"])
    rows = []
    for key in ("w0", "w2"):
        r = reads[key]
        t, readers = r["stats"], len(r["per_worker"])
        rows.append(
            [
                f"`num_workers={key[1:]}`",
                str(readers),
                str(t["backward_seeks"]),
                f"{t['rows_read']:,}",
                f"{t['rows_decoded']:,}",
                f"{t['rows_decoded'] / t['rows_read']:.2f}",
                f"{t['opens'] / (shards * readers):.2f}",
                "/".join(map(str, r["counts"])),
                "yes" if r["exact"] else "**no**",
            ]
        )
    headers = ["loader", "readers", "backward seeks", "rows read", "rows decoded", "decoded/read"]
    headers += ["opens per shard and reader", "batches per rank", "each example once"]
    return markdown(headers, rows, "lrrrrrrrl") + f"\n{provenance_line(result)}.\n"


def streaming_resume(result: Result) -> str:
    """(d) of the streaming benchmark: resume at mid-epoch against replaying to it."""
    r = result["results"]["resume"]
    rounds = [v for k, v in r.items() if k.startswith("round")]
    replay = sorted(x["replay_s"] for x in rounds)
    resume = sorted(x["resume_s"] for x in rounds)
    row = [
        f"{r['k']:,} of {r['batches']:,}",
        f"{replay[len(replay) // 2]:.3f} ({replay[0]:.3f}-{replay[-1]:.3f})",
        f"{resume[len(resume) // 2]:.3f} ({resume[0]:.3f}-{resume[-1]:.3f})",
        ratio(r["x_faster"], ".1f"),
        "yes" if r["exact"] else "**no**",
    ]
    headers = ["resume at micro-batch", "replay to it s (range)"]
    headers += ["`load_state_dict` + 1st batch s (range)", "x faster (range)", "rest identical"]
    note = f"\n{len(rounds)} rounds; {provenance_line(result)}.\n"
    return markdown(headers, [row], "lrrrl") + note


TABLES: dict[str, Callable[[Result], str]] = {
    "hf_lengths": hf_lengths_table,
    "hf_tokens": hf_tokens_table,
    "hf_loader": hf_loader_table,
    "streaming_plans": streaming_plans,
    "streaming_memory": streaming_memory,
    "streaming_reads": streaming_reads,
    "streaming_resume": streaming_resume,
}
"""Every table of this folder, by the name its ``table:<result>:<name>`` marker gives."""
