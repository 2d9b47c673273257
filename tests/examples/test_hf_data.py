"""Training on a local Hugging Face dataset or parquet files (``data.hf_path``), offline.

The datasets are built here (``Dataset.from_dict`` -> ``save_to_disk``, parquet through
pyarrow) from the embedded corpus, and the example's ``train(cfg)`` runs on them for a few
steps of the tiny model. Sockets are refused for the whole module: nothing may touch the
network. The runs check that the data flows through the library's Arrow path: the DataModule
gets a ``datasets.Dataset`` with token-id columns and their *names* as lengths, and the collate
gets each micro-batch as one Arrow table (``ColumnarItems``).
"""

from __future__ import annotations

import socket
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hydra import compose, initialize_config_dir

from examples.common.config_checks import ConfigError
from examples.translation import datamodule as datamodule_module
from examples.translation.corpora import read_corpora
from examples.translation.data import build_corpus, load_hf_dataset
from examples.translation.train import CONF_DIR, train
from lightning_varbatch import PaddingCollate, TokenBudgetDataModule
from tests.examples.recorder import read_records
from tests.examples.test_train import SMALL

PAIRS = build_corpus(num_pairs=300, seed=7)
COLUMNS = {"en": [s for s, _ in PAIRS], "de": [t for _, t in PAIRS]}
RECORD = "+callbacks.record._target_=tests.examples.recorder.RecordBatches"


@pytest.fixture(autouse=True)
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No network: Hugging Face's offline switch, and every socket connection refused."""
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def refuse(self: socket.socket, address: Any) -> None:
        raise AssertionError(f"network access to {address} during an offline test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)


class Spy:
    """What the example handed the library: the DataModule's arguments and collate inputs."""

    def __init__(self) -> None:
        self.kwargs: dict[str, Any] = {}
        self.items: Counter[str] = Counter()


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[Spy]:
    seen = Spy()

    class RecordingDataModule(TokenBudgetDataModule):
        def __init__(self, **kwargs: Any) -> None:
            seen.kwargs = kwargs
            super().__init__(**kwargs)

    class RecordingCollate(PaddingCollate):
        def __call__(self, items: Any) -> Any:
            seen.items[type(items).__name__] += 1
            return super().__call__(items)

    monkeypatch.setattr(datamodule_module, "TokenBudgetDataModule", RecordingDataModule)
    monkeypatch.setattr(datamodule_module, "PaddingCollate", RecordingCollate)
    yield seen


def run(tmp_path: Path, *overrides: str) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose(
            "config",
            overrides=[
                *SMALL,
                "data.valid=20",
                "data.test=0",
                "trainer.max_steps=2",
                "trainer.val_check_interval=2",
                "callbacks.checkpoint.enabled=false",
                "cpu_threads=1",
                f"output_dir={tmp_path / 'run'}",
                *overrides,
            ],
        )
    return train(cfg)


def hf(path: Path) -> list[str]:
    return [f"data.hf_path={path}", "data.source_column=en", "data.target_column=de"]


def test_saved_dataset_trains_an_epoch_through_the_arrow_path(tmp_path: Path, spy: Spy) -> None:
    saved = tmp_path / "saved"
    extra = {"id": list(range(len(PAIRS))), "meta": [{"k": i} for i in range(len(PAIRS))]}
    datasets.Dataset.from_dict({**COLUMNS, **extra}).save_to_disk(str(saved))
    before = sorted(p.name for p in saved.iterdir())
    record = tmp_path / "batches.jsonl"
    metrics = run(
        tmp_path,
        *hf(saved),
        "trainer.max_steps=-1",
        "trainer.max_epochs=1",
        "trainer.val_check_interval=null",
        RECORD,
        f"+callbacks.record.path={record}",
    )
    # the DataModule got Arrow datasets of token ids and read their lengths by column name
    train_ds = spy.kwargs["train_dataset"]
    assert isinstance(train_ds, datasets.Dataset) and isinstance(
        spy.kwargs["val_dataset"], datasets.Dataset
    )
    assert train_ds.column_names == ["source", "target"]
    assert spy.kwargs["train_lengths"] == spy.kwargs["val_lengths"] == ("source", "target")
    assert "test_dataset" not in spy.kwargs  # data.test=0
    # loss tokens: whole target minus BOS, per example, derived by the planner (loss_offset=1;
    # the collate checks every micro-batch's count against the plan's)
    target_lengths = [len(t) for t in train_ds["target"]]
    assert spy.kwargs["loss_offset"] == 1 and "train_loss_lengths" not in spy.kwargs
    # every micro-batch came to the collate as one Arrow table
    assert set(spy.items) == {"ColumnarItems"}, spy.items
    # one epoch trained every training pair of the dataset exactly once
    assert metrics["sizes"] == {"train": 280, "valid": 20, "test": 0}
    records = read_records(record)
    trained = sorted(map(tuple, (s for r in records for s in r["sources"])))
    assert trained == sorted(map(tuple, train_ds["source"]))
    assert sum(n for r in records for n in r["target_lengths"]) == sum(target_lengths)
    assert metrics["global_step"] == len(records) > 1
    assert metrics["val/loss"] > 0 and 0.0 <= metrics["bleu"] <= 100.0
    assert list((Path(metrics["output_dir"]) / "logs").rglob("metrics.csv"))
    # nothing was written next to the user's dataset
    assert sorted(p.name for p in saved.iterdir()) == before


def write_parquet(folder: Path, parts: int = 2) -> Path:
    folder.mkdir()
    table = pa.table(COLUMNS)
    step = -(-table.num_rows // parts)
    for i in range(parts):
        pq.write_table(table.slice(i * step, step), folder / f"part-{i}.parquet")
    return folder


def test_parquet_matches_the_same_pairs_as_tsv(tmp_path: Path, spy: Spy) -> None:
    folder = write_parquet(tmp_path / "parquet")
    cache = tmp_path / "cache"
    metrics = run(tmp_path / "a", *hf(folder), f"data.cache_dir={cache}")
    assert isinstance(spy.kwargs["train_dataset"], datasets.Dataset)
    assert spy.kwargs["train_lengths"] == ("source", "target")
    assert set(spy.items) == {"ColumnarItems"}
    assert list((cache / "hf").glob("tokens-*.arrow"))  # the token ids, reused next time
    # the same pairs as a TSV file: same splits, same tokenizer, same plan, same losses
    tsv = tmp_path / "corpus.tsv"
    tsv.write_text("".join(f"{s}\t{t}\n" for s, t in PAIRS), encoding="utf-8")
    spy.items.clear()
    reference = run(tmp_path / "b", f"data.tsv_path={tsv}")
    assert isinstance(spy.kwargs["train_dataset"], list) and "ColumnarItems" not in spy.items
    assert metrics["sizes"] == reference["sizes"] == {"train": 280, "valid": 20, "test": 0}
    assert metrics["tokenizer_sha"] == reference["tokenizer_sha"]
    assert metrics["global_step"] == reference["global_step"] == 2
    assert metrics["val/loss"] == pytest.approx(reference["val/loss"], rel=1e-5)


def test_parquet_file_folder_and_glob_load_offline(tmp_path: Path) -> None:
    folder = write_parquet(tmp_path / "parquet", parts=3)
    cache = tmp_path / "cache"
    for path in (folder, folder / "part-0.parquet", f"{folder}/part-*.parquet"):
        ds = load_hf_dataset(path, None, "en", "de", cache_dir=cache)
        assert isinstance(ds, datasets.Dataset)
        expected = 100 if str(path).endswith("part-0.parquet") else len(PAIRS)
        assert len(ds) == expected and ds[0]["en"] == PAIRS[0][0]


def test_struct_column_fields_are_named_with_a_dot(tmp_path: Path) -> None:
    saved = tmp_path / "wmt"  # the {"translation": {"en": ..., "de": ...}} layout
    rows = [{"en": s, "de": t} for s, t in PAIRS[:10]]
    datasets.Dataset.from_dict({"translation": rows}).save_to_disk(str(saved))
    ds = load_hf_dataset(saved, None, "translation.en", "translation.de")
    assert ds["translation.de"][:2] == [PAIRS[0][1], PAIRS[1][1]]


def test_dataset_dict_uses_its_own_splits(tmp_path: Path, spy: Spy) -> None:
    saved = tmp_path / "dict"
    datasets.DatasetDict(
        {
            "train": datasets.Dataset.from_dict({k: v[:250] for k, v in COLUMNS.items()}),
            "validation": datasets.Dataset.from_dict({k: v[250:280] for k, v in COLUMNS.items()}),
            "test": datasets.Dataset.from_dict({k: v[280:] for k, v in COLUMNS.items()}),
        }
    ).save_to_disk(str(saved))
    metrics = run(
        tmp_path,
        *hf(saved),
        "data.hf_valid_split=validation",
        "data.hf_test_split=test",
        "trainer.max_steps=1",
        "trainer.val_check_interval=1",
        "test=true",
    )
    # nothing held out of train: validation and test are the dataset's own splits
    assert metrics["sizes"] == {"train": 250, "valid": 30, "test": 20}
    assert isinstance(spy.kwargs["test_dataset"], datasets.Dataset)
    assert spy.kwargs["test_lengths"] == ("source", "target")
    assert metrics["test/loss"] > 0
    message = r"data\.hf_valid_split=dev: .* holds the splits \['test', 'train', 'validation'\]"
    with pytest.raises(ConfigError, match=message):
        run(tmp_path / "bad", *hf(saved), "data.hf_valid_split=dev")


def test_embedded_corpus_stays_the_default() -> None:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config")
    assert cfg.data.hf_path is None and cfg.data.hf_split == "train"
    (corpus,) = read_corpora(cfg.data)
    assert corpus.kind == "synthetic" and corpus.source["num_pairs"] == cfg.data.num_pairs


def test_bad_columns_and_splits_name_the_setting(tmp_path: Path) -> None:
    saved = tmp_path / "saved"
    numbers = {"en": COLUMNS["en"], "num": list(range(len(PAIRS))), "ids": [[1, 2]] * 300}
    datasets.Dataset.from_dict(numbers).save_to_disk(str(saved))
    wrong = [
        (
            {"target_column": "fr"},
            r"data\.target_column=fr: .* no column 'fr'; its columns are "
            r"\['en', 'num', 'ids'\]",
        ),
        ({"target_column": "num"}, r"data\.target_column=num: column 'num' .* not text"),
        ({"source_column": "ids"}, r"data\.source_column=ids: column 'ids' .* not text"),
        ({"hf_split": "dev"}, r"data\.hf_split=dev: .* single split"),
        ({"hf_valid_split": "validation"}, r"data\.hf_valid_split=validation: .* single split"),
    ]
    for changes, message in wrong:
        settings = {"hf_path": saved, "source_column": "en", "target_column": "en", **changes}
        with pytest.raises(ConfigError, match=message):
            run(tmp_path, *(f"data.{key}={value}" for key, value in settings.items()))
        assert not (tmp_path / "run").exists(), changes  # refused before writing anything
