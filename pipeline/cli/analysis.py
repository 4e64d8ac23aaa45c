"""The commands that read a scored run: metrics, report, diff, sql and view. Each opens the run through its
`Reading` (options.reads_a_run), so every reader takes the same options and checks them the same way."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from pipeline.cli.options import Reading, ScoredRun, reads_a_run
from pipeline.cli.render import (
    console,
    json_lines,
    literal,
    metrics_notes,
    metrics_table,
    out,
    partial_notice,
    print_diff,
    print_query_result,
    print_table,
)
from pipeline.core.errors import PexecError
from pipeline.metrics.query import QueryLimits, partial_of, read_statements
from pipeline.metrics.run import Run
from pipeline.metrics.tool_profiles import TOOL_FIELDS, tool_cohort_columns


@reads_a_run("cohorts", "intervals", "partial", merged=True)
def metrics(
    run: ScoredRun,
    reading: Reading,
    max_k: Annotated[
        int | None, typer.Option("--max-k", help="Largest k for PEC(k) (default: max T, at most 20).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cohort.")] = False,
    address: Annotated[
        str | None,
        typer.Option(
            "--address",
            help="Compute in Ray tasks on this Ray (`local`: start one here; `auto`: the running cluster), part "
            "by part, no process reading every rollout; needs --method poisson-merged, same numbers.",
        ),
    ] = None,
) -> None:
    """Success, TER, AUC-PEC, RR, output match and PEC(k) per cohort with 95% intervals (task bootstrap, or
    Wilson on the effective sample size for small samples)."""
    opened = reading.open(run)
    tool_by = tool_cohort_columns(reading.by)
    if tool_by is not None:
        if address is not None:
            raise PexecError("--address computes the rollout metrics; per-tool profiles (--by tool) run here")
        _tool_metrics(opened, tool_by, reading, as_json)
        return
    cohorts = opened.metrics(reading.by, reading.settings, max_k, reading.population, address)
    folder = opened.write_metrics(cohorts, reading.by)
    if as_json:
        json_lines(cohorts)
        return
    if cohorts and cohorts[0]["partial"]:
        partial_notice(cohorts[0]["partial"], out)
    print_table(metrics_table(cohorts))
    if cohorts:
        b = cohorts[0]["bootstrap"]
        out.print(
            f"95% intervals: {b['method']} task-level bootstrap, B={b['B']}, seed={b['seed']}, "
            f"DuckDB {b['duckdb_version']}; written to {literal(folder)}/"
        )
        for note in metrics_notes(cohorts):
            out.print(note)


def _tool_metrics(run: Run, by: list[str], reading: Reading, as_json: bool) -> None:
    """`metrics --by tool[,labels]`: the per-tool error profile (step-level cohorts), printed, not written."""
    from pipeline.report.layout import tools_table

    rows = run.tool_profiles(by, reading.settings, reading.population)
    if as_json:
        json_lines(rows)
        return
    if not rows:
        raise PexecError(f"{run.url} has no steps: nothing to profile per tool")
    if rows[0]["partial"]:
        partial_notice(rows[0]["partial"], out)
    keys = [k for k in rows[0] if k not in TOOL_FIELDS]
    shown = tools_table(rows, keys)
    table = Table(title=shown.title)
    for i, name in enumerate(shown.columns):
        table.add_column(name, justify="left" if i < len(keys) or name == "causes" else "right")
    for cells in shown.rows:
        table.add_row(*cells)
    print_table(table)
    b = rows[0]["bootstrap"]
    out.print(f"B={b['B']}, seed={b['seed']}, {b['method']}. " + " ".join(shown.notes), soft_wrap=True)


@reads_a_run("cohorts", "intervals", "partial")
def report(
    run: ScoredRun,
    out_dir: Annotated[str, typer.Option("--out", help="Folder to write the report into (local path or URL).")],
    reading: Reading,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option("--compare", help="COL=A COL=B: paired differences A - B over the tasks both share."),
    ] = None,
    k: Annotated[str, typer.Option("--k", help="Depths k of the PEC@k columns, e.g. 1,3,5.")] = "1,3,5",
    within: Annotated[
        str | None,
        typer.Option("--within", help="Rank the other conditions within each value of this column, e.g. model."),
    ] = None,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Remove what DIR holds first (a non-empty DIR is refused without).")
    ] = False,
    sensitivity: Annotated[
        bool, typer.Option("--sensitivity", help="Add TER and AUC-PEC under schema-only, schema+dependency, all.")
    ] = False,
) -> None:
    """Tables, ranking divergence, paired comparisons and figures as Markdown, HTML, CSV and Parquet."""
    from pipeline.report import build_report, check_request, parse_compare

    pair = parse_compare(compare) if compare else None
    ks = _depths(k)
    check_request(run, out_dir.rstrip("/"), ks, overwrite, reading.storage)  # before the run is listed
    result = build_report(
        reading.open(run),
        out_dir,
        reading.by,
        pair,
        ks,
        reading.settings,
        overwrite=overwrite,
        within=within,
        population=reading.population,
        sensitivity=sensitivity,
    )
    for path in result.files:
        out.print(literal(path))
    if result.tables.cohorts and result.tables.cohorts[0]["partial"]:
        partial_notice(result.tables.cohorts[0]["partial"], console)
    where = literal(result.out)
    console.print(f"report written to {where}/report.html and {where}/report.md ({len(result.files)} files)")


def _depths(k: str) -> list[int]:
    try:
        return [int(x) for x in k.split(",") if x.strip()]
    except ValueError as exc:
        raise PexecError(f"--k takes depths separated by commas, e.g. 1,3,5; got {k!r}") from exc


@reads_a_run("cohorts", "intervals")
def diff(
    run_a: Annotated[str, typer.Argument(help="The earlier run (A).")],
    run_b: Annotated[str, typer.Argument(help="The later run (B): differences are B - A.")],
    reading: Reading,
    fail_on: Annotated[
        list[str] | None,
        typer.Option("--fail-on", help="METRIC<NUMBER (or <=, >, >=) on B - A: exit 1 when crossed (repeatable)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cohort × metric and per tool.")] = False,
) -> None:
    """Drift between two runs with different tasks: B - A per cohort and metric, and per tool, with two-sample
    task-level bootstrap intervals; --fail-on turns thresholds into exit code 1."""
    from pipeline.metrics.drift import breaches, diff_runs, parse_threshold

    thresholds = [parse_threshold(t) for t in fail_on or []]
    result = diff_runs(reading.open(run_a), reading.open(run_b), reading.by, reading.settings, reading.population)
    if as_json:
        json_lines([{"kind": "metric", **row} for row in result.rows])
        json_lines([{"kind": "tool", "metric": "invalid_rate", **row} for row in result.tools])
    else:
        print_diff(result)
    alert(breaches(result, thresholds))


def alert(lines: list[str]) -> None:
    """One line per crossed --fail-on threshold on stderr, then exit 1 (for alerting)."""
    for line in lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if lines:
        raise typer.Exit(1)


@reads_a_run("partial")
def sql(
    run: ScoredRun,
    query: Annotated[
        str, typer.Argument(help="A read-only query over the views steps, rollouts, rejects, metrics, pec, ….")
    ],
    reading: Reading,
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
    memory_limit: Annotated[
        str, typer.Option("--memory-limit", help="DuckDB memory limit (e.g. 512MB, 4GB); beyond it, it spills.")
    ] = QueryLimits.memory_limit,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds the query may run before it is stopped.")
    ] = QueryLimits.timeout,
) -> None:
    """Run a read-only SQL query (DuckDB) over the run's tables."""
    if fmt not in ("table", "csv", "json"):
        raise PexecError(f"--format is table, csv or json, got {fmt!r}")
    limits = QueryLimits(memory_limit=memory_limit, timeout=timeout)
    read_statements(query)  # a query that is not a read, or not SQL, is refused before the run is listed
    result = reading.open(run).sql(query, limits)
    covered = partial_of(result)
    if covered:  # on stderr: the result itself stays what the query asked for
        partial_notice(covered, console)
    print_query_result(result, fmt)


@reads_a_run("intervals", "partial")
def view(
    run: Annotated[str, typer.Argument(help="A scored run folder or URL.")],
    reading: Reading,
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8765,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (default: this machine only).")
    ] = "127.0.0.1",
) -> None:
    """Browse a run: cohorts and their metrics -> the rollouts behind a number -> one rollout's steps."""
    from pipeline.view import RunView, check_address, serve

    check_address(host, port)
    run_view = RunView(reading.open(run), reading.settings)
    console.print(f"pexec view: http://{host}:{port}/ (Ctrl-C to stop)")
    try:
        serve(run_view, host=host, port=port)
    finally:
        run_view.close()
