"""The one base of every error a user is meant to read.

The command line catches `PexecError` in one place and prints its message on one line; any other
exception is a bug and keeps its traceback. Subclasses that replace a former exception (`ValueError`,
`OSError`, `duckdb.Error`) keep it as a second base, so library callers that caught it still do.
"""

from __future__ import annotations


class PexecError(Exception):
    """A problem with the user's input, settings or storage, stated in one line."""


class StorageError(PexecError, OSError):
    """A local path or storage URL that cannot be read or written (missing folder, permission, network)."""
