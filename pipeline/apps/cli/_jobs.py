"""The commands of jobs (jobs/*.toml): run one here, or submit it to a Ray cluster through the Jobs API and
follow it there (status, logs, stop, jobs)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from pipeline.apps.cli._analysis import alert
from pipeline.apps.cli._options import DashboardAddress, Force, JobFile, OnDate, RayAddress, Reading, Submission
from pipeline.apps.cli._render import console, metrics_notes, out, print_diff, print_metrics
from pipeline.apps.cli._scoring import ScoreProgress, summary, unwind_on_sigterm
from pipeline.core.text import literal


def run(
    job_file: JobFile,
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
    from pipeline.apps.jobs.definition import load_job, run_job
    from pipeline.apps.jobs.preflight import check_job

    unwind_on_sigterm()
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
    with ScoreProgress() as progress:
        manifest, cohorts = run_job(job, address, force, progress.on_plan, progress.on_shard)
    summary(manifest, job.output)
    print_metrics(cohorts)
    for note in metrics_notes(cohorts):
        out.print(note)
    if job.report is not None:
        console.print(f"report written to {literal(job.report.out.rstrip('/'))}/report.html and report.md")
    if job.diff is not None:
        _job_diff(job, address)


def _job_diff(job: Any, address: str | None) -> None:
    """The job's [diff]: `pexec diff PREVIOUS OUTPUT`, computed where the job's metrics are; a crossed fail_on
    threshold exits 1 (after the run and its metrics are written)."""
    from pipeline.apps.jobs.definition import metrics_address, previous_run
    from pipeline.metrics.drift import breaches, diff_runs, parse_threshold

    previous = previous_run(job)
    if previous is None:
        console.print(f"diff skipped: no earlier run found (looked for {', '.join(job.diff.candidates)})")
        return
    console.print(f"diff: {previous} (A) -> {job.output} (B)")
    reading = Reading(job.storage_options)
    m = job.metrics
    result = diff_runs(reading.open(previous), reading.open(job.output), job.diff.by, m.bootstrap, m.population,
                       metrics_address(job, address))  # fmt: skip
    print_diff(result)
    alert(breaches(result, [parse_threshold(t) for t in job.diff.fail_on]))


def submit(
    job_file: JobFile,
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
    from pipeline.apps.jobs.cluster import follow_job, jobs_api_address, stop_job, submit_job
    from pipeline.apps.jobs.definition import load_job
    from pipeline.core.errors import AlreadyRunning

    url = jobs_api_address(address)
    job = load_job(job_file, on_date)
    if wait:
        unwind_on_sigterm()
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
    sys.stdout.flush()  # the log first, then the verdict
    console.print(f"job {state}")
    if state != "SUCCEEDED":
        raise typer.Exit(code=1)


def status(submission: Submission, address: DashboardAddress = None) -> None:
    """The state of a submitted job (PENDING, RUNNING, SUCCEEDED, FAILED, STOPPED)."""
    from pipeline.apps.jobs.cluster import job_status, jobs_api_address

    out.print(literal(job_status(jobs_api_address(address), submission)))


def logs(
    submission: Submission,
    address: DashboardAddress = None,
    follow: Annotated[bool, typer.Option("--follow", help="Keep printing the log until the job ends.")] = False,
) -> None:
    """The driver log of a submitted job."""
    from pipeline.apps.jobs.cluster import follow_job, job_logs, jobs_api_address

    url = jobs_api_address(address)
    if follow:
        follow_job(url, submission, sys.stdout.write)
    else:
        sys.stdout.write(job_logs(url, submission))


def stop(submission: Submission, address: DashboardAddress = None) -> None:
    """Stop a submitted job and wait for it to end; prints its final state."""
    from pipeline.apps.jobs.cluster import jobs_api_address, stop_job

    out.print(stop_job(jobs_api_address(address), submission))


def jobs(address: DashboardAddress = None) -> None:
    """The jobs a Ray cluster knows: submission id, state, job, date, start and end (UTC)."""
    from pipeline.apps.jobs.cluster import jobs_api_address, list_jobs

    rows = list_jobs(jobs_api_address(address))
    table = Table("id", "state", "job", "date", "start", "end")
    for row in rows:
        table.add_row(*row.values())
    out.print(table)
