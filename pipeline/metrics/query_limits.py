"""The limits of one read-only SQL query (`pexec sql`, `Run.sql`): memory, spill, time and rows. Apart from
pipeline.metrics.query so that the command line states them without loading DuckDB."""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipeline.core.errors import PexecError

_MEMORY = re.compile(r"(?P<n>\d+(\.\d+)?)\s*(?P<unit>B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)", re.IGNORECASE)
_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}  # as DuckDB reads them
_UNITS |= {"kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
SPILL_BOUNDS = (2**20, 2**40)  # the smallest and largest --spill-limit, in bytes
MAX_ROWS_LIMIT = 1_000_000_000  # the largest --max-rows


@dataclass(frozen=True)
class QueryLimits:
    """What one `sql()` call may use. DuckDB spills to `temp_directory` beyond the memory limit, and has no
    statement timeout of its own: a timer interrupts the connection."""

    memory_limit: str = "2GB"
    spill_limit: str = "4GB"  # spill files at most (DuckDB's max_temp_directory_size)
    timeout: float = 120.0  # seconds, for all statements of the query together and reading their result
    max_rows: int = 1_000_000  # rows of the result; more is cut (streamed) or an error (a table in memory)

    def __post_init__(self) -> None:
        if not _MEMORY.fullmatch(self.memory_limit):
            raise PexecError(f"memory limit takes a size such as 512MB or 4GB, got {self.memory_limit!r}")
        spill = size_bytes(self.spill_limit)
        if spill is None or not SPILL_BOUNDS[0] <= spill <= SPILL_BOUNDS[1]:
            raise PexecError(f"spill limit takes a size from 1MiB to 1TiB such as 4GB, got {self.spill_limit!r}")
        if not self.timeout > 0:
            raise PexecError(f"timeout takes seconds > 0, got {self.timeout}")
        if not 1 <= self.max_rows <= MAX_ROWS_LIMIT:
            raise PexecError(f"max rows takes 1 to {MAX_ROWS_LIMIT:,}, got {self.max_rows}")


def size_bytes(size: str) -> int | None:
    """Bytes in a size such as `512MB` or `4GiB` (None when it is not one)."""
    match = _MEMORY.fullmatch(size.strip())
    return None if match is None else int(float(match["n"]) * _UNITS[match["unit"].lower()])
