"""`pexec`: a thin command line over the Python API (pipeline.*)."""

from __future__ import annotations

import csv
import re
import signal
import sys
import warnings
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Annotated, Any

import click
import orjson
import pyarrow as pa
import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table
from rich.text import Text
from typer.core import TyperGroup

from pipeline.core import intervals, metric_catalogue
from pipeline.core.errors import PexecError
from pipeline.envs import EnvOptions
from pipeline.metrics.cohorts import cohort_fields
from pipeline.metrics.completeness import describe_partial
from pipeline.metrics.query import QueryLimits, partial_of, read_statements
from pipeline.metrics.run import Run, open_run
from pipeline.metrics.settings import BootstrapSettings, Population, harness_note, replay_note
from pipeline.metrics.tool_profiles import TOOL_FIELDS, tool_cohort_columns
from pipeline.replay.checker import CHECKS, parse_checks
from pipeline.scoring.driver import DEFAULT_SHARD_BYTES, ShardPlan, run_scoring
from pipeline.scoring.shard import ShardReport
from pipeline.storage.lease import DEFAULT_STALE_AFTER
from pipeline.storage.stores import WriteMode, write_store
from pipeline.synthetic.rollouts import synthesize

# Data is never markup: labels, values, paths and messages are printed as they are (no [style] tags, no
# :emoji: codes), with control characters shown as escapes by `literal`. Our own styles are Text objects.
console = Console(stderr=True, markup=False, emoji=False, highlight=False)
out = Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False, highlight=False)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")  # C0, C1, bidi overrides


def literal(value: Any) -> str:
    """A value from data, a path or an exception as it should appear on a terminal: every control character
    (escape sequences, carriage returns, bells, newlines, bidi overrides) as its Python escape."""
    return _CONTROL.sub(lambda m: m[0].encode("unicode_escape").decode(), str(value))


def _show_warning(message: Warning | str, category: type[Warning], filename: str, lineno: int, *_: Any) -> None:
    # Library warnings quote data too (matplotlib names a label's glyphs it cannot draw).
    console.print(literal(f"{filename}:{lineno}: {category.__name__}: {message}"), soft_wrap=True)


warnings.showwarning = _show_warning


class _Commands(TyperGroup):
    """The one place user-facing errors end: any command's PexecError is printed as `error: <message>` on
    one line and exits 2. Any other exception is a bug and keeps its traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except PexecError as exc:
            _fail(str(exc), exc)
        except OSError as exc:  # storage: a missing bucket or file, a refused write, an unreachable endpoint
            _fail(f"{type(exc).__name__}: {exc}", exc)
        except Exception as exc:
            if type(exc).__module__.startswith("botocore"):  # credentials, endpoint (not an OSError)
                _fail(f"{type(exc).__name__}: {exc} (see the AWS environment or --endpoint-url)", exc)
            raise


def _fail(message: str, exc: Exception) -> None:
    # Some messages carry several lines (DuckDB's); soft_wrap keeps long ones on one line too.
    message = " ".join(line.strip() for line in message.splitlines() if line.strip())
    console.print(Text.assemble(("error:", "bold red"), " ", literal(message)), soft_wrap=True)
    raise typer.Exit(code=2) from exc


app = typer.Typer(cls=_Commands, add_completion=False, no_args_is_help=True, help=__doc__)


def _print_version(show: bool) -> None:
    if show:
        typer.echo(version("pexec"))
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool, typer.Option("--version", callback=_print_version, is_eager=True, help="Print the version and exit.")
    ] = False,
) -> None:
    """The options of `pexec` itself, given before any command (the app's help text comes from __doc__)."""


# Options several commands share, declared once.
EndpointUrl = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="S3-compatible endpoint (e.g. http://127.0.0.1:5555); credentials come "
        "from the standard AWS environment/config.",
    ),
]
StorageOption = Annotated[
    list[str] | None, typer.Option("--storage-option", help="k=v passed to the fsspec filesystem (repeatable).")
]
OutStore = Annotated[str, typer.Option("--out", help="Store to write (folder or fsspec URL).")]
StoreFormat = Annotated[str, typer.Option("--format", help="jsonl or parquet")]
Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace the files already in the output store.")]
Append = Annotated[
    bool, typer.Option("--append", help="Add new files beside those already in the output store (same format).")
]
By = Annotated[
    str | None,
    typer.Option(
        "--by", help="Columns that define a cohort, e.g. model,method (default: every label); attributes too."
    ),
]
HarnessErrors = Annotated[
    str,
    typer.Option(
        "--harness-errors",
        help="exclude: harness-error rollouts are left out of every metric (always counted); "
        "fail: they count as non-executable failures.",
    ),
]
Pool = Annotated[
    list[str] | None,
    typer.Option("--pool", help="NAME=B1,B2: count benchmarks B1, B2 as one benchmark NAME (repeatable)."),
]
Bootstrap = Annotated[int, typer.Option("--bootstrap", min=1, help="Bootstrap replicates B.")]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random draws: the same seed, the same output.")]
Method = Annotated[str, typer.Option("--method", help="multinomial (task resampling) or poisson")]
MetricsMethod = Annotated[
    str,
    typer.Option(
        "--method",
        help="multinomial (task resampling), poisson, or poisson-merged (Poisson weights keyed by task id: "
        "the mergeable bootstrap for large runs)",
    ),
]
SpecDir = Annotated[list[str] | None, typer.Option("--spec-dir", help="Extra folder to search for specs.")]
RayAddress = Annotated[
    str | None, typer.Option("--address", help="Ray cluster address (default: the job's for `run`, else local Ray).")
]
DashboardAddress = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray Jobs API (dashboard) URL, e.g. http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS).",
    ),
]
Force = Annotated[bool, typer.Option("--force", help="Rescore every shard, even unchanged ones.")]
OnDate = Annotated[str | None, typer.Option("--date", help="YYYY-MM-DD for {date} (default: today, UTC).")]
Partial = Annotated[
    bool,
    typer.Option(
        "--partial",
        help="Read an incomplete run (killed scoring, missing parts): only its committed shards; "
        "every output states the coverage.",
    ),
]
StrictReplay = Annotated[
    bool,
    typer.Option(
        "--strict-replay",
        help="Leave out the rollouts whose replay diverged from the log before their first error (FED untrusted).",
    ),
]


def _storage(endpoint_url: str | None, pairs: list[str] | None) -> dict[str, Any] | None:
    options: dict[str, Any] = {}
    for key, value in _pairs(pairs, "--storage-option").items():
        try:
            options[key] = orjson.loads(value)  # numbers, booleans, objects
        except orjson.JSONDecodeError:
            options[key] = value
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    return options or None


def _write_mode(overwrite: bool, append: bool) -> WriteMode:
    if overwrite and append:
        raise PexecError("--overwrite and --append exclude each other")
    return "overwrite" if overwrite else "append" if append else "new"


def _columns(by: str | None) -> list[str] | None:
    """`--by model,method` -> ["model", "method"]; None (every label) when not given."""
    return [c.strip() for c in by.split(",") if c.strip()] if by else None


def _population(harness_errors: str, pools: list[str] | None, strict_replay: bool) -> Population:
    if harness_errors not in ("exclude", "fail"):
        raise PexecError(f"--harness-errors is exclude or fail, got {harness_errors!r}")
    named = _pairs(pools, "--pool")
    pooled = tuple((name, tuple(b.strip() for b in value.split(",") if b.strip())) for name, value in named.items())
    return Population(harness_errors, pooled, strict_replay)  # type: ignore[arg-type]


def _bootstrap(replicates: int, seed: int, method: str, merged: bool = False) -> BootstrapSettings:
    if merged and method == "poisson-merged":
        return BootstrapSettings(B=replicates, seed=seed, method="poisson-merged")
    if method not in ("multinomial", "poisson"):
        raise PexecError("--method is multinomial or poisson" + (" or poisson-merged" if merged else ""))
    return BootstrapSettings(B=replicates, seed=seed, method=method)  # type: ignore[arg-type]


@app.command()
def synth(
    spec: Annotated[str, typer.Argument(help="Spec to build tasks for (shipped: shop).")],
    out_store: OutStore,
    rollouts: Annotated[int, typer.Option("--rollouts", min=1)] = 1000,
    tasks: Annotated[int, typer.Option("--tasks", min=1)] = 100,
    seed: Seed = 0,
    fmt: StoreFormat = "jsonl",
    compression: Annotated[str, typer.Option("--compression", help="none, gzip or zstd (JSON Lines)")] = "none",
    per_file: Annotated[int, typer.Option("--per-file", min=1, help="Rollouts per file.")] = 50_000,
    overwrite: Overwrite = False,
    append: Append = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Generate a synthetic store with known per-step truth (injected failures, recoveries)."""
    if fmt not in ("jsonl", "parquet") or compression not in ("none", "gzip", "zstd"):
        raise PexecError("--format is jsonl or parquet; --compression is none, gzip or zstd")
    mode = _write_mode(overwrite, append)
    records = synthesize(spec, rollouts, tasks, seed)
    storage = _storage(endpoint_url, storage_option)
    n = write_store(records, out_store, fmt, per_file, None if compression == "none" else compression, storage, mode)
    console.print(f"wrote {n} rollouts over {min(tasks, rollouts)} tasks to {literal(out_store)}")


@app.command()
def ingest(
    fmt: Annotated[str, typer.Argument(help="Source format (docs/reference/log-formats.md: bfcl, tau2, ...).")],
    sources: Annotated[list[str], typer.Argument(help="Files or folders to read.")],
    out_store: OutStore,
    label: Annotated[list[str] | None, typer.Option("--label", help="k=v added to every rollout's labels.")] = None,
    option: Annotated[list[str] | None, typer.Option("--option", help="k=v setting of the format's adapter.")] = None,
    store_fmt: StoreFormat = "jsonl",
    overwrite: Overwrite = False,
    append: Append = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Convert benchmark or production logs into canonical rollouts.

    `--option help` lists the options of FORMAT instead: nothing is read or written."""
    from pipeline.ingest import IngestOptions, accepted_options
    from pipeline.ingest import ingest as run_ingest

    if "help" in (option or []):  # each key, its default and its one-line doc, from the format's declared schema
        table = Table("option", "default", "meaning")
        for o in accepted_options(fmt).listed():
            table.add_row(literal(o.key), literal(o.default or ""), literal(o.doc))
        out.print(table)
        return
    storage = _storage(endpoint_url, storage_option)  # for the sources and the output store
    options = IngestOptions(labels=_pairs(label, "--label"), extra=_pairs(option, "--option"), storage_options=storage)
    harness_errors = orphans = orphaned = 0

    def counted(records: Iterator[dict]) -> Iterator[dict]:
        nonlocal harness_errors, orphans, orphaned
        for record in records:
            harness_errors += record.get("status") == "harness_error"
            found = int((record.get("attributes") or {}).get("orphan_results", 0))
            orphans, orphaned = orphans + found, orphaned + (found > 0)
            yield record

    records = counted(run_ingest(fmt, sources, options))
    n = write_store(records, out_store, store_fmt, storage_options=storage, mode=_write_mode(overwrite, append))
    ok = n - harness_errors
    console.print(f"wrote {n} rollouts to {literal(out_store)}: {ok} ok, {harness_errors} harness error(s)")
    if orphans:
        console.print(
            f"warning: {orphans} tool result(s) in {orphaned} rollout(s) answer no logged call; kept as 'tool' "
            "messages (attribute orphan_results)"
        )


def _pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    pairs = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PexecError(f"{flag} takes key=value, got {item!r}")
        pairs[key] = value
    return pairs


@app.command()
def score(
    store: Annotated[str, typer.Argument(help="Input store: a file or folder, local path or fsspec URL.")],
    run: Annotated[str, typer.Option("--out", help="Run folder to write (steps/, rollouts/, rejects/).")],
    env: Annotated[
        str | None, typer.Option("--env", help="Environment for every rollout (default: each rollout's benchmark).")
    ] = None,
    spec: Annotated[
        str | None, typer.Option("--spec", help="Spec giving `observed` its schemas and grounding.")
    ] = None,
    spec_dir: SpecDir = None,
    address: RayAddress = None,
    policy: Annotated[str, typer.Option("--policy", help="code or strict (written-policy overlays)")] = "code",
    shard_mb: Annotated[float, typer.Option("--shard-mb", help="Target shard size in MiB.")] = DEFAULT_SHARD_BYTES
    / 2**20,
    num_cpus: Annotated[int | None, typer.Option("--num-cpus", help="CPUs for local Ray.")] = None,
    inline: Annotated[bool, typer.Option("--inline", help="Score in this process, without Ray.")] = False,
    force: Force = False,
    lease_stale_after: Annotated[
        float,
        typer.Option(
            "--lease-stale-after",
            min=1,
            help="Seconds without a heartbeat after which another writer's lease on the run is taken over.",
        ),
    ] = DEFAULT_STALE_AFTER,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
    checks: Annotated[
        str,
        typer.Option("--checks", help="Checks that apply, a comma-separated subset of schema,dependency,precondition."),
    ] = ",".join(CHECKS),
) -> None:
    """Replay every rollout and write per-step flags, per-rollout summaries, rejects and the manifest."""
    if policy not in ("code", "strict"):
        raise PexecError("--policy is code or strict")
    try:
        selected = parse_checks(checks)
    except ValueError as exc:
        raise PexecError(f"--checks: {exc}") from None
    if shard_mb * 2**20 < 1:
        raise PexecError(f"--shard-mb takes a size > 0, got {shard_mb}")
    options = EnvOptions(spec_dirs=tuple(spec_dir or ()), spec=spec, policy=policy)
    _unwind_on_sigterm()
    progress = ScoreProgress()
    with progress.bar:
        manifest = run_scoring(
            store,
            run,
            env=env,
            options=options,
            address=address,
            executor="inline" if inline else "ray",
            shard_bytes=int(shard_mb * 2**20),
            num_cpus=num_cpus,
            storage_options=_storage(endpoint_url, storage_option),
            on_plan=progress.on_plan,
            on_shard=progress.on_shard,
            force=force,
            lease_stale_after=lease_stale_after,
            checks=selected,
        )
    _summary(manifest, run)


def _unwind_on_sigterm() -> None:
    """A scheduler's SIGTERM (a cron or pod timeout) unwinds like Ctrl-C, so the run's lease is released."""

    def leave(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, leave)


class ScoreProgress:
    """The driver's live view of a scoring job: shards, rollouts, rollouts/s, rejects, ETA."""

    def __init__(self) -> None:
        self.bar = Progress(
            TextColumn("[bold]scoring"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("shards"),
            TextColumn(
                "{task.fields[rollouts]:,} rollouts · {task.fields[rate]:,.0f}/s · {task.fields[rejects]} rejects"
            ),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
        )
        self.rollouts = self.rejects = 0
        self.task: Any = None
        self.seen: dict[str, ShardReport] = {}  # a shard holding a later copy of a duplicated id reports twice

    def on_plan(self, p: ShardPlan) -> None:
        console.print(
            f"plan: {p.files} file(s), {p.total_bytes / 2**20:,.1f} MiB -> {len(p.shards)} shard(s)"
            + (f", {p.reusable} unchanged since they were scored (reused)" if p.reusable else "")
            + (f"; ignored {len(p.ignored)} non-data file(s)" if p.ignored else "")
        )
        self.task = self.bar.add_task("score", total=len(p.shards), rollouts=0, rate=0.0, rejects=0)

    def on_shard(self, r: ShardReport) -> None:
        before = self.seen.get(r.shard)
        self.seen[r.shard] = r
        self.rollouts += r.scored - (before.scored if before else 0)
        self.rejects += r.rejected - (before.rejected if before else 0)
        elapsed = self.bar.tasks[self.task].elapsed or 1e-9
        self.bar.update(
            self.task,
            advance=0 if before else 1,
            rollouts=self.rollouts,
            rejects=self.rejects,
            rate=self.rollouts / elapsed,
        )


def _summary(manifest: dict[str, Any], run: str) -> None:
    c = manifest["counts"]
    console.print(
        f"read {c['read']:,} · scored {c['scored']:,} · rejected {c['rejected']:,} · steps {c['steps']:,} "
        f"· {c['shards_reused']} of {c['shards']} shard(s) reused · {manifest['seconds']:.1f}s -> {literal(run)}"
    )
    if c["rejected"]:
        query = "SELECT reason, source, location FROM rejects"
        hint = f"{c['rejected']} record(s) rejected; to see them: pexec sql {literal(run)} '{query}'"
        console.print(Text(hint, "yellow"))


@app.command("run")
def run_command(
    job_file: Annotated[Path, typer.Argument(help="A job definition (jobs/*.toml).")],
    on_date: OnDate = None,
    address: RayAddress = None,
    force: Force = False,
    check: Annotated[
        bool,
        typer.Option("--check", help="Only check the job (input, output, credentials, environments, columns)."),
    ] = False,
) -> None:
    """Run a job: score its input (only what changed since the last run), then write its metrics (and report).
    The job is checked first (as --check does), so a typo fails before any scoring."""
    from pipeline.jobs.definition import load_job, run_job
    from pipeline.jobs.preflight import check_job

    _unwind_on_sigterm()
    progress = ScoreProgress()
    job = load_job(job_file, on_date)
    found = check_job(job)
    if check:
        source = f"{found.files} file(s), {found.megabytes:,.1f} MiB" if found.files else "synthesized on first run"
        console.print(
            literal(
                f"job {job.name} ({job.date}) can run: input {job.input} ({source}); environments "
                f"{', '.join(found.environments)}; labels {', '.join(found.labels) or 'none'}; output {job.output}"
            ),
            soft_wrap=True,
        )
        return
    console.print(literal(f"job {job.name} ({job.date}): {job.input} -> {job.output}"))
    with progress.bar:
        manifest, cohorts = run_job(job, address, force, progress.on_plan, progress.on_shard)
    _summary(manifest, job.output)
    print_table(metrics_table(cohorts))
    for note in metrics_notes(cohorts):
        out.print(note)
    if job.report is not None:
        console.print(f"report written to {literal(job.report.out.rstrip('/'))}/report.html and report.md")
    if job.diff is not None:
        _job_diff(job)


def _job_diff(job: Any) -> None:
    """The job's [diff]: `pexec diff PREVIOUS OUTPUT`; a crossed fail_on threshold exits 1 (after the run and
    its metrics are written)."""
    from pipeline.jobs.definition import previous_run
    from pipeline.metrics.drift import breaches, diff_runs, parse_threshold

    previous = previous_run(job)
    if previous is None:
        console.print(f"diff skipped: no earlier run found (looked for {', '.join(job.diff.candidates)})")
        return
    console.print(f"diff: {previous} (A) -> {job.output} (B)")
    runs = open_run(previous, job.storage_options), open_run(job.output, job.storage_options)
    result = diff_runs(*runs, job.diff.by, job.bootstrap, job.population)
    _print_diff(result)
    _alert(breaches(result, [parse_threshold(t) for t in job.diff.fail_on]))


@app.command()
def submit(
    job_file: Annotated[Path, typer.Argument(help="A job definition (jobs/*.toml).")],
    address: DashboardAddress = None,
    on_date: OnDate = None,
    runtime: Annotated[
        str | None,
        typer.Option(
            "--runtime",
            help="local (this machine's interpreter and folder), image (the cluster's installed pexec) or package "
            "(this pexec, shipped with the job); default: the job's [submit] runtime, else local for a loopback "
            "address.",
        ),
    ] = None,
    python: Annotated[
        str | None, typer.Option("--python", help="Interpreter with pexec on the cluster (default: see --runtime).")
    ] = None,
    wait: Annotated[
        bool,
        typer.Option(
            "--wait",
            help="Follow the driver log until the job ends; exit 0 only if it SUCCEEDED. A SIGTERM stops the job.",
        ),
    ] = False,
) -> None:
    """Submit a job to a Ray cluster through the Jobs API; prints the submission id."""
    from pipeline.jobs.cluster import AlreadyRunning, follow_job, jobs_api_address, stop_job, submit_job
    from pipeline.jobs.definition import load_job

    url = jobs_api_address(address)
    job = load_job(job_file, on_date)
    if wait:
        _unwind_on_sigterm()
    try:
        submission = submit_job(job_file, job, url, runtime, python)
        console.print(literal(f"submitted {job.name} ({job.date}) to {url}"))
    except AlreadyRunning as running:
        if not wait:
            raise
        submission = running.submission  # a retried CronJob pod waits for the run it started, never a second one
        console.print(literal(f"{job.name} ({job.date}) is already running on {url}: following it"))
    if not wait:
        out.print(literal(submission))
        return
    try:
        out.print(literal(submission))
        state = follow_job(url, submission, sys.stdout.write)
    except SystemExit:  # SIGTERM: the scheduler's deadline (activeDeadlineSeconds) ends the job with us
        console.print(literal(f"terminated: stopping {submission}"))
        stop_job(url, submission, timeout=20)
        raise
    _exit_with(state)


def _exit_with(state: str) -> None:
    sys.stdout.flush()  # the log first, then the verdict
    console.print(f"job {state}")
    if state != "SUCCEEDED":
        raise typer.Exit(code=1)


@app.command()
def status(
    submission: Annotated[str, typer.Argument(help="A submission id from `pexec submit`.")],
    address: DashboardAddress = None,
) -> None:
    """The state of a submitted job (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    from pipeline.jobs.cluster import job_status, jobs_api_address

    out.print(literal(job_status(jobs_api_address(address), submission)))


@app.command()
def logs(
    submission: Annotated[str, typer.Argument(help="A submission id from `pexec submit`.")],
    address: DashboardAddress = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing the log until the job ends.")] = False,
) -> None:
    """The driver log of a submitted job."""
    from pipeline.jobs.cluster import follow_job, job_logs, jobs_api_address

    url = jobs_api_address(address)
    if follow:
        follow_job(url, submission, sys.stdout.write)
    else:
        sys.stdout.write(job_logs(url, submission))


@app.command()
def stop(
    submission: Annotated[str, typer.Argument(help="A submission id from `pexec submit`.")],
    address: DashboardAddress = None,
) -> None:
    """Stop a submitted job and wait for it to end; prints its final state."""
    from pipeline.jobs.cluster import jobs_api_address, stop_job

    out.print(stop_job(jobs_api_address(address), submission))


@app.command("jobs")
def jobs_command(address: DashboardAddress = None) -> None:
    """The jobs a Ray cluster knows: submission id, state, job, date, start and end (UTC)."""
    from pipeline.jobs.cluster import jobs_api_address, list_jobs

    rows = list_jobs(jobs_api_address(address))
    table = Table("id", "state", "job", "date", "start", "end")
    for row in rows:
        table.add_row(*row.values())
    out.print(table)


@app.command()
def metrics(
    run: Annotated[str, typer.Argument(help="A scored run folder.")],
    by: By = None,
    bootstrap: Bootstrap = 1000,
    seed: Seed = 0,
    method: MetricsMethod = "multinomial",
    max_k: Annotated[
        int | None, typer.Option("--max-k", help="Largest k for PEC(k) (default: max T, at most 20).")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cohort.")] = False,
    harness_errors: HarnessErrors = "exclude",
    pool: Pool = None,
    partial: Partial = False,
    strict_replay: StrictReplay = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Success, TER, AUC-PEC, RR, output match and PEC(k) per cohort with 95% intervals (task bootstrap, or
    Wilson on the effective sample size for small samples)."""
    settings = _bootstrap(bootstrap, seed, method, merged=True)
    population = _population(harness_errors, pool, strict_replay)
    columns = _columns(by)
    opened = open_run(run, _storage(endpoint_url, storage_option), partial)
    tool_by = tool_cohort_columns(columns)
    if tool_by is not None:
        _tool_metrics(opened, tool_by, settings, population, as_json)
        return
    cohorts = opened.metrics(columns, settings, max_k, population)
    folder = opened.write_metrics(cohorts, columns)
    if as_json:
        for cohort in cohorts:
            sys.stdout.write(orjson.dumps(cohort).decode() + "\n")
        return
    if cohorts and cohorts[0]["partial"]:
        out.print(Text(literal(describe_partial(cohorts[0]["partial"])), style="bold yellow"), soft_wrap=True)
    print_table(metrics_table(cohorts))
    if cohorts:
        b = cohorts[0]["bootstrap"]
        out.print(
            f"95% intervals: {b['method']} task-level bootstrap, B={b['B']}, seed={b['seed']}, "
            f"DuckDB {b['duckdb_version']}; written to {literal(folder)}/"
        )
        for note in metrics_notes(cohorts):
            out.print(note)


def _tool_metrics(run: Run, by: list[str], settings: BootstrapSettings, population: Population, as_json: bool) -> None:
    """`metrics --by tool[,labels]`: the per-tool error profile (step-level cohorts), printed, not written."""
    from pipeline.report.layout import tools_table

    rows = run.tool_profiles(by, settings, population)
    if as_json:
        for row in rows:
            sys.stdout.write(orjson.dumps(row).decode() + "\n")
        return
    if not rows:
        raise PexecError(f"{run.url} has no steps: nothing to profile per tool")
    if rows[0]["partial"]:
        out.print(Text(describe_partial(rows[0]["partial"]), style="bold yellow"), soft_wrap=True)
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


def metrics_table(cohorts: list[dict]) -> Table:
    # The cohort's key columns: everything of a cohort dict that is not a count, a metric or a setting.
    labels = [k for k in (cohorts[0] if cohorts else {}) if k != "benchmark" and k not in cohort_fields()]
    # The catalogue's table metrics, with the curves last (PEC@1 and PEC@3) to fit a terminal.
    ratios = [m for m in metric_catalogue.ratios() if m.in_tables]
    curves = [m for m in metric_catalogue.METRICS if m.kind == "curve" and m.in_tables]
    headers = [f"{m.label} (n)" if m.eligible else m.label for m in ratios]
    headers += [f"{m.label}@{k}" for m in curves for k in (1, 3)]
    rows = []
    for c in cohorts:
        condition = " · ".join(literal(c.get(k)) for k in labels) or "all"
        cells = [literal(c["benchmark"]), condition, str(c["n"]), str(c["n_tasks"])]
        cells += [str(c["n_unknown_success"]), str(c["n_harness_error"])]
        cells += [_ci(c[m.name]) + (f"\n({c[m.name]['eligible']})" if m.eligible else "") for m in ratios]
        for m in curves:
            curve = {p["k"]: p for p in c[m.name]}
            cells += [_ci(curve[k]) if k in curve else "–" for k in (1, 3)]
        rows.append(cells)
    table = Table(title="Prefix executability: value and 95% interval")
    for i, name in enumerate(["benchmark", "condition", "N", "tasks", "no verdict", "harness errors", *headers]):
        table.add_column(name, justify="left" if i < 2 else "right")
    for cells in rows:
        table.add_row(*cells)
    return table


def print_table(table: Table) -> None:
    """Print a table at its natural width: a narrow terminal wraps the lines, but no cell is folded or cut to
    "0.7…", which would read as another number."""
    wide = Console(
        file=out.file,
        width=100_000,
        color_system=out.color_system,
        force_terminal=out.is_terminal,
        markup=False,
        emoji=False,
        highlight=False,
    )
    wide.print(table)


def metrics_notes(cohorts: list[dict]) -> list[str]:
    """What the table's populations and markers mean (the report says the same: pipeline.report.layout)."""
    notes = [
        "success and RR: over the rollouts with a verdict (no verdict: left out); TER, AUC-PEC, PEC: all N.",
        "AUC-PEC (writes): over the rollouts with a write or irreversible call (n; the rest have none); invalid "
        "irreversible, weighted AUC-PEC: all N.",
    ]
    points = [p for c in cohorts for p in [*(c[m.name] for m in metric_catalogue.ratios()), *c["pec"]]]
    if any(p.get("method") == intervals.WILSON for p in points):
        notes.append(intervals.NOTE)
    return [*notes, harness_note(cohorts), replay_note(cohorts)]


def _ci(m: dict) -> str:
    if m.get("value") is None:
        return "–"
    mark = f" {intervals.MARK}" if m.get("method") == intervals.WILSON else ""
    return f"{m['value']:.3f}{mark}\n{m['lo']:.3f}–{m['hi']:.3f}"


@app.command()
def report(
    run: Annotated[str, typer.Argument(help="A scored run folder.")],
    out_dir: Annotated[str, typer.Option("--out", help="Folder to write the report into (local path or URL).")],
    by: By = None,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option("--compare", help="COL=A COL=B: paired differences A - B over the tasks both share."),
    ] = None,
    k: Annotated[str, typer.Option("--k", help="Depths k of the PEC@k columns, e.g. 1,3,5.")] = "1,3,5",
    within: Annotated[
        str | None,
        typer.Option("--within", help="Rank the other conditions within each value of this column, e.g. model."),
    ] = None,
    bootstrap: Bootstrap = 1000,
    seed: Seed = 0,
    method: Method = "multinomial",
    harness_errors: HarnessErrors = "exclude",
    pool: Pool = None,
    partial: Partial = False,
    strict_replay: StrictReplay = False,
    overwrite: Annotated[
        bool, typer.Option("--overwrite", help="Remove what DIR holds first (a non-empty DIR is refused without).")
    ] = False,
    sensitivity: Annotated[
        bool, typer.Option("--sensitivity", help="Add TER and AUC-PEC under schema-only, schema+dependency, all.")
    ] = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Tables, ranking divergence, paired comparisons and figures as Markdown, HTML, CSV and Parquet."""
    from pipeline.report import build_report, check_request, parse_compare

    settings = _bootstrap(bootstrap, seed, method)
    population = _population(harness_errors, pool, strict_replay)
    pair = parse_compare(compare) if compare else None
    ks = _depths(k)
    storage = _storage(endpoint_url, storage_option)
    check_request(run, out_dir.rstrip("/"), ks, overwrite, storage)  # before the run is listed, as build_report does
    result = build_report(
        open_run(run, storage, partial),
        out_dir,
        _columns(by),
        pair,
        ks,
        settings,
        overwrite=overwrite,
        within=within,
        population=population,
        sensitivity=sensitivity,
    )
    for path in result.files:
        out.print(literal(path))
    if result.tables.cohorts and result.tables.cohorts[0]["partial"]:
        notice = literal(describe_partial(result.tables.cohorts[0]["partial"]))
        console.print(Text(notice, style="bold yellow"), soft_wrap=True)
    where = literal(result.out)
    console.print(f"report written to {where}/report.html and {where}/report.md ({len(result.files)} files)")


@app.command()
def diff(
    run_a: Annotated[str, typer.Argument(help="The earlier run (A).")],
    run_b: Annotated[str, typer.Argument(help="The later run (B): differences are B - A.")],
    by: By = None,
    fail_on: Annotated[
        list[str] | None,
        typer.Option("--fail-on", help="METRIC<NUMBER (or <=, >, >=) on B - A: exit 1 when crossed (repeatable)."),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per cohort × metric and per tool.")] = False,
    bootstrap: Bootstrap = 1000,
    seed: Seed = 0,
    method: Method = "multinomial",
    harness_errors: HarnessErrors = "exclude",
    pool: Pool = None,
    strict_replay: StrictReplay = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Drift between two runs with different tasks: B - A per cohort and metric, and per tool, with two-sample
    task-level bootstrap intervals; --fail-on turns thresholds into exit code 1."""
    from pipeline.metrics.drift import breaches, diff_runs, parse_threshold

    thresholds = [parse_threshold(t) for t in fail_on or []]
    settings = _bootstrap(bootstrap, seed, method)
    population = _population(harness_errors, pool, strict_replay)
    storage = _storage(endpoint_url, storage_option)
    result = diff_runs(open_run(run_a, storage), open_run(run_b, storage), _columns(by), settings, population)
    if as_json:
        for row in result.rows:
            sys.stdout.write(orjson.dumps({"kind": "metric", **row}).decode() + "\n")
        for row in result.tools:
            sys.stdout.write(orjson.dumps({"kind": "tool", "metric": "invalid_rate", **row}).decode() + "\n")
    else:
        _print_diff(result)
    _alert(breaches(result, thresholds))


def _alert(lines: list[str]) -> None:
    """One line per crossed --fail-on threshold on stderr, then exit 1 (for alerting)."""
    for line in lines:
        console.print(line, soft_wrap=True, markup=False, highlight=False)
    if lines:
        raise typer.Exit(1)


def _print_diff(result: Any) -> None:
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


def _depths(k: str) -> list[int]:
    try:
        return [int(x) for x in k.split(",") if x.strip()]
    except ValueError as exc:
        raise PexecError(f"--k takes depths separated by commas, e.g. 1,3,5; got {k!r}") from exc


@app.command("sql")
def sql_command(
    run: Annotated[str, typer.Argument(help="A scored run folder.")],
    query: Annotated[
        str, typer.Argument(help="A read-only query over the views steps, rollouts, rejects, metrics, pec, ….")
    ],
    fmt: Annotated[str, typer.Option("--format", help="table, csv or json")] = "table",
    memory_limit: Annotated[
        str, typer.Option("--memory-limit", help="DuckDB memory limit (e.g. 512MB, 4GB); beyond it, it spills.")
    ] = QueryLimits.memory_limit,
    timeout: Annotated[
        float, typer.Option("--timeout", help="Seconds the query may run before it is stopped.")
    ] = QueryLimits.timeout,
    partial: Partial = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Run a read-only SQL query (DuckDB) over the run's tables."""
    if fmt not in ("table", "csv", "json"):
        raise PexecError(f"--format is table, csv or json, got {fmt!r}")
    limits = QueryLimits(memory_limit=memory_limit, timeout=timeout)
    read_statements(query)  # a query that is not a read, or not SQL, is refused before the run is listed
    result = open_run(run, _storage(endpoint_url, storage_option), partial).sql(query, limits)
    covered = partial_of(result)
    if covered:  # on stderr: the result itself stays what the query asked for
        console.print(Text(literal(describe_partial(covered)), style="bold yellow"), soft_wrap=True)
    rows = result.to_pylist(maps_as_pydicts="strict")
    if fmt == "json":
        for row in rows:
            sys.stdout.write(_json(row) + "\n")
    elif fmt == "csv":
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(result.column_names)
        for row in rows:
            writer.writerow(_csv_cell(v) for v in row.values())
    else:
        table = Table()
        for name in result.column_names:
            table.add_column(literal(name))
        for row in rows:
            table.add_row(*("" if v is None else literal(_csv_cell(v)) for v in row.values()))
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


@app.command()
def view(
    run: Annotated[str, typer.Argument(help="A scored run folder or URL.")],
    port: Annotated[int, typer.Option("--port", min=1, max=65535, help="Port to listen on.")] = 8765,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on (default: this machine only).")
    ] = "127.0.0.1",
    bootstrap: Bootstrap = 1000,
    seed: Seed = 0,
    method: Method = "multinomial",
    partial: Partial = False,
    endpoint_url: EndpointUrl = None,
    storage_option: StorageOption = None,
) -> None:
    """Browse a run: cohorts and their metrics -> the rollouts behind a number -> one rollout's steps."""
    from pipeline.view import RunView, check_address, serve

    settings = _bootstrap(bootstrap, seed, method)
    check_address(host, port)
    run_view = RunView(open_run(run, _storage(endpoint_url, storage_option), partial), settings)
    console.print(f"pexec view: http://{host}:{port}/ (Ctrl-C to stop)")
    try:
        serve(run_view, host=host, port=port)
    finally:
        run_view.close()


@app.command()
def envs(
    spec_dir: SpecDir = None,
    check: Annotated[
        bool, typer.Option("--check", help="Build each environment: its version, or why it cannot be built.")
    ] = False,
) -> None:
    """The environments `score` can use: built-in, entry points, and specs on the search path."""
    from pipeline.envs import get_environment, list_environments

    options = EnvOptions(spec_dirs=tuple(spec_dir or ()))
    table = Table("environment", "from", *(["version"] if check else []))
    failed = 0
    for name, source in list_environments(options).items():
        row: list[str | Text] = [literal(name), literal(source)]
        if check:
            try:
                row.append(literal(get_environment(name, options).version))
            except PexecError as exc:  # a missing simulator package, an invalid spec: reported in its row
                failed += 1
                row.append(Text(f"cannot be built: {literal(exc)}", "red"))
        table.add_row(*row)
    out.print(table)
    if failed:
        raise typer.Exit(code=1)


guard_app = typer.Typer(no_args_is_help=True, help="Pre-execution guard: check an agent's next call before it runs.")
app.add_typer(guard_app, name="guard")
GuardSpec = Annotated[str | None, typer.Option("--spec", help="Spec giving `observed` its schemas and rules.")]


@guard_app.command("serve")
def guard_serve(
    env: Annotated[str, typer.Option("--env", help="Environment of every session (as `score --env`).")],
    spec: GuardSpec = None,
    spec_dir: SpecDir = None,
    policy: Annotated[str, typer.Option("--policy", help="code or strict (written-policy overlays)")] = "code",
    host: Annotated[str, typer.Option("--host", help="Address to listen on.")] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", min=0, max=65535, help="Port to listen on.")] = 8765,
    token: Annotated[
        str | None,
        typer.Option("--token", envvar="PEXEC_GUARD_TOKEN", help="Bearer token; required beyond loopback."),
    ] = None,
    max_sessions: Annotated[int, typer.Option("--max-sessions", min=1, help="Live sessions kept at most.")] = 1000,
    ttl: Annotated[float, typer.Option("--ttl", min=1, help="Seconds an idle session is kept.")] = 600.0,
) -> None:
    """Serve the guard over HTTP: sessions (create, check, record, message, close) and stateless checks."""
    from pipeline.guard.http import require_token, serve
    from pipeline.guard.service import Guard, Limits

    if policy not in ("code", "strict"):
        raise PexecError("--policy is code or strict")
    require_token(host, token)  # before an environment is built
    guard = Guard(env, EnvOptions(tuple(spec_dir or ()), spec, policy), Limits(max_sessions, ttl))
    console.print(f"guard: {env} ({guard.version}) on http://{host}:{port}")
    serve(guard, host, port, token)


@guard_app.command("mcp")
def guard_mcp(
    upstream: Annotated[list[str], typer.Argument(help="The upstream MCP server's command, after `--`.")],
    spec: GuardSpec = None,
    spec_dir: SpecDir = None,
    log: Annotated[
        str | None, typer.Option("--log", help="Canonical rollout log to append (JSONL; default: none).")
    ] = None,
) -> None:
    """Run as a stdio MCP server in front of an upstream one, refusing calls that fail S, D or P."""
    from pipeline.guard.mcp import run_proxy

    run_proxy(upstream, EnvOptions(tuple(spec_dir or ()), spec), log)


BENCHES = ("replay", "metrics", "merged", "scale", "view", "guard", "driver", "bfcl", "tau")


@app.command()
def bench(
    what: Annotated[str, typer.Argument(help=", ".join(BENCHES))] = "replay",
    rollouts: Annotated[
        int | None,
        typer.Option(
            "--rollouts",
            help="Store size (default: 220k replay, 1M metrics, scale and view, 100M merged: 10 rollouts per task; "
            "driver: 4,000 for its per-core rate).",
        ),
    ] = None,
    workdir: Annotated[Path | None, typer.Option("--workdir", help="Where to put the generated data.")] = None,
    repeats: Annotated[
        int | None, typer.Option("--repeats", min=1, help="Runs of every measurement (default 3; scale 1, tau 5).")
    ] = None,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="Print the Markdown block (docs/reference/benchmarks.md) instead.")
    ] = False,
    readme: Annotated[
        Path | None,
        typer.Option(
            "--readme", help="Replace this bench's block in this Markdown file (docs/reference/benchmarks.md)."
        ),
    ] = None,
) -> None:
    """Benchmarks, each figure as project / baseline / ratio, min–median–max over the runs: replay through Ray vs a
    naive baseline, the metrics stage vs a plain-numpy reference, the mergeable Poisson bootstrap, scale-out over
    S3, the viewer's page latency, the guard's latency per check, the scoring driver at cluster scale, BFCL and τ
    replay."""
    from pipeline.perf import figures

    if what not in BENCHES:
        raise PexecError(f"bench takes {', '.join(BENCHES[:-1])} or {BENCHES[-1]}")
    reps = {"repeats": repeats} if repeats else {}
    if what == "replay":
        from pipeline.perf.replay import bench_replay

        result = bench_replay(n_rollouts=rollouts or 220_000, workdir=workdir, **reps)
    elif what == "metrics":
        from pipeline.perf.metrics import bench_metrics

        result = bench_metrics(n_rollouts=rollouts or 1_000_000, workdir=workdir, **reps)
    elif what == "merged":
        from pipeline.perf.merged import bench_merged

        result = bench_merged(n_tasks=(rollouts or 100_000_000) // 10, **reps)
    elif what == "scale":
        from pipeline.perf.scale import bench_scale

        result = bench_scale(n_rollouts=rollouts or 1_000_000, **reps)
    elif what == "view":
        from pipeline.perf.view import bench_view

        result = bench_view(n_rollouts=rollouts or 1_000_000, workdir=workdir, **reps)
    elif what == "guard":
        from pipeline.perf.guard import bench_guard

        result = bench_guard(**reps)
    elif what == "driver":
        from pipeline.perf.driver import bench_driver

        result = bench_driver(rollouts=rollouts or 4000, **reps)
    elif what == "bfcl":
        from pipeline.perf.bfcl import bench_bfcl

        result = bench_bfcl(**reps)
    else:
        from pipeline.perf.tau import bench_tau

        result = bench_tau(**reps)
    if readme is not None:
        figures.replace_block(readme, result)
        console.print(f"{readme}: bench {what} block replaced")
    elif markdown:
        print(figures.block(result))
    else:
        figures.show(result)
