"""Register the strategy names with Lightning as soon as Lightning is imported, not before.

``import lightning_varbatch`` must not import torch or Lightning (the planner and the plan CLI run
without them), yet ``Trainer(strategy="deepspeed_varbatch")`` must work right after it. So: if
``lightning.pytorch`` is already imported, register now; otherwise a one-shot import hook
registers right after ``lightning.pytorch`` finishes loading (before any Trainer can be built).

Example:
    >>> import lightning_varbatch
    >>> from lightning.pytorch.strategies import StrategyRegistry
    >>> "deepspeed_varbatch" in StrategyRegistry
    True
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import Any

__all__ = ["register_when_lightning_loads"]

_LIGHTNING = "lightning.pytorch"


def _register() -> None:
    importlib.import_module("lightning_varbatch.strategies")  # registers on import


class _RegisteringLoader(importlib.abc.Loader):
    """Delegates to Lightning's own loader, then registers our strategies."""

    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self.inner.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        self.inner.exec_module(module)
        _register()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self.inner, name)


class _LightningHook(importlib.abc.MetaPathFinder):
    """Finds ``lightning.pytorch`` with the other finders and wraps its loader, once."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != _LIGHTNING:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the search below from finding us
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _RegisteringLoader(spec.loader)
        return spec


def register_when_lightning_loads() -> None:
    """Register the strategy names now if Lightning is loaded, else right after it loads."""
    if _LIGHTNING in sys.modules:
        _register()
        return
    if not any(isinstance(f, _LightningHook) for f in sys.meta_path):
        sys.meta_path.insert(0, _LightningHook())
