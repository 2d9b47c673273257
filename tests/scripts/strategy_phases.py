"""One rank of several runs in one process group: ``strategy_phases.py OUT PHASES``.

``PHASES`` is a JSON list of ``[name, script, args]``: ``script`` is ``strategy``,
``schedule`` or ``callbacks``, ``args`` what follows OUT on the command line of
``strategy_train.py``, ``schedule_train.py`` or ``callbacks_train.py``. The phases run one
after another in this process, each a new ``Trainer`` (and a new model, data and strategy
object) on the process group that the first one created, each with its own folder
``OUT/<name>``. One launch then pays the imports, the rendezvous and DeepSpeed's first
initialisation once for all of a strategy's checks (``tests/strategies/runs.py``).

Launched once per rank by ``tests.launch.launch``. Writes ``OUT/rank<r>.json`` once every
phase is done: ``{"rank": r, "phases": {name: record}, "seconds": {name: wall seconds}}``,
each record what the phase's script would have written alone. A phase that raises ends the
rank without a record (the launch then fails, naming the rank, with its output).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import callbacks_train
import schedule_train
import strategy_train
from teardown import shutdown

SCRIPTS: dict[str, Callable[[Path, list[str]], dict[str, Any]]] = {
    "strategy": strategy_train.train,
    "schedule": schedule_train.train,
    "callbacks": callbacks_train.train,
}

#: What ``tests.launch.rank_env`` sets for a rank.
LAUNCH_VARIABLES = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)


def main() -> None:
    out, phases = Path(sys.argv[1]), json.loads(sys.argv[2])
    rank = int(os.environ["RANK"])
    # Lightning's environment deletes WORLD_SIZE at a trainer's teardown: every phase gets
    # the launch's variables back.
    launched = {k: v for k, v in os.environ.items() if k in LAUNCH_VARIABLES}
    records: dict[str, dict[str, Any]] = {}
    seconds: dict[str, float] = {}
    for name, script, args in phases:
        os.environ.update(launched)
        (out / name).mkdir(exist_ok=True)
        start = time.perf_counter()
        records[name] = SCRIPTS[script](out / name, list(args))
        seconds[name] = round(time.perf_counter() - start, 2)
        print(f"rank {rank}: phase {name} done in {seconds[name]} s", flush=True)
    record = {"rank": rank, "phases": records, "seconds": seconds}
    (out / f"rank{rank}.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
    shutdown()
