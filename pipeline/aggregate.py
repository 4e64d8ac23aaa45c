"""The DuckDB stage: per-cohort metrics with task-level bootstrap intervals, and read-only SQL over a run.

docs/design.md §2 ("Aggregates", "Intervals") and §7. All SQL lives in `pipeline/sql/*.sql`; this module sets a
few DuckDB variables (`getvariable(...)` in the SQL), runs the files in order and shapes the results.

Pipeline (one pass for all cohorts); the metrics and their parts come from pipeline.catalogue:
  view_population.sql        the rollouts the metrics count (`Population`: harness errors, benchmark pools)
  rollout_parts (view)       per rollout, the catalogue's integer parts p_<name>
  metrics_prepare.sql        rollouts -> cohort numbers -> per-(cohort, task) sums `s_*` (+ PEC histogram)
  pipeline.bootstrap         per-(cohort, replicate) sums of the resampled tasks' `s_*` (numpy; the draws of
  bootstrap_sums.sql         sql/hash.sql), put together exactly in SQL
  metrics_intervals.sql      ratios of sums (point estimate = full data), percentile intervals
  _metric_clusters, ...      what the small-sample interval needs, exact moments of the per-task sums (numpy);
                             pipeline.intervals picks the interval per metric

Draws come from our own 32-bit hash (sql/hash.sql, the same in numpy), never from random() or DuckDB's hash(),
so the same run, seed, B and method give the same bounds on any DuckDB version and any thread count.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from importlib import resources
from typing import Any, Literal

import duckdb
import numpy as np
import orjson
import pyarrow as pa

from pipeline import bootstrap, catalogue, intervals, schema
from pipeline.coverage import Coverage, read_coverage
from pipeline.errors import PexecError, StorageError
from pipeline.storage.run import RunPrefix

# The rollouts columns the metrics read.
_NEEDED = ("task_id", "benchmark", "T", "fed", "executable", "auc_term", "success", "n_output_mismatch",
           "n_output_compared", "diverged_before_fed")  # fmt: skip
_UINT32 = 2**32
DEFAULT_METRICS = "metrics"  # the name of the metrics over every label (no --by)
_METRICS_NAME = re.compile(r"^metrics(_by_\w+)?$")
PARTIAL_KEY = b"pexec.partial"  # schema metadata of a `sql` result read from an incomplete run


class MetricsError(PexecError, ValueError):
    """Metrics asked for with settings or cohort columns that do not fit (the message says which)."""


@dataclass(frozen=True)
class BootstrapSettings:
    B: int = 1000
    seed: int = 0
    method: Literal["multinomial", "poisson", "poisson-merged"] = "multinomial"
    level: float = 0.95

    def __post_init__(self) -> None:
        if self.B < 1:
            raise MetricsError(f"bootstrap B must be >= 1, got {self.B}")
        if not 0 <= self.seed < _UINT32:
            raise MetricsError(f"bootstrap seed must be in [0, 2**32), got {self.seed}")
        if self.method not in ("multinomial", "poisson", "poisson-merged"):
            raise MetricsError(
                f"bootstrap method must be 'multinomial', 'poisson' or 'poisson-merged', got {self.method!r}"
            )
        if not 0 < self.level < 1:
            raise MetricsError(f"confidence level must be in (0, 1), got {self.level}")

    @property
    def quantiles(self) -> tuple[float, float]:
        alpha = (1 - self.level) / 2
        return alpha, 1 - alpha

    @property
    def sql_variables(self) -> dict[str, Any]:
        """The draws and percentiles as the .sql files read them (seed, B, q_lo, q_hi)."""
        q_lo, q_hi = self.quantiles
        return {"seed": self.seed, "B": self.B, "q_lo": q_lo, "q_hi": q_hi}


DEFAULT_BOOTSTRAP = BootstrapSettings()
HarnessErrors = Literal["exclude", "fail"]


@dataclass(frozen=True)
class Population:
    """Which rollouts every aggregate counts, and as what (docs/design.md §4; sql/view_population.sql).

    harness_errors: "exclude" leaves harness-error rollouts out of every metric; "fail" counts them as
    non-executable failures (executable and success false). Either way they are counted per cohort.
    pools: (pool name, its benchmarks): those benchmarks form one cohort under the pool's name; their tasks stay
    distinct per benchmark in the bootstrap.
    strict_replay: leave out the rollouts whose replay diverged from the log before their first error (their FED
    is not trustworthy); they are counted per cohort either way.
    """

    harness_errors: HarnessErrors = "exclude"
    pools: tuple[tuple[str, tuple[str, ...]], ...] = ()
    strict_replay: bool = False

    def __post_init__(self) -> None:
        if self.harness_errors not in ("exclude", "fail"):
            raise MetricsError(f"harness errors are 'exclude' or 'fail', got {self.harness_errors!r}")
        seen: dict[str, str] = {}
        for name, benchmarks in self.pools:
            if not name or not benchmarks:
                raise MetricsError(f"a pool needs a name and its benchmarks, got {name!r}={','.join(benchmarks)!r}")
            for b in benchmarks:
                if b in seen:
                    raise MetricsError(f"benchmark {b!r} is in two pools: {seen[b]!r} and {name!r}")
                seen[b] = name

    @property
    def pooled(self) -> dict[str, str]:
        """benchmark -> the pool it is counted in."""
        return {b: name for name, benchmarks in self.pools for b in benchmarks}


DEFAULT_POPULATION = Population()


def harness_note(cohorts: Sequence[dict[str, Any]]) -> str:
    """How harness-error rollouts (the harness never really ran them) entered the cohorts' numbers."""
    n = sum(c["n_harness_error"] for c in cohorts)
    if cohorts and cohorts[0]["harness_errors"] == "fail":
        return f"Harness errors: {n}, counted in N as non-executable failures (executable and success false)."
    return f"Harness errors: {n}, left out of N and of every metric (--harness-errors fail counts them as failures)."


class QueryRefused(PexecError, ValueError):
    """A statement in a user query is not a read."""


class QueryError(PexecError, duckdb.Error):
    """DuckDB's own error for a user query (syntax, unknown column or table, a file outside the run)."""


def label_columns(columns: Sequence[str]) -> list[str]:
    """Condition label columns of a rollouts table, in table order: any column that is neither fixed, nor a
    cost, nor an attribute."""
    return [
        c for c in columns if c not in schema.RESERVED_COLUMNS and not c.startswith(("cost_", schema.ATTRIBUTE_PREFIX))
    ]


def attribute_columns(columns: Sequence[str]) -> list[str]:
    """Attribute columns (`attr_<name>`) of a rollouts table, in table order."""
    return [c for c in columns if c.startswith(schema.ATTRIBUTE_PREFIX)]


def cohort_fields() -> tuple[str, ...]:
    """The keys of a cohort dict besides its label values (a label may not take one of these names)."""
    counts = (c.name for c in (*schema.COHORT_COUNTS, *schema.POPULATION))
    return (*counts, *(m.name for m in catalogue.METRICS), "bootstrap", "partial")


def compute_metrics(
    run: str,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    storage_options: dict[str, Any] | None = None,
    partial: bool = False,
    population: Population = DEFAULT_POPULATION,
) -> list[dict[str, Any]]:
    """Metrics per cohort (benchmark + `by` columns: condition labels, or attributes when named; every condition
    label when `by` is None), JSON-ready, over the rollouts `population` counts.

    Cohorts come out sorted by their key (benchmark, then the labels in table order; NULL labels last).
    An incomplete run is refused unless `partial`; then every cohort's `partial` states the coverage
    (None for a complete run), pipeline.coverage.
    """
    return metrics_and_replicates(run, by, settings, max_k, storage_options, partial, population)[0]


Replicates = list[dict[str, list[float | None]]]  # per cohort (as listed): metric -> value per replicate b


def metrics_and_replicates(
    run: str,
    by: Sequence[str] | None = None,
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP,
    max_k: int | None = None,
    storage_options: dict[str, Any] | None = None,
    partial: bool = False,
    population: Population = DEFAULT_POPULATION,
    replicated: Sequence[str] = (),
) -> tuple[list[dict[str, Any]], Replicates]:
    """compute_metrics, and the bootstrap replicates' values of the `replicated` ratio metrics (the draws the
    intervals come from; None where a replicate's ratio is undefined)."""
    if max_k is not None and max_k < 0:
        raise MetricsError(f"max_k must be >= 0, got {max_k}")
    coverage = read_coverage(run, storage_options, partial)
    with _open_rollouts(coverage, population) as con:
        by_cols = cohort_columns(con, by)
        set_variables(
            con,
            **settings.sql_variables,
            cohort_cols=["benchmark", *by_cols],
            max_k=max_k,
            metric_defs=metric_defs(),
            parts=[f"s_{p.name}" for p in catalogue.PARTS],
            replicated=list(replicated),
        )
        run_sql(con, "metrics_prepare")
        sums = task_sums(con)
        run_bootstrap(con, sums, settings)
        run_sql(con, "metrics_intervals")
        info = fetch(con, "cohort_info")
        ratios = _join(fetch(con, "metric_intervals"), _metric_clusters(sums), ("cohort", "metric"))
        k = con.execute("SELECT getvariable('pexec_k')").fetchall()[0][0]
        pec = _join(fetch(con, "pec_intervals"), _pec_clusters(sums, k), ("cohort", "k"))
        reps = fetch(con, "replicated_values")
        run_sql(con, "harness_counts")
        harness = fetch(con, "harness_counts")
    cohorts, ids = _assemble(info, ratios, pec, harness, ["benchmark", *by_cols], settings, population)
    by_id: dict[int, dict[str, list[float | None]]] = {}
    for r in reps:
        by_id.setdefault(r["cohort"], {})[r["metric"]] = r["replicate_values"]
    # A cohort with no rollout in the population (only harness errors) has no replicates: all undefined.
    undefined = [None] * settings.B
    per_cohort: Replicates = [{m: by_id.get(cid, {}).get(m, undefined) for m in replicated} for cid in ids]
    for c in cohorts:
        c["partial"] = coverage.partial()
    return cohorts, per_cohort


@dataclass(frozen=True)
class TaskSums:
    """Table task_sums in numpy: per cohort (numbered 0 .. n-1), its tasks' s_* sums (tasks in task_id order)."""

    columns: list[str]
    cohorts: list[np.ndarray]  # int64, tasks x columns

    def column(self, cohort: int, name: str) -> np.ndarray:
        if name not in self.columns:  # a depth no rollout reached has no column (sql/metrics_prepare.sql)
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
    """rep_sums: per-(cohort, replicate) sums of the resampled tasks' s_* columns (pipeline.bootstrap draws and
    weighs the tasks in numpy; sql/bootstrap_sums.sql puts the exact sums together)."""
    if settings.method == "poisson-merged":
        # Weights keyed by the task itself (pipeline.bootstrap): what scoring shards can sum on their own; here
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
    run_sql(con, "bootstrap_sums")
    con.unregister("rep_limbs")


def _metric_clusters(sums: TaskSums) -> list[dict[str, Any]]:
    """What the small-sample interval needs per (cohort, ratio metric): y_i = the numerator part's sum of task i,
    x_i the denominator's (pipeline.intervals.Cluster)."""
    rows = []
    for c in range(len(sums.cohorts)):
        for m in catalogue.ratios():
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


@contextmanager
def open_rollouts(
    run: str,
    storage_options: dict[str, Any] | None = None,
    partial: bool = False,
    population: Population = DEFAULT_POPULATION,
) -> Iterator[duckdb.DuckDBPyConnection]:
    """A fresh in-memory connection with the view `rollouts` = the rollouts `population` counts (over the run's
    rollouts parts: `run_rollouts`, every row as scored; `all_rollouts`, the same with the pools applied), the view
    `rollout_parts` (those rollouts with the catalogue's parts) and the bootstrap hash macros: the starting point
    of every aggregate over a run (metrics here, the report's tables). Harness errors are left out or made
    failures, and under strict replay the rollouts whose replay diverged before their first error are left out,
    here, in one place, for every metric. An incomplete run is refused unless `partial` (pipeline.coverage)."""
    with _open_rollouts(read_coverage(run, storage_options, partial), population) as con:
        yield con


@contextmanager
def _open_rollouts(coverage: Coverage, population: Population) -> Iterator[duckdb.DuckDBPyConnection]:
    root = coverage.root
    con = _connect(root)
    try:
        set_variables(con, rollouts_files=coverage.parts("rollouts"))
        run_sql(con, "view_rollouts")
        columns = rollout_columns(con)
        missing = [c for c in _NEEDED if c not in columns]
        if missing:
            raise MetricsError(
                f"rollouts under {root.url} lack column(s) {', '.join(missing)}: scored by an older pexec; "
                "rescore it with the same `pexec score STORE --out RUN`"
            )
        pooled = population.pooled
        set_variables(
            con,
            harness_errors=population.harness_errors,
            pool_from=list(pooled),
            pool_to=list(pooled.values()),
        )
        run_sql(con, "view_population")
        _check_pools(con, population, root.url)
        _create_rollout_parts(con, population.strict_replay)
        run_sql(con, "hash")
        yield con
    finally:
        con.close()


def _check_pools(con: duckdb.DuckDBPyConnection, population: Population, url: str) -> None:
    # A pool naming a benchmark the run does not have would silently be a smaller pool than asked for.
    present = {r[0] for r in con.sql("SELECT DISTINCT benchmark FROM run_rollouts").fetchall()}
    absent = [b for b in population.pooled if b not in present]
    if absent:
        have = ", ".join(sorted(map(str, present)))
        raise MetricsError(f"--pool names benchmark(s) {', '.join(absent)} that {url} does not have (it has: {have})")


def _create_rollout_parts(con: duckdb.DuckDBPyConnection, strict_replay: bool) -> None:
    # The one statement built in Python: its columns are the catalogue's part expressions.
    parts = ", ".join(f"{p.sql} AS p_{p.name}" for p in catalogue.PARTS)
    where = " WHERE NOT diverged_before_fed" if strict_replay else ""
    con.execute(f"CREATE OR REPLACE TEMP VIEW rollout_parts AS SELECT *, {parts} FROM rollouts{where}")


def metric_defs(paired: bool = False) -> list[dict[str, Any]]:
    """The catalogue's ratio metrics as the SQL reads them (variable `metric_defs`); `paired`: only those of the
    paired comparison."""
    shown = [m for m in catalogue.ratios() if m.paired or not paired]
    return [{"metric": m.name, "num": m.num, "den": m.den, "scale": m.scale, "ord": i} for i, m in enumerate(shown)]


def rollout_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    return list(con.sql("SELECT * FROM rollouts LIMIT 0").columns)


def cost_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [c for c in rollout_columns(con) if c.startswith("cost_")]


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


def write_metrics(
    run: str,
    cohorts: list[dict[str, Any]],
    storage_options: dict[str, Any] | None = None,
    by: Sequence[str] | None = None,
) -> str:
    """Write RUN/metrics/<name>/metrics.parquet (one row per cohort) and pec.parquet (one per cohort and k),
    `<name>` = metrics_name(by), the `by` the cohorts were computed with; returns that folder.

    Fixed file names, replaced whole: the same `by` again overwrites, never appends; another `by` is kept
    beside it.
    """
    metrics_table, pec_table = metrics_tables(cohorts)
    root = RunPrefix(run, storage_options)
    folder = f"metrics/{metrics_name(by)}"
    try:
        root.write_parquet(f"{folder}/metrics.parquet", metrics_table)
        root.write_parquet(f"{folder}/pec.parquet", pec_table)
    except OSError as exc:
        raise StorageError(f"cannot write {root.url}/{folder}/: {exc}") from exc
    return root.file(folder)


@dataclass(frozen=True)
class QueryLimits:
    """What one `sql()` call may use. DuckDB spills to `temp_directory` beyond the memory limit, and has no
    statement timeout of its own: a timer interrupts the connection."""

    memory_limit: str = "2GB"
    timeout: float = 120.0  # seconds, for all statements of the query together

    def __post_init__(self) -> None:
        if not _MEMORY.fullmatch(self.memory_limit):
            raise PexecError(f"memory limit takes a size such as 512MB or 4GB, got {self.memory_limit!r}")
        if not self.timeout > 0:
            raise PexecError(f"timeout takes seconds > 0, got {self.timeout}")


_MEMORY = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)


def sql(
    run: str,
    query: str,
    storage_options: dict[str, Any] | None = None,
    partial: bool = False,
    limits: QueryLimits | None = None,
) -> pa.Table:
    """Run a read-only query over the views of a run: steps, rollouts, rejects, and one per metrics result
    (`metrics`/`pec`, `metrics_by_model`/`pec_by_model`, …).

    Every statement must be a read (SELECT, WITH ... SELECT, EXPLAIN [ANALYZE] SELECT); the result of the
    last one is returned. Files outside the run cannot be read. An incomplete run is refused unless
    `partial`; then the result's schema metadata carries the coverage under PARTIAL_KEY (see partial_of).
    The query runs within `limits` (memory, time); its spill files go to a private temporary folder, never
    the current directory.
    """
    limits = limits or QueryLimits()
    statements = _read_statements(query)
    coverage = read_coverage(run, storage_options, partial)
    root = coverage.root
    con = _connect(root)
    spill = tempfile.mkdtemp(prefix="pexec-sql-")
    try:
        set_variables(con, memory_limit=limits.memory_limit, temp_directory=spill)
        run_sql(con, "limits")
        for table in ("rollouts", "steps", "rejects"):
            files = coverage.parts(table)
            if files:
                set_variables(con, **{f"{table}_files": files})
                run_sql(con, f"view_{table}")
        _metrics_views(con, root)
        set_variables(con, allowed_directories=[root.url + "/"])
        run_sql(con, "lockdown")
        result = _run_limited(con, statements, limits)
        covered = coverage.partial()
        return result if covered is None else result.replace_schema_metadata({PARTIAL_KEY: orjson.dumps(covered)})
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def _run_limited(con: duckdb.DuckDBPyConnection, statements: list[str], limits: QueryLimits) -> pa.Table:
    timer = threading.Timer(limits.timeout, con.interrupt)
    timer.start()
    result = pa.table({})
    try:
        for text in statements:
            relation = con.sql(text)
            result = relation.to_arrow_table() if relation is not None else pa.table({})
    except duckdb.InterruptException as exc:
        raise QueryError(f"query stopped after {limits.timeout:g} s (the --timeout)") from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryError(
            f"query needs more than {limits.memory_limit} of memory (the --memory-limit) and its spill space"
        ) from exc
    except duckdb.Error as exc:  # the user's query is wrong, not pexec
        raise QueryError(str(exc)) from exc
    finally:
        timer.cancel()
    return result


def partial_of(result: pa.Table) -> dict[str, Any] | None:
    """The coverage of a `sql` result read from an incomplete run (None: the run is complete)."""
    raw = (result.schema.metadata or {}).get(PARTIAL_KEY)
    return None if raw is None else orjson.loads(raw)


def _metrics_views(con: duckdb.DuckDBPyConnection, root: RunPrefix) -> None:
    """A view per metrics result under RUN/metrics/<name>/: `<name>` over metrics.parquet and its PEC table
    (`pec`, `pec_by_…`) over pec.parquet."""
    files = {}
    for path in sorted(root.fs.glob(f"{root.path}/metrics/*/metrics.parquet")):
        name = path.rsplit("/", 2)[-2]
        if _METRICS_NAME.match(name):  # else not written by write_metrics
            files[name] = f"metrics/{name}/metrics.parquet"
            files["pec" + name.removeprefix("metrics")] = f"metrics/{name}/pec.parquet"
    for i, (view, rel) in enumerate(files.items()):
        if root.exists(rel):
            # The one statement built here: a view's name is data (validated above); its file, a variable of
            # its own (a view reads its variable when queried).
            set_variables(con, **{f"metrics_file_{i}": root.file(rel)})
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW \"{view}\" AS SELECT * FROM read_parquet(getvariable('metrics_file_{i}'))"
            )


def metrics_tables(cohorts: list[dict[str, Any]]) -> tuple[pa.Table, pa.Table]:
    """The cohort dicts as two flat tables (the layout of metrics.parquet and pec.parquet, pipeline.schema)."""
    fields = set(cohort_fields())
    keys: list[str] = ["benchmark"]
    for c in cohorts:
        keys += [k for k in c if k not in fields and k not in keys]
    rows, pec_rows = [], []
    for c in cohorts:
        row: dict[str, Any] = _label_values(c, keys)
        row |= {col.name: c[col.name] for col in (*schema.COHORT_COUNTS, *schema.POPULATION)}
        for m in catalogue.ratios():
            row |= {m.name: c[m.name]["value"], f"{m.name}_lo": c[m.name]["lo"], f"{m.name}_hi": c[m.name]["hi"]}
            row[f"{m.name}_method"] = c[m.name].get("method")
            if m.eligible:
                row[f"{m.name}_eligible"] = c[m.name]["eligible"]
        row |= {f"bootstrap_{k}": v for k, v in c["bootstrap"].items() if k != "duckdb_version"}
        row["duckdb_version"] = c["bootstrap"]["duckdb_version"]
        covered = c.get("partial") or {}
        row["partial"] = bool(covered)
        row |= {c.name: covered.get(c.name.removeprefix("partial_")) for c in schema.PARTIAL[1:]}
        rows.append(row)
        pec_rows += [{**_label_values(c, keys), "method": None, **p} for p in c["pec"]]
    metrics_schema = schema.arrow_schema(schema.metrics_table(), keys)
    pec_schema = schema.arrow_schema(schema.PEC, keys)
    return pa.Table.from_pylist(rows, metrics_schema), pa.Table.from_pylist(pec_rows, pec_schema)


def replay_note(cohorts: list[dict[str, Any]]) -> str:
    """How many rollouts' replay diverged from the log before their first error, and what was done with them."""
    diverged = sum(c["n_diverged_before_fed"] for c in cohorts)
    if cohorts and cohorts[0]["strict_replay"]:
        return (
            f"--strict-replay: {diverged} rollout(s) whose replay diverged from the log before their first error "
            "are left out of every number."
        )
    return (
        f"{diverged} rollout(s) diverged from the log before their first error (their FED is not trustworthy); "
        "they are counted (--strict-replay leaves them out)."
    )


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


def resolve_by(by: Sequence[str] | None, labels: list[str], attributes: Sequence[str] = ()) -> list[str]:
    """Cohort columns for `by` (every condition label when None). `attributes` are column names (`attr_<name>`),
    found by either name."""
    if by is None:
        return list(labels)
    out: list[str] = []
    for name in by:
        column = name if name in labels or name in attributes else schema.ATTRIBUTE_PREFIX + name
        if name == "benchmark" or column in out:
            continue  # benchmark is always part of the cohort
        if column not in labels and column not in attributes:
            available = ", ".join(labels) if labels else "none (the rollouts have no label columns)"
            attrs = ", ".join(a.removeprefix(schema.ATTRIBUTE_PREFIX) for a in attributes) or "none"
            raise MetricsError(
                f"unknown cohort column {name!r}; available label columns: {available}; attributes: {attrs}"
            )
        if name in cohort_fields():
            raise MetricsError(f"label column {name!r} clashes with a metric name and cannot define a cohort")
        out.append(column)
    return out


def interval(row: dict[str, Any] | None, level: float) -> dict[str, Any]:
    """value, lo, hi and the interval's method (pipeline.intervals); no method where there is no value, nor for
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
        out |= {col.name: c[col.name] for col in schema.COHORT_COUNTS if col.name != "n_harness_error"}
        out["n_harness_error"] = n_harness.get(key(c["key"]), 0)  # counted over every scored rollout
        out |= {"harness_errors": population.harness_errors, "strict_replay": population.strict_replay}
        for m in catalogue.METRICS:
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
