"""The starting point of every aggregate over a run: a DuckDB connection whose view `rollouts` holds exactly the
rollouts a Population counts.

Over the rollouts parts of a snapshot: `run_rollouts` (every row as scored), `all_rollouts` (the same with the
pools applied), `rollouts` (the population), `rollout_parts` (those rollouts with the metric catalogue's integer
parts) and the bootstrap's hash macros. Harness errors are left out or made failures, and under strict replay
the rollouts whose replay diverged before their first error are left out, here, in one place, for every metric.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import duckdb

from pipeline.core import metric_catalogue
from pipeline.core.arrow import pa
from pipeline.core.errors import MetricsError
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import connect, rollout_columns, run_sql, set_variables
from pipeline.metrics.settings import DEFAULT_POPULATION, Population
from pipeline.storage.run import RunPrefix

# The rollouts columns the metrics read.
NEEDED = ("task_id", "benchmark", "T", "fed", "executable", "auc_term", "success", "n_output_mismatch",
          "n_output_compared", "diverged_before_fed")  # fmt: skip


@contextmanager
def open_population(
    snapshot: Snapshot, population: Population = DEFAULT_POPULATION, check: bool = True
) -> Iterator[duckdb.DuckDBPyConnection]:
    """`check`: that every pooled benchmark is in the run (a scan of the run's benchmark column; the distributed
    metrics check it from their parts' benchmarks instead)."""
    with _population(snapshot.root, snapshot.parts("rollouts"), population) as con:
        if check:
            _check_pools(con, population, snapshot.root.url)
        yield con


@contextmanager
def open_part_population(
    root: RunPrefix, file: str, columns: pa.Schema, population: Population = DEFAULT_POPULATION
) -> Iterator[duckdb.DuckDBPyConnection]:
    """The same over one rollouts part file of a run (a task of the distributed metrics), with the columns of the
    whole run (`columns`: a part need not carry every label column, the run's view has them all, in its order).
    Pools are not checked here: a part need not hold every pooled benchmark."""
    with _population(root, [file], population, columns) as con:
        yield con


@contextmanager
def _population(
    root: RunPrefix, files: list[str], population: Population, columns: pa.Schema | None = None
) -> Iterator[duckdb.DuckDBPyConnection]:
    con = connect(root)
    try:
        set_variables(con, rollouts_files=files)
        if columns is None:
            run_sql(con, "metrics/view_rollouts")
        else:
            con.register("run_columns", columns.empty_table())
            run_sql(con, "metrics/view_rollouts_part")
        present = rollout_columns(con)
        missing = [c for c in NEEDED if c not in present]
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
        run_sql(con, "metrics/view_population")
        _create_rollout_parts(con, population.strict_replay)
        run_sql(con, "metrics/hash")
        yield con
    finally:
        con.close()


def _check_pools(con: duckdb.DuckDBPyConnection, population: Population, url: str) -> None:
    check_pools({r[0] for r in con.sql("SELECT DISTINCT benchmark FROM run_rollouts").fetchall()}, population, url)


def check_pools(present: set[str], population: Population, url: str) -> None:
    """A pool naming a benchmark the run does not have would silently be a smaller pool than asked for."""
    absent = [b for b in population.pooled if b not in present]
    if absent:
        have = ", ".join(sorted(map(str, present)))
        raise MetricsError(f"--pool names benchmark(s) {', '.join(absent)} that {url} does not have (it has: {have})")


def _create_rollout_parts(con: duckdb.DuckDBPyConnection, strict_replay: bool) -> None:
    # Built in Python, as is pipeline.metrics.cohorts's rollout_keys: its columns are the catalogue's part expressions.
    parts = ", ".join(f"{p.sql} AS p_{p.name}" for p in metric_catalogue.PARTS)
    where = " WHERE NOT diverged_before_fed" if strict_replay else ""
    con.execute(f"CREATE OR REPLACE TEMP VIEW rollout_parts AS SELECT *, {parts} FROM rollouts{where}")
