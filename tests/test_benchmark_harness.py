"""The benchmarks' child-process protocol and training settings (``benchmarks/harness.py``).

Real child processes throughout: a benchmark that measures in a fresh process reports through
``emit_result`` / ``run_child``, and a child that fails says which command and why.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import pytest

from benchmarks import workload as training_workload
from benchmarks.harness import (
    TAIL_CHARS,
    ChildFailed,
    TrainingSettings,
    child_command,
    read_results,
    run_child,
    run_children,
)
from benchmarks.training import compile_shapes, packing
from benchmarks.training import throughput as training_throughput

ROOT = Path(__file__).resolve().parents[1]
EMIT = "import sys\nfrom benchmarks.harness import emit_result\n"


def python(code: str, *args: str) -> list[str]:
    return [sys.executable, "-c", EMIT + code, *args]


def test_results_come_back_in_order_and_other_output_is_ignored() -> None:
    code = (
        "print('loading')\n"
        "emit_result({'steps': 3, 'peak_mb': None})\n"
        "print('RESULTS are not results', file=sys.stderr)\n"
        "emit_result([1.5, 'a'])\n"
        "emit_result(7)\n"
    )
    assert run_child(python(code)) == [{"steps": 3, "peak_mb": None}, [1.5, "a"], 7]


def test_read_results_decodes_only_prefixed_lines() -> None:
    text = 'RESULT {"a": 1}\nRESULTx 2\n RESULT 3\nRESULT "b"\n'
    assert read_results(text) == [{"a": 1}, "b"]


@pytest.mark.parametrize(
    ("code", "returncode", "reason"),
    [
        ("emit_result(1)\nsys.exit(3)", 3, "exited with code 3"),
        ("raise SystemExit('bad settings: max_tokens=-1')", 1, "exited with code 1"),
        ("print('no result here')", 0, "printed no RESULT line"),
    ],
)
def test_a_failed_child_names_its_command_and_ends_with_its_stderr(
    code: str, returncode: int, reason: str
) -> None:
    command = python("print('the cause', file=sys.stderr)\n" + code, "--child", "a")
    with pytest.raises(ChildFailed) as info:
        run_child(command)
    assert type(info.value) is ChildFailed
    (failure,) = info.value.failures
    assert failure.command == tuple(command)
    assert failure.returncode == returncode
    assert failure.reason == reason
    assert failure.stderr.startswith("the cause")
    message = str(info.value)
    assert "--child a" in message and reason in message
    assert message.rstrip().endswith(failure.stderr.rstrip())


def test_the_stderr_shown_is_the_tail() -> None:
    code = "sys.stderr.write('x' * 10000 + 'the end')\nsys.exit(1)"
    with pytest.raises(ChildFailed) as info:
        run_child(python(code))
    (failure,) = info.value.failures
    assert len(failure.stderr) == TAIL_CHARS and failure.stderr.endswith("the end")


@pytest.mark.slow
def test_a_child_past_its_timeout_is_killed() -> None:
    t0 = time.monotonic()
    with pytest.raises(ChildFailed) as info:
        run_child(python("import time\ntime.sleep(60)"), timeout=2)
    assert time.monotonic() - t0 < 30
    (failure,) = info.value.failures
    assert failure.returncode is None and failure.reason == "timed out after 2 s"


def test_children_run_together_and_report_each_own_results(tmp_path: Path) -> None:
    # each child waits for the other's file: they only finish if they run at the same time
    code = (
        "import os, time\n"
        "me, other = sys.argv[1], sys.argv[2]\n"
        "open(me, 'w').close()\n"
        "deadline = time.monotonic() + 30\n"
        "while not os.path.exists(other) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "emit_result({'rank': me[-1], 'saw_other': os.path.exists(other)})\n"
        "emit_result('done')\n"
    )
    a, b = str(tmp_path / "r0"), str(tmp_path / "r1")
    found = run_children([python(code, a, b), python(code, b, a)], timeout=60)
    assert found == [
        [{"rank": "0", "saw_other": True}, "done"],
        [{"rank": "1", "saw_other": True}, "done"],
    ]


def test_children_name_every_one_that_did_not_report() -> None:
    ok, bad = python("emit_result(1)"), python("sys.exit('rank 1 broke')")
    with pytest.raises(ChildFailed) as info:
        run_children([ok, bad, bad])
    assert [f.command for f in info.value.failures] == [tuple(bad), tuple(bad)]
    assert all(f.stderr.strip() == "rank 1 broke" for f in info.value.failures)


@pytest.mark.slow
def test_a_timeout_kills_every_child_of_the_group() -> None:
    sleeper = python("import time\ntime.sleep(60)\nemit_result(1)")
    t0 = time.monotonic()
    with pytest.raises(ChildFailed) as info:
        run_children([sleeper, sleeper], timeout=2)
    assert time.monotonic() - t0 < 30
    assert len(info.value.failures) == 2


# -- the benchmarks' own children ------------------------------------------------------------------

S = TypeVar("S", bound=TrainingSettings)


def tiny(s: S, **changes: Any) -> S:
    """``s`` with a model of a few thousand weights."""
    return dataclasses.replace(s, d_model=16, ffn=32, layers=1, nhead=2, **changes)


TRANSLATION_TINY = tiny(training_workload.DEFAULTS, target_tokens=300, vocab=100)


def test_a_benchmark_child_that_fails_names_the_benchmark_command() -> None:
    s = TRANSLATION_TINY
    with pytest.raises(ChildFailed) as info:
        training_throughput.spawn("benchmarks.training.throughput", "z", s)
    (failure,) = info.value.failures
    assert failure.returncode == 2 and "invalid choice: 'z'" in failure.stderr
    assert "python -m benchmarks.training.throughput --child z --settings" in str(info.value)


@pytest.mark.slow
def test_training_children_report_what_the_run_in_this_process_reports() -> None:
    """``spawn`` (a fresh process) and the in-process run train the same batches."""
    s = dataclasses.replace(TRANSLATION_TINY, max_steps=3)
    lm = tiny(packing.DEFAULTS, target_tokens=600, length_div=16, max_steps=2)
    arm = tiny(compile_shapes.DEFAULTS, docs=60, max_tokens=512, vocab=64, max_steps=2)
    # the three children at once, while this process trains (each is mostly its imports)
    with ThreadPoolExecutor(3) as pool:
        child_f = pool.submit(training_throughput.spawn, "benchmarks.training.throughput", "a", s)
        child_lm_f = pool.submit(packing.spawn, "benchmarks.training.packing", "packed", lm)
        child_arm_f = pool.submit(compile_shapes.spawn, "eager_free", arm)
        here = training_workload.run_config("a", s)
        here_lm = packing.run_train("packed", lm)
        child, child_lm, child_arm = child_f.result(), child_lm_f.result(), child_arm_f.result()
    assert (child.steps, child.slots, child.real, child.real_tgt) == (
        here.steps,
        here.slots,
        here.real,
        here.real_tgt,
    )
    assert (child_lm.steps, child_lm.real, child_lm.slots) == (
        here_lm.steps,
        here_lm.real,
        here_lm.slots,
    )
    assert child_arm.steps == 2 and child_arm.finite and child_arm.graphs == 0


# -- the training settings -------------------------------------------------------------------------


def test_each_workload_keeps_its_defaults() -> None:
    """The defaults each benchmark had before its settings shared one type (its figures)."""
    model = ("vocab", "d_model", "nhead", "layers", "ffn", "lr", "warmup", "threads", "seed")
    expected = [
        (training_workload.DEFAULTS, (8000, 128, 4, 2, 512, 1e-4, 2, 1, 0, 1024)),
        (packing.DEFAULTS, (512, 64, 4, 2, 256, 1e-3, 2, 1, 0, 2048)),
        (compile_shapes.DEFAULTS, (1000, 128, 4, 2, 512, 1e-3, 3, 1, 0, 4096)),
    ]
    for s, values in expected:
        assert tuple(getattr(s, k) for k in (*model, "max_tokens")) == values
        assert (s.device, s.bf16, s.max_steps) == ("cpu", False, None)
    t, lm, c = training_workload.DEFAULTS, packing.DEFAULTS, compile_shapes.DEFAULTS
    assert (t.target_tokens, t.length_scale, t.dropout) == (40_000, 0.5, 0.1)
    assert (lm.target_tokens, lm.length_div, lm.backend) == (100_000, 8, "auto")
    assert (c.docs, c.max_shapes, c.storm_steps, c.paired_steps, c.backend) == (
        10_000,
        8,
        3,
        40,
        "inductor",
    )


@pytest.mark.parametrize(
    "defaults", [training_workload.DEFAULTS, packing.DEFAULTS, compile_shapes.DEFAULTS]
)
def test_settings_travel_to_a_child_unchanged(defaults: TrainingSettings) -> None:
    s = dataclasses.replace(defaults, seed=5, max_steps=4, device="cuda:1", bf16=True)
    back = type(s).from_json(s.to_json())
    assert back == s and type(back) is type(s)
    code = (
        f"from {type(s).__module__} import {type(s).__name__} as S\n"
        "emit_result(S.from_json(sys.argv[1]).to_json())\n"
    )
    (text,) = run_child(python(code, s.to_json()))
    assert type(s).from_json(text) == s


def test_a_workload_states_its_budget_and_model() -> None:
    with pytest.raises(TypeError):
        training_workload.TranslationSettings()  # type: ignore[call-arg]


def test_every_benchmark_child_goes_through_the_harness() -> None:
    """No benchmark but the harness starts processes or reads result lines itself.

    ``run_all`` streams whole benchmarks' output to the terminal and a log: not a child
    that reports results.
    """
    found = []
    for path in sorted((ROOT / "benchmarks").glob("*.py")):
        if path.stem in ("harness", "run_all"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in ("run", "Popen", "check_output"):
                if isinstance(node.value, ast.Name) and node.value.id == "subprocess":
                    found.append(f"{path.name}:{node.lineno} subprocess.{node.attr}")
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if node.value.startswith("RESULT "):
                    found.append(f"{path.name}:{node.lineno} {node.value!r}")
    assert found == []


def test_child_command_runs_this_interpreter() -> None:
    assert child_command("benchmarks.training.packing", "--child", "packed") == [
        sys.executable,
        "-m",
        "benchmarks.training.packing",
        "--child",
        "packed",
    ]


def test_stale_reruns_keep_the_recorded_settings_but_not_the_recorded_output_path(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``python -m benchmarks --stale``: the recorded arguments again, the output in ``--out``
    (a recorded ``--json /tmp/...`` folder need not exist on the machine that reruns it)."""
    from benchmarks import results, run_all

    recorded = "python -m benchmarks.training.straggler --json /tmp/gone/x.json --max-tokens 512"
    monkeypatch.setattr(results, "stale_results", lambda: {"straggler": ["a module"]})
    monkeypatch.setattr(results, "load_result", lambda name: {"provenance": {"command": recorded}})
    assert run_all.stale_commands() == [("training.straggler", ["--max-tokens", "512"])]
