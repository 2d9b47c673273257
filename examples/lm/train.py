"""Train a tiny decoder-only language model on packed or padded token budgets, with Hydra.

From the repository root (or from this folder as ``python train.py ...``)::

    python examples/lm/train.py                                   # layout=packed, CPU, 2-4 min
    python examples/lm/train.py layout=padded                     # the same, padded batches
    python examples/lm/train.py layout=packed data.max_tokens=4096 strategy=deepspeed
    python examples/lm/train.py strategy=fsdp trainer.devices=2
    python examples/lm/train.py -m layout=packed,padded           # output_dir/0, output_dir/1

The corpus is embedded (:mod:`examples.lm.data`, no download) and long-tailed; the DataModule
of ``layout=packed`` or ``layout=padded`` is built by :mod:`examples.lm.datamodule`. Either way
the loss is the exact token mean of the optimizer step
(:func:`~lightning_varbatch.loss.step_token_mean`).

The configuration is ``examples/lm/conf/config.yaml``; its ``strategy``, ``trainer``,
``callbacks`` and ``logger`` groups are the repository's ``conf/`` ones (found through
``hydra.searchpath``, the folder named by ``$LIGHTNING_VARBATCH_CONF``, which this module sets
to the repository's ``conf/`` unless it is set already). The run around the model and the data
is the translation example's (:mod:`examples.common`): a setting that cannot work stops
before anything is written, with a message naming it, and exit status 2; SIGTERM/SIGINT save
``<output_dir>/checkpoints/last.ckpt`` at the next optimizer step (or validation micro-batch)
and exit with 143/130 (:mod:`examples.common.preemption`). ``<output_dir>/metrics.json`` holds
the final metrics and, once training has finished, its complete checkpoint as ``checkpoint``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
#: The environment variable naming the repository's shared config groups (conf/).
CONF_ENV = "LIGHTNING_VARBATCH_CONF"
os.environ.setdefault(CONF_ENV, str(ROOT / "conf"))

import hydra  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from examples.common.building import build_parts, build_trainer, instantiate  # noqa: E402
from examples.common.checkpoints import check_sampler_resume, load_checkpoint  # noqa: E402
from examples.common.cli import check_overrides, run_entry  # noqa: E402
from examples.common.fitting import fit  # noqa: E402
from examples.common.summary import finish_metrics, save_tokenizer, write_summary  # noqa: E402
from examples.lm.checks import check_config  # noqa: E402
from examples.lm.datamodule import build_datamodule  # noqa: E402

CONF_DIR = Path(__file__).resolve().parent / "conf"
#: ``metrics.json``'s run totals and the ``TokenThroughputMonitor`` totals they are
#: (``callbacks.throughput``; without it they are left out).
RUN_TOTALS = {
    "input_tokens": "train/run/input_tokens",
    "padded_tokens": "train/run/padded_tokens",
    "loss_tokens": "train/run/loss_tokens",
    "train_seconds": "train/run/seconds",
    "tokens_per_sec": "train/run/input_tokens_per_sec",
    "padding_efficiency": "train/run/padding_efficiency",
}

__all__ = ["CONF_DIR", "RUN_TOTALS", "main", "train"]


def _report(trainer: Trainer, metrics: dict[str, Any]) -> None:
    """The closing lines on rank 0: steps, time, loss, throughput and where the outputs are."""
    if trainer.global_rank != 0:
        return
    val = metrics.get("val/loss")
    result = (
        "no validation ran"
        if val is None
        else f"val loss {val:.3f}, perplexity {metrics['val/ppl']:.2f}"
    )
    print(
        f"Done ({metrics['layout']}): {metrics['global_step']} steps in "
        f"{metrics['seconds']:.0f}s on {trainer.world_size} process(es); {result}; "
        f"{metrics.get('tokens_per_sec', float('nan')):.0f} tokens/s, padding efficiency "
        f"{metrics.get('padding_efficiency', float('nan')):.3f}\n"
        f"  logs:        {metrics['log_dir']}\n  checkpoints: {metrics['ckpt_dir']}\n"
        f"  metrics:     {Path(metrics['output_dir']) / 'metrics.json'}"
    )


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, tokenizer, model, strategy, callbacks and logger; fit; return the metrics.

    Returns:
        The final logged metrics as floats (``train/loss``, ``train/ppl``, ``val/loss``,
        ``val/ppl``, the throughput monitor's ``train/total_tokens`` and ``train/run/...``,
        ...) plus ``layout``, ``global_step``, ``seconds`` (the whole run), the run totals
        (:data:`RUN_TOTALS`: ``train_seconds``, ``tokens_per_sec``, ``input_tokens``,
        ``padded_tokens``, ``loss_tokens``, ``padding_efficiency``), ``log_dir``,
        ``ckpt_dir``, ``output_dir`` and the data summary (``data``).

    Raises:
        ConfigError: for a setting that cannot work (nothing has been written then).
        SystemExit: with status 143 (SIGTERM) or 130 (SIGINT) when training was interrupted,
            after saving ``<output_dir>/checkpoints/last.ckpt`` and writing ``metrics.json``.

    The metrics are also written to ``<output_dir>/metrics.json`` (rank 0).
    """
    start = time.perf_counter()
    check_config(cfg)
    ckpt = load_checkpoint(cfg)
    output_dir = Path(cfg.output_dir).resolve()
    strategy, callbacks, logger = build_parts(cfg)
    dm, tokenizer, info = build_datamodule(cfg)
    if ckpt is not None:
        check_sampler_resume(cfg, dm, ckpt)
        del ckpt
    model = instantiate("model", cfg.model, vocab_size=tokenizer.get_vocab_size(), _convert_="all")
    trainer = build_trainer(cfg, strategy, callbacks, logger)
    save_tokenizer(trainer, output_dir, tokenizer)
    metrics: dict[str, Any] = {"output_dir": str(output_dir), "layout": cfg.layout, "data": info}
    fit(trainer, model, dm, cfg, metrics, callbacks)
    metrics.update({name: metrics[key] for name, key in RUN_TOTALS.items() if key in metrics})
    finish_metrics(trainer, metrics, start, tokenizer)
    _report(trainer, metrics)
    write_summary(metrics)
    return metrics


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Command-line entry: ``python examples/lm/train.py [overrides]``."""
    run_entry(train, cfg)  # train() writes <output_dir>/metrics.json


if __name__ == "__main__":
    check_overrides(sys.argv, CONF_DIR)
    main()
