"""Per-tool error profiles: step-level cohorts (benchmark × tool [× labels]) with task-clustered intervals.

A tool's invalid rate is sum(invalid calls) / sum(calls) over its calls in the population the metrics count
(pipeline.metrics.settings.Population); its interval is the same task-level bootstrap as the rollout metrics
(sql/tool_prepare.sql builds the per-(cohort, task) sums, then pipeline.metrics.cohorts's bootstrap and
metrics_intervals.sql run unchanged), so the calls of one task move together
(docs/explanation/intervals.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypedDict, cast

import duckdb
import numpy as np

from pipeline.metrics import bootstrap, cohorts
from pipeline.metrics._population import open_population
from pipeline.metrics.cohorts import (
    IntervalRows,
    MetricDef,
    TaskSums,
    bootstrap_intervals,
    cohort_columns,
    interval,
    task_sums,
)
from pipeline.metrics.completeness import Coverage, Snapshot
from pipeline.metrics.duck import fetch, run_sql, set_variables
from pipeline.metrics.results import BootstrapInfo, CauseCount, Key, Labels, ToolProfile
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, DEFAULT_POPULATION, BootstrapSettings, Population


@dataclass(frozen=True)
class ToolMetric:
    name: str
    label: str
    num: str
    den: str
    doc: str


# Ratio metrics over calls: sum(num part) / sum(den part) of metrics/sql/tool_prepare.sql's s_<name> columns.
TOOL_METRICS = (
    ToolMetric("invalid_rate", "invalid rate", "inv", "n", "invalid calls among the tool's calls"),
    ToolMetric(
        "output_match",
        "output match",
        "match",
        "cmp",
        "replayed output equals the logged one, among the tool's calls with both (simulated environments)",
    ),
)


# The keys of a profile dict besides its cohort columns (benchmark, tool, labels).
TOOL_FIELDS = ("n_calls", "n_tasks", "n_invalid", "n_first_errors", "causes", "first_error_share",
               *(m.name for m in TOOL_METRICS), "bootstrap", "partial")  # fmt: skip


def tool_cohort_columns(by: Sequence[str] | None) -> list[str] | None:
    """`by` without `tool` (the step-level cohort always has it); None when `by` does not name `tool`."""
    if by is None or "tool" not in by:
        return None
    return [c for c in by if c != "tool"]


def tool_profiles(
    snapshot: Snapshot,
    by: Sequence[str] | None = (),
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    population: Population = DEFAULT_POPULATION,
) -> list[ToolProfile]:
    """One dict per (benchmark, tool[, `by` labels]), sorted by that key: calls, tasks, invalid calls, their
    causes, first errors (calls that were their rollout's first invalid call) and first-error share (of the
    first errors of the benchmark [× labels], the share at this tool: a point value, no interval), and the
    ratio metrics of TOOL_METRICS with task-clustered intervals."""
    return profiles_and_replicates(snapshot, by, settings, population, replicates=False)[0]


def profiles_and_replicates(
    snapshot: Snapshot,
    by: Sequence[str] | None = (),
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    population: Population = DEFAULT_POPULATION,
    replicates: bool = True,
) -> tuple[list[ToolProfile], list[np.ndarray]]:
    """tool_profiles, and per profile (as listed) its invalid rate in every bootstrap replicate (float64, NaN where a
    replicate's ratio is undefined): the draws its interval comes from. Without `replicates`, an empty array per
    profile: B values a profile are not kept when no one reads them."""
    steps = snapshot.parts("steps")
    with open_population(snapshot, population) as con:
        keys = profile_keys(con, by)
        if not steps:
            return [], []
        set_variables(con, **settings.sql_variables, steps_files=steps, cohort_cols=keys,
                      **interval_variables(replicates))  # fmt: skip
        run_sql(con, "metrics/view_steps")
        run_sql(con, "metrics/tool_prepare")
        sums = task_sums(con)  # the metrics' own bootstrap (pipeline.metrics.bootstrap), over these task sums
        rows = bootstrap_intervals(con, sums, settings)
        info = fetch(con, "tool_info", ToolInfo)
        return assemble(info, rows, keys, settings, _clusters(sums), snapshot.partial(), replicates)


PARTS = ["s_n", "s_inv", "s_first", "s_cmp", "s_match"]  # the per-(cohort, task) sums of sql/tool_prepare.sql


def profile_keys(con: duckdb.DuckDBPyConnection, by: Sequence[str] | None) -> list[str]:
    """A profile's cohort columns: benchmark, tool, `actor` when asked (agent or user: whose call, τ telecom; a
    column of the steps, not of the rollouts), then the `by` labels."""
    asked = list(by or [])
    labels = cohort_columns(con, [b for b in asked if b != "actor"])
    return ["benchmark", "tool", *(["actor"] if "actor" in asked else []), *labels]


def interval_variables(replicates: bool) -> dict[str, object]:
    """The variables metrics_intervals.sql reads besides the bootstrap's and the pass's, for the tool metrics."""
    metric_defs: list[MetricDef] = [
        {"metric": m.name, "num": m.num, "den": m.den, "scale": 1.0, "ord": i} for i, m in enumerate(TOOL_METRICS)
    ]
    return {"metric_defs": metric_defs, "parts": PARTS, "replicated": ["invalid_rate"] if replicates else [],
            "pexec_k": 0}  # fmt: skip


class ToolInfo(TypedDict):
    """A row of table tool_info (sql/tool_prepare.sql): one (benchmark, tool[, labels]) cohort's counts."""

    cohort: int
    key: Labels
    n_calls: int
    n_tasks: int
    n_invalid: int
    n_first_errors: int
    causes: list[CauseCount]


def clusters(sums: TaskSums, K: int = 0) -> cohorts.Clusters:
    """What the small-sample interval needs per (cohort, tool metric), and no PEC (`K` unused: the signature of
    pipeline.metrics.partials.partition_result's clusters)."""
    return _clusters(sums), {}


def _clusters(sums: TaskSums) -> dict[tuple[int, str], bootstrap.Moments]:
    """What the small-sample interval needs per (cohort, tool metric), as pipeline.metrics.cohorts's for its metrics."""
    return {
        (c, m.name): bootstrap.moments(sums.column(c, f"s_{m.num}"), sums.column(c, f"s_{m.den}"))
        for c in range(len(sums.cohorts))
        for m in TOOL_METRICS
    }


def assemble(
    info: list[ToolInfo],
    rows: IntervalRows,
    keys: list[str],
    settings: BootstrapSettings,
    clusters: dict[tuple[int, str], bootstrap.Moments],
    covered: Coverage | None,
    replicates: bool,
) -> tuple[list[ToolProfile], list[np.ndarray]]:
    """The profile dicts, sorted by their key, and each one's replicate values, from table tool_info's rows and the
    intervals of the cohorts they number (one node, or merged from Ray tasks: pipeline.metrics.tool_partials)."""
    reps = {r["cohort"]: r["replicate_values"] for r in rows.replicated}
    undefined = np.full(settings.B if replicates else 0, np.nan)  # a profile without replicates: all undefined
    ratios = {(r["cohort"], r["metric"]): r for r in rows.ratios}
    group = [k for k in keys if k != "tool"]
    first_total: dict[Key, int] = {}
    for c in info:
        g = tuple(c["key"][k] for k in group)
        first_total[g] = first_total.get(g, 0) + c["n_first_errors"]
    out: list[tuple[Key, ToolProfile, np.ndarray]] = []
    for c in info:
        labels = tuple(c["key"][k] for k in keys)
        row: dict[str, object] = dict(zip(keys, labels, strict=True))
        row |= {"n_calls": c["n_calls"], "n_tasks": c["n_tasks"], "n_invalid": c["n_invalid"]}
        row |= {"n_first_errors": c["n_first_errors"], "causes": c["causes"]}
        total = first_total[tuple(c["key"][k] for k in group)]
        row["first_error_share"] = c["n_first_errors"] / total if total else None
        for m in TOOL_METRICS:
            r = ratios.get((c["cohort"], m.name))
            moments = None if r is None or r["value"] is None else clusters[(c["cohort"], m.name)]
            value = interval(r, moments, 1.0, settings.level)
            value["eligible"] = r["den_total"] if r else 0
            row[m.name] = value
        drawn: BootstrapInfo = {
            "B": settings.B,
            "seed": settings.seed,
            "method": settings.method,
            "level": settings.level,
            "unit": "task",
        }
        row["bootstrap"] = drawn
        row["partial"] = None if covered is None else covered.as_json()
        # The labels, then ToolProfile's keys: one per TOOL_METRICS (tests/test_catalogue.py checks ToolProfile
        # declares them), which the checker cannot follow through the loop above.
        out.append((labels, cast(ToolProfile, row), reps.get(c["cohort"], undefined)))
    out.sort(key=lambda p: tuple((v is None, v) for v in p[0]))
    return [p[1] for p in out], [p[2] for p in out]
