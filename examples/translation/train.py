"""Train an en->de Transformer on token-budgeted batches, configured with Hydra.

From the repository root (or from this folder as ``python train.py ...``)::

    python examples/translation/train.py                                  # tiny model, CPU
    python examples/translation/train.py strategy=deepspeed data.max_tokens=16384
    python examples/translation/train.py strategy=fsdp trainer.devices=2 model=base
    python examples/translation/train.py ckpt_path=outputs/.../checkpoints/last.ckpt
    python examples/translation/train.py -m data.max_tokens=2048,4096   # output_dir/0, output_dir/1
    python examples/translation/train.py data=mixture data.corpora.sentences.weight=3
    python examples/translation/train.py data.hf_path=ds data.source_column=en data.target_column=de
    python examples/translation/train.py data.stream=true      # train split streamed from shards

:func:`train` does the work (tests call it with a composed config); :func:`main` is the
command-line entry. A bad setting (any ``data.*``/``model.*``/``trainer.*`` value that cannot
work, a budget below the longest example with ``data.oversize=error``, a ``ckpt_path`` that
is not a checkpoint or was saved for other data, an unknown key or group option, ...) stops
before anything is written, with a message naming the setting, and exit status 2. SIGTERM and
SIGINT save ``<output_dir>/checkpoints/last.ckpt`` at the next optimizer step (during a
validation: after its micro-batch in progress) and exit with 143 and 130 (see
:mod:`examples.common.preemption`); once training has finished, ``metrics.json`` names
its complete ``last.ckpt`` as ``checkpoint`` (a signal during the test then points there).
The data: :mod:`examples.translation.datamodule`; budget semantics and the loss counts:
:class:`~lightning_varbatch.PlanConfig`'s ``loss_offset``; the early checks:
:mod:`examples.translation.checks`;
the run around them, shared with the LM example: :mod:`examples.common`.
"""

from __future__ import annotations

import sys
import time
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import hydra  # noqa: E402
from lightning.pytorch import Trainer  # noqa: E402
from omegaconf import DictConfig  # noqa: E402

from examples.common.building import build_parts, build_trainer, instantiate  # noqa: E402
from examples.common.checkpoints import load_checkpoint  # noqa: E402
from examples.common.cli import check_overrides, run_entry  # noqa: E402
from examples.common.fitting import fit  # noqa: E402
from examples.common.summary import finish_metrics, save_tokenizer, write_summary  # noqa: E402
from examples.translation import tokenizer as tok  # noqa: E402
from examples.translation.checks import check_config  # noqa: E402
from examples.translation.compiling import CompileStats, compile_training  # noqa: E402
from examples.translation.datamodule import build_datamodule, check_resume  # noqa: E402

CONF_DIR = ROOT / "conf"

__all__ = ["CONF_DIR", "main", "train"]


def _report(trainer: Trainer, metrics: dict[str, Any], stats: CompileStats | None) -> None:
    """The closing lines on rank 0: steps, time, BLEU and where the outputs are."""
    if trainer.global_rank != 0:
        return
    bleu = "n/a (no validation ran)" if metrics["bleu"] is None else f"{metrics['bleu']:.2f}"
    if "test/bleu" in metrics:
        bleu += f", test BLEU {metrics['test/bleu']:.2f}"
    print(
        f"Done: {metrics['global_step']} steps in {metrics['seconds']:.0f}s on "
        f"{trainer.world_size} process(es); final BLEU {bleu}\n"
        f"  logs:        {metrics['log_dir']}\n  checkpoints: {metrics['ckpt_dir']}\n"
        f"  tokenizer:   {Path(metrics['output_dir']) / 'tokenizer.json'}"
        + (f"\n  compile:     {stats.describe(metrics['compile'])}" if stats else "")
    )


def train(cfg: DictConfig) -> dict[str, Any]:
    """Build data, tokenizer, model, strategy, callbacks and logger; fit; return the metrics.

    Returns:
        The final logged metrics as floats (``val/bleu``, ``val/chrf``, ``val/loss``, ...; with
        ``test=true`` also ``test/bleu``, ``test/chrf``, ``test/loss``, ``test/nll``; the
        throughput monitor's run totals ``train/total_tokens``, ``train/run/...``) plus
        ``bleu`` (None without a validation), ``global_step``, ``log_dir``, ``ckpt_dir``,
        ``output_dir``, ``seconds``, the split sizes, ``trained`` (true) and ``checkpoint``
        (the complete ``last.ckpt`` of the finished training); with ``compile=true`` also
        ``compile`` (:meth:`~examples.translation.compiling.CompileStats.summary`: ``graphs``
        compiled during training, distinct training ``shapes``, ``max_shapes``, ...).

    Raises:
        ConfigError: for a setting that cannot work (nothing has been written then).
        SystemExit: with status 143 (SIGTERM) or 130 (SIGINT) when training was interrupted,
            after saving ``<output_dir>/checkpoints/last.ckpt`` (callbacks.preemption) and
            writing ``metrics.json`` with ``interrupted`` and ``checkpoint``.
    """
    start = time.perf_counter()
    check_config(cfg)
    ckpt = load_checkpoint(cfg)
    output_dir = Path(cfg.output_dir).resolve()
    strategy, callbacks, logger = build_parts(cfg)
    dm, tokenizer, sizes = build_datamodule(cfg, output_dir)
    if ckpt is not None:
        check_resume(cfg, dm, ckpt)
        del ckpt
    model = instantiate(  # plain containers: checkpoints load with weights_only
        "model",
        cfg.model,
        vocab_size=tokenizer.get_vocab_size(),
        decode_fn=partial(tok.decode, tokenizer),
        dataset_names=list(sizes.get("corpora", [])) or None,  # per-corpus loss keys
        _convert_="all",
    )
    stats = compile_training(cfg, model, dm)
    trainer = build_trainer(cfg, strategy, callbacks, logger)
    save_tokenizer(trainer, output_dir, tokenizer)
    oversize = getattr(dm, "oversize", {})
    metrics: dict[str, Any] = {"output_dir": str(output_dir), "sizes": sizes, "oversize": oversize}
    if hasattr(dm, "shards"):
        metrics["shards"] = dm.shards
    fit(trainer, model, dm, cfg, metrics, callbacks, test=bool(cfg.get("test")))
    if stats is not None:
        metrics["compile"] = stats.summary(model.compiled_shapes)
    metrics["bleu"] = metrics.get("val/bleu")
    finish_metrics(trainer, metrics, start, tokenizer)
    _report(trainer, metrics, stats)
    return metrics


@hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> None:
    """Command-line entry: ``python examples/translation/train.py [overrides]``."""
    write_summary(run_entry(train, cfg))


if __name__ == "__main__":
    check_overrides(sys.argv, CONF_DIR)
    main()
