"""The report's numbers per cohort: the metrics with intervals (pipeline.aggregate) joined with the
descriptive tables of sql/report_tables.sql and sql/report_costs.sql (recovery arithmetic, first causes, FED
histogram, mean costs)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb

from pipeline import aggregate as db
from pipeline import catalogue
from pipeline.aggregate import DEFAULT_POPULATION, BootstrapSettings, Population, Replicates, metrics_and_replicates

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
    db.set_variables(con, cohort_cols=keys)
    db.run_sql(con, "report_tables")
    out: dict[str, Any] = {t: db.fetch(con, f"report_{t}") for t in ("recovery", "causes", "fed")}
    out["costs"] = []
    if db.cost_columns(con):
        db.run_sql(con, "report_costs")
        out["costs"] = db.fetch(con, "report_costs")
    out["max_t"] = db.fetch(con, "report_depth")[0]["max_t"]
    return out


def run_tables(
    run: str,
    by: Sequence[str] | None,
    ks: Sequence[int],
    settings: BootstrapSettings,
    storage_options: dict[str, Any] | None = None,
    partial: bool = False,
    population: Population = DEFAULT_POPULATION,
) -> RunTables:
    with db.open_rollouts(run, storage_options, partial, population) as con:
        keys = ["benchmark", *db.cohort_columns(con, by)]
        parts = descriptive(con, keys)
    # PEC is computed up to the largest requested k, and at least as far as the curves go (max T, <= 20).
    max_k = max([*ks, min(parts["max_t"], 20)])
    ranked = ["success", *(m.name for m in catalogue.ratios() if m.ranked)]
    cohorts, replicates = metrics_and_replicates(
        run, keys[1:], settings, max_k, storage_options, partial, population, ranked
    )
    return RunTables(keys=keys, cohorts=cohorts, replicates=replicates, **parts)
