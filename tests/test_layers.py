"""The layers of the package, enforced: a numpy-only planner, imports in one direction, no cycles.

The rule (docs/architecture.md): ``lightning_varbatch.planner`` and the plan CLI import only
numpy and the standard library; ``import lightning_varbatch`` loads no torch; the torch layers
never import each other in a circle; and no module anywhere in the repository takes part in an
import cycle.
"""

from __future__ import annotations

import ast
import functools
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "lightning_varbatch"

# Imports fail for these inside the subprocess, as on a machine that never installed them.
BLOCKER = """
import importlib.abc, sys
BLOCKED = {"torch", "lightning", "pytorch_lightning", "deepspeed", "hydra", "omegaconf",
           "torchmetrics", "lightning_fabric", "lightning_utilities"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"{name} is blocked in this test")
        return None
sys.meta_path.insert(0, Block())
"""


def run_blocked(code: str, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", BLOCKER + code, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_planner_runs_without_torch_lightning_deepspeed_hydra() -> None:
    done = run_blocked(
        "import lightning_varbatch\n"
        "from lightning_varbatch.planner import EpochPlanner, MixturePlanner, PlanConfig\n"
        "from lightning_varbatch.planner import diagnose\n"
        "planner = EpochPlanner([3, 5, 2, 7, 4] * 20, PlanConfig(max_tokens=16))\n"
        "mix = MixturePlanner([[3] * 40, [5] * 12], PlanConfig(max_tokens=16))\n"
        "plan = planner.plan(epoch=1, world_size=2, accumulate_grad_batches=2)\n"
        "print(diagnose(planner, plan).num_micro_batches, mix.plan(0, 2).num_steps)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch'))\n"
    )
    assert done.returncode == 0, done.stderr
    counts, loaded = done.stdout.strip().splitlines()
    assert loaded == "[]"
    assert all(int(c) > 0 for c in counts.split())


def test_plan_cli_runs_without_torch(tmp_path: Path) -> None:
    done = run_blocked(
        "import runpy\n"
        "sys.argv = ['plan'] + sys.argv[1:]\n"
        "runpy.run_module('lightning_varbatch.plan', run_name='__main__')\n",
        "--synthetic",
        "wmt",
        "--num-examples",
        "20000",
        "--max-tokens",
        "4096",
        "--world-size",
        "4",
        "--no-png",
        "--json",
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["equal_counts"] is True
    assert report["num_examples"] == 20000


def test_plan_cli_reads_a_saved_dataset_without_torch_or_datasets(tmp_path: Path) -> None:
    import datasets

    folder = tmp_path / "wmt"
    rows = {"src_ids": [[1] * (3 + i % 40) for i in range(600)], "tgt_ids": [[2, 3]] * 600}
    datasets.Dataset.from_dict(rows).save_to_disk(str(folder))
    done = run_blocked(
        "BLOCKED.add('datasets')  # the dataset is read with pyarrow alone\n"
        "from lightning_varbatch.plan import main\n"
        "code = main(sys.argv[1:])\n"
        "loaded = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'datasets', "
        "'pyarrow'})\n"
        "print(loaded, file=sys.stderr)\n"
        "sys.exit(code)\n",
        *("--dataset", str(folder), "--column", "src_ids", "--column", "tgt_ids"),
        *("--max-tokens", "512", "--world-size", "2", "--no-png", "--json"),
    )
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "['pyarrow']"
    report = json.loads(done.stdout)
    assert report["num_examples"] == 600 and report["equal_counts"] is True


def test_a_torch_name_still_fails_clearly_without_torch() -> None:
    done = run_blocked("import lightning_varbatch\nlightning_varbatch.TokenBudgetDataModule\n")
    assert done.returncode != 0
    assert "torch is blocked" in done.stderr


@pytest.mark.slow
def test_strategies_are_registered_after_a_plain_import() -> None:
    code = (
        "import lightning_varbatch\n"
        "from lightning.pytorch import Trainer\n"
        "trainer = Trainer(strategy='deepspeed_varbatch', accelerator='cpu', devices=1,"
        " logger=False, enable_progress_bar=False)\n"
        "print(type(trainer.strategy).__name__)\n"
        "trainer = Trainer(strategy='fsdp_varbatch', accelerator='cpu', devices=1, logger=False)\n"
        "print(type(trainer.strategy).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split()[-2:] == ["VarBatchDeepSpeedStrategy", "VarBatchFSDPStrategy"]


# -- the import graph ---------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def python_files() -> list[Path]:
    """The repository's modules: not under a hidden folder (``.venv``, ...) or build output."""
    skip = {"outputs", "build", "__pycache__"}
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not skip & set(p.relative_to(ROOT).parts)
        and not any(part.startswith(".") for part in p.relative_to(ROOT).parts)
    )


def imports_of(path: Path, known: set[str], type_only: bool = False) -> set[str]:
    """Repository modules ``path`` imports (at any depth in the file; under TYPE_CHECKING too
    with ``type_only``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = module_name(path) if path.name == "__init__.py" else module_name(path.parent)
    found: set[str] = set()
    type_checking = {
        id(n)
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        for n in ast.walk(node)
        if not type_only
    }
    for node in ast.walk(tree):
        if id(node) in type_checking:
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            # `from pkg import sub` imports the submodule; `from pkg import name` the package.
            names = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        for name in names:
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name and name != module_name(path):
                found.add(name)
    return found


@functools.cache
def graph(type_only: bool = False) -> dict[str, set[str]]:
    """Every module of the repository -> the repository modules it imports (read once)."""
    files = python_files()
    known = {module_name(p) for p in files}
    return {module_name(p): imports_of(p, known, type_only) for p in files}


def test_no_import_cycles_anywhere_in_the_repository() -> None:
    """No cycle, type-only imports included: a module's types come from modules below it."""
    # A package's __init__ importing its own submodules is not a cycle of the layers (a copy:
    # graph() is cached for the other tests).
    edges = {
        name: {t for t in targets if not name.startswith(t + ".")}
        for name, targets in graph(type_only=True).items()
    }
    state: dict[str, int] = {}
    cycles: list[list[str]] = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [node])
    assert cycles == []


#: The settings vocabulary (stdlib and numpy only): every layer may import it.
VOCABULARY = {"lightning_varbatch.errors", "lightning_varbatch.checks"}
LAYERS = {  # what each layer of the package may import from the package (and VOCABULARY)
    "lightning_varbatch.errors": set(),
    "lightning_varbatch.checks": {"lightning_varbatch.errors"},
    "lightning_varbatch.planner": {"lightning_varbatch.planner"},
    "lightning_varbatch.plan": {"lightning_varbatch.planner", "lightning_varbatch.sources"},
    "lightning_varbatch.sources": {"lightning_varbatch.planner", "lightning_varbatch.sources"},
    "lightning_varbatch.keys": set(),
    "lightning_varbatch.attention": {"lightning_varbatch.attention"},
    "lightning_varbatch.loss": {"lightning_varbatch.keys"},
    "lightning_varbatch.data": {
        "lightning_varbatch.planner",
        "lightning_varbatch.sources",
        "lightning_varbatch.data",
        "lightning_varbatch.keys",
    },
    "lightning_varbatch.strategies": {"lightning_varbatch.strategies"},
    "lightning_varbatch.callbacks": {
        "lightning_varbatch.callbacks",
        "lightning_varbatch.keys",
        "lightning_varbatch.data",  # the worst-batch check reads the sampler's plan
        "lightning_varbatch.planner",
        "lightning_varbatch.peak_memory",  # the worst-batch check measures with it
    },
    "lightning_varbatch.memory": {"lightning_varbatch.memory", "lightning_varbatch.planner"},
    "lightning_varbatch.peak_memory": set(),  # stdlib (torch for CUDA): benchmarks share it
}
THIRD_PARTY_OF_PLANNER = {"numpy"}


@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_layer_imports_only_what_it_may(layer: str) -> None:
    edges = graph()
    allowed = LAYERS[layer] | (VOCABULARY if layer not in VOCABULARY else set())
    members = [m for m in edges if m == layer or m.startswith(layer + ".")]
    assert members, layer
    wrong = {
        (m, t)
        for m in members
        for t in edges[m]
        if t.startswith("lightning_varbatch")
        and t != "lightning_varbatch"
        and not any(t == a or t.startswith(a + ".") for a in allowed)
    }
    wrong |= {(m, t) for m in members for t in edges[m] if t == "lightning_varbatch"}
    assert wrong == set()


def test_planner_imports_only_numpy_and_the_standard_library() -> None:
    stdlib = set(sys.stdlib_module_names)
    for path in (PACKAGE / "planner").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom) and not node.level
                else []
            )
            for name in names:
                top = name.split(".")[0]
                assert top in stdlib | THIRD_PARTY_OF_PLANNER | {"lightning_varbatch"}, (
                    f"{path.name} imports {name}"
                )


def test_no_module_imports_another_modules_private_names() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "lightning_varbatch"
            ):
                found += [
                    f"{path.relative_to(ROOT)}: {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and a.name != "__version__"
                ]
    assert found == []


#: The folders outside the package whose modules take only public names from the repository.
PUBLIC_ONLY = ("benchmarks", "examples")
#: The repository's own top-level packages: a private name of any of them is off limits there.
OURS = ("lightning_varbatch", *PUBLIC_ONLY)


def private_imports(source: str, package: str) -> list[str]:
    """The repository's private names (``_x``, not ``__x__``) that ``source`` imports.

    ``package`` is the dotted package of the file, against which relative imports resolve.
    """
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            module = ".".join(filter(None, [*(base if node.level else []), node.module]))
            names = [f"{module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [
            name
            for name in names
            if name.split(".")[0] in OURS
            and any(p.startswith("_") and not p.endswith("__") for p in name.split("."))
        ]
    return found


def test_the_private_import_scan_sees_every_way_of_writing_one() -> None:
    assert private_imports(
        "from lightning_varbatch.data.sampler import _state, TokenBudgetBatchSampler\n"
        "from lightning_varbatch._internal import x\n"
        "import lightning_varbatch.planner._cut\n"
        "from benchmarks.training.packing import _naive, sft_lengths\n"
        "from .harness import _tail\n"
        "from ..translation.train import _stopped, train\n"
        "from . import _helpers\n"
        "from lightning_varbatch import __version__\n"
        "from torch._dynamo.utils import counters\n",
        "examples.lm",
    ) == [
        "lightning_varbatch.data.sampler._state",
        "lightning_varbatch._internal.x",
        "lightning_varbatch.planner._cut",
        "benchmarks.training.packing._naive",
        "examples.lm.harness._tail",
        "examples.translation.train._stopped",
        "examples.lm._helpers",
    ]
    assert private_imports("from .harness import _tail\n", "benchmarks") == [
        "benchmarks.harness._tail"
    ]


@pytest.mark.parametrize("folder", PUBLIC_ONLY)
def test_benchmarks_and_examples_import_only_public_names(folder: str) -> None:
    """``benchmarks/`` and ``examples/`` take only public names from the package, from each
    other and from their own modules (what two examples share lives in ``examples/common``)."""
    found = {
        str(path.relative_to(ROOT)): private_imports(
            path.read_text(), module_name(path if path.name == "__init__.py" else path.parent)
        )
        for path in sorted((ROOT / folder).rglob("*.py"))
        if "__pycache__" not in path.parts
    }
    assert len(found) > 10
    assert {path: names for path, names in found.items() if names} == {}
