"""Jobs (`jobs/*.toml`): a nightly or benchmark run as one file — what `pexec run` executes here and
`pexec submit` sends to a Ray cluster.

definition.py  the job file: load, check fields, run (score, metrics, report, diff)
preflight.py   `pexec run --check`: everything a job needs, checked before any scoring
cluster.py     the Ray Jobs API: submit, status, logs, stop, list

Imports: core, storage, envs, ingest, synthetic, scoring, metrics, report.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "cluster",
    "definition",
    "preflight",
]
