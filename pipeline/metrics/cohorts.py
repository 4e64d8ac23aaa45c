"""Per-cohort metrics with task-level bootstrap intervals: the DuckDB stage's main computation.

Definitions: docs/explanation/definitions.md ("Aggregates") and docs/explanation/intervals.md. The metrics and
their parts come from the metric catalogue (pipeline.core.metric_catalogue); one pass computes all cohorts:
  _population.py              the rollouts the metrics count (`Population`: harness errors, benchmark pools)
  metrics_depths.sql         K of PEC(k) and the depths that occur (prepare_sums: a column per depth)
  metrics_prepare.sql        rollouts, as they are read -> per-(cohort, task) sums `s_*` (+ PEC histogram)
                             -> cohort numbers; nothing is kept per rollout
  bootstrap.py               per-(cohort, replicate) sums of the resampled tasks' `s_*` (numpy; the draws of
  bootstrap_sums.sql         sql/hash.sql), put together exactly in SQL
  metrics_intervals.sql      ratios of sums (point estimate = full data), percentile intervals
                             (these three a pass of cohorts at a time: bootstrap_intervals)
  _metric_clusters, ...      what the small-sample interval needs, exact moments of the per-task sums (numpy);
                             pipeline.core.intervals picks the interval per metric
  results.py                 the cohort dicts' keys (`Cohort`)

Draws come from our own 32-bit hash (sql/hash.sql, the same in numpy), never from random() or DuckDB's hash(),
so the same run, seed, B and method give the same bounds on any DuckDB version and any thread count.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypedDict, cast

import duckdb
import numpy as np

from pipeline.core import intervals, metric_catalogue, run_schema
from pipeline.core.arrow import pa
from pipeline.core.errors import MetricsError, StorageError
from pipeline.metrics import bootstrap
from pipeline.metrics._population import open_population
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import fetch, rollout_columns, run_sql, set_variables
from pipeline.metrics.pec import PecRow, pec_rows
from pipeline.metrics.results import (
    Cohort,
    CohortBootstrap,
    Interval,
    Labels,
    PecPoint,
    cohort_fields,
    key_values,
    ratio,
)
from pipeline.metrics.settings import (
    DEFAULT_BOOTSTRAP,
    DEFAULT_MAX_K,
    DEFAULT_POPULATION,
    MAX_COHORT_COLUMNS,
    PASS_REPLICATE_VALUES,
    TABLE_PEC_K,
    BootstrapSettings,
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


def compute_metrics(
    snapshot: Snapshot,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    population: Population = DEFAULT_POPULATION,
) -> list[Cohort]:
    """Metrics per cohort (benchmark + `by` columns: condition labels, or attributes when named; every condition
    label when `by` is None), JSON-ready, over the rollouts `population` counts.

    Cohorts come out sorted by their key (benchmark, then the labels in table order; NULL labels last). Of a
    partial snapshot (an incomplete run), every cohort's `partial` states the coverage (None for a complete
    run), pipeline.metrics.completeness.
    """
    return metrics_and_replicates(snapshot, by, settings, max_k, population)[0]


# Per cohort (as listed): metric -> its value in replicate b = 0 .. B-1, float64, NaN where the ratio is undefined
# (8 bytes a value: a drift of 1,000 cohorts × 7 metrics × B = 1,000 held them as Python lists, 750 MB more).
Replicates = list[dict[str, np.ndarray]]


def metrics_and_replicates(
    snapshot: Snapshot,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    population: Population = DEFAULT_POPULATION,
    replicated: Sequence[str] = (),
) -> tuple[list[Cohort], Replicates]:
    """compute_metrics, and the bootstrap replicates' values of the `replicated` ratio metrics (the draws the
    intervals come from; NaN where a replicate's ratio is undefined)."""
    if max_k is not None and max_k < 0:
        raise MetricsError(f"max_k must be >= 0, got {max_k}")
    with open_population(snapshot, population) as con:
        by_cols = cohort_columns(con, by)
        set_variables(
            con,
            **settings.sql_variables,
            cohort_cols=["benchmark", *by_cols],
            max_k=max_k,
            default_max_k=DEFAULT_MAX_K,
            min_default_k=max(TABLE_PEC_K),
            metric_defs=metric_defs(),
            parts=[f"s_{p.name}" for p in metric_catalogue.PARTS],
            replicated=list(replicated),
        )
        prepare_sums(con)
        sums = task_sums(con)
        rows = bootstrap_intervals(con, sums, settings)
        info = fetch(con, "cohort_info", CohortInfo)
        k = con.execute("SELECT getvariable('pexec_k')").fetchall()[0][0]
        run_sql(con, "metrics/harness_counts")
        harness = fetch(con, "harness_counts", HarnessCount)
        clusters = _metric_clusters(sums), _pec_clusters(sums, k)
        return intervals_and_replicates(
            rows, info, clusters, harness, by_cols, settings, population, replicated, snapshot
        )


def prepare_sums(con: duckdb.DuckDBPyConnection) -> None:
    """Tables task_sums, cohort_info and cohort_diverged (sql/metrics_prepare.sql) and variable pexec_k, over the
    view rollout_parts of a population, with variables cohort_cols and max_k set: the rollouts summed per
    (cohort, task) as they are read, no row kept per rollout."""
    run_sql(con, "metrics/metrics_depths")
    # Depth columns in the order of their names (s_h1, s_h10, s_h2, ...), the order a PIVOT on them gives.
    depths = sorted((int(r[0]) for r in con.execute("SELECT depth FROM pec_depths").fetchall()), key=str)
    # Built here, as rollout_parts is (pipeline.metrics._population): a true/false column per PEC depth that occurs, so
    # that one aggregate sums them with the parts (integers only, from the run's own T and FED).
    hist = "".join(f", least(T, fed - 1, getvariable('pexec_k')) = {d} AS h_{d}" for d in (0, *depths))
    con.execute(
        "CREATE OR REPLACE TEMP VIEW rollout_keys AS "
        "SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key, "
        f"task_id, T, success, COLUMNS('^p_'){hist} FROM rollout_parts"
    )
    run_sql(con, "metrics/metrics_prepare")


class CohortInfo(TypedDict):
    """A row of table cohort_info (sql/metrics_prepare.sql): a cohort's number in the SQL tables (None: a cohort
    of harness errors only, which no table numbers), its key and its counts."""

    cohort: int | None
    key: Labels
    n: int
    n_tasks: int
    n_no_calls: int
    n_unknown_success: int
    n_diverged_before_fed: int


class HarnessCount(TypedDict):
    """A row of table harness_counts (sql/harness_counts.sql)."""

    key: Labels
    n_harness_error: int


class Point(TypedDict):
    """A point estimate and its bootstrap percentiles."""

    cohort: int
    value: float | None
    lo: float | None
    hi: float | None


class MetricRow(Point):
    """A row of table metric_intervals: a ratio metric, with its denominator's total."""

    metric: str
    den_total: int


class ReplicatedRow(TypedDict):
    """A row of table replicated_values: a metric's value in every replicate (float64, NaN where undefined)."""

    cohort: int
    metric: str
    replicate_values: np.ndarray


MetricMoments = dict[tuple[int, str], bootstrap.Moments]  # (cohort, ratio metric) -> what its interval needs
PecMoments = dict[tuple[int, int], bootstrap.Moments]  # (cohort, k >= 1) -> the same for PEC(k)
Clusters = tuple[MetricMoments, PecMoments]  # _metric_clusters, _pec_clusters


@dataclass(frozen=True)
class IntervalRows:
    """Tables metric_intervals and replicated_values (sql/metrics_intervals.sql) and PEC(k) (pipeline.metrics.pec) as
    rows, over the cohorts of one or more passes (cohort numbers as in task_sums)."""

    ratios: list[MetricRow] = field(default_factory=list)
    pec: list[PecRow] = field(default_factory=list)
    replicated: list[ReplicatedRow] = field(default_factory=list)

    def extend(self, other: IntervalRows) -> None:
        self.ratios.extend(other.ratios)
        self.pec.extend(other.pec)
        self.replicated.extend(other.replicated)


def interval_rows(con: duckdb.DuckDBPyConnection) -> IntervalRows:
    """sql/metrics_intervals.sql over tables task_sums (its rows of the cohorts from variable pass_first to before
    pass_end; none of its rows in the distributed path, where rep_sums holds the point estimates' sums as b = -1)
    and rep_sums, with the variables it names set; its tables as rows."""
    run_sql(con, "metrics/metrics_intervals")
    return IntervalRows(fetch(con, "metric_intervals", MetricRow), pec_rows(con), _replicated_values(con))


def _replicated_values(con: duckdb.DuckDBPyConnection) -> list[ReplicatedRow]:
    """Table replicated_values, each row's values as one float64 array (a NULL as NaN), not a list of floats."""
    table = con.sql("SELECT * FROM replicated_values").to_arrow_table()
    values = table["replicate_values"].combine_chunks()
    flat = values.flatten().to_numpy(zero_copy_only=False)  # float64; a null becomes NaN
    ends = values.offsets.to_numpy()
    return [
        {"cohort": cohort, "metric": metric, "replicate_values": flat[ends[i] : ends[i + 1]]}
        for i, (cohort, metric) in enumerate(zip(table["cohort"].to_pylist(), table["metric"].to_pylist(), strict=True))
    ]


def cohort_passes(n_cohorts: int, B: int, n_columns: int, K: int) -> list[range]:
    """The cohorts, in runs that each hold at most PASS_REPLICATE_VALUES replicate values (a cohort's B replicates
    of its `n_columns` sums and of PEC(0..K)), a cohort at least: memory follows a pass, not the cohorts × B."""
    per_cohort = B * (n_columns + K + 1)
    size = max(1, PASS_REPLICATE_VALUES // per_cohort)
    return [range(first, min(first + size, n_cohorts)) for first in range(0, n_cohorts, size)]


def bootstrap_intervals(con: duckdb.DuckDBPyConnection, sums: TaskSums, settings: BootstrapSettings) -> IntervalRows:
    """The bootstrap (run_bootstrap) and its intervals (interval_rows) of every cohort of task_sums, one pass of
    cohorts at a time (cohort_passes): each cohort's draws and replicates depend on its own tasks only, so the rows
    are those of one pass over every cohort. Variable pexec_k and those of metrics_intervals.sql set."""
    K = con.execute("SELECT getvariable('pexec_k')").fetchall()[0][0]
    task_key = np.zeros(0, np.uint64)
    if settings.method == "poisson-merged":  # the tasks' 64-bit keys, once, in task_sums order
        sql = "SELECT pexec_task_key(task_id) AS task_key FROM task_sums ORDER BY cohort, task_id"
        task_key = con.execute(sql).fetchnumpy()["task_key"]
    first_row = np.cumsum([0, *map(len, sums.cohorts)])  # each cohort's first row in task_sums
    rows = IntervalRows()
    for cohorts in cohort_passes(len(sums.cohorts), settings.B, len(sums.columns), K):
        set_variables(con, pass_first=cohorts.start, pass_end=cohorts.stop)
        run_bootstrap(con, sums, settings, cohorts, task_key[first_row[cohorts.start] : first_row[cohorts.stop]])
        rows.extend(interval_rows(con))
    return rows


def intervals_and_replicates(
    rows: IntervalRows,
    info: list[CohortInfo],
    clusters: Clusters,
    harness: list[HarnessCount],
    by_cols: list[str],
    settings: BootstrapSettings,
    population: Population,
    replicated: Sequence[str],
    snapshot: Snapshot,
) -> tuple[list[Cohort], Replicates]:
    """The cohort dicts and replicates from what every way of computing them ends with: the bootstrap's interval
    rows, `info` as table cohort_info, what the small-sample intervals need, and the harness-error counts."""
    keys = ["benchmark", *by_cols]
    cohorts, ids = _assemble(info, rows.ratios, rows.pec, clusters, harness, keys, settings, population, snapshot)
    by_id: dict[int, dict[str, np.ndarray]] = {}
    for r in rows.replicated:
        by_id.setdefault(r["cohort"], {})[r["metric"]] = r["replicate_values"]
    # A cohort with no rollout in the population (only harness errors) has no replicates: all undefined.
    undefined = np.full(settings.B, np.nan)
    per_cohort: Replicates = [
        {m: undefined if cid is None else by_id.get(cid, {}).get(m, undefined) for m in replicated} for cid in ids
    ]
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
    # Column-major: each cohort's column (a slice of rows) is then contiguous, as the moments and limbs read it; row-
    # major, every pass over a column touched a cache line per task (the 16-cohort moments took 5 times as long).
    sums = np.empty((len(cohort), len(columns)), dtype=np.int64, order="F")
    for j in range(len(columns)):
        sums[:, j] = table.column(j + 1).to_numpy()
    n_cohorts = int(cohort[-1]) + 1 if len(cohort) else 0  # numbered 0 .. n-1 (dense_rank), each with a task
    return TaskSums(columns, np.split(sums, np.searchsorted(cohort, np.arange(1, n_cohorts)))[:n_cohorts])


def run_bootstrap(
    con: duckdb.DuckDBPyConnection,
    sums: TaskSums,
    settings: BootstrapSettings,
    cohorts: range,
    task_key: np.ndarray,
) -> None:
    """rep_sums: per-(cohort, replicate) sums of the resampled tasks' s_* columns, of the `cohorts` (numbers) of
    task_sums (pipeline.metrics.bootstrap draws and weighs the tasks in numpy; metrics/sql/bootstrap_sums.sql puts
    the exact sums together). `task_key`: the 64-bit keys of these cohorts' tasks, in task_sums order (what the
    poisson-merged method weighs by)."""
    chosen = sums.cohorts[cohorts.start : cohorts.stop]
    if settings.method == "poisson-merged":
        # Weights keyed by the task itself (pipeline.metrics.bootstrap): what scoring shards can sum on their own; here
        # one partial over every task of these cohorts.
        codes = np.repeat(np.arange(len(chosen)), [len(c) for c in chosen])
        all_sums = np.concatenate(chosen) if chosen else np.zeros((0, len(sums.columns)), np.int64)
        partial = bootstrap.poisson_partial(
            list(cohorts), codes, task_key, all_sums, sums.columns, settings.seed, settings.B
        )
        wide, limbs = bootstrap.partial_tables(partial)
    else:
        batches = bootstrap.replicate_sums(
            chosen, sums.columns, settings.seed, settings.B, settings.method, first=cohorts.start, wide=True
        )
        wide, limbs = bootstrap.replicate_tables(batches, sums.columns)
    bootstrap_sums(con, wide, limbs)


def bootstrap_sums(con: duckdb.DuckDBPyConnection, wide: pa.Table, limbs: pa.Table) -> None:
    """Table rep_sums from the replicate sums of pipeline.metrics.bootstrap.replicate_tables (metrics/sql/
    bootstrap_sums.sql)."""
    con.register("rep_wide", wide)
    con.register("rep_limbs", limbs)
    run_sql(con, "metrics/bootstrap_sums")
    con.unregister("rep_wide")
    con.unregister("rep_limbs")


def _metric_clusters(sums: TaskSums) -> MetricMoments:
    """What the small-sample interval needs per (cohort, ratio metric): y_i = the numerator part's sum of task i,
    x_i the denominator's (pipeline.core.intervals.Cluster)."""
    return {
        (c, m.name): bootstrap.moments(sums.column(c, f"s_{m.num}"), sums.column(c, f"s_{m.den}"))
        for c in range(len(sums.cohorts))
        for m in metric_catalogue.ratios()
    }


def _pec_clusters(sums: TaskSums, K: int) -> PecMoments:
    """The same for PEC(k), k = 1 .. K: y_i(k) = rollouts of task i with depth >= k (the s_h<d> columns for
    d >= k), x_i = its rollouts."""
    out: PecMoments = {}
    for c in range(len(sums.cohorts)):
        x = sums.column(c, "s_n")
        hist = np.column_stack([sums.column(c, f"s_h{d}") for d in range(1, K + 1)]) if K else np.zeros((len(x), 0))
        at_least = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]  # column k-1: depth >= k
        for k in range(1, K + 1):
            out[(c, k)] = bootstrap.moments(np.ascontiguousarray(at_least[:, k - 1]).astype(np.int64), x)
    return out


class MetricDef(TypedDict):
    """A ratio metric as the SQL reads it (variable `metric_defs` of sql/metrics_intervals.sql)."""

    metric: str
    num: str  # the parts: s_<num> / s_<den>
    den: str
    scale: float
    ord: int


def metric_defs(paired: bool = False) -> list[MetricDef]:
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


def write_metrics(root: RunPrefix, cohorts: list[Cohort], by: Sequence[str] | None = None) -> str:
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


def metrics_tables(cohorts: list[Cohort]) -> tuple[pa.Table, pa.Table]:
    """The cohort dicts as two flat tables (the layout of metrics.parquet and pec.parquet, pipeline.core.run_schema)."""
    fields = set(cohort_fields())
    keys: list[str] = ["benchmark"]
    for c in cohorts:
        keys += [k for k in c if k not in fields and k not in keys]
    rows: list[dict[str, object]] = []
    pec_rows: list[dict[str, object]] = []
    for c in cohorts:
        entries: Mapping[str, object] = c  # read by the names of run_schema's columns
        row: dict[str, object] = dict(_label_values(c, keys))
        row |= {col.name: entries[col.name] for col in (*run_schema.COHORT_COUNTS, *run_schema.POPULATION)}
        for m in metric_catalogue.ratios():
            value = ratio(c, m.name)
            row |= {m.name: value["value"], f"{m.name}_lo": value["lo"], f"{m.name}_hi": value["hi"]}
            row[f"{m.name}_method"] = value.get("method")
            if m.eligible:
                row[f"{m.name}_eligible"] = value["eligible"]
        row |= {f"bootstrap_{k}": v for k, v in c["bootstrap"].items() if k != "duckdb_version"}
        row["duckdb_version"] = c["bootstrap"]["duckdb_version"]
        covered: Mapping[str, object] = c.get("partial") or {}
        row["partial"] = bool(covered)
        row |= {col.name: covered.get(col.name.removeprefix("partial_")) for col in run_schema.PARTIAL[1:]}
        rows.append(row)
        pec_rows += [{**_label_values(c, keys), "method": None, **p} for p in c["pec"]]
    metrics_schema = run_schema.arrow_schema(run_schema.metrics_table(), keys)
    pec_schema = run_schema.arrow_schema(run_schema.PEC, keys)
    return pa.Table.from_pylist(rows, metrics_schema), pa.Table.from_pylist(pec_rows, pec_schema)


def _label_values(cohort: Cohort, keys: list[str]) -> dict[str, str | None]:
    return dict(zip(keys, key_values(cohort, keys), strict=True))


def resolve_by(by: Sequence[str] | None, labels: list[str], attributes: Sequence[str] = ()) -> list[str]:
    """Cohort columns for `by` (every condition label when None). `attributes` are column names (`attr_<name>`),
    found by either name."""
    if by is None:
        if len(labels) > MAX_COHORT_COLUMNS:
            raise MetricsError(
                f"the run has {len(labels):,} label columns, over the limit of {MAX_COHORT_COLUMNS} to key a cohort "
                "by: name the ones to group by (--by)"
            )
        return list(labels)
    out: list[str] = []
    for name in by:
        column = name if name in labels or name in attributes else run_schema.ATTRIBUTE_PREFIX + name
        if name == "benchmark" or column in out:
            continue  # benchmark is always part of the cohort
        if column not in labels and column not in attributes:
            available = _listed(labels) if labels else "none (the rollouts have no label columns)"
            attrs = _listed([a.removeprefix(run_schema.ATTRIBUTE_PREFIX) for a in attributes]) or "none"
            raise MetricsError(
                f"unknown cohort column {name!r}; available label columns: {available}; attributes: {attrs}"
            )
        if name in cohort_fields():
            raise MetricsError(f"label column {name!r} clashes with a metric name and cannot define a cohort")
        out.append(column)
    if len(out) > MAX_COHORT_COLUMNS:
        raise MetricsError(f"{len(out):,} cohort columns are over the limit of {MAX_COHORT_COLUMNS}")
    return out


def _listed(names: Sequence[str], shown: int = 20) -> str:
    more = f" and {len(names) - shown:,} more" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def interval(point: Point | None, moments: bootstrap.Moments | None, scale: float, level: float) -> Interval:
    """value, lo, hi and the interval's method (pipeline.core.intervals), from the bootstrap's `point` and the
    moments of the per-task sums; no method where there is no value, nor without moments: PEC(0) = 1, which holds
    by definition."""
    if point is None or point["value"] is None:
        return {"value": None, "lo": None, "hi": None}
    if moments is None:
        return {"value": point["value"], "lo": point["lo"], "hi": point["hi"]}
    m = moments
    cluster = intervals.Cluster(point["value"], m.den_total, m.den_tasks, m.num_total, m.yy, m.xy, m.xx, scale=scale)
    lo, hi, method = intervals.interval(cluster, point["lo"], point["hi"], level)
    return {
        "value": point["value"],
        "lo": lo,
        "hi": hi,
        "method": method,
        "small_sample": intervals.small_sample(cluster),
    }


def _assemble(
    info: list[CohortInfo],
    ratios: list[MetricRow],
    pec: list[PecRow],
    clusters: Clusters,
    harness: list[HarnessCount],
    keys: list[str],
    settings: BootstrapSettings,
    population: Population,
    snapshot: Snapshot,
) -> tuple[list[Cohort], list[int | None]]:
    """The cohort dicts, in key order, and each one's cohort number in the SQL tables (None: no rollout)."""
    covered, rejected = snapshot.partial(), snapshot.rejected()
    metric_moments, pec_moments = clusters
    by_metric = {(r["cohort"], r["metric"]): r for r in ratios}
    pec_by_cohort: dict[int, list[PecPoint]] = {}
    for r in pec:
        moments = None if r["k"] == 0 or r["value"] is None else pec_moments[(r["cohort"], r["k"])]
        pec_by_cohort.setdefault(r["cohort"], []).append({"k": r["k"], **interval(r, moments, 1.0, settings.level)})
    drawn: CohortBootstrap = {
        "B": settings.B,
        "seed": settings.seed,
        "method": settings.method,
        "level": settings.level,
        "unit": "task",
        "duckdb_version": duckdb.__version__,
    }

    def key(k: Labels) -> tuple[str | None, ...]:
        return tuple(k[name] for name in keys)

    n_harness = {key(h["key"]): h["n_harness_error"] for h in harness}
    # A cohort made only of excluded harness errors has no rollout in the population: it is still listed.
    counted = {key(c["key"]) for c in info}
    info = [*info, *(_no_rollouts(h["key"]) for h in harness if key(h["key"]) not in counted)]
    info.sort(key=lambda c: tuple((v is None, v) for v in c["key"].values()))  # as SQL orders the key structs
    cohorts: list[Cohort] = []
    ids: list[int | None] = []
    for c in info:
        cid = c["cohort"]
        ids.append(cid)
        out: dict[str, object] = {k: c["key"][k] for k in keys}
        out |= {"n": c["n"], "n_tasks": c["n_tasks"], "n_no_calls": c["n_no_calls"]}
        out |= {"n_unknown_success": c["n_unknown_success"], "n_diverged_before_fed": c["n_diverged_before_fed"]}
        out["n_harness_error"] = n_harness.get(key(c["key"]), 0)  # counted over every scored rollout
        out |= {"harness_errors": population.harness_errors, "strict_replay": population.strict_replay}
        out["n_rejected_in_run"] = rejected
        for m in metric_catalogue.METRICS:
            if m.kind == "curve":
                out[m.name] = sorted(pec_by_cohort.get(cid, []) if cid is not None else [], key=lambda p: p["k"])
                continue
            row = None if cid is None else by_metric.get((cid, m.name))
            moments = None if row is None or row["value"] is None else metric_moments[(row["cohort"], m.name)]
            value = interval(row, moments, m.scale, settings.level)
            if m.eligible:
                value["eligible"] = row["den_total"] if row is not None else 0
            out[m.name] = value
        out["bootstrap"] = dict(drawn)
        out["partial"] = None if covered is None else covered.as_json()
        # The labels, then Cohort's keys and one entry per catalogue metric (which the catalogue alone declares):
        # tests/test_catalogue.py checks the two name every key.
        cohorts.append(cast(Cohort, out))
    return cohorts, ids


def _no_rollouts(key: Labels) -> CohortInfo:
    """cohort_info's row for a cohort with no rollout in the population (only harness errors)."""
    return {"cohort": None, "key": key, "n": 0, "n_tasks": 0, "n_no_calls": 0, "n_unknown_success": 0,
            "n_diverged_before_fed": 0}  # fmt: skip
