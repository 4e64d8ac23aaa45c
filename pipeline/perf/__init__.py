"""Performance measurements of pexec itself (`pexec bench`, `python -m pipeline.perf.<name>`): replay
throughput, the DuckDB bootstrap stage, scale-out over S3, the viewer's pages, and replay over the BFCL and τ
simulators.

Not to be confused with the benchmarks a rollout's `benchmark` names (BFCL, τ...): those are environments,
in pipeline/envs/. Measurements that need a development dependency (jsonschema for the naive replay
baseline, moto for the S3 server) look for it when they run, so these modules import without them.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

from pipeline.errors import PexecError

INSTALL_DEV = "pip install -e '.[dev]' (`make install` does)"


def dev_dependency(name: str, needed_by: str) -> ModuleType:
    """Import development dependency `name`, or say clearly that `needed_by` needs it."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise PexecError(f"{needed_by} needs {name}, a development dependency: {INSTALL_DEV}") from exc


def require_dev(name: str, needed_by: str) -> None:
    """Check that development dependency `name` is installed, without importing it (a subprocess uses it)."""
    if importlib.util.find_spec(name) is None:
        raise PexecError(f"{needed_by} needs {name}, a development dependency: {INSTALL_DEV}")
