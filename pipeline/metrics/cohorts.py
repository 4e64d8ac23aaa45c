"""Per-cohort metrics with task-level bootstrap intervals: the DuckDB stage's main computation.

Definitions: docs/explanation/definitions.md ("Aggregates") and docs/explanation/intervals.md. The metrics and
their parts come from the metric catalogue (pipeline.core.metric_catalogue); one pass computes all cohorts:
  population.py              the rollouts the metrics count (`Population`: harness errors, benchmark pools)
  metrics_prepare.sql        rollouts -> cohort numbers -> per-(cohort, task) sums `s_*` (+ PEC histogram)
  bootstrap.py               per-(cohort, replicate) sums of the resampled tasks' `s_*` (numpy; the draws of
  bootstrap_sums.sql         sql/hash.sql), put together exactly in SQL
  metrics_intervals.sql      ratios of sums (point estimate = full data), percentile intervals
  _metric_clusters, ...      what the small-sample interval needs, exact moments of the per-task sums (numpy);
                             pipeline.core.intervals picks the interval per metric

Draws come from our own 32-bit hash (sql/hash.sql, the same in numpy), never from random() or DuckDB's hash(),
so the same run, seed, B and method give the same bounds on any DuckDB version and any thread count.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import numpy as np

from pipeline.core import intervals, metric_catalogue, run_schema
from pipeline.core.arrow import pa
from pipeline.core.errors import StorageError
from pipeline.metrics import bootstrap
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import fetch, rollout_columns, run_sql, set_variables
from pipeline.metrics.population import open_population
from pipeline.metrics.settings import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_POPULATION,
    BootstrapSettings,
    MetricsError,
    Population,
)
from pipeline.storage.run import RunPrefix

DEFAULT_METRICS = "metrics"  # the name of the metrics over every label (no --by)


def label_columns(columns: Sequence[str]) -> list[str]:
    """Condition label columns of a rollouts table, in table order: any column that is neither fixed, nor a
    cost, nor an attribute."""
    return [
        c
        for c in columns
        if c not in run_schema.RESERVED_COLUMNS and not c.startswith(("cost_", run_schema.ATTRIBUTE_PREFIX))
    ]


def attribute_columns(columns: Sequence[str]) -> list[str]:
    """Attribute columns (`attr_<name>`) of a rollouts table, in table order."""
    return [c for c in columns if c.startswith(run_schema.ATTRIBUTE_PREFIX)]


def cohort_fields() -> tuple[str, ...]:
    """The keys of a cohort dict besides its label values (a label may not take one of these names)."""
    counts = (c.name for c in (*run_schema.COHORT_COUNTS, *run_schema.POPULATION))
    return (*counts, *(m.name for m in metric_catalogue.METRICS), "bootstrap", "partial")


def compute_metrics(
    snapshot: Snapshot,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    population: Population = DEFAULT_POPULATION,
) -> list[dict[str, Any]]:
    """Metrics per cohort (benchmark + `by` columns: condition labels, or attributes when named; every condition
    label when `by` is None), JSON-ready, over the rollouts `population` counts.

    Cohorts come out sorted by their key (benchmark, then the labels in table order; NULL labels last). Of a
    partial snapshot (an incomplete run), every cohort's `partial` states the coverage (None for a complete
    run), pipeline.metrics.completeness.
    """
    return metrics_and_replicates(snapshot, by, settings, max_k, population)[0]


Replicates = list[dict[str, list[float | None]]]  # per cohort (as listed): metric -> value per replicate b


def metrics_and_replicates(
    snapshot: Snapshot,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    population: Population = DEFAULT_POPULATION,
    replicated: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], Replicates]:
    """compute_metrics, and the bootstrap replicates' values of the `replicated` ratio metrics (the draws the
    intervals come from; None where a replicate's ratio is undefined)."""
    if max_k is not None and max_k < 0:
        raise MetricsError(f"max_k must be >= 0, got {max_k}")
    with open_population(snapshot, population) as con:
        by_cols = cohort_columns(con, by)
        set_variables(
            con,
            **settings.sql_variables,
            cohort_cols=["benchmark", *by_cols],
            max_k=max_k,
            metric_defs=metric_defs(),
            parts=[f"s_{p.name}" for p in metric_catalogue.PARTS],
            replicated=list(replicated),
        )
        run_sql(con, "metrics/metrics_prepare")
        sums = task_sums(con)
        run_bootstrap(con, sums, settings)
        info = fetch(con, "cohort_info")
        k = con.execute("SELECT getvariable('pexec_k')").fetchall()[0][0]
        run_sql(con, "metrics/harness_counts")
        harness = fetch(con, "harness_counts")
        clusters = _metric_clusters(sums), _pec_clusters(sums, k)
        return intervals_and_replicates(
            con, info, clusters, harness, by_cols, settings, population, replicated, snapshot
        )


Clusters = tuple[list[dict[str, Any]], list[dict[str, Any]]]  # _metric_clusters, _pec_clusters


def intervals_and_replicates(
    con: duckdb.DuckDBPyConnection,
    info: list[dict[str, Any]],
    clusters: Clusters,
    harness: list[dict[str, Any]],
    by_cols: list[str],
    settings: BootstrapSettings,
    population: Population,
    replicated: Sequence[str],
    snapshot: Snapshot,
) -> tuple[list[dict[str, Any]], Replicates]:
    """The cohort dicts and replicates from what every way of computing them ends with: on `con`, tables
    task_sums (or none of its rows, when rep_sums holds the point estimates' sums as b = -1) and rep_sums
    (pipeline/metrics/sql/bootstrap_sums.sql) and variables pexec_k and those of metrics_intervals.sql; `info` as
    table cohort_info, what the small-sample intervals need, and the harness-error counts."""
    run_sql(con, "metrics/metrics_intervals")
    ratios = _join(fetch(con, "metric_intervals"), clusters[0], ("cohort", "metric"))
    pec = _join(fetch(con, "pec_intervals"), clusters[1], ("cohort", "k"))
    reps = fetch(con, "replicated_values")
    cohorts, ids = _assemble(info, ratios, pec, harness, ["benchmark", *by_cols], settings, population)
    by_id: dict[int, dict[str, list[float | None]]] = {}
    for r in reps:
        by_id.setdefault(r["cohort"], {})[r["metric"]] = r["replicate_values"]
    # A cohort with no rollout in the population (only harness errors) has no replicates: all undefined.
    undefined = [None] * settings.B
    per_cohort: Replicates = [{m: by_id.get(cid, {}).get(m, undefined) for m in replicated} for cid in ids]
    for c in cohorts:
        covered = snapshot.partial()
        c["partial"] = None if covered is None else covered.as_json()
    return cohorts, per_cohort


@dataclass(frozen=True)
class TaskSums:
    """Table task_sums in numpy: per cohort (numbered 0 .. n-1), its tasks' s_* sums (tasks in task_id order)."""

    columns: list[str]
    cohorts: list[np.ndarray]  # int64, tasks x columns

    def column(self, cohort: int, name: str) -> np.ndarray:
        if name not in self.columns:  # a depth no rollout reached has no column (metrics/sql/metrics_prepare.sql)
            return np.zeros(len(self.cohorts[cohort]), dtype=np.int64)
        return self.cohorts[cohort][:, self.columns.index(name)]


def task_sums(con: duckdb.DuckDBPyConnection) -> TaskSums:
    # A depth no rollout of a task reached is NULL in task_sums (LEFT JOIN of the histogram): 0 rollouts.
    table = con.sql("SELECT cohort, coalesce(COLUMNS('^s_'), 0)::BIGINT FROM task_sums").to_arrow_table()
    cohort = table.column(0).to_numpy()  # rows in (cohort, task_id) order
    columns = table.column_names[1:]
    sums = np.empty((len(cohort), len(columns)), dtype=np.int64)
    for j in range(len(columns)):
        sums[:, j] = table.column(j + 1).to_numpy()
    n_cohorts = int(cohort[-1]) + 1 if len(cohort) else 0  # numbered 0 .. n-1 (dense_rank), each with a task
    return TaskSums(columns, np.split(sums, np.searchsorted(cohort, np.arange(1, n_cohorts)))[:n_cohorts])


def run_bootstrap(con: duckdb.DuckDBPyConnection, sums: TaskSums, settings: BootstrapSettings) -> None:
    """rep_sums: per-(cohort, replicate) sums of the resampled tasks' s_* columns (pipeline.metrics.bootstrap draws and
    weighs the tasks in numpy; metrics/sql/bootstrap_sums.sql puts the exact sums together)."""
    if settings.method == "poisson-merged":
        # Weights keyed by the task itself (pipeline.metrics.bootstrap): what scoring shards can sum on their own; here
        # one partial over every task of the run.
        task_key = con.sql("SELECT pexec_task_key(task_id) FROM task_sums").fetchnumpy()
        codes = np.repeat(np.arange(len(sums.cohorts)), [len(c) for c in sums.cohorts])
        all_sums = np.concatenate(sums.cohorts) if sums.cohorts else np.zeros((0, len(sums.columns)), np.int64)
        partial = bootstrap.poisson_partial(
            range(len(sums.cohorts)), codes, next(iter(task_key.values())), all_sums, sums.columns,
            settings.seed, settings.B,
        )  # fmt: skip
        limbs = bootstrap.partial_limbs(partial)
    else:
        batches = bootstrap.replicate_sums(sums.cohorts, sums.columns, settings.seed, settings.B, settings.method)
        limbs = pa.Table.from_batches(list(batches), bootstrap.LIMBS)
    con.register("rep_limbs", limbs)
    run_sql(con, "metrics/bootstrap_sums")
    con.unregister("rep_limbs")


def _metric_clusters(sums: TaskSums) -> list[dict[str, Any]]:
    """What the small-sample interval needs per (cohort, ratio metric): y_i = the numerator part's sum of task i,
    x_i the denominator's (pipeline.core.intervals.Cluster)."""
    rows = []
    for c in range(len(sums.cohorts)):
        for m in metric_catalogue.ratios():
            mom = bootstrap.moments(sums.column(c, f"s_{m.num}"), sums.column(c, f"s_{m.den}"))
            rows.append({"cohort": c, "metric": m.name, "scale": m.scale, **_moment_fields(mom)})
    return rows


def _pec_clusters(sums: TaskSums, K: int) -> list[dict[str, Any]]:
    """The same for PEC(k), k = 1 .. K: y_i(k) = rollouts of task i with depth >= k (the s_h<d> columns for
    d >= k), x_i = its rollouts; with den_total, which the PEC intervals do not carry."""
    rows = []
    for c in range(len(sums.cohorts)):
        x = sums.column(c, "s_n")
        hist = np.column_stack([sums.column(c, f"s_h{d}") for d in range(1, K + 1)]) if K else np.zeros((len(x), 0))
        at_least = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # column k-1: depth >= k
        for k in range(1, K + 1):
            mom = bootstrap.moments(np.ascontiguousarray(at_least[:, k - 1]).astype(np.int64), x)
            rows.append({"cohort": c, "k": k, "scale": 1.0, "den_total": mom.den_total, **_moment_fields(mom)})
    return rows


def _moment_fields(mom: bootstrap.Moments) -> dict[str, int]:
    return {"den_tasks": mom.den_tasks, "num_total": mom.num_total, "yy": mom.yy, "xy": mom.xy, "xx": mom.xx}


def _join(rows: list[dict[str, Any]], extra: list[dict[str, Any]], key: tuple[str, str]) -> list[dict[str, Any]]:
    by_key = {tuple(r[k] for k in key): r for r in extra}
    return [{**r, **by_key.get(tuple(r[k] for k in key), {})} for r in rows]


def metric_defs(paired: bool = False) -> list[dict[str, Any]]:
    """The catalogue's ratio metrics as the SQL reads them (variable `metric_defs`); `paired`: only those of the
    paired comparison."""
    shown = [m for m in metric_catalogue.ratios() if m.paired or not paired]
    return [{"metric": m.name, "num": m.num, "den": m.den, "scale": m.scale, "ord": i} for i, m in enumerate(shown)]


def cohort_columns(con: duckdb.DuckDBPyConnection, by: Sequence[str] | None) -> list[str]:
    """The `by` columns checked against the run's label and attribute columns (every label when None); an
    attribute is named as `termination_reason` or `attr_termination_reason` and comes back as its column."""
    columns = rollout_columns(con)
    return resolve_by(by, label_columns(columns), attribute_columns(columns))


def metrics_name(by: Sequence[str] | None) -> str:
    """The name a metrics result is kept (and queried) under: `metrics` over every label (no `by`),
    else `metrics_by_<col>[_and_<col>…]` (`metrics_by_benchmark` for the benchmark alone); characters other
    than letters, digits and `_` in a column name become `_`."""
    if by is None:
        return DEFAULT_METRICS
    cols = [re.sub(r"\W", "_", c, flags=re.ASCII) for c in dict.fromkeys(by) if c != "benchmark"]
    return "metrics_by_" + ("_and_".join(cols) or "benchmark")


def write_metrics(root: RunPrefix, cohorts: list[dict[str, Any]], by: Sequence[str] | None = None) -> str:
    """Write RUN/metrics/<name>/metrics.parquet (one row per cohort) and pec.parquet (one per cohort and k),
    `<name>` = metrics_name(by), the `by` the cohorts were computed with; returns that folder.

    Fixed file names, replaced whole: the same `by` again overwrites, never appends; another `by` is kept
    beside it.
    """
    metrics_table, pec_table = metrics_tables(cohorts)
    folder = f"metrics/{metrics_name(by)}"
    try:
        root.write_parquet(f"{folder}/metrics.parquet", metrics_table)
        root.write_parquet(f"{folder}/pec.parquet", pec_table)
    except OSError as exc:
        raise StorageError(f"cannot write {root.url}/{folder}/: {exc}") from exc
    return root.file(folder)


def metrics_tables(cohorts: list[dict[str, Any]]) -> tuple[pa.Table, pa.Table]:
    """The cohort dicts as two flat tables (the layout of metrics.parquet and pec.parquet, pipeline.core.run_schema)."""
    fields = set(cohort_fields())
    keys: list[str] = ["benchmark"]
    for c in cohorts:
        keys += [k for k in c if k not in fields and k not in keys]
    rows, pec_rows = [], []
    for c in cohorts:
        row: dict[str, Any] = _label_values(c, keys)
        row |= {col.name: c[col.name] for col in (*run_schema.COHORT_COUNTS, *run_schema.POPULATION)}
        for m in metric_catalogue.ratios():
            row |= {m.name: c[m.name]["value"], f"{m.name}_lo": c[m.name]["lo"], f"{m.name}_hi": c[m.name]["hi"]}
            row[f"{m.name}_method"] = c[m.name].get("method")
            if m.eligible:
                row[f"{m.name}_eligible"] = c[m.name]["eligible"]
        row |= {f"bootstrap_{k}": v for k, v in c["bootstrap"].items() if k != "duckdb_version"}
        row["duckdb_version"] = c["bootstrap"]["duckdb_version"]
        covered = c.get("partial") or {}
        row["partial"] = bool(covered)
        row |= {col.name: covered.get(col.name.removeprefix("partial_")) for col in run_schema.PARTIAL[1:]}
        rows.append(row)
        pec_rows += [{**_label_values(c, keys), "method": None, **p} for p in c["pec"]]
    metrics_schema = run_schema.arrow_schema(run_schema.metrics_table(), keys)
    pec_schema = run_schema.arrow_schema(run_schema.PEC, keys)
    return pa.Table.from_pylist(rows, metrics_schema), pa.Table.from_pylist(pec_rows, pec_schema)


def _label_values(cohort: dict[str, Any], keys: list[str]) -> dict[str, str | None]:
    return {k: None if cohort.get(k) is None else str(cohort[k]) for k in keys}


def resolve_by(by: Sequence[str] | None, labels: list[str], attributes: Sequence[str] = ()) -> list[str]:
    """Cohort columns for `by` (every condition label when None). `attributes` are column names (`attr_<name>`),
    found by either name."""
    if by is None:
        return list(labels)
    out: list[str] = []
    for name in by:
        column = name if name in labels or name in attributes else run_schema.ATTRIBUTE_PREFIX + name
        if name == "benchmark" or column in out:
            continue  # benchmark is always part of the cohort
        if column not in labels and column not in attributes:
            available = ", ".join(labels) if labels else "none (the rollouts have no label columns)"
            attrs = ", ".join(a.removeprefix(run_schema.ATTRIBUTE_PREFIX) for a in attributes) or "none"
            raise MetricsError(
                f"unknown cohort column {name!r}; available label columns: {available}; attributes: {attrs}"
            )
        if name in cohort_fields():
            raise MetricsError(f"label column {name!r} clashes with a metric name and cannot define a cohort")
        out.append(column)
    return out


def interval(row: dict[str, Any] | None, level: float) -> dict[str, Any]:
    """value, lo, hi and the interval's method (pipeline.core.intervals); no method where there is no value, nor for
    PEC(0) = 1, which holds by definition."""
    if row is None or row["value"] is None:
        return {"value": None, "lo": None, "hi": None}
    if row.get("k") == 0:
        return {"value": row["value"], "lo": row["lo"], "hi": row["hi"]}
    moments = (int(row[k]) for k in ("num_total", "yy", "xy", "xx"))
    cluster = intervals.Cluster(row["value"], row["den_total"], row["den_tasks"], *moments, scale=row["scale"])
    lo, hi, method = intervals.interval(cluster, row["lo"], row["hi"], level)
    return {"value": row["value"], "lo": lo, "hi": hi, "method": method}


def _assemble(
    info: list[dict[str, Any]],
    ratios: list[dict[str, Any]],
    pec: list[dict[str, Any]],
    harness: list[dict[str, Any]],
    keys: list[str],
    settings: BootstrapSettings,
    population: Population,
) -> tuple[list[dict[str, Any]], list[int | None]]:
    """The cohort dicts, in key order, and each one's cohort number in the SQL tables (None: no rollout)."""
    by_metric = {(r["cohort"], r["metric"]): r for r in ratios}
    pec_by_cohort: dict[int, list[dict[str, Any]]] = {}
    for r in pec:
        pec_by_cohort.setdefault(r["cohort"], []).append({"k": r["k"], **interval(r, settings.level)})
    bootstrap = {
        "B": settings.B,
        "seed": settings.seed,
        "method": settings.method,
        "level": settings.level,
        "unit": "task",
        "duckdb_version": duckdb.__version__,
    }

    def key(k: dict[str, Any]) -> tuple[Any, ...]:
        return tuple(k[name] for name in keys)

    n_harness = {key(h["key"]): h["n_harness_error"] for h in harness}
    # A cohort made only of excluded harness errors has no rollout in the population: it is still listed.
    counted = {key(c["key"]) for c in info}
    empty = {"cohort": None, "n": 0, "n_tasks": 0, "n_no_calls": 0, "n_unknown_success": 0, "n_diverged_before_fed": 0}
    info = [*info, *({**empty, "key": h["key"]} for h in harness if key(h["key"]) not in counted)]
    info.sort(key=lambda c: tuple((v is None, v) for v in c["key"].values()))  # as SQL orders the key structs
    cohorts, ids = [], []
    for c in info:
        cid = c["cohort"]
        ids.append(cid)
        out: dict[str, Any] = {k: c["key"][k] for k in keys}
        out |= {col.name: c[col.name] for col in run_schema.COHORT_COUNTS if col.name != "n_harness_error"}
        out["n_harness_error"] = n_harness.get(key(c["key"]), 0)  # counted over every scored rollout
        out |= {"harness_errors": population.harness_errors, "strict_replay": population.strict_replay}
        for m in metric_catalogue.METRICS:
            if m.kind == "curve":
                out[m.name] = sorted(pec_by_cohort.get(cid, []), key=lambda p: p["k"])
                continue
            row = by_metric.get((cid, m.name))
            out[m.name] = interval(row, settings.level)
            if m.eligible:
                out[m.name]["eligible"] = row["den_total"] if row is not None else 0
        out["bootstrap"] = dict(bootstrap)
        cohorts.append(out)
    return cohorts, ids
