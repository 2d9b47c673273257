"""One rank of the streaming runs: ``OUT DATA MODE [CKPT] --workers K``.

Modes (every rank writes ``OUT/rank<r>.json`` when it finishes):

- ``train``: two epochs, a checkpoint every ``EVERY`` optimizer steps in ``OUT/ckpt``.
- ``resume CKPT``: the same run resumed from ``CKPT`` (with this launch's world size).

The record holds the ids of every trained micro-batch, the optimizer steps, the warnings
Lightning gave, how long building the (restored) loader took and, with ``--workers 0``, the
rows the source read (rows before the restored position must not be read).
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

from streaming_common import EVERY, fit
from teardown import shutdown


def main() -> None:
    argv = sys.argv[1:]
    workers = 0
    if "--workers" in argv:
        i = argv.index("--workers")
        workers = int(argv[i + 1])
        del argv[i : i + 2]
    out, data, mode = Path(argv[0]), Path(argv[1]), argv[2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if mode == "train":
            trainer, model, dm = fit(
                data,
                devices=_world(),
                max_epochs=2,
                num_workers=workers,
                ckpt_dir=out / "ckpt",
                ckpt_every=EVERY,
            )
        else:
            assert mode == "resume", mode
            trainer, model, dm = fit(
                data, devices=_world(), max_epochs=2, num_workers=workers, ckpt_path=argv[3]
            )
    assert dm.stream is not None and model.first_batch_at is not None
    assert dm.loader_built_at is not None
    record = {
        "rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
        "trained": model.trained,
        "num_training_batches": (
            "inf" if math.isinf(trainer.num_training_batches) else trainer.num_training_batches
        ),
        "loader_seconds": dm.loader_seconds,
        "first_batch_seconds": model.first_batch_at - dm.loader_built_at,
        "rows_read": dm.train_source.stats.rows_read,
        "warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
    }
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))


def _world() -> int:
    import os

    return int(os.environ["WORLD_SIZE"])


if __name__ == "__main__":
    main()
    shutdown()
