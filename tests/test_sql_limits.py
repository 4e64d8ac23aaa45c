"""`pexec sql` within limits: time, memory, nothing readable outside the run, every type out.

A real run (synthetic store scored inline), real DuckDB, the real console entry point.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import duckdb
import psutil
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import PexecError
from pipeline.metrics.query import QueryError, _Stopping
from pipeline.metrics.query_limits import QueryLimits
from pipeline.metrics.run import open_run
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

pytestmark = pytest.mark.fuzz  # an adversarial suite: `make fuzz` runs it too


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sqlrun")
    write_store(synthesize("shop", 60, 10, 5), str(root / "store"), "jsonl")
    run_scoring(str(root / "store"), str(root / "run"), ScoreSettings(inline=True))
    return root / "run"


def test_a_runaway_join_is_stopped_by_the_timeout(run: Path) -> None:
    # The measured case: a cross join of the steps table with itself that ran past 60 s.
    query = "SELECT sum(a.step * b.step * c.step * d.step) FROM steps a, steps b, steps c, steps d"
    with pytest.raises(QueryError, match=r"^query stopped after 1 s \(the --timeout\)$"):
        open_run(str(run)).sql(query, QueryLimits(timeout=1))


def test_a_query_over_the_memory_limit_is_an_error(run: Path) -> None:
    query = "SELECT max(length(l)) FROM (SELECT list(x) AS l FROM range(40000000) t(x) GROUP BY x % 2)"
    with pytest.raises(QueryError, match=r"^query needs more than 30MB of memory \(the --memory-limit\)"):
        open_run(str(run)).sql(query, QueryLimits(memory_limit="30MB", timeout=60))


@pytest.mark.parametrize(("limits", "message"), [({"memory_limit": "lots"}, "512MB"), ({"timeout": 0}, "> 0")])
def test_bad_limits_are_refused(limits: dict, message: str) -> None:
    with pytest.raises(PexecError, match=message):
        QueryLimits(**limits)


def test_files_in_the_current_directory_tmp_are_not_readable(run: Path, tmp_path: Path, monkeypatch) -> None:
    # DuckDB's default temp directory is ./.tmp, and it let queries read files there.
    monkeypatch.chdir(tmp_path)
    (tmp_path / ".tmp").mkdir()
    (tmp_path / ".tmp" / "secret.csv").write_text("token\nhunter2\n")
    for path in (".tmp/secret.csv", str(tmp_path / ".tmp" / "secret.csv")):
        with pytest.raises(QueryError, match="Permission Error"):
            open_run(str(run)).sql(f"SELECT * FROM read_csv('{path}')")
    assert open_run(str(run)).sql("SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": 60}]  # the run still is
    assert not list(Path(tempfile.gettempdir()).glob("pexec-sql-*"))  # spill folders are removed


TYPES = (
    "SELECT [1, 2] AS l, {'a': 1, 'b': 'x'} AS s, MAP {'k': [true]} AS m, DATE '2026-11-30' AS d, "
    "1.50::DECIMAL(10, 2) AS dec, '\\xAA\\x00z'::BLOB AS b, INTERVAL 1 DAY AS i, INTERVAL '1 month 90 minutes' AS i2, "
    "TIMESTAMP '2026-11-30 12:00:00' AS ts, NULL AS n, true AS t, 'a,\"b\"' AS txt FROM rollouts LIMIT 1"
)


def cli(*args: str) -> str:
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


def test_csv_and_json_write_every_column_type(run: Path) -> None:
    rows = list(csv.reader(io.StringIO(cli("sql", str(run), TYPES, "--format", "csv"))))
    assert rows == [
        ["l", "s", "m", "d", "dec", "b", "i", "i2", "ts", "n", "t", "txt"],
        [
            "[1,2]",
            '{"a":1,"b":"x"}',
            '{"k":[true]}',
            "2026-11-30",
            "1.50",
            "\\xAA\\x00z",
            "P1D",
            "P1MT5400S",
            "2026-11-30 12:00:00",
            "",
            "true",
            'a,"b"',
        ],
    ]
    (line,) = cli("sql", str(run), TYPES, "--format", "json").splitlines()
    assert json.loads(line) == {
        "l": [1, 2],
        "s": {"a": 1, "b": "x"},
        "m": {"k": [True]},
        "d": "2026-11-30",
        "dec": "1.50",
        "b": "\\xAA\\x00z",
        "i": "P1D",
        "i2": "P1MT5400S",
        "ts": "2026-11-30T12:00:00",
        "n": None,
        "t": True,
        "txt": 'a,"b"',
    }
    table = cli("sql", str(run), TYPES)
    assert "[1,2]" in table and "\\xAA\\x00z" in table


PEXEC = str(Path(sys.executable).parent / "pexec")


def pexec_sql(run: Path, query: str, *options: str, out: Path) -> tuple[int, str, float, float]:
    """`pexec sql` in a process of its own: exit code, stderr, seconds, and its peak RSS in MiB."""
    began = time.perf_counter()
    with out.open("wb") as stdout:
        proc = subprocess.Popen([PEXEC, "sql", str(run), query, *options], stdout=stdout, stderr=subprocess.PIPE)
        peak = 0
        while proc.poll() is None:
            try:
                peak = max(peak, psutil.Process(proc.pid).memory_info().rss)
            except psutil.NoSuchProcess:
                break
            time.sleep(0.05)
        stderr = proc.stderr.read().decode()
    return proc.wait(), stderr, time.perf_counter() - began, peak / 2**20


def test_a_huge_result_streams_within_memory_and_is_cut_at_max_rows(run: Path, tmp_path: Path) -> None:
    # Measured before: SELECT * FROM range(50000000) with --memory-limit 100MB used 12.4 GB for 198 s, exit 0.
    out = tmp_path / "out.csv"
    code, stderr, _took, peak = pexec_sql(
        run,
        "SELECT * FROM range(50000000)",
        "--memory-limit",
        "100MB",
        "--format",
        "csv",
        "--max-rows",
        "200000",
        out=out,
    )
    assert code == 1 and "the result was cut at 200,000 rows (the --max-rows)" in stderr
    with out.open() as f:
        assert sum(1 for _ in f) == 1 + 200_000  # the header and the rows
    assert peak < 400, f"peak RSS {peak:.0f} MiB"  # the process alone takes ~160 MiB
    code, stderr, _took, _peak = pexec_sql(
        run, "SELECT * FROM range(10)", "--max-rows", "10", "--format", "json", out=out
    )
    assert code == 0 and stderr == "" and len(out.read_text().splitlines()) == 10  # exactly the limit: not cut


def test_the_timeout_covers_writing_the_result(run: Path, tmp_path: Path) -> None:
    # Measured before: SELECT * FROM steps (37k rows, a table) took 83 s with --timeout 1.
    code, stderr, took, _peak = pexec_sql(
        run,
        "SELECT * FROM range(100000000)",
        "--timeout",
        "2",
        "--max-rows",
        "100000000",
        "--format",
        "json",
        out=tmp_path / "out.json",
    )
    assert code == 2 and "query stopped after 2 s (the --timeout)" in stderr and took < 30


def test_a_table_is_cut_with_a_message(run: Path) -> None:
    result = CliRunner().invoke(app, ["sql", str(run), "SELECT * FROM range(1500)"])
    assert result.exit_code == 1
    assert "a table shows at most 1,000 rows: --format csv or json streams up to --max-rows" in result.stderr
    assert " 999 " in result.stdout and " 1000 " not in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["metrics", "RUN", "--bootstrap", "10001"],  # reached 22.7 GB in 120 s at 10^8
        ["sql", "RUN", "SELECT 1", "--max-rows", "0"],
        ["sql", "RUN", "SELECT 1", "--max-rows", "1000000001"],
        ["metrics", "RUN", "--max-k", "1001"],
        ["score", "STORE", "--out", "RUN", "--shard-mb", "5000"],
        ["synth", "shop", "--out", "S", "--rollouts", "100000001"],
        ["guard", "serve", "--env", "shop", "--max-sessions", "100001"],
        ["view", "RUN", "--header-timeout", "301"],
    ],
)
def test_size_options_have_upper_bounds_checked_at_parse_time(args: list[str]) -> None:
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2 and "Invalid value for" in result.output, result.output
    assert "less than or equal to" in result.output or "greater than or equal to" in result.output


SPILLING = "SELECT count(*) AS n FROM (SELECT x, count(*) FROM range({n}) t(x) GROUP BY x)"  # a hash table to spill


def spill_folders(where: Path) -> list[Path]:
    return sorted(where.glob("pexec-sql-*"))


def folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def test_spill_files_stay_under_the_spill_limit_and_are_removed(run: Path, tmp_path: Path, monkeypatch) -> None:
    # Measured before: spill files uncapped (716 MiB in 40 s; DuckDB's own default is 90% of the free disk).
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            peak[0] = max([peak[0], *(folder_bytes(f) for f in spill_folders(tmp_path))])
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with pytest.raises(QueryError, match=r"^query needs more than 40MB of spill files \(the --spill-limit\)$"):
            open_run(str(run)).sql(SPILLING.format(n=30_000_000), QueryLimits(memory_limit="100MB", spill_limit="40MB"))
    finally:
        done.set()
        watcher.join()
    assert 0 < peak[0] <= 40 * 10**6, peak[0]  # it did spill, and no more than the limit
    assert spill_folders(tmp_path) == []
    table = open_run(str(run)).sql(SPILLING.format(n=3_000_000), QueryLimits(memory_limit="100MB", spill_limit="1GB"))
    assert table.to_pylist() == [{"n": 3_000_000}] and spill_folders(tmp_path) == []


@pytest.mark.parametrize("limit", ["2TB", "100KB", "lots"])
def test_a_spill_limit_out_of_bounds_is_refused(limit: str) -> None:
    with pytest.raises(PexecError, match=r"spill limit takes a size from 1MiB to 1TiB"):
        QueryLimits(spill_limit=limit)


def spilling_process(run: Path, tmp: Path) -> tuple[subprocess.Popen[bytes], Path]:
    """`pexec sql` on a query that spills for minutes, once its spill folder holds files: the process and the
    folder."""
    query = SPILLING.format(n=2_000_000_000)
    env = {**os.environ, "TMPDIR": str(tmp)}
    proc = subprocess.Popen(
        [PEXEC, "sql", str(run), query, "--memory-limit", "100MB", "--timeout", "600"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
    )
    deadline = time.monotonic() + 60
    while not (folders := spill_folders(tmp)) or folder_bytes(folders[0]) == 0:
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.05)
    return proc, folders[0]


def test_sigterm_mid_query_removes_the_spill_folder_and_exits_143(run: Path, tmp_path: Path) -> None:
    # Measured before: the folder (hundreds of MiB) was left behind.
    proc, folder = spilling_process(run, tmp_path)
    assert folder.name.startswith(f"pexec-sql-{proc.pid}-")
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=30)
    stderr = proc.stderr.read().decode() if proc.stderr else ""
    assert code == 128 + signal.SIGTERM, stderr
    assert "Traceback" not in stderr
    assert spill_folders(tmp_path) == []


def test_the_spill_folder_of_a_killed_query_is_removed_by_the_next(run: Path, tmp_path: Path, monkeypatch) -> None:
    proc, folder = spilling_process(run, tmp_path)
    proc.kill()  # SIGKILL: nothing of it runs
    proc.wait(timeout=30)
    assert folder.exists()
    live = tmp_path / f"pexec-sql-{os.getpid()}-mine"  # a live process's folder is left alone
    live.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert open_run(str(run)).sql("SELECT 1 AS one").to_pylist() == [{"one": 1}]
    assert spill_folders(tmp_path) == [live]


def test_a_signal_as_the_query_ends_stops_nothing_and_prints_no_traceback(monkeypatch) -> None:
    # The fresh-clone run's race: SIGTERM reached the watcher after the query's connection was closed, and its
    # interrupt printed "Exception in thread pexec-sql-signals: ... Connection already closed!" before exit 143.
    raised: list[BaseException | None] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: raised.append(args.exc_value))
    con = duckdb.connect()
    stopping = _Stopping(con)
    stopping.start()
    try:
        con.close()
        assert stopping._sockets is not None
        stopping._sockets[1].send(bytes([signal.SIGTERM]))  # what the wake-up fd carries for a SIGTERM
    finally:
        stopping.stop()  # the watcher reads the byte (and interrupts) before the end of the stream: joined here
    assert raised == []
