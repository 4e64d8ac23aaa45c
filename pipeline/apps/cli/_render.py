"""What the commands print: the two consoles, data shown literally, tables that fit the width they are given, the
metrics table and its notes, the drift printout and query results as a table, CSV or JSON Lines.

Human output fits its width (`output_width`: COLUMNS when set, else the terminal's, else PIPED_WIDTH on a pipe or
file): a table wider than that is printed one record per block (each column's name and value on a line of its
own), never wrapped mid-row or with a cell cut to "0.7…", which would read as another number. Machine formats
(`--json`, `--csv`, `sql --format csv|json`) are not laid out at all.

Data is never markup: labels, values, paths and messages are printed as they are (no [style] tags, no :emoji:
codes), with control characters shown as escapes by `literal`. Our own styles are Text objects.
"""

from __future__ import annotations

import csv
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, TextIO, cast

import orjson
from rich.console import Console
from rich.table import Table
from rich.text import Text

from pipeline.core import intervals, metric_catalogue
from pipeline.core.arrow import pa
from pipeline.core.errors import PexecError
from pipeline.core.text import label_text, literal
from pipeline.metrics.completeness import Coverage
from pipeline.metrics.results import Cohort, Interval, cohort_fields, key_values, ratio
from pipeline.metrics.settings import TABLE_PEC_K, effects_note, harness_note, replay_note

if TYPE_CHECKING:  # a query result is printed only after DuckDB made it
    from pipeline.metrics.query import QueryResult

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


PIPED_WIDTH = 120  # the width human output fits on a pipe or in a file when COLUMNS is not set


def output_width() -> int:
    """The width human output on stdout fits: COLUMNS when set, else the terminal's, else PIPED_WIDTH."""
    columns = os.environ.get("COLUMNS", "")
    if columns.isdigit() and int(columns) > 0:
        return int(columns)
    return out.size.width if out.is_terminal else PIPED_WIDTH


def fit_output() -> int:
    """Set the width prose on stdout, and messages on stderr when it is no terminal, wrap at to `output_width()`
    (read per command: COLUMNS may change between invocations in one process) and return it. A terminal's stderr
    keeps the terminal's width."""
    width = output_width()
    out.width = width
    if not console.is_terminal:
        console.width = width
    return width


def _wide() -> Console:
    """A console on stdout that never wraps: what it prints was measured to fit first."""
    return Console(
        file=out.file,
        width=100_000,
        # The property names one of the systems the constructor takes (rich types it as any str).
        color_system=cast(_ColorSystem, out.color_system),
        force_terminal=out.is_terminal,
        markup=False,
        emoji=False,
        highlight=False,
    )


def table_width(table: Table) -> int:
    """The columns `table` takes at its natural width (no cell wrapped)."""
    return _wide().measure(table).maximum


def fits(table: Table, width: int | None = None) -> bool:
    return table_width(table) <= (width or output_width())


def print_table(table: Table, width: int | None = None) -> None:
    """Print a table at its natural width when it fits `width` (default: `output_width()`), else one record per
    block: no cell is folded or cut to "0.7…", which would read as another number."""
    width = width or fit_output()
    if fits(table, width):
        _wide().print(table)
    else:
        print_records(table)


def print_records(table: Table) -> None:
    """A table one row per block: a rule naming the row (`-[ RECORD 3 ]-`), then each column's name and its value
    (a cell's lines joined by spaces), as psql's expanded display does; a value longer than the output is wide goes
    on under itself, so a record never runs past the terminal's edge."""
    names = [literal(str(c.header)) for c in table.columns]
    cells = [[str(cell) for cell in column.cells] for column in table.columns]
    pad = max((len(n) for n in names), default=0)
    room = max(20, output_width() - pad - 3)  # what is left beside "name | "
    if table.title:
        out.print(Text(str(table.title), "italic"), soft_wrap=True)
    for i in range(table.row_count):
        out.print(f"-[ RECORD {i + 1} ]" + "-" * max(0, min(pad, 40) - 8), soft_wrap=True)
        for name, column in zip(names, cells, strict=True):
            value = " ".join(line.strip() for line in column[i].splitlines())
            first, *more = Text(value).wrap(out, room, overflow="fold") or [Text("")]
            out.print(f"{name.ljust(pad)} | {first.plain.rstrip()}", soft_wrap=True)
            for line in more:
                out.print(f"{' ' * pad} | {line.plain.rstrip()}", soft_wrap=True)


@dataclass(frozen=True)
class MetricsColumn:
    """A column of the metrics table: the name `--columns` takes, its header, and its cell of a cohort."""

    key: str
    header: str
    cell: Any  # Callable[[Cohort], str]


def metrics_columns() -> list[MetricsColumn]:
    """Every column of the metrics table, in the order the full table shows them: the counts, then the
    catalogue's table metrics, the curves last (PEC@1 and PEC@3)."""
    columns = [
        MetricsColumn("benchmark", "benchmark", lambda c: literal(c["benchmark"])),
        MetricsColumn("condition", "condition", _condition),
        MetricsColumn("n", "N", lambda c: str(c["n"])),
        MetricsColumn("tasks", "tasks", lambda c: str(c["n_tasks"])),
        MetricsColumn("no_verdict", "no verdict", lambda c: str(c["n_unknown_success"])),
        MetricsColumn("harness_errors", "harness errors", lambda c: str(c["n_harness_error"])),
    ]
    for m in metric_catalogue.ratios():
        if m.in_tables:
            header = f"{m.label} (n)" if m.eligible else m.label
            columns.append(MetricsColumn(m.name, header, lambda c, m=m: _ratio_cell(c, m)))
    for m in metric_catalogue.METRICS:
        if m.kind == "curve" and m.in_tables:  # PEC, the catalogue's one curve
            for k in TABLE_PEC_K:
                columns.append(MetricsColumn(f"{m.name}@{k}", f"{m.label}@{k}", lambda c, k=k: _curve_cell(c, k)))
    return columns


# What `pexec metrics` shows unless --columns says otherwise: the cohort, its size, and the headline metrics in the
# order a reader follows them: the benchmark's own success, how many rollouts stay executable throughout and how
# deep the others get, how many recover, and how many get their first call right.
DEFAULT_COLUMNS = ("benchmark", "condition", "n", "success", "ter", "auc_pec", "rr", "pec@1")


def chosen_columns(asked: str | None) -> list[MetricsColumn]:
    """The columns `--columns` names (comma-separated keys, or `all`); None: DEFAULT_COLUMNS. An unknown key is
    an error listing the keys."""
    every = metrics_columns()
    if asked is None:
        return [c for key in DEFAULT_COLUMNS for c in every if c.key == key]
    if asked.strip() == "all":
        return every
    by_key = {c.key: c for c in every}
    keys = [k.strip() for k in asked.split(",") if k.strip()]
    unknown = [k for k in keys if k not in by_key]
    if unknown or not keys:
        raise PexecError(
            f"--columns takes `all` or keys separated by commas, got {asked!r} (keys: {', '.join(by_key)})"
        )
    return [by_key[k] for k in keys]


def metrics_table(cohorts: Sequence[Cohort], columns: Sequence[MetricsColumn] | None = None) -> Table:
    """The cohorts' metrics, one row each, in `columns` (default: every column)."""
    columns = list(columns) if columns is not None else metrics_columns()
    table = Table(title="Prefix executability: value and 95% interval")
    for col in columns:
        table.add_column(col.header, justify="left" if col.key in ("benchmark", "condition") else "right")
    for c in cohorts:
        table.add_row(*(col.cell(c) for col in columns))
    return table


def print_metrics(cohorts: Sequence[Cohort], asked: str | None = None, width: int | None = None) -> None:
    """The metrics table in the columns asked (`--columns`; default DEFAULT_COLUMNS) when it fits `width`, else
    one cohort per block, one metric per line (value and interval on one line)."""
    columns = chosen_columns(asked)
    table = metrics_table(cohorts, columns)
    width = width or fit_output()
    if fits(table, width):
        _wide().print(table)
        return
    out.print(Text(str(table.title), "italic"), soft_wrap=True)
    for c in cohorts:
        out.print(f"-[ {literal(c['benchmark'])} · {_condition(c)} ]-", soft_wrap=True)
        shown = [col for col in columns if col.key not in ("benchmark", "condition")]
        pad = max((len(col.header) for col in shown), default=0)
        for col in shown:
            lines = col.cell(c).splitlines() or [""]
            value = lines[0] + (f" [{lines[1]}]" if len(lines) > 1 else "") + "".join(f" {x}" for x in lines[2:])
            out.print(f"{col.header.ljust(pad)} | {value}", soft_wrap=True)


def _condition(c: Cohort) -> str:
    # The cohort's key columns: everything of a cohort dict that is not a count, a metric or a setting.
    labels = [k for k in c if k != "benchmark" and k not in cohort_fields()]
    return " · ".join(label_text(v) for v in key_values(c, labels)) or "all"


def _ratio_cell(c: Cohort, m: Any) -> str:
    return _ci(ratio(c, m.name)) + (f"\n({ratio(c, m.name)['eligible']})" if m.eligible else "")


def _curve_cell(c: Cohort, k: int) -> str:
    curve = {p["k"]: p for p in c["pec"]}
    return _ci(curve[k]) if k in curve else "–"


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
    effects = effects_note(cohorts)
    return [*notes, *([effects] if effects else []), harness_note(cohorts), replay_note(cohorts)]


def _ci(m: Interval) -> str:
    if m.get("value") is None:
        return "–"
    mark = f" {intervals.MARK}" if m.get("method") == intervals.WILSON else ""
    return f"{m['value']:.3f}{mark}\n{m['lo']:.3f}–{m['hi']:.3f}"


def print_diff(result: Any) -> None:
    """A `diff_runs` result: the settings, drift per cohort and per tool, and what only one run has."""
    fit_output()
    s = result.settings
    out.print(
        f"Differences B − A (B = the second run). 95% intervals: two-sample task-level bootstrap ({s.method}, "
        f"B={s.B}): each run's tasks resampled on their own, seed {s.seed} for A and {result.seed_b} for B.",
    )
    if result.shared_tasks:
        out.print(
            f"The runs share {result.shared_tasks} task(s): this unpaired interval ignores the pairing; for a paired "
            "comparison put both in one run and use `pexec report --compare`.",
        )
    if not result.rows:
        out.print("No cohort is in both runs: nothing to compare (the cohorts of each are listed below).")
    else:
        _print_drift(result)
    for name, only in (("A", result.only_a), ("B", result.only_b)):
        for k in only:
            out.print(literal(f"cohort only in {name}: " + ", ".join(f"{c}={label_text(v)}" for c, v in k.items())))
    if result.tools:
        keys = [k for k in result.tools[0] if k not in ("a", "b", "diff", "lo", "hi", "replicates_used",
                                                        "small_sample", "calls_a", "calls_b")]  # fmt: skip
        table = Table(title="Invalid rate per tool: B − A")
        for name in [*keys, "A", "B", "B − A", "95% interval", "calls A", "calls B"]:
            table.add_column(name, justify="left" if name in keys else "right")
        for r in result.tools:
            cells = [label_text(r[k]) for k in keys] + [_fmt(r["a"]), _fmt(r["b"]), _fmt(r["diff"], "+")]
            table.add_row(*cells, _bounds(r), str(r["calls_a"]), str(r["calls_b"]))
        print_table(table)
    if any(r["small_sample"] for r in [*result.rows, *result.tools]):
        out.print(SMALL_DRIFT)
    for label, rows in (("new tool", result.new_tools), ("vanished tool", result.vanished_tools)):
        for r in rows:
            out.print(literal(f"{label}: " + ", ".join(f"{k}={label_text(v)}" for k, v in r.items())))
    for r in result.new_causes:
        where = ", ".join(f"{k}={label_text(v)}" for k, v in r.items() if k not in ("cause", "n"))
        out.print(literal(f"new cause: {r['cause']} ({r['n']} call(s); {where})"))


def _drift_table(title: str, keys: Sequence[str], rows: Sequence[Mapping[str, Any]], tasks: bool = True) -> Table:
    table = Table(title=title)
    for name in [*keys, "metric", "A", "B", "B − A", "95% interval", *(("tasks A", "tasks B") if tasks else ())]:
        table.add_column(name, justify="left" if name in keys or name == "metric" else "right")
    for r in rows:
        cells = [label_text(r[k]) for k in keys] + [r["metric"], _fmt(r["a"]), _fmt(r["b"])]
        cells += [_fmt(r["diff"], "+"), _bounds(r)]
        table.add_row(*cells, *((str(r["tasks_a"]), str(r["tasks_b"])) if tasks else ()))
    return table


def _print_drift(result: Any) -> None:
    """The drift rows as one table when it fits the output; else one table per cohort (its keys in the title),
    each one record per block when even that does not fit."""
    width = output_width()
    whole = _drift_table("Drift per cohort: B − A", result.keys, result.rows)
    if fits(whole, width):
        _wide().print(whole)
        return
    cohorts: dict[tuple[str, ...], list[Mapping[str, Any]]] = {}
    for r in result.rows:
        cohorts.setdefault(tuple(label_text(r[k]) for k in result.keys), []).append(r)
    for key, rows in cohorts.items():
        title = f"Drift of {' · '.join(key)}: B − A"
        counts = {(r["tasks_a"], r["tasks_b"]) for r in rows}
        if len(counts) == 1:  # the same tasks behind every metric of the cohort: said once, in the title
            ((a, b),) = counts
            print_table(_drift_table(f"{title} (tasks: A {a}, B {b})", [], rows, tasks=False), width)
        else:
            print_table(_drift_table(title, [], rows), width)


def _fmt(x: float | None, sign: str = "") -> str:
    return "–" if x is None else f"{x:{sign}.3f}"


def _bounds(r: Mapping[str, Any]) -> str:
    """A drift row's interval: its bounds, or a dash where either run's sample is too small for one."""
    if r["small_sample"] or r["lo"] is None:
        return "–"
    return f"{_fmt(r['lo'], '+')} – {_fmt(r['hi'], '+')}"


SMALL_DRIFT = (
    f"–: no interval where either run has fewer than {intervals.MIN_TASKS} tasks or {intervals.MIN_DENOMINATOR} units "
    "in the metric's denominator (calls for a tool): the task bootstrap says nothing there."
)


TABLE_ROWS = 1_000  # rows `sql --format table` lays out (the whole table is measured before it prints)


def print_query_result(result: QueryResult, fmt: str, vertical: bool = False) -> None:
    """A query's rows on stdout as they stream: CSV (with a header row) or JSON Lines (one object per row),
    written batch by batch; or a table, of at most TABLE_ROWS rows (laid out whole), one record per block when
    `vertical` or when it is wider than the output (said on stderr). Past the time limit the writing stops with
    the query's own error."""
    if fmt == "table":
        fit_output()
        _print_table(result, vertical)
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


def _print_table(result: QueryResult, vertical: bool) -> None:
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
    if vertical:
        print_records(table)
    elif fits(table):
        _wide().print(table)
    else:
        console.print(
            f"pexec sql: the result is {table_width(table)} columns wide, over the {output_width()} of the output: "
            "one record per block (--format csv or json for all columns on a line)",
        )
        print_records(table)


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
    # Control characters as escapes, as a table shows them: a raw carriage return ends a CSV record for most
    # readers (Python's csv module quotes only the line terminator it writes), and an escape sequence would reach a
    # terminal. JSON output keeps values exactly, in JSON's own escapes.
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes | pa.MonthDayNano):
        return _json_default(value)
    if isinstance(value, list | dict):
        return _json(value)
    return literal(str(value))
