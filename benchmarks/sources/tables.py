"""The source benchmarks' tables (Hugging Face datasets, streaming) for the documents.

Each function takes a whole result file and returns markdown; :data:`TABLES` names them for
:mod:`benchmarks.render`.
"""

from __future__ import annotations

from collections.abc import Callable

from benchmarks.render_tables import Result

TABLES: dict[str, Callable[[Result], str]] = {}
