"""``data.stream=true``: the translation example trains on its corpus streamed from shards."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.translation import streaming
from examples.translation.checks import check_config
from examples.translation.datamodule import build_datamodule, check_resume
from examples.translation.streaming import MANIFEST
from examples.translation.train import CONF_DIR, train
from lightning_varbatch import StreamingDataModule, TokenBudgetDataModule, shards_from_files
from tests.examples.test_train import SMALL
from tests.launch import launch

STREAM = ["data.stream=true", "data.shard_rows=500"]  # 1460 training pairs: 3 shards


@pytest.fixture(autouse=True)
def shard_index_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Shard indexes in the test's folder, not in ~/.cache (the ranks inherit it)."""
    monkeypatch.setenv("LIGHTNING_VARBATCH_CACHE", str(tmp_path / "index-cache"))


def make(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides))


def test_stream_config_composes(tmp_path: Path) -> None:
    cfg = make("data.stream=true", f"output_dir={tmp_path}")
    check_config(cfg)
    assert cfg.data.stream is True and cfg.data.shard_dir is None
    assert cfg.data.shard_rows == 10000 and cfg.data.window is None
    assert make().data.stream is False


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["data=mixture", "data.stream=true"], ["data.stream=true", "data.corpora"]),
        (["data.stream=true", "compile=true"], ["data.max_shapes=16", "compile=true"]),
        (
            ["data.stream=true", "data.max_shapes=4", "data.bucket_width=1"],
            ["data.max_shapes=4"],
        ),
        (
            ["data.stream=true", "on_resume_mismatch=restart_epoch"],
            ["on_resume_mismatch=restart_epoch"],
        ),
        (["data.stream=true", "data.shard_rows=0"], ["data.shard_rows"]),
        (["data.stream=true", "data.window=0"], ["data.window"]),
        (["data.shard_dir=shards"], ["data.shard_dir=shards", "data.stream=true"]),
        (["data.stream=1"], ["data.stream must be true or false"]),
    ],
    ids=[
        "mixture",
        "compile",
        "max-shapes",
        "restart-epoch",
        "rows",
        "window",
        "no-stream",
        "bool",
    ],
)
def test_incompatible_settings_are_refused(overrides: list[str], names: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        check_config(make(*overrides))
    assert all(name in str(info.value) for name in names), str(info.value)


def _run(out: Path, *overrides: str) -> dict[str, Any]:
    cfg = make(
        *SMALL,
        *STREAM,
        "trainer.val_check_interval=4",
        "callbacks.checkpoint.every_n_train_steps=4",
        f"output_dir={out}",
        *overrides,
    )
    return train(cfg)


def _pairs(items: Any) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    return sorted((tuple(it["source"]), tuple(it["target"])) for it in items)


@pytest.mark.slow
def test_single_process_streams_reuses_and_resumes(tmp_path: Path) -> None:
    shards = tmp_path / "shards"
    first = _run(tmp_path / "a", f"data.shard_dir={shards}", "trainer.max_steps=4")
    assert first["global_step"] == 4 and math.isfinite(first["train/loss"])
    assert first["val/loss"] > 0 and first["shards"]["written"] is True
    manifest = json.loads((shards / MANIFEST).read_text())
    files = sorted(shards.glob("*.parquet"))
    assert [f.name for f in files] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    assert [pq.read_metadata(f).num_rows for f in files] == [500, 500, 460]
    assert manifest["rows"] == first["sizes"]["train"] == 1460
    stamps = {f.name: f.stat().st_mtime_ns for f in [*files, shards / MANIFEST]}

    # The shards hold the token ids the map-style path trains on (same specials and cut).
    dm, _, _ = build_datamodule(make(*SMALL, f"output_dir={tmp_path / 'map'}"), tmp_path / "map")
    assert isinstance(dm, TokenBudgetDataModule)
    streamed = [row for f in files for row in pq.read_table(f).to_pylist()]
    assert _pairs(streamed) == _pairs(dm.datasets["train"])
    schema = pq.read_schema(files[0])
    assert [str(schema.field(n).type) for n in ("source", "target")] == ["list<element: int32>"] * 2

    # A second run reuses them without writing, and resumes the stream from a checkpoint.
    ckpt = tmp_path / "a" / "checkpoints" / "last.ckpt"
    second = _run(
        tmp_path / "b", f"data.shard_dir={shards}", "trainer.max_steps=6", f"ckpt_path={ckpt}"
    )
    assert second["global_step"] == 6 and math.isfinite(second["train/loss"])
    assert second["shards"]["written"] is False
    assert {f.name: f.stat().st_mtime_ns for f in [*files, shards / MANIFEST]} == stamps

    # Other settings over the same folder: refused, naming the folder and what differs.
    with pytest.raises(ConfigError, match=r"data.shard_dir=.*data.max_length: 32 -> 24"):
        build_datamodule(
            make(*SMALL, *STREAM, f"data.shard_dir={shards}", "data.max_length=24"), tmp_path
        )
    # The checkpoint's stream position belongs to its shards' content: identical files in
    # another folder resume, shards cut differently are refused.
    cfg = make(*SMALL, *STREAM, f"output_dir={tmp_path / 'c'}", f"ckpt_path={ckpt}")
    other, _, _ = build_datamodule(cfg, tmp_path / "c")  # writes <output_dir>/shards
    assert type(other) is StreamingDataModule  # the library's own, no subclass
    assert (tmp_path / "c" / "shards" / MANIFEST).is_file()
    saved = torch.load(ckpt, map_location="cpu", weights_only=True)
    check_resume(cfg, other, saved)  # the same shards in another folder (a node-local copy)
    cut = make(
        *SMALL, "data.stream=true", "data.shard_rows=400", f"output_dir={tmp_path / 'd'}",
        f"ckpt_path={ckpt}",
    )  # fmt: skip
    recut, _, _ = build_datamodule(cut, tmp_path / "d")  # the same pairs in other shards
    with pytest.raises(ConfigError, match=r"ckpt_path=.*same data.shard_dir"):
        check_resume(cut, recut, saved)
    # A folder that is neither empty nor shards is refused.
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("x")
    with pytest.raises(ConfigError, match="holds no shards"):
        build_datamodule(make(*SMALL, *STREAM, f"data.shard_dir={tmp_path / 'junk'}"), tmp_path)


@pytest.mark.multiprocess
@pytest.mark.parametrize("shares", [(), ("data.rank_shares=[1.0,0.5]",)], ids=["equal", "shares"])
def test_two_process_ddp_streams_to_the_same_step(shares: tuple[str, ...], tmp_path: Path) -> None:
    """Rank 0 writes <output_dir>/shards while rank 1 waits; both end on the same step (also
    with fixed shares, which a stream plans every window with)."""
    records = launch(
        "translation_train.py",
        2,
        tmp_path,
        *SMALL,
        *STREAM,
        *shares,
        "strategy=ddp",
        "trainer.accumulate_grad_batches=2",
        "trainer.max_steps=3",
        "trainer.val_check_interval=4",
        "callbacks.checkpoint.enabled=false",
        timeout=150,
    )
    assert [r["rank"] for r in records] == [0, 1]
    for record in records:
        metrics = record["metrics"]
        assert metrics["global_step"] == 3 and metrics["world_size"] == 2
        assert math.isfinite(metrics["train/loss"]) and metrics["shards"]["rows"] == 1460
    assert [r["metrics"]["shards"]["written"] for r in records] == [True, False]
    assert records[0]["metrics"]["val/loss"] == pytest.approx(records[1]["metrics"]["val/loss"])


def test_a_checkpoint_of_the_former_subclass_still_resumes(tmp_path: Path) -> None:
    """Checkpoints keep the stream under the old class name; check_resume applies it."""
    import pyarrow as pa

    rows = [{"source": [1] * (2 + i % 5), "target": [2] * (2 + i % 3)} for i in range(30)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "part-0.parquet")

    def source() -> Any:
        return shards_from_files(tmp_path, ("source", "target"), cache_dir=None)

    saved = StreamingDataModule(source(), 16, window=8, loss_offset=1)
    loader = iter(saved.train_dataloader())
    next(loader)
    state = {k: v for k, v in saved.state_dict().items() if k != "version"}  # as saved then
    ckpt = {streaming.LEGACY_STATE_KEY: state}
    resumed = StreamingDataModule(source(), 16, window=8, loss_offset=1)
    streaming.check_resume(str(tmp_path / "last.ckpt"), resumed, ckpt)
    assert resumed.state_dict() == {"version": 1, **state}  # pending, applied at the start
    changed = StreamingDataModule(source(), 17, window=8, loss_offset=1)
    with pytest.raises(ConfigError, match=r"max_tokens: saved 16, now 17"):
        streaming.check_resume(str(tmp_path / "last.ckpt"), changed, ckpt)
