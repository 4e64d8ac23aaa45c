"""PEC(k) of a pass of cohorts with its percentile interval, from table all_sums (sql/metrics_intervals.sql): per
(cohort, replicate) the rollouts s_n and the depth histogram, s_h<d> rollouts at PEC depth d (the depths that
occur). The point estimates are the row b = -1, the replicates b >= 0.

PEC(k) is the share of rollouts at depth >= k, that is of the shallowest histogram column at or past k: the
rollouts at depth >= d are the running sum of the columns from the deepest down, taken here in numpy, once per
column. Every k that falls on the same column shares its values, so a (cohort, replicate) holds one value per
depth that occurs, never one per k, and no table holds B x K rows (a cohort at B = 10,000 and 1,000 depths
took 1.9 GB that way). The counts are integers below 2^53, exact as float64, and each share is one division:
the values are bit for bit those of a division in SQL. The percentiles stay in SQL (sql/pec_intervals.sql),
DuckDB's quantile_cont, the rule of every other interval.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import duckdb
import numpy as np

from pipeline.core.arrow import pa
from pipeline.metrics.duck import run_sql
from pipeline.metrics.settings import PASS_REPLICATE_VALUES

_NO_DEPTH = "none"  # the column of a k past every depth that occurs: no rollout reaches it (PEC 0)
_BATCH_ROWS = 1024  # rows of all_sums fetched at a time (at 1,000 depths, 8 MiB)


class PecRow(TypedDict):
    """PEC(k) of a cohort: its point estimate and bootstrap percentiles."""

    cohort: int
    k: int
    value: float | None
    lo: float | None
    hi: float | None


@dataclass(frozen=True)
class _Shares:
    """Rows of all_sums as PEC shares: column "0" (PEC(0)), one per depth d (rollouts at depth >= d over the
    rollouts) and _NO_DEPTH (0), each a contiguous column of one float64 matrix."""

    cohort: np.ndarray
    matrix: np.ndarray  # rows x columns, column-major
    names: list[str]
    defined: np.ndarray  # rows that drew a rollout: the others have no PEC

    def column(self, name: str) -> np.ndarray:
        return self.matrix[:, self.names.index(name)]


def pec_rows(con: duckdb.DuckDBPyConnection) -> list[PecRow]:
    """PEC(0 .. pexec_k) of every cohort of table all_sums, rows in (cohort, k) order."""
    K = con.execute("SELECT getvariable('pexec_k')").fetchall()[0][0]
    points = _shares(con, "all_sums WHERE b = -1")
    replicates = _shares(con, "rep_sums WHERE b >= 0")  # all_sums's replicates, read where they are held
    bounds: dict[str, np.ndarray] = {}
    # DuckDB holds the values of the columns one query takes: at most a pass's worth, whatever the depths.
    per_query = max(1, PASS_REPLICATE_VALUES // max(1, len(replicates.cohort)))
    for first in range(0, len(replicates.names), per_query):
        chunk = replicates.names[first : first + per_query]
        shares = {f"p_{n}": pa.array(replicates.column(n), mask=~replicates.defined) for n in chunk}
        con.register("pec_shares", pa.table({"cohort": replicates.cohort, **shares}))
        try:
            run_sql(con, "metrics/pec_intervals")
            bounds |= con.sql("SELECT * FROM pec_intervals ORDER BY cohort").fetchnumpy()
        finally:
            con.unregister("pec_shares")
            con.execute("DROP TABLE IF EXISTS pec_intervals")
    del replicates
    depths = [int(n) for n in points.names if n not in ("0", _NO_DEPTH)]
    # Each k's column: the shallowest depth at or past k (PEC(0) has its own).
    at = np.searchsorted(depths, np.arange(1, K + 1))
    names = ["0", *(str(depths[i]) if i < len(depths) else _NO_DEPTH for i in at)]
    values = points.matrix[:, [points.names.index(n) for n in names]]  # cohorts x (K + 1)
    lo, hi = ([bounds[f"{side}_{n}"] for n in names] for side in ("lo", "hi"))
    point_row = {c: i for i, c in enumerate(points.cohort.tolist())}
    rows: list[PecRow] = []
    for i, c in enumerate(bounds["cohort"].tolist()):
        row = point_row.get(c)
        for k in range(len(names)):
            value = None if row is None or not points.defined[row] else float(values[row, k])
            rows.append({"cohort": c, "k": k, "value": value, "lo": _bound(lo[k], i), "hi": _bound(hi[k], i)})
    return rows


def _shares(con: duckdb.DuckDBPyConnection, rows: str) -> _Shares:
    """The `rows` (a relation and condition of pexec's own) as PEC shares, in no particular order. One matrix,
    filled a record batch at a time and turned into running sums and shares in place: the pass's depth histogram
    is held once beside DuckDB's own."""
    query = f"SELECT cohort, coalesce(COLUMNS('^s_(n|h[0-9]+)$'), 0)::DOUBLE FROM {rows}"
    n = con.execute(f"SELECT count(*) FROM {rows}").fetchall()[0][0]
    reader = con.sql(query).to_arrow_reader(_BATCH_ROWS)
    depths = sorted(int(name[3:]) for name in reader.schema.names if name.startswith("s_h"))
    names = [*map(str, depths), "0", _NO_DEPTH]
    matrix = np.zeros((n, len(names)), order="F")
    cohort = np.zeros(n, np.int64)
    filled = 0
    for batch in reader:
        end = filled + batch.num_rows
        cohort[filled:end] = batch["cohort"].to_numpy()
        matrix[filled:end, len(depths)] = batch["s_n"].to_numpy()
        for j, d in enumerate(depths):
            matrix[filled:end, j] = batch[f"s_h{d}"].to_numpy()
        filled = end
    for j in range(len(depths) - 2, -1, -1):  # from the deepest column down: rollouts at depth >= d
        matrix[:, j] += matrix[:, j + 1]
    rollouts = matrix[:, len(depths)].copy()
    with np.errstate(invalid="ignore", divide="ignore"):
        matrix /= rollouts[:, None]  # a row that drew no rollout: NaN, masked as undefined
    return _Shares(cohort, matrix, names, rollouts > 0)


def _bound(column: np.ndarray, i: int) -> float | None:
    """Row i of a percentile column (masked where quantile_cont had no defined replicate: NULL)."""
    return None if np.ma.getmaskarray(column)[i] else float(column[i])
