"""The commands that read a scored run: metrics, report, diff, sql, view and verify. Each takes the shared options it
needs (pipeline.apps.cli._options), in the same order, and opens the run through one `Reading` made of them, so every
reader checks them the same way (MetricsSettings)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from pipeline.apps.cli._options import (
    LOCAL_METHODS,
    AllowEmpty,
    AllowHost,
    Bootstrap,
    By,
    EndpointUrl,
    HarnessErrors,
    HeaderTimeout,
    IntervalsSeed,
    MaxConcurrency,
    MergedMethod,
    Method,
    MetricsAddress,
    Partial,
    Pool,
    Reading,
    ScoredRun,
    ShutdownTimeout,
    StorageOption,
    StrictReplay,
    TokenFile,
    metrics_settings,
    server_limits,
    storage,
)
from pipeline.apps.cli._render import (
    chosen_columns,
    console,
    json_lines,
    metrics_notes,
    out,
    partial_notice,
    print_diff,
    print_metrics,
    print_query_result,
    print_table,
    warning_notice,
)
from pipeline.core.errors import EmptyRun, PartDamaged, PexecError, rejects_query
from pipeline.core.text import literal, public_url
from pipeline.metrics.completeness import Coverage
from pipeline.metrics.query_limits import MAX_ROWS_LIMIT, QueryLimits
from pipeline.metrics.settings import DEFAULT_POPULATION, MAX_K, METHODS, VIEW_PORT, MetricsSettings

if TYPE_CHECKING:  # DuckDB, which these load, loads with the first run a command reads
    from pipeline.metrics.run import Run


def metrics(
    run: ScoredRun,
    max_k: Annotated[
        int | None,
        typer.Option(
            "--max-k", min=0, max=MAX_K, help="Largest k for PEC(k) (default: max T, at most 20, at least 3)."
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cohort.")] = False,
    columns: Annotated[
        str | None,
        typer.Option(
            "--columns",
            help="Columns of the table, comma-separated (benchmark, condition, n, tasks, no_verdict, "
            "harness_errors, success, ter, auc_pec, rr, output_match, write_auc, irreversible_invalid, "
            "weighted_auc_pec, pec@1, pec@3), or `all` (default: benchmark, condition, n, pec@1, pec@3, ter, auc_pec, "
            "rr). A table wider than the output is shown one cohort per block.",
        ),
    ] = None,
    address: MetricsAddress = None,
    by: By = None,
    bootstrap: Bootstrap = 1000,
    seed: IntervalsSeed = 0,
    method: MergedMethod = "multinomial",
    harness_errors: HarnessErrors = "exclude",
    pool: Pool = None,
    partial: Partial = False,
    strict_replay: StrictReplay = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
    allow_empty: AllowEmpty = False,
) -> None:
    """Success, TER, AUC-PEC, RR, output match and PEC(k) per cohort with 95% intervals (task bootstrap, or
    Wilson on the effective sample size for small samples). Records rejected at scoring are in no N: the table
    ends saying how many, and the query that lists why. A run that holds no rollout is an error (exit 2) unless
    --allow-empty."""
    asked = metrics_settings(
        by, bootstrap, seed, method, harness_errors, pool, strict_replay, max_k=max_k, methods=METHODS
    )
    from pipeline.metrics.tool_profiles import tool_cohort_columns

    opened = Reading(storage(endpoint_url, storage_option), partial).open(run)
    tool_by = tool_cohort_columns(asked.by)
    if tool_by is not None:
        _tool_metrics(opened, tool_by, asked, as_json, address)
        return
    chosen_columns(columns)  # an unknown column fails before the metrics are computed
    cohorts = opened.cohorts(asked.by, asked.bootstrap, asked.max_k, asked.population, address)
    rejected = opened.rejected()
    if not cohorts and not allow_empty:
        raise EmptyRun(run, rejected, rejected)
    folder = opened.write_metrics(cohorts, asked.by)
    if as_json:
        json_lines(cohorts)
        return
    if cohorts and cohorts[0]["partial"]:
        partial_notice(Coverage.from_json(cohorts[0]["partial"]), out)
    for note in opened.written_by(asked.population):
        warning_notice(note, out)
    print_metrics(cohorts, columns)
    if cohorts:
        b = cohorts[0]["bootstrap"]
        out.print(
            f"95% intervals: {b['method']} task-level bootstrap, B={b['B']}, seed={b['seed']}, "
            f"DuckDB {b['duckdb_version']}; written to {literal(folder)}/"
        )
        for note in metrics_notes(cohorts):
            out.print(note)
    if rejected:
        out.print(
            f"{rejected:,} record(s) rejected at scoring are in no N; why: {rejects_query(literal(public_url(run)))}",
            soft_wrap=True,
        )


def _tool_metrics(run: Run, by: list[str], asked: MetricsSettings, as_json: bool, address: str | None) -> None:
    """`metrics --by tool[,labels]`: the per-tool error profile (step-level cohorts), printed, not written."""
    from pipeline.metrics.tool_profiles import TOOL_FIELDS
    from pipeline.report.layout import tools_table

    rows = run.tool_profiles(by, asked.bootstrap, asked.population, address)
    if not rows:
        raise PexecError(f"{run.url} has no steps: nothing to profile per tool")
    if as_json:
        json_lines(rows)
        return
    if rows[0]["partial"]:
        partial_notice(Coverage.from_json(rows[0]["partial"]), out)
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


def report(
    run: ScoredRun,
    out_dir: Annotated[str, typer.Option("--out", help="Folder to write the report into (local path or URL).")],
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
    list_files: Annotated[
        bool, typer.Option("--list", help="Print every file written, one per line (default: only where they are).")
    ] = False,
    figures: Annotated[
        bool,
        typer.Option(
            "--figures/--no-figures",
            help="Draw the figures (PNG, SVG, PDF); --no-figures writes the tables and text alone, several times "
            "faster on a small run, and says so at the top of the report.",
        ),
    ] = True,
    address: MetricsAddress = None,
    by: By = None,
    bootstrap: Bootstrap = 1000,
    seed: IntervalsSeed = 0,
    method: MergedMethod = "multinomial",
    harness_errors: HarnessErrors = "exclude",
    pool: Pool = None,
    partial: Partial = False,
    strict_replay: StrictReplay = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
    allow_empty: AllowEmpty = False,
) -> None:
    """Tables, ranking divergence, paired comparisons and figures as Markdown, HTML, CSV and Parquet. A run that
    holds no rollout is an error (exit 2), nothing written, unless --allow-empty."""
    from pipeline.report import build_report, check_request, parse_compare

    asked = metrics_settings(by, bootstrap, seed, method, harness_errors, pool, strict_replay, methods=METHODS)
    reading = Reading(storage(endpoint_url, storage_option), partial)
    pair = parse_compare(compare) if compare else None
    ks = _depths(k)
    check_request(run, out_dir.rstrip("/"), ks, overwrite, reading.storage)  # before the run is listed
    result = build_report(
        reading.open(run),
        out_dir,
        asked.by,
        pair,
        ks,
        asked.bootstrap,
        overwrite=overwrite,
        within=within,
        population=asked.population,
        sensitivity=sensitivity,
        figures=figures,
        allow_empty=allow_empty,
        address=address,
    )
    if list_files:
        for path in result.files:
            out.print(literal(path))
    if result.tables.cohorts and result.tables.cohorts[0]["partial"]:
        partial_notice(Coverage.from_json(result.tables.cohorts[0]["partial"]), console)
    where = literal(result.out)
    listed = "" if list_files else "; --list names them"
    console.print(f"report written to {where}/report.html and {where}/report.md ({len(result.files)} files{listed})")


def _depths(k: str) -> list[int]:
    try:
        return [int(x) for x in k.split(",") if x.strip()]
    except ValueError as exc:
        raise PexecError(f"--k takes depths separated by commas, e.g. 1,3,5; got {k!r}") from exc


def diff(
    run_a: Annotated[str, typer.Argument(help="The earlier run (A).")],
    run_b: Annotated[str, typer.Argument(help="The later run (B): differences are B - A.")],
    fail_on: Annotated[
        list[str] | None,
        typer.Option("--fail-on", help="METRIC<NUMBER (or <=, >, >=) on B - A: exit 1 when crossed (repeatable)."),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option("--json", help="One JSON object per line: the settings, then per cohort × metric and per tool."),
    ] = False,
    paired: Annotated[
        bool | None,
        typer.Option(
            "--paired/--unpaired",
            help="Compare the same rollouts step by step, or the runs' cohorts as drift (default: paired when at "
            "least half of the smaller run's rollout ids are in both).",
        ),
    ] = None,
    address: MetricsAddress = None,
    by: By = None,
    bootstrap: Bootstrap = 1000,
    seed: IntervalsSeed = 0,
    method: MergedMethod = "multinomial",
    harness_errors: HarnessErrors = "exclude",
    pool: Pool = None,
    strict_replay: StrictReplay = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Two runs of the same rollouts: verdict flips step by step, paired by rollout. Runs with different tasks:
    drift, B - A per cohort and metric, and per tool, with two-sample task-level bootstrap intervals. --fail-on
    turns thresholds into exit code 1."""
    from pipeline.metrics.drift import breaches, diff_runs, parse_threshold
    from pipeline.metrics.verdicts import relabelled_rollouts, shared_rollouts

    asked = metrics_settings(by, bootstrap, seed, method, harness_errors, pool, strict_replay, methods=METHODS)
    reading = Reading(storage(endpoint_url, storage_option))
    a, b = reading.open(run_a), reading.open(run_b)
    for given, opened in ((run_a, a), (run_b, b)):
        name = literal(public_url(given))
        if not opened.snapshot.scored():  # checked first: its cohorts and columns would be absent, not empty
            rejected = opened.snapshot.rejected()
            why = (
                f"; to see why: {rejects_query(name, 'SELECT reason, source, location FROM rejects')}"
                if rejected
                else ""
            )
            raise PexecError(f"{name} holds no rollout ({rejected:,} record(s) rejected): nothing to compare{why}")
    # Which rollout ids both runs have decides the default; --unpaired needs no such scan of both runs' ids.
    shared = (0, 0, 0) if paired is False else shared_rollouts(a, b)
    if paired or (paired is None and shared[2] and 2 * shared[2] >= min(shared[:2])):
        if address is not None or asked.bootstrap.method not in LOCAL_METHODS:
            raise PexecError("--address and --method poisson-merged apply to drift (--unpaired), not the paired diff")
        relabelled = relabelled_rollouts(a, b)
        if relabelled["relabelled"] and relabelled["example"] is not None:
            example = relabelled["example"]
            said = (
                f"{relabelled['relabelled']:,} of the {shared[2]:,} rollout ids both runs have carry other labels "
                f"in B (the first: {example['a']} in A, {example['b']} in B): ids that collide, not the same rollouts"
            )
            if paired is None:  # the default would pair them: refused rather than guessed
                raise PexecError(f"{said}; --paired compares them step by step anyway, --unpaired as drift")
            warning_notice(f"{said}; compared step by step as --paired asks", console)
        alert(_paired(a, b, asked, fail_on or [], as_json, shared))
        return
    thresholds = [parse_threshold(t) for t in fail_on or []]
    result = diff_runs(a, b, asked.by, asked.bootstrap, asked.population, address)
    if as_json:
        json_lines(result.json_rows())
    else:
        print_diff(result)
    alert(breaches(result, thresholds))


def _paired(
    a: Run, b: Run, asked: MetricsSettings, fail_on: list[str], as_json: bool, shared: tuple[int, int, int]
) -> list[str]:
    from pipeline.apps.cli._verdicts import paired

    if not shared[2]:
        raise PexecError(
            f"--paired: the runs share no rollout id ({shared[0]} in A, {shared[1]} in B): nothing to compare step "
            "by step; without --paired they are compared as drift"
        )
    if asked.by:
        raise PexecError("--by does not apply to the paired diff (every shared rollout is compared); use --unpaired")
    if asked.population != DEFAULT_POPULATION:
        raise PexecError(
            "--harness-errors, --pool and --strict-replay do not apply to the paired diff (a rollout that is a "
            "harness error in either run is left out and counted); use --unpaired"
        )
    return paired(a, b, asked.bootstrap, fail_on, as_json, shared)


def alert(lines: list[str]) -> None:
    """One line per crossed --fail-on threshold on stderr, then exit 1 (for alerting)."""
    for line in lines:
        console.print(literal(line), soft_wrap=True)  # a breach names labels and tools, which come from the logs
    if lines:
        raise typer.Exit(1)


def sql(
    run: ScoredRun,
    query: Annotated[
        str, typer.Argument(help="A read-only query over the views steps, rollouts, rejects, metrics, pec, ….")
    ],
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
    vertical: Annotated[
        bool,
        typer.Option(
            "--vertical",
            help="A table one record per block (each column's name and value on a line); a table wider than the "
            "output is shown so anyway, said on stderr.",
        ),
    ] = False,
    memory_limit: Annotated[
        str, typer.Option("--memory-limit", help="DuckDB memory limit (e.g. 512MB, 4GB); beyond it, it spills.")
    ] = QueryLimits.memory_limit,
    spill_limit: Annotated[
        str,
        typer.Option(
            "--spill-limit", help="Spill files DuckDB may write beyond the memory limit (1MiB to 1TiB, e.g. 4GB)."
        ),
    ] = QueryLimits.spill_limit,
    timeout: Annotated[
        float,
        typer.Option("--timeout", min=0.001, max=86_400, help="Seconds the query and writing its result may take."),
    ] = QueryLimits.timeout,
    max_rows: Annotated[
        int,
        typer.Option(
            "--max-rows", min=1, max=MAX_ROWS_LIMIT, help="Rows written at most; a longer result is cut (exit 1)."
        ),
    ] = QueryLimits.max_rows,
    partial: Partial = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Run a read-only SQL query (DuckDB) over the run's tables; the result streams out within the limits."""
    if fmt not in ("table", "csv", "json"):
        raise PexecError(f"--format is table, csv or json, got {fmt!r}")
    from pipeline.metrics.query import read_statements, stream_sql

    limits = QueryLimits(memory_limit=memory_limit, spill_limit=spill_limit, timeout=timeout, max_rows=max_rows)
    read_statements(query)  # a query that is not a read, or not SQL, is refused before the run is listed
    reading = Reading(storage(endpoint_url, storage_option), partial)
    with stream_sql(reading.open(run).snapshot, query, limits) as result:
        if result.partial:  # on stderr: the result itself stays what the query asked for
            partial_notice(result.partial, console)
        print_query_result(result, fmt, vertical)
    if result.cut:  # the rows written are not the whole result: said, and not exit 0
        sys.stdout.flush()
        console.print(f"pexec sql: {result.cut}", soft_wrap=True)
        raise typer.Exit(1)


def view(
    run: Annotated[str, typer.Argument(help="A scored run folder or URL.")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = VIEW_PORT,
    host: Annotated[
        str,
        typer.Option("--host", help="Address to listen on (default: this machine only; beyond it, a token)."),
    ] = "127.0.0.1",
    token: Annotated[
        str | None,
        typer.Option(
            "--token",
            envvar="PEXEC_VIEW_TOKEN",
            help="Token a browser opens the viewer with (`/?token=…` once, then a cookie); required beyond loopback.",
        ),
    ] = None,
    token_file: TokenFile = None,
    allow_host: AllowHost = None,
    header_timeout: HeaderTimeout = 5.0,
    max_concurrency: MaxConcurrency = 64,
    shutdown_timeout: ShutdownTimeout = 10.0,
    bootstrap: Bootstrap = 1000,
    seed: IntervalsSeed = 0,
    method: Method = "multinomial",
    partial: Partial = False,
    inputs: Annotated[
        list[str] | None,
        typer.Option(
            "--inputs",
            help="A folder or URL prefix whose inputs rollout pages may read to show the logged trajectory "
            "(repeatable; default: only the run's own folder, since a run's manifest may name any URL).",
        ),
    ] = None,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Browse a run: cohorts and their metrics -> the rollouts behind a number -> one rollout's steps."""
    from pipeline.apps.view import RunView, check_token, serve
    from pipeline.apps.web import listen, read_token

    token = read_token(token, token_file)
    check_token(host, token)
    asked = MetricsSettings.from_values(bootstrap=bootstrap, seed=seed, method=method, methods=LOCAL_METHODS)
    with listen(host, port) as sock:  # bound before the run is read and before the banner says so
        port = sock.getsockname()[1]
        opened = Reading(storage(endpoint_url, storage_option), partial).open(run)
        run_view = RunView(opened, asked.bootstrap, tuple(inputs or ()))
        console.print(f"pexec view: http://{host}:{port}/ (Ctrl-C to stop)")
        try:
            limits = server_limits(header_timeout, max_concurrency, shutdown_timeout)
            serve(run_view, host, port, token, limits, tuple(allow_host or ()), sock)
        finally:
            run_view.close()


_LISTED = 20  # damaged or unverified parts printed one a line; the rest counted


def verify(
    run: ScoredRun,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Check every part of the run against the size, SHA-256 digest and rows its shard's marker recorded: exit 0
    when all match, 2 listing the damaged parts, 1 when some could not be verified (a layout 1 run)."""
    from pipeline.metrics.verify import verify_run

    found = verify_run(run, storage(endpoint_url, storage_option))
    runs = f", {found.runs} runs" if found.runs > 1 else ""
    out.print(
        f"{found.parts:,} parts of {found.shards:,} shards{runs}: {found.verified:,} verified, "
        f"{len(found.damaged):,} damaged, {len(found.unverified):,} unverified",
        soft_wrap=True,
    )
    for url in found.incomplete:
        out.print(f"incomplete run (its committed shards were checked): {url}", soft_wrap=True)
    for part in found.damaged[:_LISTED]:
        out.print(f"damaged: {part.url}: {part.problem}", soft_wrap=True)
    if found.damaged:
        more = len(found.damaged) - _LISTED
        listed = f" ({more:,} more not listed)" if more > 0 else ""
        raise PartDamaged(
            f"{len(found.damaged):,} of {found.parts:,} parts damaged{listed}; "
            f"{'; '.join(found.repairs)} rescores their shards"
        )
    for url in found.unverified[:_LISTED]:
        out.print(f"unverified: {url}", soft_wrap=True)
    if len(found.unverified) > _LISTED:
        out.print(f"unverified: {len(found.unverified) - _LISTED:,} more not listed", soft_wrap=True)
    if found.unverified:
        console.print(
            f"pexec verify: {len(found.unverified):,} parts have no recorded digest (run folder layout 1): their "
            "sizes and rows match, their bytes cannot be checked; rescore the run with this pexec to record them",
            soft_wrap=True,
        )
        raise typer.Exit(1)
