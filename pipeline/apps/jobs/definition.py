"""Job definitions (`jobs/*.toml`): what `pexec run` executes locally or on a cluster and `pexec submit`
sends to a Ray cluster through the Jobs API.

A job = input store, output run, how it is scored (every `pexec score` option but `--force`: a ScoreSettings),
what its metrics are asked for (a MetricsSettings), and optionally a report and a diff against an earlier run.
The settings objects check the values, as they do a command's options. `{date}` in `input`/`output` is replaced
by the job's date (YYYY-MM-DD; today in UTC by default), so a nightly job scores the new date partition into its
own run folder, and all of them stay queryable together (`pexec sql` / `pexec metrics` on the parent folder read
every partition).
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.core.errors import JobFileError, SettingError, check_fields
from pipeline.core.run_folder import Manifest, ShardMarker
from pipeline.core.settings import check_flag, check_name
from pipeline.metrics.results import Cohort
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import DEFAULT_METRICS, MetricsSettings
from pipeline.scoring.driver import ShardPlan, run_scoring
from pipeline.scoring.settings import DEFAULT_SCORING, ScoreSettings
from pipeline.storage.fs import absolute, exists
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

if TYPE_CHECKING:
    from pipeline.ingest.sharded import RawSource
    from pipeline.report import Compare


# fsspec options a job file may set (`storage_options`): none is a credential. Keys, secrets, tokens and passwords
# come from the environment; an allowlist rather than a list of refused names, so that an option a filesystem adds
# later is refused until someone decides it is no credential.
JOB_STORAGE_OPTIONS = frozenset({"anon", "default_block_size", "profile", "requester_pays", "use_ssl", "version_aware"})


@dataclass(frozen=True)
class JobField:
    """Keys of a job file, declared once: the loader accepts exactly these, and the reference page's table of
    fields (docs/reference/jobs.md) is generated from them. A key of the top level is named as the `pexec score`
    option it stands for (its parameter), a key of [metrics], [report], [diff] as that command's."""

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
        "the input's log format, read where it lies inside the scoring tasks; its `--option` settings "
        '(`options = {error_prefix = "Error:"}`); labels added to every rollout (`labels = {team = "search"}`)',
        "`canonical` (a store); none; none",
    ),
    JobField("", ("output",), "run URL; `{date}` allowed", "required"),
    JobField("", ("env",), "environment for every rollout (else each rollout's `benchmark`)", "none"),
    JobField("", ("spec", "spec_dirs"), "the spec `observed` uses; extra spec folders (a list)", "none"),
    JobField("", ("policy",), "`code` or `strict`", "`code`"),
    JobField("", ("address",), "Ray address (`pexec run --address` overrides it)", "local Ray"),
    JobField("", ("inline",), "score in the job's own process, without Ray (`address`, `num_cpus` unused)", "false"),
    JobField("", ("shard_mb", "num_cpus"), "target shard size in MiB; CPUs of a local Ray", "64; all"),
    JobField(
        "",
        ("lease_stale_after",),
        "seconds without a heartbeat after which another writer's lease on the run is taken over",
        "600",
    ),
    JobField(
        "",
        ("checks",),
        'the checks that apply, a list from `"schema"`, `"dependency"`, `"precondition"`',
        "all three",
    ),
    JobField(
        "",
        ("allow_empty",),
        "a run that holds no rollout (every record rejected) is a result: its metrics are written and the job "
        "exits 0, as `--allow-empty`",
        "false: the job fails after scoring, before its metrics",
    ),
    JobField(
        "",
        ("endpoint_url",),
        "S3-compatible endpoint; credentials come from the AWS environment, never from the job",
        "none",
    ),
    JobField(
        "",
        ("storage_options",),
        "fsspec options of the input and the run, among those that are no credentials: "
        + ", ".join(f"`{k}`" for k in sorted(JOB_STORAGE_OPTIONS))
        + " (any other key is refused: credentials come from the environment)",
        "none",
    ),
    JobField(
        "metrics",
        ("by", "bootstrap", "seed", "method", "max_k"),
        "as `pexec metrics` (kept under `<output>/metrics/<name>/`)",
        "all condition labels, 1000, 0, multinomial, max T ≤ 20 (at least 3)",
    ),
    JobField(
        "metrics",
        ("harness_errors",),
        '`"exclude"` or `"fail"`, as `--harness-errors` (metrics and report)',
        "exclude",
    ),
    JobField(
        "metrics",
        ("pool",),
        'benchmarks counted as one, as `--pool` (`pool = { tau3 = ["tau_airline", "tau_retail"] }`)',
        "none",
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
        "report",
        ("sensitivity",),
        "add TER and AUC-PEC under schema-only, schema+dependency and all checks, as `--sensitivity`",
        "false",
    ),
    JobField(
        "report",
        ("figures",),
        "draw the figures; `false` writes the tables and text alone, as `--no-figures`",
        "true",
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


# The `pexec score` options a job file has no key for, each with the reason (docs/reference/jobs.md lists them).
NOT_IN_JOB_FILES = {
    "force": "rescoring every shard is a decision for one run, not a property of the job: `pexec run JOB --force`",
}


def field_keys(table: str) -> set[str]:
    """The keys a job file may hold at top level (`table` ""; the tables themselves included) or in [table]."""
    keys = {k for f in FIELDS if f.table == table for k in f.keys}
    return keys | {f.table for f in FIELDS if f.table} if table == "" else keys


_JOB_KEYS = field_keys("")
_METRICS_KEYS = field_keys("metrics")
_REPORT_KEYS = field_keys("report")
_SYNTH_KEYS = field_keys("synth")
_SUBMIT_KEYS = field_keys("submit")  # how `pexec submit` runs the job (pipeline/apps/jobs/cluster.py)
RUNTIMES = ("local", "image", "package")  # where a submitted job's pexec comes from (pipeline/apps/jobs/cluster.py)
_DIFF_KEYS = field_keys("diff")


@dataclass(frozen=True)
class JobReport:
    out: str
    by: tuple[str, ...] | None
    compare: Compare | None  # from two COL=VALUE items, as `pexec report --compare`
    ks: tuple[int, ...]
    overwrite: bool = False  # replace what `out` holds (`pexec report --overwrite`); else a non-empty out fails
    within: str | None = None  # as `pexec report --within`
    sensitivity: bool = False  # as `pexec report --sensitivity`
    figures: bool = True  # as `pexec report --figures/--no-figures`


@dataclass(frozen=True)
class JobDiff:
    """`pexec diff` of the job's run against an earlier one (the [diff] table)."""

    candidates: tuple[str, ...]  # the runs to compare against, most recent first: the first that exists is used
    by: tuple[str, ...] | None
    fail_on: tuple[str, ...]  # --fail-on thresholds, checked when the job file is loaded


@dataclass(frozen=True)
class Job:
    name: str
    input: str
    output: str
    date: str
    scoring: ScoreSettings = DEFAULT_SCORING  # how `input` is scored into `output` (the top-level keys)
    metrics: MetricsSettings = DEFAULT_METRICS  # the [metrics] table (the report and diff take its bootstrap)
    partial: bool = False  # metrics and report of an incomplete output run, stating their coverage (--partial)
    synth: dict[str, Any] | None = None  # generate the input first when it does not exist (demo jobs)
    report: JobReport | None = None  # write a report after the metrics
    runtime: str | None = None  # [submit]: local, image or package (None: by the address)
    python: str | None = None  # [submit]: the interpreter with pexec on the cluster
    diff: JobDiff | None = None  # compare the run with an earlier one after the metrics

    @property
    def storage_options(self) -> dict[str, Any] | None:
        return self.scoring.storage_options


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
    table = raw.get("metrics", {})
    check_fields(table, _METRICS_KEYS, f"{path} [metrics]", JobFileError)
    with settings_of(f"{path} [metrics]"):
        metrics = MetricsSettings.from_values(**{k: v for k, v in table.items() if k != "partial"})
        partial = table.get("partial", False)
        check_flag("partial", partial)
    synth = raw.get("synth")
    if synth is not None:
        check_fields(synth, _SYNTH_KEYS, f"{path} [synth]", JobFileError)
    output = _fill(raw["output"], day, path)
    report = _load_report(raw.get("report"), output, metrics, day, path)
    diff = _load_diff(raw.get("diff"), raw["output"], metrics, day, path)
    submit = raw.get("submit", {})
    check_fields(submit, _SUBMIT_KEYS, f"{path} [submit]", JobFileError)
    if submit.get("runtime", "local") not in RUNTIMES:
        raise JobFileError(f"{path} [submit]: runtime is one of {', '.join(RUNTIMES)}, got {submit['runtime']!r}")
    scoring = _scoring(raw, path)
    if synth is not None and scoring.format != "canonical":
        raise JobFileError(f"{path}: [synth] writes a canonical store: it does not go with format = {scoring.format!r}")
    return Job(
        name=raw["name"],
        input=_fill(raw["input"], day, path),
        output=output,
        date=day,
        scoring=scoring,
        metrics=metrics,
        partial=partial,
        synth=synth,
        report=report,
        runtime=submit.get("runtime"),
        python=submit.get("python"),
        diff=diff,
    )


@contextmanager
def settings_of(where: str) -> Iterator[None]:
    """A settings object made of a job file's values: a value that does not fit fails naming the file, the table
    and the key (the settings' message starts with the key)."""
    try:
        yield
    except SettingError as exc:
        raise JobFileError(f"{where}: {exc}") from None


# Top-level keys that are ScoreSettings fields of the same name, taken as they are; an empty `env`, `spec` or
# `address` is one not given.
_SCORING_KEYS = ("spec_dirs", "policy", "inline", "shard_mb", "num_cpus", "lease_stale_after", "checks", "format",
                 "allow_empty")  # fmt: skip
_UNSET_IF_EMPTY = ("env", "spec", "address")


def _scoring(raw: dict[str, Any], path: Path) -> ScoreSettings:
    """The ScoreSettings of a job file's top-level keys (pexec score's options, named as its parameters)."""
    given = {k: raw[k] for k in _SCORING_KEYS if k in raw}
    given |= {k: raw[k] for k in _UNSET_IF_EMPTY if raw.get(k)}
    with settings_of(str(path)):
        storage = _storage_options(raw.get("storage_options", {}))
        check_name("endpoint_url", raw.get("endpoint_url") or None)
        if raw.get("endpoint_url"):
            storage["endpoint_url"] = raw["endpoint_url"]
        return ScoreSettings(
            **given,
            options=_strings(raw, "options", path),
            labels=_strings(raw, "labels", path),
            storage_options=storage or None,
        )


def _storage_options(table: Any) -> dict[str, Any]:
    """A job's `storage_options`, none of them a credential (JOB_STORAGE_OPTIONS)."""
    if not isinstance(table, dict):
        # the value is not shown: it may be a credential in the wrong place
        raise SettingError(
            "storage_options", f"storage_options is a table of fsspec options, got a {type(table).__name__}"
        )
    refused = sorted(set(table) - JOB_STORAGE_OPTIONS)
    if refused:
        raise SettingError(
            "storage_options",
            f"storage_options: {', '.join(refused)} cannot be set in a job file (credentials come from the "
            f"environment, never from a job; a job may set {', '.join(sorted(JOB_STORAGE_OPTIONS))})",
        )
    return dict(table)


def _strings(raw: dict[str, Any], key: str, path: Path) -> dict[str, str]:
    """A table of strings (`options`, `labels`); numbers and booleans are written as the CLI would take them."""
    table = raw.get(key, {})
    if not isinstance(table, dict) or not all(isinstance(v, str | int | float | bool) for v in table.values()):
        raise JobFileError(f'{path}: {key} is a table of names to values, such as {{ error_prefix = "Error:" }}')
    return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in table.items()}


def _load_report(
    raw: dict[str, Any] | None, output: str, metrics: MetricsSettings, day: str, path: Path
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
    out = _fill(raw.get("out", f"{output.rstrip('/')}/report"), day, path)
    with settings_of(where):
        check_name("within", raw.get("within"))
        check_flag("overwrite", raw.get("overwrite", False))
        check_flag("sensitivity", raw.get("sensitivity", False))
        check_flag("figures", raw.get("figures", True))
        by = replace(metrics, by=raw["by"]).by if "by" in raw else metrics.by
    return JobReport(
        out,
        by,
        compare,
        tuple(ks),
        raw.get("overwrite", False),
        raw.get("within"),
        raw.get("sensitivity", False),
        raw.get("figures", True),
    )


def _load_diff(
    raw: dict[str, Any] | None, template: str, metrics: MetricsSettings, day: str, path: Path
) -> JobDiff | None:
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
    from pipeline.core.errors import DiffError
    from pipeline.metrics.drift import parse_threshold

    try:
        for t in fail_on:
            parse_threshold(t)
    except DiffError as exc:
        raise JobFileError(f"{where}: {exc}") from exc
    with settings_of(where):
        by = replace(metrics, by=raw["by"]).by if "by" in raw else metrics.by
    return JobDiff(candidates, by, tuple(fail_on))


def previous_run(job: Job) -> str | None:
    """The run the job's [diff] compares against: the first of its candidates that exists (None: none does)."""
    assert job.diff is not None
    return next((c for c in job.diff.candidates if exists(c, job.storage_options)), None)


def run_job(
    job: Job,
    address: str | None = None,
    force: bool = False,
    on_plan: Callable[[ShardPlan], None] | None = None,
    on_shard: Callable[[ShardMarker], None] | None = None,
) -> tuple[Manifest, list[Cohort]]:
    """Score the job's input (reusing unchanged shards; `force`: rescoring all), on the Ray at `address` (default:
    the job's), then compute and write its metrics (and its report, when the job has a [report] table)."""
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
    scoring = replace(job.scoring, address=address or job.scoring.address, force=force)
    manifest = run_scoring(job.input, job.output, scoring, on_plan=on_plan, on_shard=on_shard)
    scoring.refuse_empty(manifest, job.output, "allow_empty = true in the job file")
    run = open_run(job.output, job.storage_options, job.partial)  # the metrics and report read the same shards
    m = job.metrics
    cohorts = run.cohorts(m.by, m.bootstrap, m.max_k, m.population, metrics_address(job, address))
    run.write_metrics(cohorts, m.by)
    if job.report is not None:
        from pipeline.report import build_report

        r = job.report
        build_report(run, r.out, r.by, r.compare, r.ks, m.bootstrap, overwrite=r.overwrite, within=r.within,
                     population=m.population, sensitivity=r.sensitivity, figures=r.figures,
                     allow_empty=scoring.allow_empty, address=metrics_address(job, address))  # fmt: skip
    return manifest, cohorts


def metrics_address(job: Job, address: str | None = None) -> str | None:
    """Where the job's metrics, and its diff's, are computed: with the mergeable bootstrap, in Ray tasks on the Ray
    that scores the run (`address`, else the job's, else a local one), no process reading every rollout or call;
    otherwise here (None)."""
    if job.metrics.bootstrap.method != "poisson-merged":
        return None
    return address or job.scoring.address or "local"


def raw_input(job: Job) -> RawSource | None:
    """The job's raw logs (None: a canonical store read as is); an unknown format or option fails here."""
    from pipeline.ingest import IngestError

    try:
        return job.scoring.raw_input([job.input])
    except IngestError as exc:
        raise JobFileError(f"job {job.name}: {exc}") from exc


def absolute_paths(job: Job) -> Job:
    """The job with its local relative paths made absolute against this process's working directory: Ray
    workers (those of a submitted job above all) do not share the driver's working directory."""
    report = job.report and replace(job.report, out=absolute(job.report.out))
    scoring = replace(job.scoring, spec_dirs=tuple(absolute(d) for d in job.scoring.spec_dirs))
    return replace(job, input=absolute(job.input), output=absolute(job.output), scoring=scoring, report=report)


def relative_paths(job: Job) -> list[str]:
    """`field 'path'` for each local relative path of the job."""
    named = [("input", job.input), ("output", job.output), *(("spec_dirs", d) for d in job.scoring.spec_dirs)]
    if job.report is not None:
        named.append(("[report] out", job.report.out))
    return [f"{name} {url!r}" for name, url in named if absolute(url) != url]


def _fill(template: str, day: str, path: Path) -> str:
    unknown = set(re.findall(r"\{(\w*)\}", template)) - {"date"}
    if unknown:
        names = ", ".join(sorted(unknown))
        raise JobFileError(f"{path}: unknown placeholder(s) {names} in {template!r} (only {{date}})")
    return template.replace("{date}", day)
