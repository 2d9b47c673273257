"""Plan one epoch from the command line and report what it will cost.

Usage::

    python -m lightning_varbatch.plan --synthetic wmt --max-tokens 16384 --world-size 8
    python -m lightning_varbatch.plan --lengths wmt.npy --lengths news.npy --max-tokens 16384 \
        --world-size 8 --mixing per_step --weights 3 1 --steps-per-epoch 1000
    python -m lightning_varbatch.plan --dataset data/wmt --column src_ids --column tgt_ids \
        --max-tokens 4096 --json --no-png

Prints a :class:`~.diagnostics.PlanDiagnostics` report (``--json``: as JSON) and writes a PNG of the
examples-per-micro-batch histogram and every rank's token load per step; ``--batch-schedule`` adds a
table of steps by schedule stage (``schedule_report``). Several ``--lengths`` (or ``--dataset``)
plan a mixture, with a per-dataset table. ``--dataset`` memory-maps the lengths of a Hugging Face
dataset on disk (no ``datasets`` or torch import): ``--column`` names a column of lengths or token
ids, twice a (source, target) pair. Bad settings print one ``error: ...`` line and exit with code 2.

Example:
    >>> import contextlib, io, json
    >>> out = io.StringIO()
    >>> with contextlib.redirect_stdout(out):
    ...     code = main(["--synthetic", "wmt", "--num-examples", "2000", "--max-tokens", "4096",
    ...                  "--world-size", "2", "--json", "--no-png"])
    >>> code, json.loads(out.getvalue())["equal_counts"]
    (0, True)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import re
import sys
import time
import types
import typing
import warnings
from pathlib import Path
from typing import Any, Literal

import numpy as np

from lightning_varbatch.errors import SettingError
from lightning_varbatch.planner.diagnostics import PlanDiagnostics, diagnose, rank_loads
from lightning_varbatch.planner.epoch_plan import EpochPlan
from lightning_varbatch.planner.epoch_planner import EpochPlanner
from lightning_varbatch.planner.mixture import MixturePlanner
from lightning_varbatch.planner.mixture_datasets import MIXING_POLICIES, DataSource
from lightning_varbatch.planner.mixture_report import dataset_breakdown, format_breakdown
from lightning_varbatch.planner.protocol import Planner
from lightning_varbatch.planner.schedule_report import schedule_report
from lightning_varbatch.planner.settings import PlanConfig
from lightning_varbatch.planner.synthetic import wmt_like_lengths
from lightning_varbatch.planner.warmup_report import step_figures, warmup_report
from lightning_varbatch.sources.length_files import dataset_lengths, npy_lengths

__all__ = ["main"]

_LINES_UP_TO = 8  # ranks drawn as one line each; more ranks are drawn as a min/mean/max band


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m lightning_varbatch.plan",
        description="Plan one epoch of token-budgeted micro-batches and report its diagnostics.",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--lengths",
        type=Path,
        action="append",
        metavar="FILE.npy",
        help="(n,) or (n, 2) lengths; repeat for a mixture of datasets",
    )
    src.add_argument("--synthetic", choices=["wmt"], help="built-in synthetic lengths")
    src.add_argument(
        "--dataset",
        type=Path,
        action="append",
        metavar="PATH",
        help="a Dataset.save_to_disk folder, .arrow or .parquet file, or folder of parquet "
        "files; needs --column; repeat for a mixture of datasets",
    )
    p.add_argument(
        "--column",
        action="append",
        metavar="NAME",
        help="with --dataset: a column of lengths or of token ids; twice for (source, target)",
    )
    p.add_argument("--num-examples", type=int, default=4_500_000, help="for --synthetic")
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument("--accumulate-grad-batches", type=int, default=1)
    p.add_argument("--epoch", type=int, default=0)
    _add_settings(p.add_argument_group("plan settings (the fields of PlanConfig)"))
    mix = p.add_argument_group("several --lengths or --dataset (a mixture of datasets)")
    mix.add_argument("--mixing", choices=MIXING_POLICIES, default="per_step")
    mix.add_argument("--weights", type=float, nargs="+", default=None, help="one per dataset")
    mix.add_argument("--temperature", type=float, default=1.0)
    mix.add_argument("--steps-per-epoch", type=int, default=None)
    mix.add_argument(
        "--dataset-max-tokens", type=int, nargs="+", default=None, help="one per dataset"
    )
    png = p.add_mutually_exclusive_group()
    png.add_argument("--png", type=Path, default=Path("plan_report.png"), help="figure path")
    png.add_argument("--no-png", action="store_true", help="do not write the figure")
    p.add_argument("--json", action="store_true", help="print the diagnostics as JSON")
    return p


def _flag_kwargs(setting: dataclasses.Field[Any], hint: Any) -> dict[str, Any]:
    """The argparse keywords of a :class:`PlanConfig` field: type, choices, default, help."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", str(setting.metadata["help"])).replace("``", "")
    kwargs: dict[str, Any] = {"help": text.replace("%", "%%")}
    if setting.default is dataclasses.MISSING:
        kwargs["required"] = True
    else:
        kwargs["default"] = setting.default
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    options = [a for a in typing.get_args(hint) if a is not type(None)] if union else [hint]
    literals = [a for a in options if typing.get_origin(a) is Literal]
    if literals:  # a name among choices (a callable cost cannot be given on the command line)
        kwargs["choices"] = [c for lit in literals for c in typing.get_args(lit)]
    elif options[0] is bool:
        kwargs["action"] = argparse.BooleanOptionalAction
    elif typing.get_origin(options[0]) is tuple:  # one value per rank: --rank-shares 1 0.5
        kwargs["type"] = typing.get_args(options[0])[0]
        kwargs["nargs"] = "+"
    else:
        kwargs["type"] = options[0]
    return kwargs


def _add_settings(group: argparse._ArgumentGroup) -> None:
    """Add one flag per :class:`PlanConfig` field (``max_tokens``: ``--max-tokens``)."""
    hints = typing.get_type_hints(PlanConfig)
    for setting in dataclasses.fields(PlanConfig):
        flag = "--" + setting.name.replace("_", "-")
        group.add_argument(flag, dest=setting.name, **_flag_kwargs(setting, hints[setting.name]))


def _load_lengths(args: argparse.Namespace) -> tuple[list[np.ndarray], str]:
    if args.synthetic is not None:
        if args.num_examples < 1:
            raise ValueError(f"--num-examples must be >= 1, got {args.num_examples}.")
        lengths = wmt_like_lengths(args.num_examples, seed=0)
        return [lengths], f"synthetic {args.synthetic} lengths"
    if args.dataset is not None:
        columns: list[str] = args.column
        which = ", ".join(repr(c) for c in columns)
        label = f"column {which}" if len(columns) == 1 else f"columns {which}"
        shown = ", ".join(str(p) for p in args.dataset)
        return [dataset_lengths(path, columns) for path in args.dataset], f"{shown} ({label})"
    paths: list[Path] = args.lengths
    return [npy_lengths(path) for path in paths], ", ".join(str(p) for p in paths)


def _check_columns(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse ``--column`` without ``--dataset``, the reverse, and more than two (code 2)."""
    columns: list[str] = args.column or []
    if columns and args.dataset is None:
        parser.error(
            "--column names columns of a --dataset: pass --dataset PATH too (--lengths and "
            "--synthetic take no --column)."
        )
    if args.dataset is not None and not columns:
        parser.error(
            "--dataset needs --column: name a column of lengths or of token ids (e.g. "
            "--column input_ids), or give --column twice for (source, target) pairs."
        )
    if len(columns) > 2:
        parser.error(
            f"--column given {len(columns)} times ({', '.join(columns)}): give one column "
            "(lengths or token ids) or two, (source, target)."
        )
    if len(columns) == 2 and columns[0] == columns[1]:
        parser.error(
            f"--column {columns[0]!r} given twice: give one column, or two different ones "
            "(source, target)."
        )


def _png_path(path: Path) -> Path:
    """The file the figure goes to: ``--png`` with ``.png`` added when it has no suffix."""
    if path.is_dir() or str(path).endswith(("/", "\\")):
        raise ValueError(
            f"--png {str(path)!r} is a directory; pass a file name, e.g. "
            f"--png {str(path / 'plan_report.png')!r}."
        )
    if path.suffix == "":
        path = path.with_name(path.name + ".png")
    elif path.suffix.lower() != ".png":
        raise ValueError(
            f"--png {str(path)!r} must name a .png file, got suffix {path.suffix!r}; pass e.g. "
            f"--png {str(path.with_suffix('.png'))!r}."
        )
    if not path.parent.is_dir():
        raise ValueError(
            f"--png {str(path)!r}: the folder {str(path.parent)!r} does not exist; create it "
            "or pass another path."
        )
    return path


def _warmup_panel(ax: Any, plan: EpochPlan, examples: np.ndarray) -> None:
    """The length warm-up over the steps: its caps, the longest example, examples per step."""
    trace = plan.length_warmup
    assert trace is not None  # drawn only for a plan with a warm-up
    steps = np.arange(trace.step_longest.shape[0])
    ax.plot(steps, trace.step_longest, lw=0.6, color="tab:gray", label="longest example")
    for name, style in (("realised", "-"), ("scheduled", ":")):
        cap = getattr(trace, name)
        capped = np.arange(cap.shape[0])
        ax.step(capped, cap, where="post", color="tab:red", ls=style, label=f"{name} cap")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("length (planning key)")
    ax.legend(fontsize="small", loc="lower right")
    twin = ax.twinx()
    twin.plot(steps, examples, lw=0.6, color="tab:blue")
    twin.set_ylabel("examples per step", color="tab:blue")
    ax.set_title(f"length warm-up: {trace.scheduled.shape[0]} steps")


def _write_png(path: Path, diag: PlanDiagnostics, planner: Planner, plan: EpochPlan) -> None:
    """Write the figure: micro-batch sizes, ranks' loads and the length warm-up (if on)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sizes = plan.micro_batch_size[plan.assign.reshape(-1)]
    loads = rank_loads(planner, plan, "linear")
    panels = 2 if plan.length_warmup is None else 3
    fig, axes = plt.subplots(1, panels, figsize=(6.5 * panels, 4.5), constrained_layout=True)
    hist, load = axes[0], axes[1]
    if plan.length_warmup is not None:
        _warmup_panel(axes[2], plan, step_figures(planner, plan)["examples"])
    lo, hi = (int(sizes.min()), int(sizes.max())) if sizes.size else (1, 1)
    if hi > 20 * lo:
        hist.hist(sizes, bins=np.geomspace(lo, hi + 1, 50), color="tab:blue")
        hist.set_xscale("log")
    else:
        hist.hist(sizes, bins=min(50, hi - lo + 1), color="tab:blue")
    hist.set_xlabel("examples per micro-batch")
    hist.set_ylabel("micro-batches")
    hist.set_title(
        f"{diag.num_micro_batches:,} micro-batches, padding efficiency "
        f"{100 * diag.padding_efficiency:.1f} %"
    )
    steps = np.arange(loads.shape[0])
    if loads.shape[1] <= _LINES_UP_TO:
        for rank in range(loads.shape[1]):
            load.plot(steps, loads[:, rank], lw=0.6, alpha=0.7, label=f"rank {rank}")
        load.legend(fontsize="small", ncol=4, loc="lower center")
    elif loads.shape[0]:
        load.fill_between(steps, loads.min(axis=1), loads.max(axis=1), alpha=0.3, label="min-max")
        load.plot(steps, loads.mean(axis=1), lw=0.8, label="mean over ranks")
        load.legend(fontsize="small", loc="lower center")
    budget = diag.max_tokens * diag.accumulate_grad_batches
    load.axhline(budget, color="k", ls="--", lw=0.8)
    load.set_xlabel("optimizer step")
    load.set_ylabel("padded tokens per rank (examples x longest)")
    load.set_title(
        f"{diag.world_size} ranks, imbalance mean {diag.imbalance_linear_mean:.3f} "
        f"max {diag.imbalance_linear_max:.3f}"
    )
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _planner(args: argparse.Namespace, lengths: list[np.ndarray], config: PlanConfig) -> Planner:
    mixed = (args.weights, args.steps_per_epoch, args.dataset_max_tokens)
    if len(lengths) == 1 and all(v is None for v in mixed) and args.temperature == 1:
        return EpochPlanner(lengths[0], config)
    budgets = args.dataset_max_tokens or [None] * len(lengths)
    if len(budgets) != len(lengths):
        given = "--dataset paths" if args.dataset else "--lengths files"
        raise ValueError(
            f"--dataset-max-tokens has {len(budgets)} values for {len(lengths)} {given}: give "
            "one per dataset."
        )
    names = _source_names(args.lengths or args.dataset or [], len(lengths))
    sources = [
        DataSource(x, max_tokens=b, name=name)
        for x, b, name in zip(lengths, budgets, names, strict=True)
    ]
    return MixturePlanner(
        sources,
        config,
        mixing=args.mixing,
        weights="size" if args.weights is None else args.weights,
        temperature=args.temperature,
        steps_per_epoch=args.steps_per_epoch,
    )


def _source_names(paths: list[Path], count: int) -> list[str]:
    """Each dataset's name in the report: its file's stem or folder's name, else the path.

    Example:
        >>> _source_names([Path("a/wmt.npy"), Path("b/news.npy")], 2)
        ['wmt', 'news']
        >>> _source_names([Path("a/train"), Path("b/train")], 2)
        ['a/train', 'b/train']
    """
    if not paths:
        return [str(i) for i in range(count)]
    names = [p.name if p.is_dir() or not p.suffix else p.stem for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def _run(args: argparse.Namespace) -> int:
    start = time.perf_counter()
    png = None if args.no_png else _png_path(args.png)  # checked before the planning work
    all_lengths, source = _load_lengths(args)
    config = PlanConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(PlanConfig)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        planner = _planner(args, all_lengths, config)
    for warning in caught:  # e.g. how many examples oversize= skips or truncates
        print(f"warning: {warning.message}", file=sys.stderr)
    plan: EpochPlan = planner.plan(args.epoch, args.world_size, args.accumulate_grad_batches)
    diag = diagnose(planner, plan)
    warm = warmup_report(planner, plan)
    schedule = schedule_report(planner, plan)
    shares = dataset_breakdown(planner, plan) if isinstance(planner, MixturePlanner) else None
    elapsed = time.perf_counter() - start
    note = sys.stderr if args.json else sys.stdout
    if args.json:
        report: dict[str, object] = dict(diag.to_dict())
        if shares is not None:
            report["datasets"] = [row.to_dict() for row in shares]
        if warm is not None:
            report["length_warmup"] = warm.to_dict()
        if schedule is not None:
            report["batch_schedule"] = schedule.to_dict()
        print(json.dumps(report, indent=2))
    else:
        print(f"{source}: planned and diagnosed in {elapsed:.2f} s")
        print(diag.format())
        if warm is not None:
            print(warm.format())
        if schedule is not None:
            print(schedule.format())
        if shares is not None:
            print(format_breakdown(shares))
    if png is not None:
        try:
            _write_png(png, diag, planner, plan)
        except OSError as err:
            raise ValueError(
                f"cannot write --png {str(png)!r}: {err.strerror or err}; pass a path in a "
                "folder you can write to, or --no-png."
            ) from None
        print(f"wrote {png}", file=note)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: the arguments (``sys.argv[1:]`` when ``None``).

    Returns:
        The exit code: 0 on success, 2 for bad settings, unreadable lengths or columns, or an
        unwritable ``--png`` (one ``error: ...`` line on stderr, no traceback); flags argparse
        refuses (``--column``/``--dataset`` alone, over two ``--column``) raise ``SystemExit(2)``.
    """
    parser = _parser()
    args = parser.parse_args(argv)
    _check_columns(parser, args)
    try:
        return _run(args)
    except SettingError as err:  # named by its flag as typed (--rank-shares), and if defaulted
        flag, value = "--" + err.setting.replace("_", "-"), getattr(args, err.setting, None)
        default = value is not None and value == parser.get_default(err.setting)
        note = f" (flag {flag}{f', at its default {value}' if default else ''})"
        print(f"error: {err}{note if err.setting in vars(args) else ''}", file=sys.stderr)
        return 2
    except (ValueError, TypeError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
