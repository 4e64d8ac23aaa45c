"""pexec: prefix executability for tool-using agents.

The public API. Each name is imported from its stage on first use, so `import pipeline.core.model` (a Ray
worker's first import) loads the data model and nothing else.

Stages, in pipeline order (each a package under `pipeline/`, importing only the ones before it; what users run is
one wing of packages, `pipeline/apps/`, above them all):
  core       the data model, records, run schema, metric catalogue, intervals, errors
  storage    every byte read or written: fsspec URLs, input stores, run folders, leases
  expr       the safe expression language of specs
  envs       environments: the protocol, the registry, the built-in families
  replay     the S/D/P checker and cause labels
  ingest     log formats -> canonical rollouts
  synthetic  stores with known truth
  scoring    shards replayed as Ray tasks, run tables written, the manifest last
  metrics    the DuckDB stage: one run handle, cohorts with bootstrap intervals, SQL, per-tool profiles, drift
  report     the analysis an evaluation team publishes
  apps/      what users run: web, view, guard, jobs, integrations (inside other tools), perf, cli

Each package says what it exports (`__all__`); a module named `_x.py` is its package's own.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

# public name -> the module that defines it
_API = {
    "BootstrapSettings": "pipeline.metrics.settings",
    "Call": "pipeline.core.model",
    "EnvOptions": "pipeline.envs",
    "Environment": "pipeline.envs",
    "GuardSession": "pipeline.apps.guard",
    "GuardVerdict": "pipeline.apps.guard",
    "InvalidRecord": "pipeline.core.errors",
    "Message": "pipeline.core.model",
    "MetricsSettings": "pipeline.metrics.settings",
    "Outcome": "pipeline.envs",
    "Population": "pipeline.metrics.settings",
    "QueryLimits": "pipeline.metrics.query_limits",
    "QueryRefused": "pipeline.core.errors",
    "Reject": "pipeline.core.model",
    "Rollout": "pipeline.core.model",
    "RolloutResult": "pipeline.core.model",
    "Run": "pipeline.metrics.run",
    "RunIncomplete": "pipeline.core.errors",
    "RunNotFound": "pipeline.core.errors",
    "ScoreSettings": "pipeline.scoring.settings",
    "Spec": "pipeline.envs.spec.loader",
    "SpecError": "pipeline.envs",
    "StepResult": "pipeline.core.model",
    "ToolInfo": "pipeline.envs",
    "get_environment": "pipeline.envs",
    "load_spec": "pipeline.envs.spec.loader",
    "open_run": "pipeline.metrics.run",
    "open_session": "pipeline.apps.guard",
    "parse_rollout": "pipeline.core.records",
    "plan": "pipeline.scoring.driver",
    "register": "pipeline.envs",
    "replay": "pipeline.replay.checker",
    "run_scoring": "pipeline.scoring.driver",
    "synthesize": "pipeline.synthetic.rollouts",
    "write_store": "pipeline.storage.stores",
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'pipeline' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_API])
