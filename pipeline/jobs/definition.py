"""Job definitions (`jobs/*.toml`): what `pexec run` executes locally or on a cluster and `pexec submit`
sends to a Ray cluster through the Jobs API.

A job = input store, environment, output run, Ray address, shard size, bootstrap settings, label columns.
`{date}` in `input`/`output` is replaced by the job's date (YYYY-MM-DD; today in UTC by default), so a
nightly job scores the new date partition into its own run folder, and all of them stay queryable together
(`pexec sql` / `pexec metrics` on the parent folder read every partition).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import PexecError, check_fields
from pipeline.core.run_folder import Manifest, ShardMarker
from pipeline.envs import EnvOptions
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings, Population
from pipeline.scoring.driver import DEFAULT_SHARD_BYTES, ShardPlan, run_scoring
from pipeline.storage.fs import absolute, exists
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

if TYPE_CHECKING:
    from pipeline.ingest.sharded import RawSource
    from pipeline.report import Compare


@dataclass(frozen=True)
class JobField:
    """Keys of a job file, declared once: the loader accepts exactly these, and the reference page's table of
    fields (docs/reference/jobs.md) is generated from them."""

    table: str  # "" for a top-level key, else the [table] the keys sit in
    keys: tuple[str, ...]
    meaning: str
    default: str


FIELDS = (
    JobField("", ("name", "description"), "names the job (and its submission ids)", 'required / ""'),
    JobField(
        "",
        ("input",),
        "store URL (folder, file, `s3://…`), or with `format` the raw logs' folder or file; `{date}` is replaced by "
        "the job's date",
        "required",
    ),
    JobField(
        "",
        ("format", "options", "labels"),
        "the input's log format, read where it lies inside the scoring tasks (as `pexec score --format`); its "
        '`--option` settings (`options = {error_prefix = "Error:"}`); labels added to every rollout',
        "`canonical` (a store); none; none",
    ),
    JobField("", ("output",), "run URL; `{date}` allowed", "required"),
    JobField("", ("env",), "environment for every rollout (else each rollout's `benchmark`)", "none"),
    JobField("", ("spec", "spec_dirs"), "the spec `observed` uses; extra spec folders", "none"),
    JobField("", ("policy",), "`code` or `strict`", "`code`"),
    JobField("", ("address",), "Ray address (`--address` overrides it)", "local Ray"),
    JobField("", ("shard_mb", "num_cpus"), "target shard size in MiB; CPUs of a local Ray", "64; all"),
    JobField(
        "",
        ("endpoint_url",),
        "S3-compatible endpoint; credentials come from the AWS environment, never from the job",
        "none",
    ),
    JobField(
        "metrics",
        ("by", "bootstrap", "seed", "method", "max_k"),
        "as `pexec metrics` (kept under `<output>/metrics/<name>/`)",
        "all condition labels, 1000, 0, multinomial, max T ≤ 20",
    ),
    JobField(
        "metrics",
        ("harness_errors",),
        '`"exclude"` or `"fail"`, as `--harness-errors` (metrics and report)',
        "exclude",
    ),
    JobField(
        "metrics",
        ("partial",),
        "read the output run even when it is incomplete, as `--partial` (metrics and report state their coverage)",
        "false: an incomplete run fails the job",
    ),
    JobField(
        "metrics",
        ("strict_replay",),
        "leave out the rollouts whose replay diverged before their first error, as `--strict-replay` (metrics and "
        "report)",
        "false",
    ),
    JobField(
        "synth",
        ("spec", "rollouts", "tasks", "seed"),
        "generate the input first when it does not exist (demo)",
        "none; `shop`, 1000, 100, 0",
    ),
    JobField(
        "submit",
        ("runtime", "python"),
        "how `pexec submit` runs the job: `local` (this machine's interpreter and working directory), `image` (the "
        "cluster image's pexec; only the job file is uploaded, relative paths are refused) or `package` (this "
        "pexec, shipped with the job as a wheel's contents); the interpreter on the cluster",
        "`local` for a loopback address, else `image`; this interpreter / `python`",
    ),
    JobField(
        "report",
        ("out", "by", "compare", "k", "within"),
        'write a report after the metrics, as `pexec report` (`compare = ["method=A", "method=B"]`; '
        '`within = "model"` is `--within model`; `out` may use `{date}`)',
        "no report; `out` = `<output>/report`, `by` = the metrics' `by`, `k` = `[1, 3, 5]`, ranking per benchmark",
    ),
    JobField(
        "report",
        ("overwrite",),
        "replace what `out` holds, as `--overwrite`; without it a non-empty `out` fails the job before scoring (a "
        "job that reruns into the same `out` sets it)",
        "false",
    ),
    JobField(
        "diff",
        ("against", "by", "fail_on", "look_back_days"),
        'after the metrics, `pexec diff PREVIOUS OUTPUT` (B = tonight\'s run): `against = "previous"` is the output '
        "at the latest earlier date within `look_back_days` whose run exists (none: the diff is skipped, said on "
        'stderr), or a run folder/URL; `fail_on = ["ter<-0.02"]` as `--fail-on`, checked when the job is loaded: '
        "a crossed threshold prints a `breach …` line and `pexec run` exits 1, after the run and its metrics are "
        "written",
        "no diff; `against` = previous, `by` = the metrics' `by`, `look_back_days` = 7",
    ),
)


def field_keys(table: str) -> set[str]:
    """The keys a job file may hold at top level (`table` ""; the tables themselves included) or in [table]."""
    keys = {k for f in FIELDS if f.table == table for k in f.keys}
    return keys | {f.table for f in FIELDS if f.table} if table == "" else keys


_JOB_KEYS = field_keys("")
_METRICS_KEYS = field_keys("metrics")
_REPORT_KEYS = field_keys("report")
_SYNTH_KEYS = field_keys("synth")
_SUBMIT_KEYS = field_keys("submit")  # how `pexec submit` runs the job (pipeline/jobs/cluster.py)
RUNTIMES = ("local", "image", "package")  # where a submitted job's pexec comes from (pipeline/jobs/cluster.py)
_DIFF_KEYS = field_keys("diff")


class JobFileError(PexecError, ValueError):
    """A job file that cannot be run; the message names the file and the field."""


@dataclass(frozen=True)
class JobReport:
    out: str
    by: list[str] | None
    compare: Compare | None  # from two COL=VALUE items, as `pexec report --compare`
    ks: tuple[int, ...]
    overwrite: bool = False  # replace what `out` holds (`pexec report --overwrite`); else a non-empty out fails
    within: str | None = None  # as `pexec report --within`


@dataclass(frozen=True)
class JobDiff:
    """`pexec diff` of the job's run against an earlier one (the [diff] table)."""

    candidates: tuple[str, ...]  # the runs to compare against, most recent first: the first that exists is used
    by: list[str] | None
    fail_on: tuple[str, ...]  # --fail-on thresholds, checked when the job file is loaded


@dataclass(frozen=True)
class Job:
    name: str
    input: str
    output: str
    date: str
    env: str | None = None
    options: EnvOptions = field(default_factory=EnvOptions)
    address: str | None = None
    shard_bytes: int = DEFAULT_SHARD_BYTES
    num_cpus: int | None = None
    endpoint_url: str | None = None
    by: list[str] | None = None
    bootstrap: BootstrapSettings = field(default_factory=BootstrapSettings)
    population: Population = field(default_factory=Population)  # how harness errors count (metrics and report)
    max_k: int | None = None
    partial: bool = False  # metrics and report of an incomplete output run, stating their coverage (--partial)
    synth: dict[str, Any] | None = None  # generate the input first when it does not exist (demo jobs)
    report: JobReport | None = None  # write a report after the metrics
    runtime: str | None = None  # [submit]: local, image or package (None: by the address)
    python: str | None = None  # [submit]: the interpreter with pexec on the cluster
    diff: JobDiff | None = None  # compare the run with an earlier one after the metrics
    fmt: str = "canonical"  # the input's log format (`pexec score --format`)
    read_options: dict[str, str] = field(default_factory=dict)  # the format's `--option`s
    labels: dict[str, str] = field(default_factory=dict)  # added to every rollout's labels

    @property
    def raw(self) -> bool:
        """Whether the input is read by a format's adapter (raw logs, or a store given labels or options)."""
        return self.fmt != "canonical" or bool(self.read_options) or bool(self.labels)

    @property
    def storage_options(self) -> dict[str, Any] | None:
        return {"endpoint_url": self.endpoint_url} if self.endpoint_url else None


def load_job(path: str | Path, on_date: str | None = None) -> Job:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise JobFileError(f"{path}: {exc}") from exc
    check_fields(raw, _JOB_KEYS, str(path), JobFileError)
    for key in ("name", "input", "output"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise JobFileError(f"{path}: '{key}' (a non-empty string) is required")
    day = on_date or datetime.now(UTC).date().isoformat()
    try:
        date.fromisoformat(day)
    except ValueError as exc:
        raise JobFileError(f"--date must be YYYY-MM-DD, got {day!r}") from exc
    metrics = raw.get("metrics", {})
    check_fields(metrics, _METRICS_KEYS, f"{path} [metrics]", JobFileError)
    synth = raw.get("synth")
    if synth is not None:
        check_fields(synth, _SYNTH_KEYS, f"{path} [synth]", JobFileError)
    try:
        bootstrap = BootstrapSettings(
            B=metrics.get("bootstrap", 1000), seed=metrics.get("seed", 0), method=metrics.get("method", "multinomial")
        )
        population = Population(
            harness_errors=metrics.get("harness_errors", "exclude"),
            strict_replay=_flag(metrics, "strict_replay", f"{path} [metrics]"),
        )
    except ValueError as exc:
        raise JobFileError(f"{path} [metrics]: {exc}") from exc
    output = _fill(raw["output"], day, path)
    report = _load_report(raw.get("report"), output, metrics.get("by"), day, path)
    diff = _load_diff(raw.get("diff"), raw["output"], metrics.get("by"), day, path)
    policy = raw.get("policy", "code")
    if policy not in ("code", "strict"):
        raise JobFileError(f"{path}: policy is 'code' or 'strict', got {policy!r}")
    submit = raw.get("submit", {})
    check_fields(submit, _SUBMIT_KEYS, f"{path} [submit]", JobFileError)
    if submit.get("runtime", "local") not in RUNTIMES:
        raise JobFileError(f"{path} [submit]: runtime is one of {', '.join(RUNTIMES)}, got {submit['runtime']!r}")
    fmt = raw.get("format", "canonical")
    if not isinstance(fmt, str) or not fmt:
        raise JobFileError(f"{path}: format is a log format name (pexec ingest's), got {fmt!r}")
    read_options, labels = _strings(raw, "options", path), _strings(raw, "labels", path)
    if synth is not None and fmt != "canonical":
        raise JobFileError(f"{path}: [synth] writes a canonical store: it does not go with format = {fmt!r}")
    shard_mb = raw.get("shard_mb", DEFAULT_SHARD_BYTES / 2**20)
    if isinstance(shard_mb, bool) or not isinstance(shard_mb, int | float) or shard_mb * 2**20 < 1:
        raise JobFileError(f"{path}: shard_mb is a size in MiB > 0, got {shard_mb!r}")
    return Job(
        name=raw["name"],
        input=_fill(raw["input"], day, path),
        output=output,
        date=day,
        env=raw.get("env") or None,
        options=EnvOptions(spec_dirs=tuple(raw.get("spec_dirs", [])), spec=raw.get("spec") or None, policy=policy),
        address=raw.get("address") or None,
        shard_bytes=int(shard_mb * 2**20),
        num_cpus=raw.get("num_cpus"),
        endpoint_url=raw.get("endpoint_url") or None,
        by=metrics.get("by"),
        bootstrap=bootstrap,
        population=population,
        max_k=metrics.get("max_k"),
        partial=_flag(metrics, "partial", f"{path} [metrics]"),
        synth=synth,
        report=report,
        runtime=submit.get("runtime"),
        python=submit.get("python"),
        diff=diff,
        fmt=fmt,
        read_options=read_options,
        labels=labels,
    )


def _strings(raw: dict[str, Any], key: str, path: Path) -> dict[str, str]:
    """A table of strings (`options`, `labels`); numbers and booleans are written as the CLI would take them."""
    table = raw.get(key, {})
    if not isinstance(table, dict) or not all(isinstance(v, str | int | float | bool) for v in table.values()):
        raise JobFileError(f'{path}: {key} is a table of names to values, such as {{ error_prefix = "Error:" }}')
    return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in table.items()}


def _load_report(
    raw: dict[str, Any] | None, output: str, by: list[str] | None, day: str, path: Path
) -> JobReport | None:
    if raw is None:
        return None
    where = f"{path} [report]"
    check_fields(raw, _REPORT_KEYS, where, JobFileError)
    ks = raw.get("k", [1, 3, 5])
    if not isinstance(ks, list) or not ks or not all(isinstance(k, int) and k >= 1 for k in ks):
        raise JobFileError(f"{where}: k is a list of depths >= 1, got {ks!r}")
    compare = None
    if "compare" in raw:
        from pipeline.report import parse_compare

        items = raw["compare"]
        try:
            compare = parse_compare(items if isinstance(items, list) else [items])
        except ValueError as exc:
            raise JobFileError(f"{where}: compare: {exc}") from exc
    within = raw.get("within")
    if within is not None and (not isinstance(within, str) or not within):
        raise JobFileError(f"{where}: within is a label column name, got {within!r}")
    out = _fill(raw.get("out", f"{output.rstrip('/')}/report"), day, path)
    return JobReport(out, raw.get("by", by), compare, tuple(ks), _flag(raw, "overwrite", where), within)


def _load_diff(raw: dict[str, Any] | None, template: str, by: list[str] | None, day: str, path: Path) -> JobDiff | None:
    """against = "previous": the output template at the latest earlier date (within look_back_days, default 7)
    whose run exists; any other string is a run folder or URL ({date} filled in)."""
    if raw is None:
        return None
    where = f"{path} [diff]"
    check_fields(raw, _DIFF_KEYS, where, JobFileError)
    against = raw.get("against", "previous")
    if not isinstance(against, str) or not against:
        raise JobFileError(f'{where}: against is "previous" or a run folder, got {against!r}')
    days = raw.get("look_back_days", 7)
    if isinstance(days, bool) or not isinstance(days, int) or days < 1:
        raise JobFileError(f"{where}: look_back_days is a whole number >= 1, got {days!r}")
    if against == "previous":
        if "{date}" not in template:
            raise JobFileError(f'{where}: against = "previous" needs {{date}} in the job\'s output')
        start = date.fromisoformat(day)
        candidates = tuple(_fill(template, (start - timedelta(days=d)).isoformat(), path) for d in range(1, days + 1))
    else:
        candidates = (_fill(against, day, path),)
    fail_on = raw.get("fail_on", [])
    if not isinstance(fail_on, list) or not all(isinstance(t, str) for t in fail_on):
        raise JobFileError(f'{where}: fail_on is a list of thresholds such as "ter<-0.02", got {fail_on!r}')
    from pipeline.metrics.drift import DiffError, parse_threshold

    try:
        for t in fail_on:
            parse_threshold(t)
    except DiffError as exc:
        raise JobFileError(f"{where}: {exc}") from exc
    return JobDiff(candidates, raw.get("by", by), tuple(fail_on))


def previous_run(job: Job) -> str | None:
    """The run the job's [diff] compares against: the first of its candidates that exists (None: none does)."""
    assert job.diff is not None
    return next((c for c in job.diff.candidates if exists(c, job.storage_options)), None)


def _flag(table: dict[str, Any], key: str, where: str) -> bool:
    value = table.get(key, False)
    if not isinstance(value, bool):
        raise JobFileError(f"{where}: {key} is true or false, got {value!r}")
    return value


def run_job(
    job: Job,
    address: str | None = None,
    force: bool = False,
    on_plan: Callable[[ShardPlan], None] | None = None,
    on_shard: Callable[[ShardMarker], None] | None = None,
) -> tuple[Manifest, list[dict[str, Any]]]:
    """Score the job's input (reusing unchanged shards), then compute and write its metrics (and its report,
    when the job has a [report] table)."""
    job = absolute_paths(job)
    if job.report is not None:  # before any work: a report folder it may not write fails the job now
        from pipeline.report import ReportError, check_output

        try:
            check_output(job.output, job.report.out, job.report.overwrite, job.storage_options)
        except ReportError as exc:
            raise JobFileError(f"job {job.name}: {exc} (in a job file: overwrite = true in [report])") from exc
    if job.synth is not None and not exists(job.input, job.storage_options):
        records = synthesize(job.synth.get("spec", "shop"), job.synth.get("rollouts", 1000),
                             job.synth.get("tasks", 100), job.synth.get("seed", 0))  # fmt: skip
        write_store(records, job.input, storage_options=job.storage_options)
    manifest = run_scoring(
        job.input,
        job.output,
        source=raw_input(job),
        env=job.env,
        options=job.options,
        address=address or job.address,
        shard_bytes=job.shard_bytes,
        num_cpus=job.num_cpus,
        storage_options=job.storage_options,
        on_plan=on_plan,
        on_shard=on_shard,
        force=force,
    )
    run = open_run(job.output, job.storage_options, job.partial)  # the metrics and report read the same shards
    # The mergeable bootstrap runs in Ray tasks on the Ray that scored the run, no process reading every rollout.
    on_ray = (address or job.address or "local") if job.bootstrap.method == "poisson-merged" else None
    cohorts = run.cohorts(job.by, job.bootstrap, job.max_k, job.population, on_ray)
    run.write_metrics(cohorts, job.by)
    if job.report is not None:
        from pipeline.report import build_report

        r = job.report
        build_report(run, r.out, r.by, r.compare, r.ks, job.bootstrap, overwrite=r.overwrite, within=r.within,
                     population=job.population)  # fmt: skip
    return manifest, cohorts


def raw_input(job: Job) -> RawSource | None:
    """The job's raw logs (None: a canonical store read as is); an unknown format or option fails here."""
    if not job.raw:
        return None
    from pipeline.ingest import IngestError, IngestOptions
    from pipeline.ingest.sharded import raw_source

    options = IngestOptions(labels=job.labels, extra=job.read_options, storage_options=job.storage_options)
    try:
        return raw_source(job.fmt, [job.input], options)
    except IngestError as exc:
        raise JobFileError(f"job {job.name}: {exc}") from exc


def absolute_paths(job: Job) -> Job:
    """The job with its local relative paths made absolute against this process's working directory: Ray
    workers (those of a submitted job above all) do not share the driver's working directory."""
    report = job.report and replace(job.report, out=absolute(job.report.out))
    options = replace(job.options, spec_dirs=tuple(absolute(d) for d in job.options.spec_dirs))
    return replace(job, input=absolute(job.input), output=absolute(job.output), options=options, report=report)


def relative_paths(job: Job) -> list[str]:
    """`field 'path'` for each local relative path of the job."""
    named = [("input", job.input), ("output", job.output), *(("spec_dirs", d) for d in job.options.spec_dirs)]
    if job.report is not None:
        named.append(("[report] out", job.report.out))
    return [f"{name} {url!r}" for name, url in named if absolute(url) != url]


def _fill(template: str, day: str, path: Path) -> str:
    unknown = set(re.findall(r"\{(\w*)\}", template)) - {"date"}
    if unknown:
        names = ", ".join(sorted(unknown))
        raise JobFileError(f"{path}: unknown placeholder(s) {names} in {template!r} (only {{date}})")
    return template.replace("{date}", day)
