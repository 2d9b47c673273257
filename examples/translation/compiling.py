"""``compile=true``: the training forward under ``torch.compile`` on a shape budget.

``torch.compile(dynamic=False)`` specialises on tensor shapes: free token-budget batches give a
new ``(rows, length)`` nearly every step, hence a recompilation nearly every step. With
``compile=true`` the example turns on the library's shape budget (``data.max_shapes``, a
planner setting: every micro-batch padded to one of at most that many static ``(rows,
length)`` shapes, with ``data.bucket_width=1``) and compiles the model's teacher-forced
forward for the training steps only, so it compiles once per shape and never again:

- ``conf/data/default.yaml`` sets ``max_shapes: ${if:${compile},16,null}`` and
  ``bucket_width: ${if:${compile},1,2}`` (the ``if`` resolver below): ``compile=true`` alone
  gives 16 shapes and exact lengths; an explicit ``data.max_shapes=8`` wins; an explicit
  ``data.max_shapes=null`` with ``compile=true`` is refused (:func:`check_compile`).
- Validation, test and the greedy decoding stay eager (their batches have their own shapes,
  and decoding grows its prefix one token a step), so dynamo's recompile limit only has to
  cover the training shapes: :func:`raise_recompile_limit` lifts it to ``data.max_shapes``.
- :class:`CompileStats` counts the graphs dynamo compiled during training (its counters) next
  to the distinct shapes the compiled forward ran: the example prints ``compiled N graphs for
  N training shapes`` at the end and writes ``compile`` into ``metrics.json``.

Example:
    >>> from omegaconf import OmegaConf
    >>> budget = "${if:${compile},16,null}"
    >>> OmegaConf.create({"compile": True, "data": {"max_shapes": budget}}).data.max_shapes
    16
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import torch
from omegaconf import DictConfig, OmegaConf

from examples.common.config_checks import ConfigError
from examples.common.summary import rank

__all__ = [
    "DEFAULT_BACKEND",
    "CompileStats",
    "check_compile",
    "compile_training",
    "graph_counters",
    "if_resolver",
    "raise_recompile_limit",
]

#: The backend ``compile=true`` uses unless ``compile_backend`` says otherwise.
DEFAULT_BACKEND = "inductor"


def if_resolver(condition: Any, then: Any, otherwise: Any) -> Any:
    """``${if:COND,THEN,ELSE}``: ``THEN`` when ``COND`` is ``true``, else ``ELSE``.

    Example:
        >>> if_resolver(True, 16, None), if_resolver(False, 16, None)
        (16, None)
    """
    return then if condition is True else otherwise


OmegaConf.register_new_resolver("if", if_resolver, replace=True)


def _backends() -> list[str]:
    import torch._dynamo

    return sorted(torch._dynamo.list_backends(exclude_tags=()))


def check_compile(cfg: DictConfig) -> None:
    """Refuse ``compile``/``compile_backend``/``data.max_shapes`` settings that cannot work.

    Raises:
        ConfigError: naming the setting, the value received and what to change.
    """
    compile_ = cfg.get("compile", False)
    if not isinstance(compile_, bool):
        raise ConfigError(f"compile must be true or false, got {compile_!r}.")
    backend = cfg.get("compile_backend", DEFAULT_BACKEND)
    data = cfg.data
    max_shapes = data.get("max_shapes")
    if max_shapes is not None and not (
        isinstance(max_shapes, int) and not isinstance(max_shapes, bool) and max_shapes >= 1
    ):
        raise ConfigError(
            f"data.max_shapes must be a positive integer or null (free shapes), got {max_shapes!r}."
        )
    if max_shapes is not None and data.get("bucket_width") != 1:
        raise ConfigError(
            f"data.max_shapes={max_shapes} needs data.bucket_width=1 (the shapes are the "
            f"buckets), got data.bucket_width={data.get('bucket_width')!r}: drop the "
            "data.bucket_width override or set it to 1."
        )
    if not compile_:
        return
    if max_shapes is None:
        raise ConfigError(
            "compile=true needs a shape budget, but data.max_shapes=null: every micro-batch "
            "would have its own shape and torch.compile would recompile nearly every step. "
            "Drop the data.max_shapes override (compile=true sets 16) or set "
            "data.max_shapes=K (e.g. 8), or run without compile=true."
        )
    if not isinstance(backend, str) or backend not in _backends():
        raise ConfigError(
            f"compile_backend must be a torch.compile backend ({', '.join(_backends())}), "
            f"got {backend!r}."
        )


def raise_recompile_limit(shapes: int) -> int:
    """Let dynamo compile the training forward once per shape (``shapes`` of them).

    ``torch._dynamo.config.recompile_limit`` (``cache_size_limit`` before torch 2.6) caps the
    compiled versions of one function; past it dynamo falls back to eager for good. Only
    raised, never lowered (something else in the process may need more).

    Returns:
        The limit now in force.
    """
    import torch._dynamo.config as dynamo_config

    name = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
    limit = max(int(getattr(dynamo_config, name)), int(shapes))
    setattr(dynamo_config, name, limit)
    total = "accumulated_" + name
    if hasattr(dynamo_config, total):
        setattr(dynamo_config, total, max(int(getattr(dynamo_config, total)), 2 * limit))
    return limit


def graph_counters() -> Counter[str]:
    """Dynamo's running counts: ``graphs`` compiled, ``graph_breaks``, ``recompile_limit_hits``.

    Process-wide and cumulative: take the difference over a region (:class:`CompileStats`).
    """
    from torch._dynamo.utils import counters

    return Counter(
        graphs=int(counters["stats"]["unique_graphs"]),
        graph_breaks=int(sum(counters["graph_break"].values())),
        recompile_limit_hits=int(
            sum(v for k, v in counters["frames"].items() if "limit" in str(k).lower())
        ),
    )


class CompileStats:
    """What ``compile=true`` compiled during training: graphs, shapes, graph breaks.

    Args:
        max_shapes: the shape budget (``data.max_shapes``).
        backend: the ``torch.compile`` backend.
        planned: the training split's static ``(rows, length)`` shapes (the planner's).

    Example:
        >>> stats = CompileStats(max_shapes=4, backend="eager", planned=[(8, 4), (2, 16)])
        >>> stats.summary(shapes=set())["graphs"]
        0
    """

    def __init__(
        self, max_shapes: int, backend: str, planned: list[tuple[int, int]] | None = None
    ) -> None:
        self.max_shapes = int(max_shapes)
        self.backend = backend
        self.planned = [list(map(int, s)) for s in planned or []]
        self.recompile_limit = raise_recompile_limit(self.max_shapes)
        self._start = graph_counters()

    def summary(self, shapes: set[tuple[int, ...]]) -> dict[str, Any]:
        """The counts since construction and the distinct training ``shapes`` (rows, length).

        Returns:
            ``graphs`` (compiled by dynamo since then), ``shapes`` (how many distinct training
            shapes ran compiled), ``shape_list`` (those ``[rows, length]``), ``planned_shapes``
            (the training split's), ``max_shapes``, ``graph_breaks``, ``recompile_limit``,
            ``backend`` and ``torch`` (its version).
        """
        now = graph_counters()
        return {
            "graphs": now["graphs"] - self._start["graphs"],
            "shapes": len(shapes),
            "shape_list": [list(s) for s in sorted(shapes)],
            "planned_shapes": self.planned,
            "max_shapes": self.max_shapes,
            "graph_breaks": now["graph_breaks"] - self._start["graph_breaks"],
            "recompile_limit": self.recompile_limit,
            "backend": self.backend,
            "torch": torch.__version__,
        }

    @staticmethod
    def describe(summary: dict[str, Any]) -> str:
        """One line for the final report."""
        line = (
            f"compiled {summary['graphs']} graph(s) for {summary['shapes']} training shape(s) "
            f"(data.max_shapes={summary['max_shapes']}, backend {summary['backend']})"
        )
        if summary["graph_breaks"]:
            line += f", {summary['graph_breaks']} graph break(s)"
        return line


def compile_training(cfg: DictConfig, model: Any, dm: Any) -> CompileStats | None:
    """With ``compile=true``: compile the model's training forward; say what was set.

    The shape budget itself (``data.max_shapes``, ``data.bucket_width``) is set by the config
    (``conf/data/default.yaml``) and checked by :func:`check_compile`.

    Returns:
        The :class:`CompileStats` to summarise at the end, or ``None`` without
        ``compile=true``.

    Example:
        >>> from omegaconf import OmegaConf
        >>> compile_training(OmegaConf.create({"compile": False}), None, None) is None
        True
    """
    if not cfg.get("compile"):
        return None
    backend = str(cfg.get("compile_backend", DEFAULT_BACKEND))
    # A fresh dynamo cache: the jobs of a multirun (-m) share one process and one
    # TranslationModel.forward code object, whose compiled versions would pile up past
    # the recompile limit.
    torch._dynamo.reset()
    model.compile_forward(backend)
    shapes = getattr(dm.planner("train"), "shapes", None)
    stats = CompileStats(cfg.data.max_shapes, backend, None if shapes is None else shapes.tolist())
    if rank() == 0:
        listed = "" if shapes is None else ": " + ", ".join(f"{r}x{n}" for r, n in shapes.tolist())
        count = "" if shapes is None else f"{len(shapes)} "
        print(
            f"compile=true: the training forward runs under torch.compile(dynamic=False, "
            f"backend={backend!r}); data.max_shapes={cfg.data.max_shapes}, "
            f"data.bucket_width={cfg.data.bucket_width}; the training split has "
            f"{count}shapes (rows x length){listed}; dynamo recompile limit "
            f"{stats.recompile_limit}. Validation and decoding run eager."
        )
    return stats
