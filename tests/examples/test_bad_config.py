"""Every bad setting of the example stops before training with a message naming it.

Each case is composed with Hydra and run through ``train(cfg)`` in-process: it must raise
:class:`ConfigError` (``main`` turns it into exit status 2) whose message names the key and,
for values, what is allowed. A few cases run the command line to check the exit status 2 and
that nothing is written. ``{tmp}`` in a case is a folder with prepared bad files.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir

from examples.common.config_checks import ConfigError
from examples.translation.train import CONF_DIR, ROOT, train

BASE = [
    "data.num_pairs=300",
    "data.valid=20",
    "data.test=0",
    "data.vocab_size=300",
    "trainer.max_steps=1",
    "trainer.val_check_interval=1000",
    "trainer.enable_progress_bar=false",
    "trainer.enable_model_summary=false",
    "cpu_threads=1",
    "~logger",
]

# (overrides, text the message must contain: the key, and for values what is allowed)
CASES: list[tuple[str, str]] = [
    # data.*: budgets and batching
    ("data.max_tokens=0", "data.max_tokens must be a positive integer"),
    ("data.max_tokens=-5", "data.max_tokens must be a positive integer"),
    ("data.max_tokens=abc", "data.max_tokens must be a positive integer, got 'abc'"),
    ("data.max_tokens=null", "data.max_tokens must be a positive integer, got None"),
    ("data.max_tokens=1.5", "data.max_tokens must be a positive integer, got 1.5"),
    ("data.max_tokens=true", "data.max_tokens must be a positive integer, got True"),
    ("data.max_tokens=16", "data.max_tokens=16 cannot batch the train split"),
    ("data.max_tokens=8 data.oversize=truncate", "data.max_tokens=8 cannot batch the train"),
    ("data.max_tokens=8 data.oversize=skip", "data.max_tokens=8 cannot batch the train"),
    ("data.val_max_tokens=0", "data.val_max_tokens must be a positive integer or null"),
    ("data.val_max_tokens=4", "data.val_max_tokens=4 cannot batch the valid split"),
    ("data.val_max_tokens=abc", "data.val_max_tokens must be a positive integer or null"),
    ("data.bucket_width=0", "data.bucket_width must be a positive integer, got 0"),
    ("data.bucket_width=-2", "data.bucket_width must be a positive integer"),
    ("data.bucket_width=1.5", "data.bucket_width must be a positive integer"),
    ("data.pad_to_multiple_of=0", "data.pad_to_multiple_of must be a positive integer, got 0"),
    ("data.pad_to_multiple_of=x", "data.pad_to_multiple_of must be a positive integer"),
    ("data.tail=foo", "data.tail must be one of spread, drop, pad"),
    ("data.tail=null", "data.tail must be one of spread, drop, pad"),
    ("data.oversize=foo", "data.oversize must be one of error, skip, truncate"),
    ("data.oversize=false", "data.oversize must be one of error, skip, truncate"),
    ("data.num_workers=-1", "data.num_workers must be an integer >= 0"),
    ("data.num_workers=two", "data.num_workers must be an integer >= 0"),
    # data.*: corpus, tokenizer, splits
    ("data.max_length=1", "data.max_length must be an integer >= 2 or null"),
    ("data.max_length=-3", "data.max_length must be an integer >= 2 or null"),
    ("data.max_length=abc", "data.max_length must be an integer >= 2 or null"),
    ("data.vocab_size=10", "data.vocab_size must be an integer >= 260"),
    ("data.vocab_size=null", "data.vocab_size must be an integer >= 260"),
    ("data.num_pairs=0", "data.num_pairs must be a positive integer"),
    ("data.num_pairs=-1", "data.num_pairs must be a positive integer"),
    ("data.num_pairs=1e3", "data.num_pairs must be a positive integer, got 1000.0"),
    ("data.valid=0", "data.valid must be a positive integer"),
    ("data.valid=10000", "data.valid=10000 and data.test=0 must leave training pairs"),
    ("data.test=-1", "data.test must be an integer >= 0"),
    ("data.seed=-1", "data.seed must be an integer >= 0"),
    ("data.seed=abc", "data.seed must be an integer >= 0"),
    ("data.cache_dir=''", "data.cache_dir must be a path"),
    ("data.src_path={tmp}/a.en", "data.src_path and data.tgt_path must be given together"),
    ("data.src_path={tmp}/a.en data.tgt_path={tmp}/short.de", "data.src_path="),
    ("data.src_path={tmp}/no.en data.tgt_path={tmp}/no.de", "No such file"),
    ("data.tsv_path={tmp}/missing.tsv", "data.tsv_path={tmp}/missing.tsv"),
    ("data.tsv_path={tmp}", "Cannot read the corpus of data.tsv_path="),
    ("data.tsv_path={tmp}/empty.tsv", "is empty"),
    ("data.tsv_path={tmp}/notab.tsv", "notab.tsv:2: expected 2 tab-separated fields"),
    ("data.tsv_path={tmp}/latin1.tsv", "data.tsv_path="),
    ("data.tsv_path={tmp}/ok.tsv data.src_path={tmp}/a.en data.tgt_path={tmp}/a.en", "either"),
    ("data.tsv_path=3", "data.tsv_path must be a path"),
    # data.hf_path: a local Hugging Face dataset (the unknown/non-text column cases need a
    # dataset: tests/examples/test_hf_data.py)
    (
        "data.hf_path={tmp}/missing data.source_column=en data.target_column=de",
        "data.hf_path={tmp}/missing: no local dataset at",
    ),
    (
        "data.hf_path={tmp} data.source_column=en data.target_column=de",
        "data.hf_path={tmp}: no local dataset at {tmp} (found no",
    ),
    (
        "data.hf_path={tmp}/ok.tsv data.source_column=en data.target_column=de",
        "data.hf_path={tmp}/ok.tsv: no local dataset",
    ),
    ("data.hf_path={tmp}", "data.hf_path={tmp} needs data.source_column and data.target_column"),
    ("data.hf_path={tmp} data.source_column=en", "data.hf_path={tmp} needs data.target_column"),
    ("data.source_column=en", "data.source_column applies to a Hugging Face dataset: set data.hf"),
    ("data.hf_test_split=test", "data.hf_test_split applies to a Hugging Face dataset: set data"),
    ("data.hf_split=dev", "data.hf_split=dev applies to a Hugging Face dataset: set data.hf_path"),
    (
        "data.hf_path={tmp} data.source_column=en data.target_column=de data.tsv_path={tmp}/ok.tsv",
        "either data.hf_path or data.tsv",
    ),
    (
        "data.hf_path={tmp} data.source_column=en data.target_column=de test=true",
        "set data.test > 0 (or data.hf_test_split)",
    ),
    ("data.hf_path=''", "data.hf_path must be a path"),
    ("data.hf_path={tmp} data.source_column=en data.target_column=3", "data.target_column must"),
    ("data=mixture data.hf_path={tmp}", "data.hf_path is set next to data.corpora"),
    ("data.steps_per_epoch=10", "data.steps_per_epoch=10 applies to a mixture"),
    ("data.steps_per_epoch=0", "data.steps_per_epoch must be a positive integer or null"),
    ("data.mixing=foo", "data.mixing must be one of per_step, per_batch"),
    ("data.temperature=0", "data.temperature must be a positive number"),
    ("data.temperature=hot", "data.temperature must be a positive number"),
    # data=mixture: data.corpora.<name>.*
    ("data=mixture data.corpora.expressions.kind=foo", "data.corpora.expressions.kind must be"),
    ("data=mixture data.corpora.expressions.kind=null", "data.corpora.expressions.kind must be"),
    ("data=mixture data.corpora.expressions.weight=-1", "data.corpora.expressions.weight must"),
    ("data=mixture data.corpora.expressions.weight=abc", "data.corpora.expressions.weight must"),
    ("data=mixture data.corpora.expressions.max_tokens=0", "data.corpora.expressions.max_tokens"),
    ("data=mixture data.corpora.expressions.max_examples=0", "expressions.max_examples must"),
    ("data=mixture data.corpora.expressions.num_pairs=0", "data.corpora.expressions.num_pairs"),
    ("data=mixture data.corpora.expressions.domain=foo", "data.corpora.expressions.domain"),
    ("data=mixture data.corpora.expressions.valid=0", "data.corpora.expressions.valid"),
    ("data=mixture +data.corpora.expressions.foo=1", "data.corpora.expressions has unknown"),
    ("data=mixture +data.corpora.expressions.tsv_path=x.tsv", "do(es) not apply to kind"),
    ("data=mixture data.corpora.sentences.weight=null", "data.corpora.sentences.weight missing"),
    ("data=mixture data.steps_per_epoch=null", "set data.steps_per_epoch"),
    ("data=mixture data.corpora.expressions.weight=0 data.corpora.sentences.weight=0", "all 0"),
    ("data=mixture +data.corpora.mine.kind=tsv", "data.corpora.mine (kind=tsv) needs"),
    ("data=mixture data.tsv_path=x.tsv", "data.tsv_path is set next to data.corpora"),
    # model.*
    ("model.d_model=0", "model.d_model must be a positive integer"),
    ("model.d_model=abc", "model.d_model must be a positive integer"),
    ("model.nhead=3", "model.d_model=128 must be divisible by model.nhead=3"),
    ("model.nhead=0", "model.nhead must be a positive integer"),
    ("model.num_encoder_layers=0", "model.num_encoder_layers must be a positive integer"),
    ("model.num_decoder_layers=-1", "model.num_decoder_layers must be a positive integer"),
    ("model.dim_feedforward=-1", "model.dim_feedforward must be a positive integer"),
    ("model.dropout=1.5", "model.dropout must be a number in [0, 1)"),
    ("model.dropout=-0.1", "model.dropout must be a number in [0, 1)"),
    ("model.dropout=null", "model.dropout must be a number in [0, 1)"),
    ("model.positions=foo", "model.positions must be one of sinusoidal, learned"),
    ("model.max_positions=8", "model.max_positions=8 is below data.max_length=64"),
    ("model.label_smoothing=1", "model.label_smoothing must be a number in [0, 1)"),
    ("model.lr=0", "model.lr must be a number in (0, inf)"),
    ("model.lr=-1e-3", "model.lr must be a number in (0, inf)"),
    ("model.lr=abc", "model.lr must be a number in (0, inf)"),
    ("model.warmup_steps=0", "model.warmup_steps must be a positive integer"),
    ("model.betas=[0.9]", "model.betas must be two numbers in [0, 1)"),
    ("model.betas=[0.9,1.5]", "model.betas must be two numbers in [0, 1)"),
    ("model.weight_decay=-1", "model.weight_decay must be a number in [0, inf)"),
    ("model.decode_batches=-1", "model.decode_batches must be an integer >= 0"),
    ("model.max_decode_length=0", "model.max_decode_length must be a positive integer"),
    ("model.num_samples=-1", "model.num_samples must be an integer >= 0"),
    ("+model.foo=1", "model cannot be built: TypeError"),
    # trainer.*
    ("trainer.max_steps=0", "trainer.max_steps must be a positive integer or -1"),
    ("trainer.max_steps=-2", "trainer.max_steps must be a positive integer or -1"),
    ("trainer.max_steps=abc", "trainer.max_steps must be a positive integer or -1"),
    ("trainer.max_steps=-1 trainer.max_epochs=-1", "would train forever"),
    ("trainer.max_epochs=0", "trainer.max_epochs must be a positive integer, -1 or null"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches must be a positive"),
    ("trainer.accumulate_grad_batches=1.5", "trainer.accumulate_grad_batches must be a positive"),
    ("trainer.devices=0", "trainer.devices must be a positive integer or auto"),
    ("trainer.devices=abc", "trainer.devices must be a positive integer or auto"),
    ("trainer.num_nodes=0", "trainer.num_nodes must be a positive integer"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval must be a positive integer"),
    ("trainer.val_check_interval=1.5", "trainer.val_check_interval must be a positive integer"),
    ("trainer.check_val_every_n_epoch=0", "trainer.check_val_every_n_epoch must be a positive"),
    ("trainer.log_every_n_steps=0", "trainer.log_every_n_steps must be a positive integer"),
    ("trainer.num_sanity_val_steps=-2", "trainer.num_sanity_val_steps must be an integer >= -1"),
    ("trainer.gradient_clip_val=-1", "trainer.gradient_clip_val must be a number in [0, inf)"),
    ("trainer.enable_progress_bar=maybe", "trainer.enable_progress_bar must be true or false"),
    ("trainer.deterministic=sometimes", "trainer.deterministic must be true, false or warn"),
    ("trainer.precision=17", "trainer cannot be built: ValueError: Precision 17 is invalid"),
    ("trainer.accelerator=foo", "trainer cannot be built: ValueError: You selected an invalid"),
    ("trainer.accelerator=3", "trainer.accelerator must be a name"),
    # callbacks.*, strategy, top level
    ("callbacks.lr_scaler.rule=foo", "callbacks.lr_scaler cannot be built"),
    ("callbacks.lr_scaler.enabled=maybe", "callbacks.lr_scaler.enabled must be true or false"),
    ("callbacks.checkpoint.every_n_train_steps=-1", "callbacks.checkpoint cannot be built"),
    ("callbacks.throughput.log_every_n_steps=0", "callbacks.throughput cannot be built"),
    ("strategy=deepspeed strategy.stage=7", "strategy.stage must be a ZeRO stage 0, 1, 2 or 3"),
    ("strategy=deepspeed strategy.offload_optimizer=yes", "strategy.offload_optimizer must be"),
    ("+foo=1", "Unknown top-level setting(s) ['foo']"),
    ("+ckpt=last.ckpt", "Unknown top-level setting(s) ['ckpt']"),
    ("seed=-1", "seed must be an integer >= 0"),
    ("seed=abc", "seed must be an integer >= 0"),
    ("test=maybe", "test must be true or false"),
    ("test=true", "test=true needs a test split: set data.test > 0"),
    ("cpu_threads=0", "cpu_threads must be a positive integer or null"),
    ("cpu_threads=two", "cpu_threads must be a positive integer or null"),
    ("output_dir=null", "output_dir must be a path"),
    ("ckpt_path={tmp}/missing.ckpt", "ckpt_path={tmp}/missing.ckpt does not exist"),
    ("ckpt_path={tmp}", "ckpt_path={tmp} is a directory"),
    ("ckpt_path={tmp}/ok.tsv", "is not a torch checkpoint"),
    ("ckpt_path=5", "ckpt_path must be a path"),
    ("on_resume_mismatch=foo", "on_resume_mismatch must be one of error, restart_epoch"),
]


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("bad")
    (tmp / "a.en").write_text("".join(f"sentence {i}\n" for i in range(200)))
    (tmp / "short.de").write_text("".join(f"Satz {i}\n" for i in range(150)))
    (tmp / "empty.tsv").write_text("")
    (tmp / "notab.tsv").write_text("hello\tHallo\nno tab here\n")
    (tmp / "latin1.tsv").write_bytes("caf\xe9\tKaff\xe9e\n".encode("latin-1") * 50)
    (tmp / "ok.tsv").write_text("".join(f"hello {i}\tHallo {i}\n" for i in range(100)))
    return tmp


@pytest.fixture(scope="module")
def hydra_conf() -> Iterator[None]:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        yield


@pytest.mark.parametrize(("overrides", "message"), CASES, ids=[c[0] for c in CASES])
def test_bad_setting_is_named_before_training(
    overrides: str, message: str, bad_files: Path, tmp_path: Path, hydra_conf: None
) -> None:
    out = tmp_path / "run"
    given = overrides.replace("{tmp}", str(bad_files)).split()
    cfg = compose("config", overrides=[*BASE, f"output_dir={out}", *given])
    with pytest.raises(ConfigError) as info:
        train(cfg)
    assert message.replace("{tmp}", str(bad_files)) in str(info.value), str(info.value)
    assert not out.exists(), "a refused run must not write anything"


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.bucket_width=0"], "data.bucket_width must be a positive integer"),
    ],
)
def test_command_line_exits_2_and_writes_nothing(
    overrides: list[str], message: str, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    script = str(ROOT / "examples" / "translation" / "train.py")
    proc = subprocess.run(
        [sys.executable, script, *overrides, f"output_dir={run}"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("Configuration error:") and message in proc.stderr
    assert not run.exists()
