"""The DuckDB stage: a scored run opened once, and everything computed from it — per-cohort metrics with
task-level bootstrap intervals, read-only SQL, per-tool error profiles, drift between runs, verdict
flips between runs of the same rollouts.

run.py            `open_run(url)` -> Run: the handle every reader uses (one listing, one completeness snapshot)
completeness.py   which runs lie under a path, whether each is complete, what a partial read covers
settings.py       what is asked for: bootstrap settings, the population (harness errors, pools, strict replay),
                  and both with the cohort columns and PEC depth (MetricsSettings)
_population.py     a connection whose `rollouts` view holds the population
cohorts.py        per-cohort metrics with intervals; writing them under RUN/metrics/
results.py        what the cohort and per-tool dicts hold, key by key (TypedDicts)
bootstrap.py      the replicates' sums in numpy, exactly as sql/hash.sql draws them
partials.py       the poisson-merged metrics in Ray tasks: part sums, task partitions, an exact merge
query.py          read-only user SQL within limits
query_limits.py   the limits of one such query (read without loading DuckDB)
tool_profiles.py  per-tool error profiles (step-level cohorts)
drift.py          `pexec diff`: drift between two runs of different tasks
verdicts.py       `pexec diff`: the step-level verdict diff of two runs of the same rollouts
duck.py           the DuckDB plumbing: connections, .sql files, variables
sql/              every statement, as .sql files

Imports: core, storage.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "bootstrap",
    "cohorts",
    "completeness",
    "drift",
    "duck",
    "partials",
    "query",
    "results",
    "run",
    "settings",
    "tool_profiles",
    "verdicts",
]
