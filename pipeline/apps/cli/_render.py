"""What the commands print: the two consoles, data shown literally, tables at their natural width, the metrics
table and its notes, the drift printout and query results as a table, CSV or JSON Lines.

Data is never markup: labels, values, paths and messages are printed as they are (no [style] tags, no :emoji:
codes), with control characters shown as escapes by `literal`. Our own styles are Text objects.
"""

from __future__ import annotations

import csv
import sys
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TextIO, cast

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.core import intervals, metric_catalogue
from pipeline.core.arrow import pa
from pipeline.core.text import literal
from pipeline.metrics.cohorts import cohort_fields
from pipeline.metrics.completeness import Coverage
from pipeline.metrics.query import QueryResult
from pipeline.metrics.results import Cohort, Interval, key_values, ratio
from pipeline.metrics.settings import harness_note, replay_note

console = Console(stderr=True, markup=False, emoji=False, highlight=False)  # messages, progress, notices
out = Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False, highlight=False)  # results

_ColorSystem = Literal["auto", "standard", "256", "truecolor", "windows"] | None


def show_warning(
    message: Warning | str,
    category: type[Warning],
    filename: str,
    lineno: int,
    file: TextIO | None = None,
    line: str | None = None,
) -> None:
    """`warnings.showwarning` for the command line: library warnings quote data too (matplotlib names a label's
    glyphs it cannot draw)."""
    console.print(literal(f"{filename}:{lineno}: {category.__name__}: {message}"), soft_wrap=True)


def partial_notice(partial: Coverage, where: Console) -> None:
    """Say, in bold yellow, how much of an incomplete run (--partial) the output covers."""
    where.print(Text(literal(partial.describe()), style="bold yellow"), soft_wrap=True)


def warning_notice(message: str, where: Console) -> None:
    """A warning above the results, in bold yellow (as a partial read's)."""
    where.print(Text(literal(f"⚠ {message}"), style="bold yellow"), soft_wrap=True)


def json_lines(rows: Sequence[Mapping[str, Any]]) -> None:
    """One JSON object per line on stdout (`--json`)."""
    for row in rows:
        sys.stdout.write(orjson.dumps(row).decode() + "\n")


def print_table(table: Table) -> None:
    """Print a table at its natural width: a narrow terminal wraps the lines, but no cell is folded or cut to
    "0.7…", which would read as another number."""
    wide = Console(
        file=out.file,
        width=100_000,
        # The property names one of the systems the constructor takes (rich types it as any str).
        color_system=cast(_ColorSystem, out.color_system),
        force_terminal=out.is_terminal,
        markup=False,
        emoji=False,
        highlight=False,
    )
    wide.print(table)


def metrics_table(cohorts: Sequence[Cohort]) -> Table:
    # The cohort's key columns: everything of a cohort dict that is not a count, a metric or a setting.
    labels = [k for k in (cohorts[0] if cohorts else ()) if k != "benchmark" and k not in cohort_fields()]
    # The catalogue's table metrics, with the curves last (PEC@1 and PEC@3) to fit a terminal.
    ratios = [m for m in metric_catalogue.ratios() if m.in_tables]
    curves = [m for m in metric_catalogue.METRICS if m.kind == "curve" and m.in_tables]
    headers = [f"{m.label} (n)" if m.eligible else m.label for m in ratios]
    headers += [f"{m.label}@{k}" for m in curves for k in (1, 3)]
    rows = []
    for c in cohorts:
        condition = " · ".join(literal(v) for v in key_values(c, labels)) or "all"
        cells = [literal(c["benchmark"]), condition, str(c["n"]), str(c["n_tasks"])]
        cells += [str(c["n_unknown_success"]), str(c["n_harness_error"])]
        cells += [_ci(ratio(c, m.name)) + (f"\n({ratio(c, m.name)['eligible']})" if m.eligible else "") for m in ratios]
        for _ in curves:  # PEC, the catalogue's one curve
            curve = {p["k"]: p for p in c["pec"]}
            cells += [_ci(curve[k]) if k in curve else "–" for k in (1, 3)]
        rows.append(cells)
    table = Table(title="Prefix executability: value and 95% interval")
    for i, name in enumerate(["benchmark", "condition", "N", "tasks", "no verdict", "harness errors", *headers]):
        table.add_column(name, justify="left" if i < 2 else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def metrics_notes(cohorts: Sequence[Cohort]) -> list[str]:
    """What the table's populations and markers mean (the report says the same: pipeline.report.layout)."""
    notes = [
        "success and RR: over the rollouts with a verdict (no verdict: left out); TER, AUC-PEC, PEC: all N.",
        "AUC-PEC (writes): over the rollouts with a write or irreversible call (n; the rest have none); invalid "
        "irreversible, weighted AUC-PEC: all N.",
    ]
    points = [p for c in cohorts for p in [*(ratio(c, m.name) for m in metric_catalogue.ratios()), *c["pec"]]]
    if any(p.get("method") == intervals.WILSON for p in points):
        notes.append(intervals.NOTE)
    return [*notes, harness_note(cohorts), replay_note(cohorts)]


def _ci(m: Interval) -> str:
    if m.get("value") is None:
        return "–"
    mark = f" {intervals.MARK}" if m.get("method") == intervals.WILSON else ""
    return f"{m['value']:.3f}{mark}\n{m['lo']:.3f}–{m['hi']:.3f}"


def print_diff(result: Any) -> None:
    """A `diff_runs` result: the settings, drift per cohort and per tool, and what only one run has."""
    s = result.settings
    out.print(
        f"Differences B − A (B = the second run). 95% intervals: two-sample task-level bootstrap ({s.method}, "
        f"B={s.B}): each run's tasks resampled on their own, seed {s.seed} for A and {result.seed_b} for B.",
        soft_wrap=True,
    )
    if result.shared_tasks:
        out.print(
            f"The runs share {result.shared_tasks} task(s): this unpaired interval ignores the pairing; for a paired "
            "comparison put both in one run and use `pexec report --compare`.",
            soft_wrap=True,
        )
    if not result.rows:
        out.print("No cohort is in both runs: nothing to compare (the cohorts of each are listed below).")
    else:
        table = Table(title="Drift per cohort: B − A")
        for name in [*result.keys, "metric", "A", "B", "B − A", "95% interval", "tasks A", "tasks B"]:
            table.add_column(name, justify="left" if name in result.keys or name == "metric" else "right")
        for r in result.rows:
            cells = [str(r[k]) for k in result.keys] + [r["metric"], _fmt(r["a"]), _fmt(r["b"])]
            cells += [_fmt(r["diff"], "+"), f"{_fmt(r['lo'], '+')} – {_fmt(r['hi'], '+')}", str(r["tasks_a"])]
            table.add_row(*cells, str(r["tasks_b"]))
        print_table(table)
    for name, only in (("A", result.only_a), ("B", result.only_b)):
        for k in only:
            out.print(f"cohort only in {name}: " + ", ".join(f"{c}={v}" for c, v in k.items()), soft_wrap=True)
    if result.tools:
        keys = [k for k in result.tools[0] if k not in ("a", "b", "diff", "lo", "hi", "replicates_used", "calls_a",
                                                        "calls_b")]  # fmt: skip
        table = Table(title="Invalid rate per tool: B − A")
        for name in [*keys, "A", "B", "B − A", "95% interval", "calls A", "calls B"]:
            table.add_column(name, justify="left" if name in keys else "right")
        for r in result.tools:
            cells = [str(r[k]) for k in keys] + [_fmt(r["a"]), _fmt(r["b"]), _fmt(r["diff"], "+")]
            table.add_row(*cells, f"{_fmt(r['lo'], '+')} – {_fmt(r['hi'], '+')}", str(r["calls_a"]), str(r["calls_b"]))
        print_table(table)
    for label, rows in (("new tool", result.new_tools), ("vanished tool", result.vanished_tools)):
        for r in rows:
            out.print(f"{label}: " + ", ".join(f"{k}={v}" for k, v in r.items()), soft_wrap=True)
    for r in result.new_causes:
        where = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("cause", "n"))
        out.print(f"new cause: {r['cause']} ({r['n']} call(s); {where})", soft_wrap=True)


def _fmt(x: float | None, sign: str = "") -> str:
    return "–" if x is None else f"{x:{sign}.3f}"


TABLE_ROWS = 1_000  # rows `sql --format table` lays out (the whole table is measured before it prints)


def print_query_result(result: QueryResult, fmt: str) -> None:
    """A query's rows on stdout as they stream: CSV (with a header row) or JSON Lines (one object per row),
    written batch by batch; or a table, of at most TABLE_ROWS rows (laid out whole). Past the time limit the
    writing stops with the query's own error."""
    if fmt == "table":
        _print_table(result)
        return
    writer = csv.writer(sys.stdout, lineterminator="\n")
    if fmt == "csv":
        writer.writerow(result.schema.names)
    for batch in result.batches():
        rows = batch.to_pylist(maps_as_pydicts="strict")
        if fmt == "json":
            sys.stdout.write("".join(_json(row) + "\n" for row in rows))
        else:
            writer.writerows([_csv_cell(v) for v in row.values()] for row in rows)
        result.check_time()


def _print_table(result: QueryResult) -> None:
    table = Table()
    for name in result.schema.names:
        table.add_column(literal(name))
    shown = 0
    for batch in result.batches():
        for row in batch.to_pylist(maps_as_pydicts="strict"):
            if shown == TABLE_ROWS:
                result.cut = f"a table shows at most {TABLE_ROWS:,} rows: --format csv or json streams up to --max-rows"
                break
            table.add_row(*("" if v is None else literal(_csv_cell(v)) for v in row.values()))
            shown += 1
        result.check_time()
        if result.cut:
            break
    result.rows = shown
    result.check_time()
    out.print(table)


def _json(value: Any) -> str:
    # Every DuckDB type: nested values as JSON, decimals exact (as text), blobs and intervals as text.
    return orjson.dumps(value, default=_json_default, option=orjson.OPT_NON_STR_KEYS).decode()


def _json_default(value: Any) -> str:
    if isinstance(value, bytes):
        return _blob(value)
    if isinstance(value, pa.MonthDayNano):  # an INTERVAL, as an ISO 8601 duration
        months, days, ns = value
        seconds = f"T{ns / 1e9:g}S" if ns else ""
        return "P" + (f"{months}M" if months else "") + (f"{days}D" if days or not (months or ns) else "") + seconds
    return str(value)  # Decimal, and anything else with a text form


def _blob(value: bytes) -> str:
    """Bytes as DuckDB prints a BLOB: printable ASCII as is, the rest as \\xNN."""
    return "".join(chr(b) if 32 <= b < 127 and b != 92 else f"\\x{b:02X}" for b in value)


def _csv_cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | pa.MonthDayNano):
        return _json_default(value)
    if isinstance(value, list | dict):
        return _json(value)
    return str(value)
