"""What users run, on top of the pipeline's stages: the command line and the servers and integrations that put
the same checks and results where users work.

cli           `pexec`: a thin layer over the Python API
guard         the pre-execution guard: library sessions, HTTP service, MCP proxy, Ray Serve
view          `pexec view`, the local web viewer of a run
web           the hardened HTTP server the guard and the viewer run on
integrations  pexec inside other tools: verdicts back on MLflow and Phoenix traces, an Inspect AI scorer
jobs          job files: what `pexec run` executes and `pexec submit` sends to a Ray cluster
perf          `pexec bench`: measurements of pexec itself

Imports: every stage below (pipeline/__init__.py lists them in order).
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "cli",
    "guard",
    "integrations",
    "jobs",
    "perf",
    "view",
    "web",
]
