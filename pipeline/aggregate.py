"""The DuckDB stage: per-cohort metrics with task-level bootstrap intervals, and read-only SQL over a run.

docs/design.md §2 ("Aggregates", "Intervals") and §7. All SQL lives in `pipeline/sql/*.sql`; this module sets a
few DuckDB variables (`getvariable(...)` in the SQL), runs the files in order and shapes the results.

Pipeline (one pass for all cohorts); the metrics and their parts come from pipeline.catalogue:
  rollout_parts (view)       per rollout, the catalogue's integer parts p_<name>
  metrics_prepare.sql        rollouts -> cohort numbers -> per-(cohort, task) sums `s_*` (+ PEC histogram)
  bootstrap_<method>.sql     per-(cohort, replicate) sums of the resampled tasks' `s_*`
  metrics_intervals.sql      ratios of sums (point estimate = full data), percentile intervals

Draws come from our own 32-bit hash (sql/hash.sql), never from random() or DuckDB's hash(), so the
same run, seed, B and method give the same bounds on any DuckDB version and any thread count.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import duckdb
import pyarrow as pa

from pipeline import catalogue, schema
from pipeline.errors import PexecError, StorageError
from pipeline.storage.run import RunPrefix

# The rollouts columns the metrics read.
_NEEDED = ("task_id", "benchmark", "T", "fed", "executable", "auc_term", "success")
_UINT32 = 2**32


class MetricsError(PexecError, ValueError):
    """Metrics asked for with settings or cohort columns that do not fit (the message says which)."""


@dataclass(frozen=True)
class BootstrapSettings:
    B: int = 1000
    seed: int = 0
    method: Literal["multinomial", "poisson"] = "multinomial"
    level: float = 0.95

    def __post_init__(self) -> None:
        if self.B < 1:
            raise MetricsError(f"bootstrap B must be >= 1, got {self.B}")
        if not 0 <= self.seed < _UINT32:
            raise MetricsError(f"bootstrap seed must be in [0, 2**32), got {self.seed}")
        if self.method not in ("multinomial", "poisson"):
            raise MetricsError(f"bootstrap method must be 'multinomial' or 'poisson', got {self.method!r}")
        if not 0 < self.level < 1:
            raise MetricsError(f"confidence level must be in (0, 1), got {self.level}")

    @property
    def quantiles(self) -> tuple[float, float]:
        alpha = (1 - self.level) / 2
        return alpha, 1 - alpha


DEFAULT_BOOTSTRAP = BootstrapSettings()


class QueryRefused(PexecError, ValueError):
    """A statement in a user query is not a read."""


class QueryError(PexecError, duckdb.Error):
    """DuckDB's own error for a user query (syntax, unknown column or table, a file outside the run)."""


class RunNotFound(PexecError, FileNotFoundError):
    """No scored run (or no rollouts in it) where one was named."""


def label_columns(columns: Sequence[str]) -> list[str]:
    """Label columns of a rollouts table, in table order: any column that is neither fixed nor a cost."""
    return [c for c in columns if c not in schema.RESERVED_COLUMNS and not c.startswith("cost_")]


def cohort_fields() -> tuple[str, ...]:
    """The keys of a cohort dict besides its label values (a label may not take one of these names)."""
    return ("n", "n_tasks", "n_no_calls", *(m.name for m in catalogue.METRICS), "bootstrap")


def compute_metrics(
    run: str,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    storage_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """Metrics per cohort (benchmark + `by` labels; all labels when `by` is None), JSON-ready.

    Cohorts come out sorted by their key (benchmark, then the labels in table order; NULL labels last).
    """
    if max_k is not None and max_k < 0:
        raise MetricsError(f"max_k must be >= 0, got {max_k}")
    with open_rollouts(run, storage_options) as con:
        by_cols = cohort_columns(con, by)
        q_lo, q_hi = settings.quantiles
        set_variables(
            con,
            cohort_cols=["benchmark", *by_cols],
            max_k=max_k,
            seed=settings.seed,
            B=settings.B,
            q_lo=q_lo,
            q_hi=q_hi,
            metric_defs=metric_defs(),
            parts=[f"s_{p.name}" for p in catalogue.PARTS],
        )
        for name in ("metrics_prepare", f"bootstrap_{settings.method}", "metrics_intervals"):
            run_sql(con, name)
        info = fetch(con, "cohort_info")
        intervals = fetch(con, "metric_intervals")
        pec = fetch(con, "pec_intervals")
    return _assemble(info, intervals, pec, ["benchmark", *by_cols], settings)


@contextmanager
def open_rollouts(run: str, storage_options: dict[str, Any] | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh in-memory connection with the view `rollouts` over RUN/rollouts and the bootstrap hash macros:
    the starting point of every aggregate over a run (metrics here, the report's tables)."""
    root = RunPrefix(run, storage_options)
    if not root.has("rollouts"):
        raise RunNotFound(f"no rollouts Parquet files under {root.url}/rollouts/")
    con = _connect(root)
    try:
        set_variables(con, rollouts_glob=root.glob("rollouts"))
        run_sql(con, "view_rollouts")
        columns = rollout_columns(con)
        missing = [c for c in _NEEDED if c not in columns]
        if missing:
            raise MetricsError(f"rollouts under {root.url} lack column(s) {', '.join(missing)}")
        _create_rollout_parts(con)
        run_sql(con, "hash")
        yield con
    finally:
        con.close()


def _create_rollout_parts(con: duckdb.DuckDBPyConnection) -> None:
    # The one statement built in Python: its columns are the catalogue's part expressions.
    parts = ", ".join(f"{p.sql} AS p_{p.name}" for p in catalogue.PARTS)
    con.execute(f"CREATE OR REPLACE TEMP VIEW rollout_parts AS SELECT *, {parts} FROM rollouts")


def metric_defs() -> list[dict[str, Any]]:
    """The catalogue's ratio metrics as the SQL reads them (variable `metric_defs`)."""
    return [
        {"metric": m.name, "num": m.num, "den": m.den, "scale": m.scale, "ord": i}
        for i, m in enumerate(catalogue.ratios())
    ]


def rollout_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    return list(con.sql("SELECT * FROM rollouts LIMIT 0").columns)


def cost_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [c for c in rollout_columns(con) if c.startswith("cost_")]


def cohort_columns(con: duckdb.DuckDBPyConnection, by: Sequence[str] | None) -> list[str]:
    """The `by` labels checked against the run's label columns (all of them when None)."""
    return resolve_by(by, label_columns(rollout_columns(con)))


def write_metrics(run: str, cohorts: list[dict[str, Any]], storage_options: dict[str, Any] | None = None) -> None:
    """Write RUN/metrics/metrics.parquet (one row per cohort) and pec.parquet (one per cohort and k).

    Fixed file names, replaced whole: a rerun overwrites, never appends.
    """
    metrics_table, pec_table = metrics_tables(cohorts)
    root = RunPrefix(run, storage_options)
    try:
        root.write_parquet("metrics/metrics.parquet", metrics_table)
        root.write_parquet("metrics/pec.parquet", pec_table)
    except OSError as exc:
        raise StorageError(f"cannot write {root.url}/metrics/: {exc}") from exc


def sql(run: str, query: str, storage_options: dict[str, Any] | None = None) -> pa.Table:
    """Run a read-only query over the views steps, rollouts, metrics (+ pec) of a run.

    Every statement must be a read (SELECT, WITH ... SELECT, EXPLAIN [ANALYZE] SELECT); the result of the
    last one is returned. Files outside the run cannot be read.
    """
    statements = _read_statements(query)
    root = RunPrefix(run, storage_options)
    if not root.fs.exists(root.path):
        raise RunNotFound(f"no run at {run}")
    con = _connect(root)
    try:
        for table in ("rollouts", "steps"):
            if root.has(table):
                set_variables(con, **{f"{table}_glob": root.glob(table)})
                run_sql(con, f"view_{table}")
        for name in ("metrics", "pec"):
            if root.exists(f"metrics/{name}.parquet"):
                set_variables(con, **{f"{name}_file": root.file(f"metrics/{name}.parquet")})
                run_sql(con, f"view_{name}")
        set_variables(con, allowed_directories=[root.url + "/"])
        run_sql(con, "lockdown")
        result = pa.table({})
        for text in statements:
            try:
                relation = con.sql(text)
                result = relation.to_arrow_table() if relation is not None else pa.table({})
            except duckdb.Error as exc:  # the user's query is wrong, not pexec
                raise QueryError(str(exc)) from exc
        return result
    finally:
        con.close()


def metrics_tables(cohorts: list[dict[str, Any]]) -> tuple[pa.Table, pa.Table]:
    """The cohort dicts as two flat tables (the layout of metrics.parquet and pec.parquet, pipeline.schema)."""
    fields = set(cohort_fields())
    keys: list[str] = ["benchmark"]
    for c in cohorts:
        keys += [k for k in c if k not in fields and k not in keys]
    rows, pec_rows = [], []
    for c in cohorts:
        row: dict[str, Any] = _label_values(c, keys)
        row |= {"n": c["n"], "n_tasks": c["n_tasks"], "n_no_calls": c["n_no_calls"]}
        for m in catalogue.ratios():
            row |= {m.name: c[m.name]["value"], f"{m.name}_lo": c[m.name]["lo"], f"{m.name}_hi": c[m.name]["hi"]}
            if m.eligible:
                row[f"{m.name}_eligible"] = c[m.name]["eligible"]
        row |= {f"bootstrap_{k}": v for k, v in c["bootstrap"].items() if k != "duckdb_version"}
        row["duckdb_version"] = c["bootstrap"]["duckdb_version"]
        rows.append(row)
        pec_rows += [{**_label_values(c, keys), **p} for p in c["pec"]]
    metrics_schema = schema.arrow_schema(schema.metrics_table(), keys)
    pec_schema = schema.arrow_schema(schema.PEC, keys)
    return pa.Table.from_pylist(rows, metrics_schema), pa.Table.from_pylist(pec_rows, pec_schema)


def _label_values(cohort: dict[str, Any], keys: list[str]) -> dict[str, str | None]:
    return {k: None if cohort.get(k) is None else str(cohort[k]) for k in keys}


# --- internals ---------------------------------------------------------------------------------------


def _connect(root: RunPrefix) -> duckdb.DuckDBPyConnection:
    # In-memory database: nothing is persisted but the Parquet files we write.
    con = duckdb.connect()
    root.attach(con)
    # DuckDB's progress bar only where a person watches (it garbles logs and captured output).
    con.execute(f"SET enable_progress_bar = {str(sys.stderr.isatty()).lower()}")
    return con


def _sql_text(name: str) -> str:
    return (resources.files("pipeline") / "sql" / f"{name}.sql").read_text(encoding="utf-8")


def run_sql(con: duckdb.DuckDBPyConnection, name: str) -> None:
    for statement in duckdb.extract_statements(_sql_text(name)):
        con.execute(statement.query)


def set_variables(con: duckdb.DuckDBPyConnection, **values: Any) -> None:
    # Parameters reach the .sql files as DuckDB variables; names come from this module only.
    for name, value in values.items():
        con.execute(f"SET VARIABLE {name} = ?", [value])


def fetch(con: duckdb.DuckDBPyConnection, table: str) -> list[dict[str, Any]]:
    return con.sql(f"SELECT * FROM {table}").to_arrow_table().to_pylist()


def resolve_by(by: Sequence[str] | None, labels: list[str]) -> list[str]:
    if by is None:
        return list(labels)
    out: list[str] = []
    for name in by:
        if name == "benchmark" or name in out:
            continue  # benchmark is always part of the cohort
        if name not in labels:
            available = ", ".join(labels) if labels else "none (the rollouts have no label columns)"
            raise MetricsError(f"unknown cohort column {name!r}; available label columns: {available}")
        if name in cohort_fields():
            raise MetricsError(f"label column {name!r} clashes with a metric name and cannot define a cohort")
        out.append(name)
    return out


def _interval(row: dict[str, Any] | None) -> dict[str, float | None]:
    if row is None:
        return {"value": None, "lo": None, "hi": None}
    return {"value": row["value"], "lo": row["lo"], "hi": row["hi"]}


def _assemble(
    info: list[dict[str, Any]],
    intervals: list[dict[str, Any]],
    pec: list[dict[str, Any]],
    keys: list[str],
    settings: BootstrapSettings,
) -> list[dict[str, Any]]:
    by_metric = {(r["cohort"], r["metric"]): r for r in intervals}
    pec_by_cohort: dict[int, list[dict[str, Any]]] = {}
    for r in pec:
        pec_by_cohort.setdefault(r["cohort"], []).append({"k": r["k"], **_interval(r)})
    bootstrap = {
        "B": settings.B,
        "seed": settings.seed,
        "method": settings.method,
        "level": settings.level,
        "unit": "task",
        "duckdb_version": duckdb.__version__,
    }
    cohorts = []
    for c in info:
        cid = c["cohort"]
        out: dict[str, Any] = {k: c["key"][k] for k in keys}
        out |= {"n": c["n"], "n_tasks": c["n_tasks"], "n_no_calls": c["n_no_calls"]}
        for m in catalogue.METRICS:
            if m.kind == "curve":
                out[m.name] = sorted(pec_by_cohort.get(cid, []), key=lambda p: p["k"])
                continue
            row = by_metric.get((cid, m.name))
            out[m.name] = _interval(row)
            if m.eligible:
                out[m.name]["eligible"] = row["den_total"] if row is not None else 0
        out["bootstrap"] = dict(bootstrap)
        cohorts.append(out)
    return cohorts


_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?:ANALYZE\s+)?(?:\([^)]*\)\s*)?(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)


def _read_statements(query: str) -> list[str]:
    """The statements of a query, each checked to be a read by DuckDB's own parser."""
    try:
        statements = duckdb.extract_statements(query)
    except duckdb.ParserException as exc:
        raise QueryError(str(exc)) from exc
    if not statements:
        raise QueryRefused("empty query")
    out = []
    for statement in statements:
        if not _is_read(statement):
            kind = statement.type.name
            text = " ".join(statement.query.split())[:80]
            raise QueryRefused(f"only reads (SELECT, WITH, EXPLAIN SELECT) are allowed; refused {kind}: {text}")
        out.append(statement.query)
    return out


def _is_read(statement: Any) -> bool:
    if statement.type == duckdb.StatementType.SELECT:
        return True
    if statement.type == duckdb.StatementType.EXPLAIN:
        match = _EXPLAIN.match(statement.query)
        if match is None:
            return False
        inner = duckdb.extract_statements(match["rest"])
        return len(inner) == 1 and inner[0].type == duckdb.StatementType.SELECT
    return False
