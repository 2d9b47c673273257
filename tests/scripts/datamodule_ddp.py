"""One rank of a 2-process run through TokenBudgetDataModule: ``OUT [resume [STRATEGY]]``.

``--source hf`` or ``--source hf:DIR`` (anywhere; ``hf_source.py``): the same pairs as Hugging
Face datasets, planned from their ``("source", "target")`` columns.

Launched per rank by ``tests.launch.launch``; the Trainer keeps its default
``use_distributed_sampler=True``. Writes ``OUT/rank<r>.json`` with what this rank trained and
validated, its step count and its train loader's length. With ``resume``: an uninterrupted
run, a run stopped after a mid-epoch checkpoint, and a run resumed from it, in one process.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from datamodule_common import fit
from hf_source import loader_evidence, pop_source
from teardown import shutdown

RESUME_EVERY = 2


def resume(out: Path, world: int, strategy: str, source: str) -> None:
    common = {
        "devices": world,
        "strategy": strategy,
        "accumulate": 2,
        "with_val": False,
        "source": source,
    }
    _, full, dm = fit(max_epochs=2, **common)
    ckpt_dir = out / "ckpt"
    fit(
        max_epochs=2,
        max_steps=RESUME_EVERY + 1,
        ckpt_dir=ckpt_dir,
        ckpt_every=RESUME_EVERY,
        **common,
    )
    ckpt = ckpt_dir / f"epoch=0-step={RESUME_EVERY}.ckpt"
    trainer, resumed, _ = fit(max_epochs=2, ckpt_path=str(ckpt), **common)
    record = {
        "rank": trainer.global_rank,
        "epoch_length": dm.samplers["train"].epoch_length,
        "full": [r["ids"] for r in full.trained],
        "resumed": [r["ids"] for r in resumed.trained],
        "global_steps": [full.trained[-1]["global_step"], trainer.global_step],
        "loader": loader_evidence(trainer.train_dataloader),
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def main() -> None:
    argv = sys.argv[1:]
    source = pop_source(argv)
    out = Path(argv[0])
    world = int(os.environ["WORLD_SIZE"])
    if argv[1:2] == ["resume"]:
        resume(out, world, argv[2] if len(argv) > 2 else "ddp", source)
        return
    trainer, model, dm = fit(
        devices=world, strategy="ddp", accumulate=2, max_epochs=2, source=source
    )
    record = {
        "rank": trainer.global_rank,
        "global_step": trainer.global_step,
        "len_train_dataloader": len(trainer.train_dataloader),
        "epoch_length": dm.samplers["train"].epoch_length,
        "use_distributed_sampler": trainer._accelerator_connector.use_distributed_sampler,
        "trained": model.trained,
        "validated": model.validated,
        "loader": loader_evidence(trainer.train_dataloader),
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
