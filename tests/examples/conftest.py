"""One torch thread for the in-process tests of the example.

Their models are tiny: a second intra-op thread does not speed them up, and on a busy 2-core
machine it slows them down several times (measured: 30 steps of the copy-task model in 0.25 s
with one thread, 2.3 s with two). The multi-process tests already run one thread per rank
(``tests.launch.rank_env``).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def one_torch_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
