"""``data.stream=true``: train on the training split streamed from parquet shards of token ids.

The training split is tokenized once, exactly as the map-style path tokenizes it (the same
specials, ``data.max_length`` and, with ``data.oversize=truncate``, the same cut), and written
to ``data.shard_dir`` (``null``: ``<output_dir>/shards``) as ``part-NNNNN.parquet`` files of
``data.shard_rows`` rows each, with two ``list<int32>`` columns, ``source`` (``... EOS``) and
``target`` (``BOS ... EOS``), and a ``manifest.json``. The manifest holds a hash of the
tokenizer, the training texts and those settings: a later run with the same hash reuses the
shards without tokenizing the training split again; a folder whose manifest differs is
refused (the message names the settings that differ). A folder of shards without a manifest is
taken as the user's own shards (``source``/``target`` token-id list columns made with this
example's tokenizer) and streamed as it is.

Training then runs on :class:`~lightning_varbatch.StreamingDataModule` over
:func:`~lightning_varbatch.shards_from_files` with the map-style path's collate
(``PaddingCollate(pad_id, pad_to_multiple_of, loss_offset=1)``), budget and planner settings;
the loss counts are ``target - 1`` per pair (``loss_offset=1``), so ``step_ntokens`` stays the
exact loss normaliser. Validation (and ``test=true``) stays map-style on the held-out splits.

With several ranks, global rank 0 writes the shards (into a temporary folder renamed into
place) and the others wait for its manifest: the folder must be shared by every node.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from examples.common.config_checks import ConfigError
from examples.common.oversize import fitting_length
from examples.common.rank_shares import rank_settings
from examples.common.summary import rank
from examples.translation import tokenizer as tok
from lightning_varbatch import (
    PaddingCollate,
    ShardedSource,
    StreamingDataModule,
    shards_from_files,
)
from lightning_varbatch.sources import SHARD_SUFFIXES

__all__ = [
    "LEGACY_STATE_KEY",
    "MANIFEST",
    "SHARD_COLUMNS",
    "announce",
    "build",
    "check_resume",
    "check_stream",
    "open_shards",
    "prepare_shards",
]

#: The token-id columns of a shard (also of your own shards given with ``data.shard_dir``).
SHARD_COLUMNS = ("source", "target")
MANIFEST = "manifest.json"
FORMAT = "lightning_varbatch translation shards 1"
#: How long a rank other than 0 waits for rank 0's shards.
WAIT_SECONDS = 1800.0


def check_stream(cfg: DictConfig) -> None:
    """Refuse ``data.stream`` settings that cannot work (before anything is built).

    Raises:
        ConfigError: naming the setting (``data.stream``, ``data.corpora``,
            ``data.max_shapes``, ``callbacks.rank_balance``, ``on_resume_mismatch``,
            ``data.shard_rows``, ...).
    """
    data = cfg.data
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise ConfigError(f"data.stream must be true or false, got {stream!r}.")
    if not stream:
        given = [k for k in ("shard_dir", "window") if data.get(k) is not None]
        if given:
            raise ConfigError(
                f"data.{given[0]}={data.get(given[0])} applies to a streamed corpus: add "
                f"data.stream=true, or unset data.{given[0]}."
            )
        return
    rows = data.get("shard_rows", 10000)
    if not (isinstance(rows, int) and not isinstance(rows, bool) and rows >= 1):
        raise ConfigError(f"data.shard_rows must be a positive integer, got {rows!r}.")
    window = data.get("window")
    if window is not None and not (
        isinstance(window, int) and not isinstance(window, bool) and window >= 1
    ):
        raise ConfigError(
            f"data.window must be a positive integer (examples planned together) or null "
            f"(about 200 micro-batches' worth), got {window!r}."
        )
    shard_dir = data.get("shard_dir")
    if shard_dir is not None and not (isinstance(shard_dir, str) and shard_dir.strip()):
        raise ConfigError(f"data.shard_dir must be a folder (a path) or null, got {shard_dir!r}.")
    if data.get("corpora"):
        raise ConfigError(
            f"data.stream=true streams one corpus; data.corpora={sorted(data.corpora)} mixes "
            "several (map-style only): set data.corpora={} (or data=default), or "
            "data.stream=false."
        )
    if data.get("max_shapes") is not None:
        how = " (set by compile=true)" if cfg.get("compile") else ""
        raise ConfigError(
            f"data.stream=true cannot keep a shape budget: data.max_shapes="
            f"{data.max_shapes}{how} needs the whole epoch's plan. Set data.max_shapes=null "
            "and compile=false, or data.stream=false."
        )
    if cfg.get("callbacks", {}).get("rank_balance", {}).get("enabled"):
        raise ConfigError(
            "callbacks.rank_balance.enabled=true cannot balance data.stream=true: a stream plans "
            "window by window, so its shares are fixed for the run. Set them with "
            "data.rank_shares=[...] and callbacks.rank_balance.enabled=false, or data.stream=false."
        )
    if cfg.get("on_resume_mismatch", "error") != "error":
        raise ConfigError(
            f"on_resume_mismatch={cfg.on_resume_mismatch} is for the map-style sampler: with "
            "data.stream=true a resume continues the streamed epoch where it stopped, on the "
            "same shards. Set on_resume_mismatch=error, or data.stream=false."
        )


def _texts_sha(sources: list[str], targets: list[str]) -> str:
    """A sha256 of the training texts, in order (what the shards are made of)."""
    h = hashlib.sha256(f"{len(sources)}\n".encode())
    for texts in (sources, targets):
        for text in texts:
            h.update(text.encode())
            h.update(b"\x00")
        h.update(b"\x01")
    return h.hexdigest()


def shard_settings(
    data: DictConfig, tokenizer: Any, texts: tuple[list[str], list[str]]
) -> dict[str, Any]:
    """What the shards depend on; the manifest's hash is taken over it."""
    cut = None
    if data.oversize == "truncate":
        cut = fitting_length(data.max_tokens, data.pad_to_multiple_of)
    return {
        "format": FORMAT,
        "tokenizer_sha256": hashlib.sha256(tokenizer.to_str().encode()).hexdigest(),
        "texts_sha256": _texts_sha(*texts),
        "pairs": len(texts[0]),
        "max_length": data.max_length,
        "truncate_to": cut,
        "shard_rows": int(data.shard_rows),
        "columns": list(SHARD_COLUMNS),
    }


def _digest(settings: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()


def _shard_files(folder: Path) -> list[Path]:
    return sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix.lower() in SHARD_SUFFIXES and p.name != MANIFEST
    )


def _rows(items: Any, start: int, stop: int) -> tuple[list[Any], list[Any]]:
    """Sources and targets of rows ``[start, stop)`` of a list of items or an HF dataset."""
    if isinstance(items, list):
        chunk = items[start:stop]
        return [it["source"] for it in chunk], [it["target"] for it in chunk]
    chunk = items[start:stop]  # a datasets.Dataset: a dict of columns
    return chunk["source"], chunk["target"]


def write_shards(
    folder: Path, items: Any, settings: dict[str, Any], lengths: np.ndarray
) -> dict[str, Any]:
    """Write ``items`` as parquet shards plus the manifest, atomically (temp folder, rename)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    cut, per_shard = settings["truncate_to"], settings["shard_rows"]
    ids = pa.list_(pa.int32())
    schema = pa.schema([(name, ids) for name in SHARD_COLUMNS])
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = folder.parent / f".{folder.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    shards = []
    n = len(items)
    for k, start in enumerate(range(0, n, per_shard)):
        sources, targets = _rows(items, start, min(start + per_shard, n))
        if cut is not None:
            sources, targets = [s[:cut] for s in sources], [t[:cut] for t in targets]
        table = pa.table([pa.array(sources, ids), pa.array(targets, ids)], schema=schema)
        name = f"part-{k:05d}.parquet"
        pq.write_table(table, tmp / name)
        shards.append({"file": name, "rows": len(sources)})
    longest = lengths.max(axis=0) if len(lengths) else np.zeros(2, dtype=np.int64)
    if cut is not None:
        longest = np.minimum(longest, cut)
    manifest = {
        "hash": _digest(settings),
        "settings": settings,
        "rows": n,
        "shards": shards,
        "longest": [int(x) for x in longest],
        "truncated": int((lengths > cut).any(axis=1).sum()) if cut is not None else 0,
    }
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=2))
    if folder.exists():
        folder.rmdir()  # empty (checked by the caller)
    os.replace(tmp, folder)
    return manifest


def _mismatch(folder: Path, found: Mapping[str, Any], settings: Mapping[str, Any]) -> str:
    old = found.get("settings", {})
    names = {
        "tokenizer_sha256": "the tokenizer (data.vocab_size or the corpus)",
        "texts_sha256": "the training texts (the corpus, data.num_pairs, data.valid/test, seed)",
        "pairs": "the number of training pairs",
        "max_length": "data.max_length",
        "truncate_to": "the cut of data.oversize=truncate (data.max_tokens)",
        "shard_rows": "data.shard_rows",
        "format": "the shard format",
        "columns": "the columns",
    }
    differ = [
        f"{names.get(k, k)}: {old.get(k)!r} -> {settings[k]!r}"
        if k in ("pairs", "max_length", "truncate_to", "shard_rows")
        else names.get(k, k)
        for k in settings
        if old.get(k) != settings[k]
    ]
    return (
        f"data.shard_dir={folder} holds shards of other data or settings (manifest hash "
        f"{str(found.get('hash'))[:12]}, this run {_digest(settings)[:12]}; differing: "
        f"{'; '.join(differ) or 'unknown'}). Delete the folder to have it rewritten, or point "
        "data.shard_dir at another (empty or missing) folder."
    )


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def prepare_shards(
    data: DictConfig,
    folder: Path,
    tokenizer: Any,
    texts: tuple[list[str], list[str]],
    encode_train: Callable[[], tuple[Any, np.ndarray]],
    world_size: int,
) -> dict[str, Any]:
    """Make sure ``folder`` holds the training shards; return what it holds.

    Returns:
        ``{"dir", "written", "own", "rows", "files", "names", "longest", "truncated"}``:
        ``own`` is true for the user's shards (no manifest), ``names`` the shard files in
        order, ``longest`` the longest (source, target) of the shards we wrote (``None`` for
        the user's: read from the shards).

    Raises:
        ConfigError: for a folder of other shards, a folder with other files, or (ranks > 0)
            no shards from rank 0 within :data:`WAIT_SECONDS`.
    """
    settings = shard_settings(data, tokenizer, texts)
    digest = _digest(settings)
    manifest_path = folder / MANIFEST
    deadline = time.monotonic() + WAIT_SECONDS
    while True:
        found = _read_manifest(manifest_path) if manifest_path.is_file() else None
        if found is not None:
            if found.get("hash") != digest:
                raise ConfigError(_mismatch(folder, found, settings))
            return {
                "dir": str(folder),
                "written": False,
                "own": False,
                "rows": int(found["rows"]),
                "files": len(found["shards"]),
                "names": [str(shard["file"]) for shard in found["shards"]],
                "longest": found.get("longest"),
                "truncated": int(found.get("truncated", 0)),
            }
        if folder.is_dir() and any(folder.iterdir()):
            files = _shard_files(folder)
            if not files:
                raise ConfigError(
                    f"data.shard_dir={folder} is not empty but holds no shards "
                    f"({', '.join(sorted(SHARD_SUFFIXES))} files) and no {MANIFEST}: give a "
                    "folder of shards, an empty folder, or a missing one (written then)."
                )
            return {
                "dir": str(folder),
                "written": False,
                "own": True,
                "rows": None,
                "files": len(files),
                "names": [f.name for f in files],
                "longest": None,
                "truncated": 0,
            }
        if rank() == 0:
            break
        if time.monotonic() > deadline:
            raise ConfigError(
                f"rank {rank()} waited {WAIT_SECONDS:.0f}s for rank 0 to write the shards to "
                f"data.shard_dir={folder}: with several nodes that folder must be shared (or "
                "written beforehand by a one-process run with the same settings)."
            )
        time.sleep(0.5)
    start = time.perf_counter()
    items, lengths = encode_train()
    manifest = write_shards(folder, items, settings, lengths)
    print(
        f"data.stream=true: wrote {manifest['rows']:,} training pairs as "
        f"{len(manifest['shards'])} parquet shard(s) to {folder} in "
        f"{time.perf_counter() - start:.1f}s (world size {world_size}).",
        file=sys.stderr,
    )
    return {
        "dir": str(folder),
        "written": True,
        "own": False,
        "rows": manifest["rows"],
        "files": len(manifest["shards"]),
        "names": [shard["file"] for shard in manifest["shards"]],
        "longest": manifest["longest"],
        "truncated": manifest["truncated"],
    }


def open_shards(shards: Mapping[str, Any], cache_dir: str | None) -> ShardedSource:
    """The shards :func:`prepare_shards` found, as a source with ``source``/``target`` lengths.

    The manifest's files in order, or the user's shard files of the folder, sorted by name.
    """
    folder = Path(shards["dir"])
    cache: Any = True if cache_dir is None else Path(cache_dir) / "shard_index"
    files = [folder / name for name in shards["names"]]
    try:
        return shards_from_files(files, SHARD_COLUMNS, fields=SHARD_COLUMNS, cache_dir=cache)
    except ValueError as error:
        raise ConfigError(
            f"data.shard_dir={folder} cannot be streamed: {error} -- shards need "
            f"{' and '.join(SHARD_COLUMNS)} columns of token ids (lists of ints, source "
            "'... EOS', target 'BOS ... EOS', from this example's tokenizer)."
        ) from error


def announce(shards: Mapping[str, Any], folder: Path, rows: int) -> None:
    """Say (rank 0, on stderr) how many pairs are streamed from which shards."""
    if rank() == 0:
        what = "your own shards" if shards["own"] else "shards"
        print(
            f"data.stream=true: training on {rows:,} pairs streamed from {shards['files']} "
            f"{what} in {folder}"
            + ("" if shards["written"] or shards["own"] else " (reused: same manifest hash)"),
            file=sys.stderr,
        )


#: The name this example's streaming DataModule had when it subclassed the library's (its
#: checkpoints keep their state under it; :func:`check_resume` reads them).
LEGACY_STATE_KEY = "TranslationStreamingDataModule"


def build(
    data: DictConfig,
    source: ShardedSource,
    shards: Mapping[str, Any],
    val: tuple[Any, np.ndarray],
    test: tuple[Any, np.ndarray] | None,
) -> StreamingDataModule:
    """The streaming DataModule: shards for training, map-style validation (and test).

    Raises:
        ConfigError: for the user's shards with ``data.oversize=truncate`` (their loss counts
            would miss the cut), or shards with a pair longer than the budget under
            ``data.oversize=error``.
        ValueError: for settings the library refuses (the caller names the budget).
    """
    cut = fitting_length(data.max_tokens, data.pad_to_multiple_of)
    if shards["own"] and data.oversize == "truncate":
        raise ConfigError(
            f"data.oversize=truncate cannot cut your own shards in data.shard_dir="
            f"{shards['dir']} (their loss counts are planned uncut): cut them to {cut} tokens "
            "per side when you write them, or set data.oversize=error|skip."
        )
    if data.oversize == "error":
        longest = shards["longest"]
        if longest is None:  # the user's shards: the lengths the planner will read anyway
            lengths = source.lengths()
            longest = lengths.max(axis=0).tolist() if len(lengths) else [0, 0]
        if max(longest) > cut:
            raise ConfigError(
                f"data.max_tokens={data.max_tokens} cannot batch the streamed training split: "
                f"its longest (source, target) is {tuple(longest)} tokens, above the "
                f"{cut} one example may have. Raise data.max_tokens or lower data.max_length, "
                "or set data.oversize=skip|truncate to leave out or cut the longest examples."
            )
    val_items, val_lengths = val
    kwargs: dict[str, Any] = {}
    if test is not None:
        kwargs = {
            "test_dataset": test[0],
            "test_lengths": test[1],
        }
    return StreamingDataModule(
        source,
        data.max_tokens,
        window=data.get("window"),
        # the loss predicts target[1:]: one loss token fewer than target tokens per pair
        collate=PaddingCollate(
            pad_id=tok.PAD_ID, pad_to_multiple_of=data.pad_to_multiple_of, loss_offset=1
        ),
        num_workers=data.num_workers,
        val_dataset=val_items,
        val_lengths=val_lengths,
        val_max_tokens=data.val_max_tokens,
        loss_offset=1,  # the planner counts target minus BOS per pair, after any cut
        bucket_width=data.bucket_width,
        tail=data.tail,
        pair_order=data.get("pair_order", "two_sided"),
        oversize=data.oversize,
        pad_to_multiple_of=data.pad_to_multiple_of,
        seed=data.seed,
        **rank_settings(data),  # fixed shares / budgets per rank, as the map-style path
        **kwargs,
    )


def check_resume(ckpt_path: str, dm: StreamingDataModule, ckpt: Mapping[str, Any]) -> None:
    """Refuse a checkpoint whose stream position cannot continue on these shards.

    A checkpoint of this example's earlier releases keeps the position under
    :data:`LEGACY_STATE_KEY`, which Lightning does not hand to the DataModule: it is loaded
    here (and applied when training starts).

    Raises:
        ConfigError: for a map-style checkpoint, or one saved on other shards or settings
            (naming ``ckpt_path`` and ``data.shard_dir``).
    """
    state = ckpt.get(type(dm).__qualname__)
    legacy = state is None and isinstance(ckpt.get(LEGACY_STATE_KEY), Mapping)
    if legacy:
        state = ckpt[LEGACY_STATE_KEY]
    if not isinstance(state, Mapping) or "stream" not in state:
        if any(isinstance(v, Mapping) and "train_sampler" in v for v in ckpt.values()):
            raise ConfigError(
                f"ckpt_path={ckpt_path} was saved by a map-style run (data.stream=false): its "
                "sampler position cannot continue a streamed epoch. Resume it with "
                "data.stream=false."
            )
        return
    try:
        dm.check_state(state)  # the library's own check of a saved position
    except ValueError as error:
        folder = Path(ckpt_path).resolve().parent.parent / "shards"
        hint = (
            f" (the checkpoint's run wrote {folder}: data.shard_dir={folder})"
            if (folder / MANIFEST).is_file()
            else ""
        )
        raise ConfigError(
            f"ckpt_path={ckpt_path} cannot continue on these shards: {error} -- the stream's "
            "position is tied to its shard files (their paths and rows) and plan settings: "
            f"resume with the same data.shard_dir{hint}, data.max_tokens, data.window and "
            "data.seed."
        ) from error
    if legacy:
        dm.load_state_dict(dict(state))
