"""The training benchmarks' tables for the documents.

Each function takes a whole result file and returns markdown; :data:`TABLES` names them for
:mod:`benchmarks.render`.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.render_tables import Result, cell, markdown

TRAINING_LABELS = {
    "a": "(a) ours: token budget",
    "m": "(a') ours, pairs by max(source, target)",
    "b": "(b) random, fixed B",
    "c": "(c) sorted, fixed B",
}


def training_throughput(result: Result) -> str:
    """The training-throughput benchmark's configurations as a markdown table."""
    configs = result["results"]["configs"]
    rows = []
    for kind, label in TRAINING_LABELS.items():
        if kind not in configs:
            continue
        c = configs[kind]
        rows.append(
            [
                label,
                f"{c['steps']}",
                f"{c['mean_examples']:.1f}",
                f"{c['tps_median']:,.0f}",
                f"{min(c['tps']):,.0f}..{max(c['tps']):,.0f}",
                f"{c['speedup_vs_b']:.2f}",
                f"{c['pad_fraction']:.3f}",
                cell(c.get("peak_mb"), ".0f"),
            ]
        )
    headers = ["configuration", "steps", "B mean", "tgt tok/s", "min..max", "x (b)", "pad frac"]
    return markdown([*headers, "peak MB"], rows)


def straggler(result: Result) -> str:
    """The straggler benchmark's dealings as a markdown table."""
    rows = [
        [
            kind,
            f"{c['imb_lin']:.4f}",
            f"{c['imb_quad']:.4f}",
            f"{c['wait_median_s']:.2f}",
            f"{c['wait_vs_ours']:.2f}",
            f"{c['wait_pct_compute']:.1f}",
            f"{c['gap_vs_ours']:.2f}",
            f"{c['epoch_vs_ours']:.3f}",
            " / ".join(f"{w:.2f}" for w in c["wait_s"]),
        ]
        for kind, c in result["results"]["configs"].items()
    ]
    headers = ["dealing", "imb lin", "imb quad", "wait s", "x ours", "wait % compute"]
    headers += ["gap x ours", "epoch x ours", "wait s per round"]
    return markdown(headers, rows)


def _interval(x: list[float] | None) -> str:
    return "-" if x is None else f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]"


def compile_shapes_padding(result: Result) -> str:
    """Part 1 of the shape-budget benchmark: the real-token share of K static shapes."""
    rows = [
        [
            "unrestricted" if r["k"] is None else f"`max_shapes={r['k']}`",
            f"{r['share']:.4f}",
            "-" if r["k"] is None else f"{100 * r['gap']:.1f} %",
            "-" if r["k"] is None else f"{r['bound']:.4f}",
            f"{r['shapes']}",
            f"{r['steps']}",
        ]
        for r in result["results"]["padding"]["rows"]
    ]
    headers = ["shapes allowed", "real-token share", "gap to unrestricted"]
    headers += ["bound (best any K lengths can do)", "shapes", "steps"]
    return markdown(headers, rows)


COMPILE_ARMS = {
    "eager_free": "eager, free shapes",
    "eager_k": "eager, `max_shapes=K`",
    "compiled_k": "`compile(dynamic=False)`, `max_shapes=K`",
    "dynamic_free": "`compile(dynamic=True)`, free shapes",
    "static_free": "`compile(dynamic=False)`, free shapes",
}


def compile_shapes_training(result: Result) -> str:
    """Part 2 of the shape-budget benchmark: torch.compile's arms on CPU."""
    rows = []
    for arm, label in COMPILE_ARMS.items():
        r = result["results"]["training"].get(arm)
        if r is None:
            continue
        per = r.get("compile_per_shape_s")
        rows.append(
            [
                label,
                f"{r['steps']}",
                f"{r['shapes']}",
                f"{r['graphs']}",
                "-" if per is None else f"{r['compile_s']:.1f} ({per:.1f})",
                f"{r['slots'] / r['real']:.3f}",
                cell(r["tps"], ",.0f") if r["tps"] is not None else "all compiling",
                cell(r["speedup_vs_eager"], ".2f"),
                _interval(r.get("paired_vs_eager_free")),
                _interval(r.get("paired_vs_same_batches")),
            ]
        )
    headers = ["arm", "steps", "shapes", "graphs", "compile s (per shape)", "slots / real"]
    headers += ["steady real tok/s", "x eager, unpaired", "x eager free shapes, paired [90 %]"]
    headers += ["compiled / eager, same batches [90 %]"]
    return markdown(headers, rows)


SHARE_ARMS = {"a": "equal shares", "b": "fixed [1, 1/f]", "c": "balancing"}


def rank_shares(result: Result) -> str:
    """The 2-rank shares benchmark: each factor's arms (times on rank 0)."""
    res = result["results"]
    rows = []
    for f in res["settings"]["factors"]:
        for arm, label in SHARE_ARMS.items():
            x = res["configs"][arm][str(f)]
            shares = x["shares"][-1] or [1.0, 1.0]
            epochs = x["x_equal_epochs"]
            checks = f"{x['grad_checks']}: {x['grad_max_rel_err']:.1e}"
            once = "yes" if x["once"] and x["counts_equal"] else "NO"
            rows.append(
                [
                    f"{f:g}x, {arm}: {label}",
                    "/".join(f"{v:.3f}" for v in shares),
                    "/".join(str(b) for b in x["budgets"][-1]),
                    f"{100 * x['work_share_r1'][-1]:.1f}",
                    f"{x['first_s']:.2f}",
                    f"{x['later_s']:.2f}",
                    f"{x['x_equal']:.3f}",
                    f"{min(epochs):.3f}..{max(epochs):.3f}",
                    f"{x['vs_fixed']:.3f}",
                    f"{x['worst_vs_fixed']:.3f}",
                    once,
                    checks,
                ]
            )
    headers = ["factor, arm", "shares (last)", "budgets", "r1 work %", "epoch 1 s", "epoch 2+ s"]
    headers += ["x equal", "x equal per epoch", "/ fixed", "worst / fixed", "once, equal counts"]
    headers += ["grad checks: max rel err"]
    return markdown(headers, rows)


def rank_shares_model(result: Result) -> str:
    """The 4-rank model of the shares benchmark (planner only)."""
    model = result["results"]["model"]
    base = model["arms"]["equal"]["epoch_time"]
    rows = [
        [
            "equal shares" if name == "equal" else "shares = speeds",
            "/".join(str(b) for b in a["budgets"]),
            f"{a['steps']}",
            f"{a['micro_batches_per_rank'][0]}",
            f"{sum(a['empty_micro_batches'])}",
            f"{base / a['epoch_time']:.3f}",
            "/".join(f"{x:.3f}" for x in a["work_share"]),
            "/".join(f"{x:.3f}" for x in a["target_share"]),
            f"{100 * a['max_share_rel_dev']:.2f}",
            "yes" if a["examples_once"] and a["over_budget"] == 0 else "NO",
        ]
        for name, a in model["arms"].items()
    ]
    headers = ["plan", "budgets", "steps", "mb/rank", "empty mb", "x equal", "work share"]
    headers += ["target", "max rel dev %", "once, in budget"]
    return markdown(headers, rows)


def _range(values: list[float], spec: str, scale: float = 1.0) -> str:
    """``median (min..max)`` of ``values`` (times ``scale``)."""
    xs = sorted(v * scale for v in values)
    mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    return f"{mid:{spec}} ({xs[0]:{spec}}..{xs[-1]:{spec}})"


def callback_overhead(result: Result) -> str:
    """The callback-overhead benchmark's configurations: step, hook time, overheads in %."""
    rows = []
    for c in result["results"]["configs"].values():
        row = [c["label"], f"{c['step_median_ms_all']:.1f}"]
        if "direct" in c:
            row += [f"{c['hook_us_median']:.0f}", _range(c["direct"], ".3f", 100)]
            row += [_range(c["e2e"], "+.2f", 100)]
        else:
            row += ["-", "-", "-"]
        rows.append(row)
    headers = ["configuration", "step ms", "our hooks µs/step", "direct overhead % of a step"]
    return markdown([*headers, "end-to-end overhead %"], rows)


def callback_overhead_hooks(result: Result) -> str:
    """Our hooks' time per measured step, hook by hook, in B and C (µs)."""
    configs = {k: c for k, c in result["results"]["configs"].items() if "hooks_us" in c}
    names = sorted({h for c in configs.values() for h in c["hooks_us"]})
    rows = [
        [f"`{h}`", *(f"{c['hooks_us'].get(h, 0.0):.1f}" for c in configs.values())] for h in names
    ]
    return markdown(["hook", *(f"{k} µs/step" for k in configs)], rows)


def packing_flops(result: Result) -> str:
    """The packing benchmark's Part 1: per-step FLOP imbalance of every schedule."""
    rows = [
        [
            r["name"],
            f"{r['d_model']}",
            f"{r['acc']}",
            f"{r['steps']:,}",
            f"{r['slot_eff']:.4f}",
            f"{r['fill']:.3f}",
            f"{r['imb_mean']:.4f}",
            f"{r['imb_p95']:.4f}",
            f"{r['imb_max']:.4f}",
            f"{r['busiest_vs_ours']:.3f}",
            f"{r['useful']:.3f}",
        ]
        for r in result["results"]["flops"]["rows"]
    ]
    headers = ["schedule", "d_model", "acc", "steps", "slot eff", "fill", "imb mean", "imb p95"]
    return markdown([*headers, "imb max", "epoch x ours", "useful"], rows)


PACKING_DOC_LABELS = {
    "ours, packed": 'ours, `layout="packed"`',
    "ours, packed, token-balanced": "ours, packed but balanced by tokens (`flop_attention=0`)",
    "naive packing": "naive packing (shuffle, fill in order, round-robin to ranks)",
    "ours, padded": 'ours, `layout="padded"`',
}


def packing_flops_summary(result: Result) -> str:
    """Part 1 at ``d_model`` 1024 and accumulation 1, the way docs/packing.md shows it."""
    rows = [
        [
            PACKING_DOC_LABELS.get(r["name"], r["name"]),
            f"{r['imb_mean']:.4f} / {r['imb_p95']:.4f}",
            f"{r['busiest_vs_ours']:.3f}\u00d7",
        ]
        for r in result["results"]["flops"]["rows"]
        if r["d_model"] == 1024 and r["acc"] == 1
    ]
    headers = ["schedule", "FLOP imbalance per step (mean / p95)", "busiest rank's epoch, vs ours"]
    return markdown(headers, rows)


PACKING_LABELS = {
    "packed": "(i) ours: packed rows",
    "padded": "(ii) ours: padded layout",
    "random": "(iii) random fixed B",
}


def packing_training(result: Result) -> str:
    """The packing benchmark's Part 2: real tokens/s, paired ratios over the rounds."""
    rows = []
    for kind, c in result["results"]["training"]["configs"].items():
        tps = c["tps"]
        rows.append(
            [
                PACKING_LABELS.get(kind, kind),
                f"{c['steps']}",
                f"{c['docs_mean']:.1f}",
                f"{c['slots_per_real']:.3f}",
                f"{c['tps_median']:,.0f}",
                f"{min(tps):,.0f}..{max(tps):,.0f}",
                _range(c["vs_random_rounds"], ".2f"),
                _range(c["vs_padded_rounds"], ".2f"),
                c["backend"],
            ]
        )
    headers = ["configuration", "steps", "docs/batch", "slots/real", "real tok/s", "min..max"]
    return markdown([*headers, "x (iii), paired", "x (ii), paired", "attention"], rows)


def _seeds(values: list[float], spec: str) -> str:
    """``median [min, max]`` over seeds (one value: itself; none: ``-``)."""
    if not values:
        return "-"
    xs = sorted(values)
    mid = xs[len(xs) // 2] if len(xs) % 2 else (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2
    if len(xs) == 1:
        return f"{mid:{spec}}"
    return f"{mid:{spec}} [{xs[0]:{spec}}, {xs[-1]:{spec}}]"


def batch_schedule_training(result: Result) -> str:
    """Training at equal tokens with and without the ramp: per (peak lr, schedule), seeds."""
    rows = []
    for r in result["results"]["table"]:
        ramp = r["schedule"] != "none"
        rows.append(
            [
                f"{r['lr']:g}",
                r["schedule"],
                _seeds(r["steps"], ".0f"),
                _seeds(r["ramp_fill"], ".2f"),
                _seeds(r["train_loss"], ".3f"),
                _seeds(r["train_loss_ramp_end"], ".3f"),
                _seeds(r["val_loss"], ".3f"),
                _seeds(r["d_val"], "+.3f") if ramp else "",
                _seeds(r["d_train"], "+.3f") if ramp else "",
                _seeds(r["steps_ratio"], ".2f") if ramp else "",
                _seeds(r["time_ratio"], ".2f") if ramp else "",
            ]
        )
    headers = ["peak lr", "schedule", "steps", "ramp fill", "train loss, last 10 %"]
    headers += ["train loss at ramp end", "held-out loss", "Δ held-out", "Δ train"]
    return markdown([*headers, "steps x", "time x"], rows)


TABLES: dict[str, Callable[[Result], str]] = {
    "compile_shapes_padding": compile_shapes_padding,
    "compile_shapes_training": compile_shapes_training,
    "rank_shares": rank_shares,
    "rank_shares_model": rank_shares_model,
    "training_throughput": training_throughput,
    "straggler": straggler,
    "callback_overhead": callback_overhead,
    "callback_overhead_hooks": callback_overhead_hooks,
    "packing_flops_summary": packing_flops_summary,
    "packing_flops": packing_flops,
    "packing_training": packing_training,
    "batch_schedule_training": batch_schedule_training,
}
