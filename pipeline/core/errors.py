"""The one base of every error a user is meant to read, and the field check every settings file uses.

The command line catches `PexecError` in one place and prints its message on one line; any other
exception is a bug and keeps its traceback. Subclasses that replace a former exception (`ValueError`,
`OSError`, `duckdb.Error`) keep it as a second base, so library callers that caught it still do.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


class PexecError(Exception):
    """A problem with the user's input, settings or storage, stated in one line."""


class StorageError(PexecError, OSError):
    """A local path or storage URL that cannot be read or written (missing folder, permission, network)."""


def check_fields(table: Any, allowed: set[str], where: str, error: type[PexecError]) -> None:
    """Raise `error` naming `where` when `table` is not a table or has fields outside `allowed`."""
    if not isinstance(table, dict):
        raise error(f"{where}: expected a table, got {table!r}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def read_json_file(path: Path, kind: type, where: str, error: type[PexecError]) -> Any:
    """The JSON value of a local data file, which must be a `kind` (list or dict); `error` says `where` it failed."""
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise error(f"{where}: cannot read {path}: {exc}") from exc
    if not isinstance(value, kind):
        raise error(f"{where}: {path} must hold a JSON {'list' if kind is list else 'object'}")
    return value
