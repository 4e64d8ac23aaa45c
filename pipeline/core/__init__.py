"""The data every stage shares: what a rollout and its results are, and the rules that define the run's tables
and metrics. Pure definitions and checks, no IO but reading a spec's own files.

model.py             the canonical rollout (input) and per-step / per-rollout results (output)
records.py           a decoded JSON record checked and turned into a Rollout
values.py            whether a replayed output equals the logged one
effects.py           what an invalid call of a tool could have done (read, write, irreversible)
run_schema.py        the run's tables and their columns, declared once
metric_catalogue.py  every cohort metric, as a ratio of sums of per-rollout parts
intervals.py         which interval a metric gets, and the small-sample one
errors.py            the one base of every error a user is meant to read
plugins.py           the registry of a plug-in kind: built-ins imported on first use, entry points loaded guarded
ray_start.py         how pexec starts or joins Ray (the one call; Ray's token-auth notice dropped)
ray_waits.py         waits on Ray that end, with an error, once this machine's Ray node dies
settings.py          the checks a stage's settings object makes of its values, and the error naming one

Imports: nothing of pexec.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "arrow",
    "effects",
    "errors",
    "intervals",
    "metric_catalogue",
    "model",
    "plugins",
    "ray_start",
    "ray_waits",
    "records",
    "run_folder",
    "run_schema",
    "settings",
    "text",
    "values",
]
