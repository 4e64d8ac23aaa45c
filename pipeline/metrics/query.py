"""Read-only SQL over a run (`pexec sql`): the run's tables as views, every statement checked to be a read,
within a memory, spill and time limit, and nothing outside the run readable.

DuckDB spills what does not fit its memory limit to files in a private temporary folder, at most `spill_limit` of
them (its `max_temp_directory_size`). The folder is removed when the query ends, however it ends: an error, the
timeout, or SIGTERM / SIGINT (which interrupt DuckDB mid-query, so that the folder is removed before the process
exits with 128 + the signal's number). One killed outright (SIGKILL) cannot: the next query removes the folders of
processes that are gone (their names carry the process id)."""

from __future__ import annotations

import contextlib
import functools
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import duckdb
import orjson

from pipeline.core.arrow import pa
from pipeline.core.errors import PexecError, QueryRefused
from pipeline.metrics.completeness import Coverage, Snapshot
from pipeline.metrics.duck import connect, run_sql, set_variables
from pipeline.metrics.query_limits import QueryLimits

PARTIAL_KEY = b"pexec.partial"  # schema metadata of a `sql` result read from an incomplete run
_METRICS_NAME = re.compile(r"^metrics(_by_\w+)?$")
_SPILL_PREFIX = "pexec-sql-"  # the spill folder's name: the prefix, the process id, a dash, a random part
_STOPPING = (signal.SIGTERM, signal.SIGINT)  # signals that stop a query and remove its spill folder
BATCH_ROWS = 10_000  # rows fetched from DuckDB at a time while a result streams
Result = TypeVar("Result")
_EXPLAIN = re.compile(r"^\s*EXPLAIN\s+(?:ANALYZE\s+)?(?:\([^)]*\)\s*)?(?P<rest>.*)$", re.IGNORECASE | re.DOTALL)


class QueryError(PexecError, duckdb.Error):
    """DuckDB's own error for a user query (syntax, unknown column or table, a file outside the run)."""


class QueryResult:
    """A query's result as it streams: its schema, its batches (each fetched within the time limit, at most
    `max_rows` rows in all), the run's coverage when partial, and after the batches why rows were cut, if
    they were."""

    def __init__(
        self,
        reader: pa.RecordBatchReader,
        limits: QueryLimits,
        deadline: float,
        partial: Coverage | None,
    ) -> None:
        self.schema = reader.schema
        self.partial = partial
        self.limits = limits
        self.rows = 0
        self.cut: str | None = None  # why fewer rows were given than the query has (None: all were)
        self._reader = reader
        self._deadline = deadline

    def check_time(self) -> None:
        """QueryError once the --timeout has passed (a consumer writing rows checks too)."""
        if time.monotonic() > self._deadline:
            raise QueryError(f"query stopped after {self.limits.timeout:g} s (the --timeout)")

    def batches(self) -> Iterator[pa.RecordBatch]:
        left = self.limits.max_rows
        while True:
            self.check_time()
            try:
                batch = _limited(lambda: self._reader.read_next_batch(), self.limits)
            except StopIteration:
                return
            more = batch.num_rows > left
            if more:
                batch = batch.slice(0, left)
            elif batch.num_rows == left:  # a row past the limit tells a cut result from one exactly that long
                more = self._has_more()
            if more:
                self.cut = f"the result was cut at {self.limits.max_rows:,} rows (the --max-rows)"
            self.rows += batch.num_rows
            left -= batch.num_rows
            if batch.num_rows:
                yield batch
            if left == 0:
                return

    def _has_more(self) -> bool:
        try:
            while True:
                batch = _limited(lambda: self._reader.read_next_batch(), self.limits)
                if batch.num_rows:
                    return True
        except StopIteration:
            return False


def sql(snapshot: Snapshot, query: str, limits: QueryLimits | None = None) -> pa.Table:
    """Run a read-only query over the views of a run: steps, rollouts, rejects, and one per metrics result
    (`metrics`/`pec`, `metrics_by_model`/`pec_by_model`, …), and return its result as one table.

    Every statement must be a read (SELECT, WITH ... SELECT, EXPLAIN [ANALYZE] SELECT); the result of the
    last one is returned. Files outside the run cannot be read. Of an incomplete run (a partial snapshot), the
    result's schema metadata carries the coverage under PARTIAL_KEY (see partial_of). The query runs within
    `limits` (memory, time, rows: a result longer than `max_rows` is a QueryError here; `stream_sql` cuts it);
    its spill files go to a private temporary folder, never the current directory.
    """
    limits = limits or QueryLimits()
    with stream_sql(snapshot, query, limits) as result:
        batches = list(result.batches())
        if result.cut:
            raise QueryError(f"the result has more than {limits.max_rows:,} rows (the --max-rows)")
        table = pa.Table.from_batches(batches, result.schema)
    covered = result.partial
    return table if covered is None else table.replace_schema_metadata({PARTIAL_KEY: orjson.dumps(covered.as_json())})


@contextmanager
def stream_sql(snapshot: Snapshot, query: str, limits: QueryLimits | None = None) -> Iterator[QueryResult]:
    """`sql`'s query with its result streamed (QueryResult.batches) under the same memory and time limits, at
    most `max_rows` rows (`cut` says whether more were left)."""
    limits = limits or QueryLimits()
    statements = read_statements(query)
    deadline = time.monotonic() + limits.timeout
    root = snapshot.root
    con = connect(root)
    spill = _spill_folder()
    # DuckDB has no statement timeout of its own: a timer interrupts the connection, reading included.
    timer = threading.Timer(limits.timeout, _interrupt, (con,))
    timer.start()
    stopping = _Stopping(con)
    try:
        stopping.start()
        set_variables(con, memory_limit=limits.memory_limit, spill_limit=limits.spill_limit, temp_directory=str(spill))
        run_sql(con, "metrics/limits")
        for table in ("rollouts", "steps", "rejects"):
            files = snapshot.parts(table)
            if files:
                set_variables(con, **{f"{table}_files": files})
                # A view reads its parts' footers: a part damaged where no digest can tell (layout 1) is DuckDB's
                # one-line error, as a query's own.
                _limited(functools.partial(run_sql, con, f"metrics/view_{table}"), limits)
        _metrics_views(con, snapshot)
        set_variables(con, allowed_directories=[root.url + "/"])
        run_sql(con, "metrics/lockdown")
        for text in statements[:-1]:  # run for their errors; only the last one's result is shown
            _limited(functools.partial(_drain, con, text), limits)
        reader = _limited(lambda: _reader(con, statements[-1]), limits)
        yield QueryResult(reader, limits, deadline, snapshot.partial())
    finally:
        stopping.closing = True  # a signal from here on waits for the folder to be removed
        timer.cancel()
        con.close()
        shutil.rmtree(spill, ignore_errors=True)
        stopping.stop()


def _spill_folder() -> Path:
    """A new private folder for the query's spill files, named with this process's id; the folders of processes
    that are gone (killed outright) are removed first."""
    base = Path(tempfile.gettempdir())
    for folder in base.glob(f"{_SPILL_PREFIX}*-*"):
        pid = folder.name.removeprefix(_SPILL_PREFIX).split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{_SPILL_PREFIX}{os.getpid()}-"))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _interrupt(con: duckdb.DuckDBPyConnection) -> None:
    """Interrupt the query running on `con`, from another thread. The query may have ended and the connection
    been closed meanwhile (a signal or the timeout arriving as the query finishes): nothing is left to stop then,
    and DuckDB's error about the closed connection would print as a thread's traceback."""
    with contextlib.suppress(duckdb.ConnectionException):
        con.interrupt()


class _Stopping:
    """While a query runs in the main thread: SIGTERM and SIGINT interrupt DuckDB (from a thread that waits on
    the signal wake-up socket, since the main thread is inside DuckDB and runs no Python until it returns), then
    end the process with 128 + the signal's number (SystemExit, so every `finally` on the way runs). A signal
    that arrives while the query is being cleaned up ends the process once the cleanup is done. Off the main
    thread (a notebook's worker, the viewer) nothing is installed: signals are the caller's."""

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self.closing = False
        self.signalled: int | None = None
        self._installed = False
        self._previous: dict[int, Any] = {}
        self._wakeup = -1
        self._sockets: tuple[socket.socket, socket.socket] | None = None
        self._watcher: threading.Thread | None = None

    def start(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        reader, writer = socket.socketpair()
        writer.setblocking(False)
        self._sockets = (reader, writer)
        for signum in _STOPPING:
            self._previous[signum] = signal.signal(signum, self._handle)
        self._wakeup = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        self._installed = True
        self._watcher = threading.Thread(target=self._watch, args=(reader,), name="pexec-sql-signals", daemon=True)
        self._watcher.start()

    def _watch(self, reader: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := reader.recv(64):  # b"": the writing end closed, the query is over
                if any(b in _STOPPING for b in data):
                    _interrupt(self.con)

    def _handle(self, signum: int, frame: object) -> None:
        self.signalled = signum
        if not self.closing:
            raise SystemExit(128 + signum)

    def stop(self) -> None:
        if not self._installed:
            return
        signal.set_wakeup_fd(self._wakeup)
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)
        if self._sockets is not None:
            reader, writer = self._sockets
            writer.close()  # the watcher reads the end of the stream and returns (dropping the connection)
            if self._watcher is not None:
                self._watcher.join(timeout=10)
            reader.close()
        self._installed = False
        if self.signalled is not None:
            raise SystemExit(128 + self.signalled)


def _reader(con: duckdb.DuckDBPyConnection, text: str) -> pa.RecordBatchReader:
    # DuckDB's stubs promise a relation; a statement without a result gives None.
    relation: duckdb.DuckDBPyRelation | None = con.sql(text)
    if relation is None:
        return pa.RecordBatchReader.from_batches(pa.schema([]), [])
    return relation.to_arrow_reader(BATCH_ROWS)


def _drain(con: duckdb.DuckDBPyConnection, text: str) -> None:
    """Run a statement for its errors only: its result is read and dropped."""
    for _batch in _reader(con, text):
        pass


def partial_of(result: pa.Table) -> Coverage | None:
    """The coverage of a `sql` result read from an incomplete run (None: the run is complete)."""
    raw = (result.schema.metadata or {}).get(PARTIAL_KEY)
    return None if raw is None else Coverage(**orjson.loads(raw))


def _limited(step: Callable[[], Result], limits: QueryLimits) -> Result:
    """`step()` with DuckDB's interrupt and memory errors as the one-line errors naming the option."""
    try:
        return step()
    except duckdb.InterruptException as exc:
        raise QueryError(f"query stopped after {limits.timeout:g} s (the --timeout)") from exc
    except duckdb.OutOfMemoryException as exc:
        raise QueryError(_out_of_memory(str(exc), limits)) from exc
    except duckdb.Error as exc:  # the user's query is wrong, not pexec
        raise QueryError(str(exc)) from exc
    except pa.ArrowInvalid as exc:  # DuckDB's errors while a stream is read arrive through Arrow
        message = str(exc)
        if "INTERRUPT" in message.upper():
            raise QueryError(f"query stopped after {limits.timeout:g} s (the --timeout)") from exc
        if "Out of Memory" in message:
            raise QueryError(_out_of_memory(message, limits)) from exc
        raise QueryError(message) from exc


def _out_of_memory(message: str, limits: QueryLimits) -> str:
    if "max_temp_directory_size" in message:
        return f"query needs more than {limits.spill_limit} of spill files (the --spill-limit)"
    return f"query needs more than {limits.memory_limit} of memory (the --memory-limit) and its spill space"


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


def _is_read(statement: duckdb.Statement) -> bool:
    if statement.type == duckdb.StatementType.SELECT:
        return True
    if statement.type == duckdb.StatementType.EXPLAIN:
        match = _EXPLAIN.match(statement.query)
        if match is None:
            return False
        inner = duckdb.extract_statements(match["rest"])
        return len(inner) == 1 and inner[0].type == duckdb.StatementType.SELECT
    return False
