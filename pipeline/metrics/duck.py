"""DuckDB plumbing every reader of a run shares: a connection, the `.sql` files, variables, results as rows.

SQL lives in `.sql` files beside the code that runs it (`pipeline/<room>/sql/<name>.sql`), named here as
"<room>/<name>". Python hands them values as DuckDB variables (`getvariable(...)` in the SQL), never by building
statement text from data.
"""

from __future__ import annotations

import contextlib
import sys
from importlib import resources
from typing import Any, TypeVar, cast

import duckdb

from pipeline.storage.run import RunPrefix


def connect(root: RunPrefix) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory connection that can read the run under `root` (nothing is persisted but the Parquet
    files pexec writes)."""
    con = duckdb.connect()
    root.attach(con)
    # DuckDB's progress bar only where a person watches (it garbles logs and captured output). In a Jupyter kernel
    # without ipywidgets DuckDB refuses any change of the setting, and its default there is no bar.
    with contextlib.suppress(duckdb.InvalidInputException):
        con.execute(f"SET enable_progress_bar = {str(sys.stderr.isatty()).lower()}")
    return con


def sql_text(name: str) -> str:
    """The text of `pipeline/<room>/sql/<file>.sql` for name "<room>/<file>" ("apps/view/…" in the apps wing)."""
    room, _, file = name.rpartition("/")
    return resources.files("pipeline").joinpath(*room.split("/"), "sql", f"{file}.sql").read_text(encoding="utf-8")


def run_sql(con: duckdb.DuckDBPyConnection, name: str) -> None:
    for statement in duckdb.extract_statements(sql_text(name)):
        con.execute(statement.query)


def set_variables(con: duckdb.DuckDBPyConnection, **values: Any) -> None:
    # Parameters reach the .sql files as DuckDB variables; names come from pexec's own code only.
    for name, value in values.items():
        con.execute(f"SET VARIABLE {name} = ?", [value])


Row = TypeVar("Row")


def fetch(con: duckdb.DuckDBPyConnection, table: str, row: type[Row]) -> list[Row]:
    """The rows of `table`, one dict each; `row` (a TypedDict) names the columns the SQL that made the table gives
    them, which the checker cannot read from the SQL."""
    return cast(list[Row], con.sql(f"SELECT * FROM {table}").to_arrow_table().to_pylist())


def rollout_columns(con: duckdb.DuckDBPyConnection, view: str = "rollouts") -> list[str]:
    return list(con.sql(f"SELECT * FROM {view} LIMIT 0").columns)


def cost_columns(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [c for c in rollout_columns(con) if c.startswith("cost_")]
