"""Orderly end of a multi-process test script."""

import torch.distributed as dist


def shutdown() -> None:
    """Destroy the process group before interpreter exit.

    Left to interpreter teardown, gloo's and DeepSpeed's background threads were once destroyed
    while joinable ("terminate called without an active exception", SIGABRT) after a rank had
    already written its completion record.
    """
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
