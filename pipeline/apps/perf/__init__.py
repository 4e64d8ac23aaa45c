"""Performance measurements of pexec itself (`pexec bench`, `python -m pipeline.apps.perf.<name>`): replay
throughput, the DuckDB bootstrap stage, the mergeable bootstrap, scale-out over S3, the viewer's pages, the
guard's latency, the scoring driver at cluster scale, local Ray's start against scoring in-process (start), replay
over the BFCL and τ simulators, and a night of raw production logs scored where they lie (nightly). Each returns a
`figures.Bench` (project / baseline / ratio per figure, CPU-seconds where measured), printed by `figures.show` or as
a Markdown block of docs/reference/benchmarks.md.

Not to be confused with the benchmarks a rollout's `benchmark` names (BFCL, τ...): those are environments,
in pipeline/envs/. Measurements that need a development dependency (jsonschema for the naive replay
baseline, moto for the S3 server) look for it when they run, so these modules import without them.

Imports: every stage but jobs and cli.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING

from pipeline.core.errors import PexecError

if TYPE_CHECKING:
    from pipeline.apps.perf.figures import Figure

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


CLUSTER_CORES = 128 * 16
CLUSTER_ROLLOUTS = 100_000_000


def cluster_projection(steps_per_s_per_core: Sequence[float], steps_per_rollout: Sequence[float], how: str) -> Figure:
    """Seconds to score CLUSTER_ROLLOUTS rollouts on CLUSTER_CORES cores at a per-core rate measured end to end
    (reading and writing included), one value per repetition: a projection, not a cluster measurement."""
    from pipeline.apps.perf.figures import figure

    calls = CLUSTER_ROLLOUTS * max(steps_per_rollout)
    seconds = [CLUSTER_ROLLOUTS * k / (CLUSTER_CORES * rate) for rate, k in zip(steps_per_s_per_core, steps_per_rollout,
                                                                              strict=True)]  # fmt: skip
    return figure(
        f"projection: {CLUSTER_ROLLOUTS / 1e6:,.0f}M rollouts (≈ {calls / 1e9:.2g}B calls) on 128 × 16 cores",
        "s",
        seconds,
        f"none: the per-core rate of {how} × {CLUSTER_CORES:,} cores (scaling assumed linear, driver and merge not "
        "included)",
    )


# What the package exports: its public modules and the names defined here (a `_x.py` module is its own).
__all__ = [
    "CLUSTER_CORES",
    "CLUSTER_ROLLOUTS",
    "INSTALL_DEV",
    "bfcl",
    "cluster_projection",
    "dev_dependency",
    "distributed",
    "driver",
    "figures",
    "guard",
    "merged",
    "metrics",
    "nightly",
    "registry",
    "replay",
    "require_dev",
    "scale",
    "spans",
    "start",
    "tau",
    "view",
]
