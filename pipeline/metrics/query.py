"""Read-only SQL over a run (`pexec sql`): the run's tables as views, every statement checked to be a read,
within a memory and time limit, and nothing outside the run readable."""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
from dataclasses import dataclass
from typing import Any

import duckdb
import orjson
import pyarrow as pa

from pipeline.core.errors import PexecError
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import connect, run_sql, set_variables

PARTIAL_KEY = b"pexec.partial"  # schema metadata of a `sql` result read from an incomplete run
_METRICS_NAME = re.compile(r"^metrics(_by_\w+)?$")
_MEMORY = re.compile(r"\d+(\.\d+)?\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?:ANALYZE\s+)?(?:\([^)]*\)\s*)?(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)


class QueryRefused(PexecError, ValueError):
    """A statement in a user query is not a read."""


class QueryError(PexecError, duckdb.Error):
    """DuckDB's own error for a user query (syntax, unknown column or table, a file outside the run)."""


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


def sql(snapshot: Snapshot, query: str, limits: QueryLimits | None = None) -> pa.Table:
    """Run a read-only query over the views of a run: steps, rollouts, rejects, and one per metrics result
    (`metrics`/`pec`, `metrics_by_model`/`pec_by_model`, …).

    Every statement must be a read (SELECT, WITH ... SELECT, EXPLAIN [ANALYZE] SELECT); the result of the
    last one is returned. Files outside the run cannot be read. Of an incomplete run (a partial snapshot), the
    result's schema metadata carries the coverage under PARTIAL_KEY (see partial_of). The query runs within
    `limits` (memory, time); its spill files go to a private temporary folder, never the current directory.
    """
    limits = limits or QueryLimits()
    statements = read_statements(query)
    root = snapshot.root
    con = connect(root)
    spill = tempfile.mkdtemp(prefix="pexec-sql-")
    try:
        set_variables(con, memory_limit=limits.memory_limit, temp_directory=spill)
        run_sql(con, "metrics/limits")
        for table in ("rollouts", "steps", "rejects"):
            files = snapshot.parts(table)
            if files:
                set_variables(con, **{f"{table}_files": files})
                run_sql(con, f"metrics/view_{table}")
        _metrics_views(con, snapshot)
        set_variables(con, allowed_directories=[root.url + "/"])
        run_sql(con, "metrics/lockdown")
        result = _run_limited(con, statements, limits)
        covered = snapshot.partial()
        return result if covered is None else result.replace_schema_metadata({PARTIAL_KEY: orjson.dumps(covered)})
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)


def partial_of(result: pa.Table) -> dict[str, Any] | None:
    """The coverage of a `sql` result read from an incomplete run (None: the run is complete)."""
    raw = (result.schema.metadata or {}).get(PARTIAL_KEY)
    return None if raw is None else orjson.loads(raw)


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


def _metrics_views(con: duckdb.DuckDBPyConnection, snapshot: Snapshot) -> None:
    """A view per metrics result under RUN/metrics/<name>/: `<name>` over metrics.parquet and its PEC table
    (`pec`, `pec_by_…`) over pec.parquet, as the snapshot listed them."""
    files = {}
    for rel in sorted(snapshot.files):
        parts = rel.split("/")
        if len(parts) == 3 and parts[0] == "metrics" and parts[2] == "metrics.parquet":
            name = parts[1]
            if _METRICS_NAME.match(name):  # else not written by write_metrics
                files[name] = f"metrics/{name}/metrics.parquet"
                files["pec" + name.removeprefix("metrics")] = f"metrics/{name}/pec.parquet"
    for i, (view, rel) in enumerate(files.items()):
        if rel in snapshot.files:
            # The one statement built here: a view's name is data (validated above); its file, a variable of
            # its own (a view reads its variable when queried).
            set_variables(con, **{f"metrics_file_{i}": snapshot.root.file(rel)})
            con.execute(
                f"CREATE OR REPLACE TEMP VIEW \"{view}\" AS SELECT * FROM read_parquet(getvariable('metrics_file_{i}'))"
            )


def read_statements(query: str) -> list[str]:
    """The statements of a query, each checked to be a read by DuckDB's own parser (QueryError, QueryRefused):
    what `sql` runs, and what a caller may check before it opens the run."""
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
