"""Extract the fenced code blocks of README.md and docs/*.md and run or check each one.

Every block needs a way to be tested. A block's kind comes from its language and an optional
annotation, an HTML comment among the comment lines right above the opening fence::

    <!-- doctest: KIND ARGS -->

=========  ============================  ==========================================================
language   kind (default first)          what the test does
=========  ============================  ==========================================================
python     ``run``                       exec in the file's namespace, in order (stdout captured)
python     ``file NAME``                 write it as ``NAME`` into the file's work folder; compile
python     ``skip-run (WHY)``            compile; ``lightning_varbatch`` imports must resolve
bash       ``run [timeout=S]``           ``bash -euo pipefail`` in the work folder; must exit 0
bash       ``skip-run (WHY)``            static checks of every command (see :func:`check_bash`)
bash       ``file NAME``                 written into the work folder, then as ``skip-run``
text       ``output``                    every line matches a line the previous run printed
text       ``quote MODULE``              the text is a string literal of ``MODULE`` (e.g. an error)
=========  ============================  ==========================================================

A bash block without an annotation, a text block without one, or a block in any other language
fails the test: nothing in the docs goes unchecked by accident. All blocks of one Markdown file
share one work folder (a fresh temporary directory, also the working directory of the python
blocks) and one Python namespace, so a page reads top to bottom like a session.

Static checks of a bash command: ``python PATH`` needs ``PATH`` to exist (repository or work
folder) and, for ``examples/translation/train.py``, its Hydra overrides must compose against
``conf/``; ``python -m MOD`` needs an importable module, and ``lightning_varbatch.plan``
arguments must parse; ``torchrun`` arguments must parse with torch's own parser (``$VARS``
replaced by ``0``) and its script is checked as above; ``srun``/``sbatch`` wrap a checked
command; ``pip install`` pins must match the installed torch and name existing extras.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.metadata
import importlib.util
import io
import itertools
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)\s*(?P<lang>[\w+-]*)\s*$")
_COMMENT = re.compile(r"^\s*<!--.*-->\s*$")
_ANNOTATION = re.compile(r"<!--\s*doctest:\s*(?P<spec>.*?)\s*-->")
_KINDS = {
    "python": ("run", "file", "skip-run"),
    "bash": ("run", "skip-run", "file"),
    "text": ("output", "quote"),
}
_DEFAULT = {"python": "run"}
_KNOWN_COMMANDS = {
    "python",
    "python3",
    "pip",
    "torchrun",
    "srun",
    "sbatch",
    "ruff",
    "mypy",
    ".",
    "source",
    "export",
    "cd",
    "tensorboard",
}
_WRAPPERS = {"srun", "sbatch", "env", "time"}
_TRAIN_SCRIPT = "examples/translation/train.py"


class DocError(AssertionError):
    """A block of the docs failed its test; the message names the file and line."""


@dataclass
class Block:
    """One fenced code block."""

    path: Path
    line: int  # 1-based line of the first code line
    lang: str
    code: str
    kind: str
    args: str = ""

    @property
    def where(self) -> str:
        """``file:line`` of the block, relative to the repository."""
        try:
            rel = self.path.relative_to(ROOT)
        except ValueError:
            rel = self.path
        return f"{rel}:{self.line}"


@dataclass
class Session:
    """What the blocks of one Markdown file share."""

    workdir: Path
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__docs__"})
    last_output: str | None = None
    ran: list[str] = field(default_factory=list)


def parse(path: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of a Markdown file, with their kinds.

    Raises:
        DocError: for an unclosed fence, an unknown language or kind, or a block that needs an
            annotation and has none.
    """
    lines = (path.read_text() if text is None else text).splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, fence, lang = m["indent"], m["fence"], m["lang"].lower()
        start = i
        body: list[str] = []
        i += 1
        while i < len(lines) and not (
            lines[i].strip().startswith(fence) and lines[i].strip().strip(fence[0]) == ""
        ):
            line = lines[i]
            body.append(line[len(indent) :] if line.startswith(indent) else line.lstrip())
            i += 1
        if i == len(lines):
            raise DocError(f"{path}:{start + 1}: the code fence is never closed.")
        i += 1
        spec = _annotation(lines, start)
        where = f"{path}:{start + 1}"
        if lang in ("sh", "shell", "console"):
            raise DocError(f"{where}: write ```bash, not ```{lang}.")
        if lang not in _KINDS:
            raise DocError(
                f"{where}: a ```{lang or '(no language)'} block cannot be tested; use one of "
                f"{', '.join(_KINDS)} with a <!-- doctest: ... --> annotation if needed."
            )
        if spec is None:
            if lang not in _DEFAULT:
                raise DocError(
                    f"{where}: a ```{lang} block needs an annotation above it, one of "
                    + ", ".join(f"<!-- doctest: {k} -->" for k in _KINDS[lang])
                )
            kind, args = _DEFAULT[lang], ""
        else:
            kind, _, args = spec.partition(" ")
            args = args.strip()
        if kind not in _KINDS[lang]:
            raise DocError(f"{where}: unknown doctest kind {kind!r} for ```{lang}.")
        if kind == "skip-run" and not re.fullmatch(r"\(.+\)", args):
            raise DocError(f"{where}: skip-run needs a reason: <!-- doctest: skip-run (why) -->.")
        if kind in ("file", "quote") and not re.fullmatch(r"[\w./-]+", args):
            raise DocError(f"{where}: {kind} needs a name: <!-- doctest: {kind} NAME -->.")
        blocks.append(Block(path, start + 2, lang, "\n".join(body) + "\n", kind, args))
    return blocks


def _annotation(lines: list[str], fence_index: int) -> str | None:
    j = fence_index - 1
    found: list[str] = []
    while j >= 0 and (not lines[j].strip() or _COMMENT.match(lines[j])):
        m = _ANNOTATION.search(lines[j])
        if m:
            found.append(m["spec"])
        j -= 1
    if len(found) > 1:
        raise DocError(f"line {fence_index + 1}: more than one doctest annotation.")
    return found[0] if found else None


# -- running ---------------------------------------------------------------------------------


def run_file(path: Path, workdir: Path) -> Session:
    """Run or check every block of one Markdown file, in order.

    Raises:
        DocError: at the first block that fails, naming it.
    """
    session = Session(workdir)
    for block in parse(path):
        run_block(block, session)
    return session


def run_block(block: Block, session: Session) -> None:
    """Run or check one block (see the module docstring)."""
    handler = {
        ("python", "run"): _python_run,
        ("python", "file"): _python_file,
        ("python", "skip-run"): _python_static,
        ("bash", "run"): _bash_run,
        ("bash", "skip-run"): _bash_static,
        ("bash", "file"): _bash_file,
        ("text", "output"): _text_output,
        ("text", "quote"): _text_quote,
    }[(block.lang, block.kind)]
    handler(block, session)
    session.ran.append(f"{block.where} {block.lang} {block.kind}")


def _compile(block: Block) -> Any:
    try:
        tree = ast.parse(block.code, filename=str(block.path))
    except SyntaxError as err:
        raise DocError(f"{block.where}: not valid Python: {err}") from None
    ast.increment_lineno(tree, block.line - 1)
    return tree


def _python_run(block: Block, session: Session) -> None:
    code = compile(_compile(block), str(block.path), "exec")
    out = io.StringIO()
    cwd = Path.cwd()
    os.chdir(session.workdir)
    try:
        with contextlib.redirect_stdout(out):
            exec(code, session.namespace)
    except BaseException as err:
        raise DocError(
            f"{block.where}: the python block raised {type(err).__name__}: {err}\n"
            f"--- its output ---\n{out.getvalue()}"
        ) from err
    finally:
        os.chdir(cwd)
    session.last_output = out.getvalue()
    sys.stdout.write(session.last_output)


def _python_file(block: Block, session: Session) -> None:
    _python_static(block, session)
    (session.workdir / block.args).write_text(block.code)


def _python_static(block: Block, session: Session) -> None:
    tree = _compile(block)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
            "lightning_varbatch"
        ):
            module = importlib.import_module(node.module or "")
            missing = [a.name for a in node.names if not hasattr(module, a.name)]
            if missing:
                raise DocError(f"{block.where}: {node.module} has no {', '.join(missing)}.")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("lightning_varbatch"):
                    importlib.import_module(alias.name)


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def _bash_run(block: Block, session: Session) -> None:
    m = re.fullmatch(r"(?:timeout=(\d+))?", block.args)
    if m is None:
        raise DocError(f"{block.where}: bad run arguments {block.args!r} (timeout=SECONDS).")
    timeout = int(m[1] or 60)
    try:
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block.code],
            cwd=session.workdir,
            env=_env(),
            capture_output=True,
            text=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as err:
        raise DocError(
            f"{block.where}: the bash block ran over {timeout} s.\n{err.stdout}"
        ) from err
    output = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise DocError(
            f"{block.where}: the bash block exited with {proc.returncode}:\n{output[-6000:]}"
        )
    session.last_output = output
    sys.stdout.write(output)


def _bash_file(block: Block, session: Session) -> None:
    (session.workdir / block.args).write_text(block.code)
    _bash_static(block, session)


def _bash_static(block: Block, session: Session) -> None:
    checked = check_bash(block.code, session.workdir)
    if not checked:
        raise DocError(f"{block.where}: the bash block holds no command to check.")
    for problem in (p for p in checked if p):
        raise DocError(f"{block.where}: {problem}")


def _normalise(text: str) -> str:
    return " ".join(text.split())


def _text_output(block: Block, session: Session) -> None:
    if session.last_output is None:
        raise DocError(f"{block.where}: an output block must follow a block that runs.")
    got = [_normalise(line) for line in session.last_output.splitlines()]
    for expected in filter(None, (_normalise(x) for x in block.code.splitlines())):
        pattern = ".*".join(re.escape(part) for part in expected.split("..."))
        if not any(re.fullmatch(pattern, line) for line in got):
            raise DocError(
                f"{block.where}: no output line matches {expected!r} ('...' matches anything).\n"
                f"--- the output ---\n{session.last_output[-4000:]}"
            )


def _text_quote(block: Block, session: Session) -> None:
    spec = importlib.util.find_spec(block.args)
    if spec is None or spec.origin is None:
        raise DocError(f"{block.where}: module {block.args} not found.")
    tree = ast.parse(Path(spec.origin).read_text())
    literals = [
        _normalise(node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]
    quoted = _normalise(block.code)
    if not any(quoted in literal for literal in literals):
        raise DocError(f"{block.where}: this text is not a string in {block.args}:\n{quoted}")


# -- static checks of shell commands -----------------------------------------------------------


def _commands(code: str) -> Iterator[list[str]]:
    """The simple commands of a bash snippet (continuations joined, comments dropped)."""
    joined = re.sub(r"\\\n", " ", code)
    for line in joined.splitlines():
        tokens = shlex.split(line, comments=True)
        command: list[str] = []
        for token in [*tokens, "&&"]:
            if token in ("&&", "||", ";", "|"):
                if command:
                    yield command
                command = []
            else:
                command.append(token)


def _expand(token: str) -> str:
    return re.sub(r"\$\{?\w+\}?", "0", token)


def check_bash(code: str, workdir: Path) -> list[str | None]:
    """Check each command of a bash snippet; one entry per command: ``None`` or a problem."""
    return [check_command(c, workdir) for c in _commands(code)]


def check_command(argv: list[str], workdir: Path) -> str | None:
    """Check one command (see the module docstring); returns a problem or ``None``."""
    while argv and re.fullmatch(r"\w+=.*", argv[0]):
        argv = argv[1:]  # environment assignments
    if not argv:
        return None
    name = argv[0]
    if name not in _KNOWN_COMMANDS:
        return f"command {name!r} is not one the doc test knows how to check ({argv})."
    if name in _WRAPPERS:
        inner = next(
            (i for i, a in enumerate(argv) if a in ("python", "python3", "torchrun")), None
        )
        return None if inner is None else check_command(argv[inner:], workdir)
    if name == "torchrun":
        return _check_torchrun(argv[1:], workdir)
    if name in ("python", "python3"):
        return _check_python(argv[1:], workdir)
    if name == "pip":
        return _check_pip(argv[1:])
    return None


def _check_torchrun(args: list[str], workdir: Path) -> str | None:
    from torch.distributed.run import get_args_parser

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            parsed = get_args_parser().parse_args([_expand(a) for a in args])
    except SystemExit:
        return f"torchrun does not accept {args}."
    if parsed.module:
        return _check_python(["-m", parsed.training_script, *parsed.training_script_args], workdir)
    return _check_python([parsed.training_script, *parsed.training_script_args], workdir)


def _check_python(args: list[str], workdir: Path) -> str | None:
    if not args or args[0] == "-c":
        return None
    if args[0] == "-m":
        module = args[1]
        if module == "venv":
            return None
        if importlib.util.find_spec(module) is None:
            return f"python -m {module}: no such module."
        if module == "lightning_varbatch.plan":
            from lightning_varbatch.plan import _parser

            try:
                with contextlib.redirect_stderr(io.StringIO()):
                    _parser().parse_args(args[2:])
            except SystemExit:
                return f"python -m lightning_varbatch.plan does not accept {args[2:]}."
        return None
    script = args[0]
    if not ((ROOT / script).is_file() or (workdir / script).is_file()):
        return f"python {script}: no such file in the repository or the doc's work folder."
    if script == _TRAIN_SCRIPT:
        return check_overrides(args[1:])
    return None


def check_overrides(overrides: list[str]) -> str | None:
    """Compose the translation example's config with these command-line overrides.

    ``-m``/``--multirun`` sweeps (``key=a,b``) compose once per value.
    """
    from hydra import compose, initialize_config_dir

    overrides = [o for o in overrides if o not in ("-m", "--multirun")]
    choices = [
        [f"{o.split('=', 1)[0]}={v}" for v in o.split("=", 1)[1].split(",")]
        if "=" in o and "," in o and "[" not in o
        else [o]
        for o in overrides
    ]
    for combination in itertools.product(*choices):
        try:
            with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base="1.3"):
                compose("config", overrides=list(combination))
        except Exception as err:
            return f"train.py overrides {list(combination)} do not compose: {err}"
    return None


def _check_pip(args: list[str]) -> str | None:
    if args[:1] != ["install"]:
        return None
    import torch

    extras = importlib.metadata.metadata("lightning_varbatch").get_all("Provides-Extra") or []
    for arg in args[1:]:
        if arg.startswith("torch=="):
            installed = torch.__version__.split("+")[0]
            if arg != f"torch=={installed}":
                return f"the docs pin {arg} but torch {installed} is installed."
        m = re.fullmatch(r"\.\[(.*)\]", arg)
        if m:
            unknown = set(m[1].split(",")) - set(extras)
            if unknown:
                return f"pip install {arg}: lightning_varbatch has no extra(s) {sorted(unknown)}."
    return None
