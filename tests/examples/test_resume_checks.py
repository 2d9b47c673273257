"""``ckpt_path`` is checked before training: not a checkpoint, or saved for other data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from hydra import compose, initialize_config_dir

from examples.common.config_checks import ConfigError
from examples.translation.train import CONF_DIR, train
from tests.examples.test_train import SMALL

COMMON = [
    *SMALL,
    "data.num_pairs=400",
    "data.max_tokens=1024",
    "trainer.val_check_interval=1000",
    "callbacks.checkpoint.every_n_train_steps=3",
    "~logger",
    "cpu_threads=1",
]


def _cfg(out: Path, *overrides: str) -> Any:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[*COMMON, f"output_dir={out}", *overrides])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real checkpoint of the example, mid-epoch (step 3)."""
    out = tmp_path_factory.mktemp("first")
    assert train(_cfg(out, "trainer.max_steps=3"))["global_step"] == 3
    return out / "checkpoints" / "last.ckpt"


def test_changed_lengths_are_refused_or_restart_the_epoch(checkpoint: Path, tmp_path: Path) -> None:
    resume = [f"ckpt_path={checkpoint}", "trainer.max_steps=5", "data.max_length=24"]
    with pytest.raises(ConfigError, match="on_resume_mismatch=restart_epoch") as info:
        train(_cfg(tmp_path / "refused", *resume))
    assert "ckpt_path=" in str(info.value) and "lengths" in str(info.value)
    assert not (tmp_path / "refused").exists(), "nothing is written before the refusal"
    metrics = train(_cfg(tmp_path / "restarted", *resume, "on_resume_mismatch=restart_epoch"))
    assert metrics["global_step"] == 5


def test_same_data_resumes(checkpoint: Path, tmp_path: Path) -> None:
    metrics = train(_cfg(tmp_path, f"ckpt_path={checkpoint}", "trainer.max_steps=4"))
    assert metrics["global_step"] == 4


def _bad_file(kind: str, tmp_path: Path, checkpoint: Path) -> Path:
    path = tmp_path / "bad.ckpt"
    if kind == "missing":
        return tmp_path / "missing.ckpt"
    if kind == "directory":
        return tmp_path
    if kind == "text":
        path.write_text("not a checkpoint\n")
    elif kind == "truncated":
        path.write_bytes(checkpoint.read_bytes()[: checkpoint.stat().st_size // 2])
    elif kind == "empty":
        path.write_bytes(b"")
    elif kind == "tensor":
        torch.save(torch.zeros(3), path)
    elif kind == "pickle":
        torch.save({"state_dict": {}, "loops": {}, "x": Path("/")}, path)
    elif kind == "damaged-pickle":  # a complete zip whose pickle is garbage
        import zipfile

        with zipfile.ZipFile(checkpoint) as src, zipfile.ZipFile(path, "w") as out:
            for name in src.namelist():
                data = src.read(name)
                out.writestr(name, b"\x80\x02garbage" if name.endswith("data.pkl") else data)
    return path


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("missing", "does not exist"),
        ("directory", "is a directory"),
        ("text", "not a torch checkpoint"),
        ("truncated", "not a torch checkpoint"),
        ("empty", "not a torch checkpoint"),
        ("tensor", "not a Lightning training checkpoint"),
        ("pickle", "holds objects other than tensors"),
        ("damaged-pickle", "or its pickle is damaged"),
    ],
)
def test_not_a_checkpoint_is_refused_before_training(
    kind: str, message: str, checkpoint: Path, tmp_path: Path
) -> None:
    path = _bad_file(kind, tmp_path, checkpoint)
    out = tmp_path / "run"
    with pytest.raises(ConfigError, match=message) as info:
        train(_cfg(out, f"ckpt_path={path}", "trainer.max_steps=4"))
    text = str(info.value)
    assert text.startswith(f"ckpt_path={path}")
    assert "weights_only=False" not in text and "weights_only" not in text
    assert not out.exists()
