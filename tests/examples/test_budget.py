"""The example keeps its own token budget: no micro-batch pads more than the planner allows.

The planner's cost model for the example's (source, target) pairs is ``"padded"``: a
micro-batch of ``n`` pairs costs ``n x max(padded source width, padded target width)``
(:mod:`lightning_varbatch.planner.costs`, ``prepare_lengths``), so each padded field of a batch
(``n x width``) must stay within the budget.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from examples.translation.datamodule import build_datamodule
from examples.translation.train import CONF_DIR
from lightning_varbatch import keys


@pytest.mark.parametrize("pad", [1, 8])
def test_no_micro_batch_pads_past_the_budget(pad: int, tmp_path: Path) -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                "data.num_pairs=3000",  # default corpus settings, fewer pairs
                "data.valid=200",
                "data.val_max_tokens=1024",
                f"data.pad_to_multiple_of={pad}",
                f"output_dir={tmp_path}",
            ],
        )
    dm, _, _ = build_datamodule(cfg, tmp_path)
    checked = 0
    for loader, budget in (
        (dm.train_dataloader(), cfg.data.max_tokens),
        (dm.val_dataloader(), cfg.data.val_max_tokens),
    ):
        over = []
        for batch in loader:
            n = int(batch[keys.NEXAMPLES])
            for field in ("source", "target"):
                slots = n * batch[field].shape[1]
                assert batch[field].shape[1] % pad == 0
                if slots > budget:
                    over.append((field, n, batch[field].shape[1], slots))
            checked += 1
        assert not over, f"{len(over)} micro-batches pad past the budget {budget}: {over[:5]}"
    assert checked > 20


def test_loss_tokens_are_target_minus_bos(tmp_path: Path) -> None:
    """step_ntokens is the step's number of loss tokens (target[1:]), as the model uses."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config", overrides=["data.num_pairs=800", "data.valid=50", f"output_dir={tmp_path}"]
        )
    dm, _, _ = build_datamodule(cfg, tmp_path)
    for batch in dm.train_dataloader():
        loss_tokens = int(batch["target_mask"][:, 1:].sum())
        assert int(batch[keys.STEP_NTOKENS]) == loss_tokens  # one micro-batch per step here
