"""Every option more than one command takes, declared once, and what the commands make of their values.

An option is an `Annotated` alias a command names as a parameter's type (`seed: Seed = 0`): every option of a
command stands in its own signature, where Typer reads it. A command hands the values to its stage's settings
object (pipeline.scoring.settings.ScoreSettings, pipeline.metrics.settings.MetricsSettings), which checks them;
a parameter is named as the setting it sets, so an error names the option the user typed (pipeline.apps.cli.app).
The commands that read a scored run (metrics, report, diff, sql, view) open it through a `Reading` of their
storage options and --partial.
"""

from __future__ import annotations

from collections.abc import Sequence
from copy import copy
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args

import orjson
import typer

from pipeline.apps.cli._render import console
from pipeline.core.errors import PexecError
from pipeline.metrics.settings import MAX_B, MetricsSettings
from pipeline.storage.stores import WriteMode

if TYPE_CHECKING:  # DuckDB loads with the first run a command reads, not with every command
    from pipeline.metrics.run import Run

# Where `pexec guard serve` listens by default: not where `pexec view` does (VIEW_PORT), so both can run at once.
GUARD_PORT = 8766

# Help panels: the options every reader of a run shares stand apart from the command's own.
COHORTS = "Cohorts and population"
INTERVALS = "Intervals"
STORAGE = "Storage"

EndpointUrl = Annotated[
    str | None,
    typer.Option(
        "--endpoint-url",
        help="S3-compatible endpoint (e.g. http://127.0.0.1:5555); credentials come "
        "from the standard AWS environment/config.",
        rich_help_panel=STORAGE,
    ),
]
StorageOption = Annotated[
    list[str] | None,
    typer.Option("--storage-option", help="k=v passed to the fsspec filesystem (repeatable).", rich_help_panel=STORAGE),
]
Partial = Annotated[
    bool,
    typer.Option(
        "--partial",
        help="Read an incomplete run (killed scoring, missing parts): only its committed shards; "
        "every output states the coverage.",
        rich_help_panel=STORAGE,
    ),
]
OutStore = Annotated[str, typer.Option("--out", help="Store to write (folder or fsspec URL).")]
StoreFormat = Annotated[str, typer.Option("--output-format", help="File type of the store written: jsonl or parquet.")]
# `--format` is the input log format wherever it is taken (score, guard replay); synth and ingest took it for the
# file type they write: that spelling still works for one release, with a note.
OldStoreFormat = Annotated[
    str | None, typer.Option("--format", hidden=True, help="The old spelling of --output-format.")
]


def store_format(output_format: str, old: str | None, command: str) -> str:
    """The file type a store is written as: `--output-format`, or the old `--format` with a note on stderr."""
    if old is None:
        return output_format
    if output_format != "jsonl":
        raise PexecError("--format is the old spelling of --output-format: give --output-format alone")
    console.print(
        f"note: `pexec {command} --format` is now --output-format (--format is the input log format elsewhere); "
        "the old spelling goes in the next release",
        soft_wrap=True,
    )
    return old


Overwrite = Annotated[bool, typer.Option("--overwrite", help="Replace the files already in the output store.")]
Append = Annotated[
    bool, typer.Option("--append", help="Add new files beside those already in the output store (same format).")
]
Seed = Annotated[int, typer.Option("--seed", help="Seed of the random draws: the same seed, the same output.")]
SpecDir = Annotated[list[str] | None, typer.Option("--spec-dir", help="Extra folder to search for specs.")]
Policy = Annotated[str, typer.Option("--policy", help="code or strict (written-policy overlays)")]
RayAddress = Annotated[
    str | None, typer.Option("--address", help="Ray cluster address (default: the job's for `run`, else local Ray).")
]
MetricsAddress = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Compute in Ray tasks on this Ray (`local`: start one here; `auto`: the running cluster), part by "
        "part, no process reading every rollout or call; needs --method poisson-merged, same numbers.",
    ),
]
DashboardAddress = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray Jobs API (dashboard) URL, e.g. http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS).",
    ),
]
AllowEmpty = Annotated[
    bool,
    typer.Option(
        "--allow-empty",
        help="A run that holds no rollout (every record rejected) is a result, not a failure (exit 0).",
    ),
]
Force = Annotated[bool, typer.Option("--force", help="Rescore every shard, even unchanged ones.")]
OnDate = Annotated[str | None, typer.Option("--date", help="YYYY-MM-DD for {date} (default: today, UTC).")]
JobFile = Annotated[Path, typer.Argument(help="A job definition (jobs/*.toml).")]
Submission = Annotated[str, typer.Argument(help="A submission id from `pexec submit`.")]
ScoredRun = Annotated[str, typer.Argument(help="A scored run folder.")]

# The options of the commands that read a run, in the order their help lists them.
By = Annotated[
    str | None,
    typer.Option(
        "--by",
        help="Columns that define a cohort, e.g. model,method (default: every label); attributes too.",
        rich_help_panel=COHORTS,
    ),
]
HarnessErrors = Annotated[
    str,
    typer.Option(
        "--harness-errors",
        help="exclude: harness-error rollouts are left out of every metric (always counted); "
        "fail: they count as non-executable failures.",
        rich_help_panel=COHORTS,
    ),
]
Pool = Annotated[
    list[str] | None,
    typer.Option(
        "--pool",
        help="NAME=B1,B2: count benchmarks B1, B2 as one benchmark NAME (repeatable).",
        rich_help_panel=COHORTS,
    ),
]
StrictReplay = Annotated[
    bool,
    typer.Option(
        "--strict-replay",
        help="Leave out the rollouts whose replay diverged from the log before their first error (FED untrusted).",
        rich_help_panel=COHORTS,
    ),
]
Bootstrap = Annotated[
    int,
    typer.Option("--bootstrap", min=1, max=MAX_B, help="Bootstrap replicates B.", rich_help_panel=INTERVALS),
]
Method = Annotated[
    str, typer.Option("--method", help="multinomial (task resampling) or poisson", rich_help_panel=INTERVALS)
]
MergedMethod = Annotated[
    str,
    typer.Option(
        "--method",
        help="multinomial (task resampling), poisson, or poisson-merged (Poisson weights keyed by task id: "
        "the mergeable bootstrap for large runs)",
        rich_help_panel=INTERVALS,
    ),
]


TokenFile = Annotated[
    str | None,
    typer.Option("--token-file", help="File whose first line is the bearer token (kept out of the process list)."),
]
AllowHost = Annotated[
    list[str] | None,
    typer.Option(
        "--allow-host",
        help="Another name the service is reached by (a Host header it answers), e.g. guard.internal (repeatable).",
    ),
]


HeaderTimeout = Annotated[
    float,
    typer.Option(
        "--header-timeout",
        min=0.1,
        max=300,
        help="Seconds a connection may take to send a request head; a silent one is closed then.",
    ),
]
MaxConcurrency = Annotated[
    int,
    typer.Option(
        "--max-concurrency",
        min=1,
        max=10_000,
        help="Requests being answered at once (open connections are not counted); one more gets 503.",
    ),
]


ShutdownTimeout = Annotated[
    float,
    typer.Option(
        "--shutdown-timeout",
        min=0,
        max=300,
        help="Seconds the requests being answered get to finish after SIGTERM or Ctrl-C; then they are cut off.",
    ),
]


def server_limits(header_timeout: float, max_concurrency: int, shutdown_timeout: float) -> Any:
    """The hardened server's limits (pipeline.apps.web.ServerLimits) with the three a user may set."""
    from pipeline.apps.web import ServerLimits

    return ServerLimits(
        header_timeout=header_timeout, max_concurrency=max_concurrency, shutdown_timeout=shutdown_timeout
    )


def in_panel(option: Any, panel: str) -> Any:
    """The option `option` (an Annotated alias) listed in help panel `panel`."""
    kind, info = get_args(option)
    info = copy(info)
    info.rich_help_panel = panel
    return Annotated[kind, info]


IntervalsSeed = in_panel(Seed, INTERVALS)
# The bootstrap methods of the readers that compute in this process only (report, diff, view).
LOCAL_METHODS = ("multinomial", "poisson")


@dataclass(frozen=True)
class Reading:
    """How a command reads a scored run: where it lies (storage options), and whether an incomplete one is read."""

    storage: dict[str, Any] | None = None
    partial: bool = False

    def open(self, url: str) -> Run:
        """The run (or runs) under `url`, read as this Reading says."""
        from pipeline.metrics.run import open_run

        return open_run(url, self.storage, self.partial)


def metrics_settings(
    by: str | None,
    bootstrap: int,
    seed: int,
    method: str,
    harness_errors: str,
    pool: list[str] | None,
    strict_replay: bool,
    max_k: int | None = None,
    methods: Sequence[str] = LOCAL_METHODS,
) -> MetricsSettings:
    """The MetricsSettings of a reading command's options: `--by model,method` as its columns (None, every label,
    when not given), each `--pool NAME=B1,B2` as a pool, the others as they are; `methods`: the bootstrap methods
    the command computes."""
    columns = [c.strip() for c in by.split(",") if c.strip()] if by else None
    pools = {name: [b.strip() for b in value.split(",") if b.strip()] for name, value in pairs(pool, "--pool").items()}
    return MetricsSettings.from_values(
        by=columns, bootstrap=bootstrap, seed=seed, method=method, harness_errors=harness_errors, pool=pools,
        strict_replay=strict_replay, max_k=max_k, methods=methods,
    )  # fmt: skip


def pairs(items: list[str] | None, flag: str) -> dict[str, str]:
    """`k=v` items of a repeatable option -> {k: v}."""
    found = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise PexecError(f"{flag} takes key=value, got {item!r}")
        found[key] = value
    return found


def storage(endpoint_url: str | None, items: list[str] | None) -> dict[str, Any] | None:
    """The fsspec storage options of --endpoint-url and --storage-option (None: the defaults)."""
    options: dict[str, Any] = {}
    for key, value in pairs(items, "--storage-option").items():
        try:
            options[key] = orjson.loads(value)  # numbers, booleans, objects
        except orjson.JSONDecodeError:
            options[key] = value
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    return options or None


def write_mode(overwrite: bool, append: bool) -> WriteMode:
    if overwrite and append:
        raise PexecError("--overwrite and --append exclude each other")
    return "overwrite" if overwrite else "append" if append else "new"
