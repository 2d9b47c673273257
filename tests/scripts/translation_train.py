"""One rank of a translation run through ``train(cfg)``: ``translation_train.py OUT [OVERRIDES]``.

Launched once per rank by ``tests.launch.launch`` (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_* set),
so Lightning does not spawn processes itself. Composes ``conf/`` with the given Hydra overrides
(plus ``trainer.devices=WORLD_SIZE`` and ``output_dir=OUT/run``) and writes ``OUT/rank<r>.json``
with the returned metrics and what the run was made of.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from hydra import compose, initialize_config_dir  # noqa: E402
from teardown import shutdown  # noqa: E402

from examples.translation.train import CONF_DIR, train  # noqa: E402


def main() -> None:
    out, overrides = Path(sys.argv[1]), sys.argv[2:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[*overrides, f"trainer.devices={world}", f"output_dir={out / 'run'}"],
        )
    metrics = train(cfg)
    record = {"rank": rank, "metrics": metrics}
    shutdown()
    (out / f"rank{rank}.json").write_text(json.dumps(record, default=str))


if __name__ == "__main__":
    main()
