"""The report's numbers per cohort: the metrics with intervals (pipeline.metrics.cohorts) joined with the descriptive
tables of report/sql/report_tables.sql and report/sql/report_costs.sql (recovery arithmetic, first causes, FED
histogram, mean costs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from pipeline.core import metric_catalogue
from pipeline.metrics.cohorts import Replicates, cohort_columns, metrics_and_replicates
from pipeline.metrics.duck import cost_columns, fetch, run_sql, set_variables
from pipeline.metrics.run import Run
from pipeline.metrics.settings import DEFAULT_POPULATION, BootstrapSettings, Population

Key = tuple[str | None, ...]


@dataclass(frozen=True)
class RunTables:
    """Everything the report shows, per cohort. Rows are dicts whose first fields are the cohort keys."""

    keys: list[str]  # benchmark + the condition labels (and attribute columns, when asked for)
    cohorts: list[dict[str, Any]]  # compute_metrics' cohort dicts (intervals, PEC curve, bootstrap settings)
    recovery: list[dict[str, Any]]
    causes: list[dict[str, Any]]
    fed: list[dict[str, Any]]
    costs: list[dict[str, Any]]  # empty when the logs carry no cost_* column
    max_t: int
    replicates: Replicates  # per cohort: success and the ranked metrics per bootstrap replicate (the ranking's)


def key_of(row: dict[str, Any], keys: Sequence[str]) -> Key:
    return tuple(None if row.get(k) is None else str(row[k]) for k in keys)


def descriptive(con: duckdb.DuckDBPyConnection, keys: list[str]) -> dict[str, Any]:
    set_variables(con, cohort_cols=keys)
    run_sql(con, "report/report_tables")
    out: dict[str, Any] = {t: fetch(con, f"report_{t}") for t in ("recovery", "causes", "fed")}
    out["costs"] = []
    if cost_columns(con):
        run_sql(con, "report/report_costs")
        out["costs"] = fetch(con, "report_costs")
    out["max_t"] = fetch(con, "report_depth")[0]["max_t"]
    return out


def run_tables(
    run: Run,
    by: Sequence[str] | None,
    ks: Sequence[int],
    settings: BootstrapSettings,
    population: Population = DEFAULT_POPULATION,
) -> RunTables:
    with run.connect(population) as con:
        keys = ["benchmark", *cohort_columns(con, by)]
        parts = descriptive(con, keys)
    # PEC is computed up to the largest requested k, and at least as far as the curves go (max T, <= 20).
    max_k = max([*ks, min(parts["max_t"], 20)])
    ranked = ["success", *(m.name for m in metric_catalogue.ratios() if m.ranked)]
    cohorts, replicates = metrics_and_replicates(run.snapshot, keys[1:], settings, max_k, population, ranked)
    return RunTables(keys=keys, cohorts=cohorts, replicates=replicates, **parts)
