"""Every option more than one command takes, declared once, and the checks of their values.

An option is an `Annotated` alias a command names as a parameter's type (`seed: Seed = 0`). The commands that
read a scored run (metrics, report, diff, sql, view) take theirs through `@reads_a_run(...)`, which adds the
options to the command and hands it one checked `Reading`: the storage options, the cohort columns, the
bootstrap's settings and the population, built the same way for every reader.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from copy import copy
from dataclasses import dataclass
from functools import update_wrapper
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar, get_args

import orjson
import typer

from pipeline.core.errors import PexecError
from pipeline.metrics.run import Run, open_run
from pipeline.metrics.settings import DEFAULT_BOOTSTRAP, DEFAULT_POPULATION, MAX_B, BootstrapSettings, Population
from pipeline.storage.stores import WriteMode

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
StoreFormat = Annotated[str, typer.Option("--format", help="jsonl or parquet")]
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
DashboardAddress = Annotated[
    str | None,
    typer.Option(
        "--address",
        help="Ray Jobs API (dashboard) URL, e.g. http://HEAD:8265 (default: $RAY_API_SERVER_ADDRESS, $RAY_ADDRESS).",
    ),
]
Force = Annotated[bool, typer.Option("--force", help="Rescore every shard, even unchanged ones.")]
OnDate = Annotated[str | None, typer.Option("--date", help="YYYY-MM-DD for {date} (default: today, UTC).")]
JobFile = Annotated[Path, typer.Argument(help="A job definition (jobs/*.toml).")]
Submission = Annotated[str, typer.Argument(help="A submission id from `pexec submit`.")]
ScoredRun = Annotated[str, typer.Argument(help="A scored run folder.")]

# The options of @reads_a_run, in the order the help lists them.
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
        "--max-concurrency", min=1, max=10_000, help="Open connections and requests in flight; one more gets 503."
    ),
]


def server_limits(header_timeout: float, max_concurrency: int) -> Any:
    """The hardened server's limits (pipeline.web.ServerLimits) with the two a user may set."""
    from pipeline.web import ServerLimits

    return ServerLimits(header_timeout=header_timeout, max_concurrency=max_concurrency)


def in_panel(option: Any, panel: str) -> Any:
    """The option `option` (an Annotated alias) listed in help panel `panel`."""
    kind, info = get_args(option)
    info = copy(info)
    info.rich_help_panel = panel
    return Annotated[kind, info]


Part = Literal["cohorts", "intervals", "partial"]


def _keyword(part: Part | Literal["storage"], name: str, option: Any, default: Any) -> tuple[str, inspect.Parameter]:
    return part, inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=option, default=default)


_READING = [
    _keyword("cohorts", "by", By, None),
    _keyword("intervals", "bootstrap", Bootstrap, 1000),
    _keyword("intervals", "seed", in_panel(Seed, INTERVALS), 0),
    _keyword("intervals", "method", Method, "multinomial"),
    _keyword("cohorts", "harness_errors", HarnessErrors, "exclude"),
    _keyword("cohorts", "pool", Pool, None),
    _keyword("partial", "partial", Partial, False),
    _keyword("cohorts", "strict_replay", StrictReplay, False),
    _keyword("storage", "endpoint_url", EndpointUrl, None),
    _keyword("storage", "storage_option", StorageOption, None),
]


@dataclass(frozen=True)
class Reading:
    """How a command reads a scored run: where it lies (storage options), whether an incomplete one is read,
    the cohort columns (None: every label), the bootstrap's settings and the population counted."""

    storage: dict[str, Any] | None = None
    partial: bool = False
    by: list[str] | None = None
    settings: BootstrapSettings = DEFAULT_BOOTSTRAP
    population: Population = DEFAULT_POPULATION

    def open(self, url: str) -> Run:
        """The run (or runs) under `url`, read as this Reading says."""
        return open_run(url, self.storage, self.partial)


Command = TypeVar("Command", bound=Callable[..., Any])


def reads_a_run(*parts: Part, merged: bool = False) -> Callable[[Command], Command]:
    """Give a command the options it reads a run with and pass them to it as one checked `reading: Reading`:
    the storage options always; "cohorts": --by, --harness-errors, --pool, --strict-replay; "intervals":
    --bootstrap, --seed, --method (with `merged`, poisson-merged too); "partial": --partial."""

    def decorate(command: Command) -> Command:
        shared = [p for part, p in _READING if part in (*parts, "storage")]
        if merged:
            shared = [p.replace(annotation=MergedMethod) if p.name == "method" else p for p in shared]
        own = [p for p in inspect.signature(command, eval_str=True).parameters.values() if p.name != "reading"]

        def with_reading(**values: Any) -> Any:
            given = {p.name: values.pop(p.name) for p in shared}
            return command(**values, reading=_reading(given, merged))

        # Typer reads a command's options from its signature: the command's own, then the shared ones.
        update_wrapper(with_reading, command)
        with_reading.__signature__ = inspect.Signature([*own, *shared])  # type: ignore[attr-defined]
        with_reading.__annotations__ = {p.name: p.annotation for p in [*own, *shared]}
        return with_reading  # type: ignore[return-value]

    return decorate


def _reading(given: dict[str, Any], merged: bool) -> Reading:
    """The Reading the parsed option values ask for; a wrong value fails here, before any file is read."""
    settings = DEFAULT_BOOTSTRAP
    if "bootstrap" in given:
        settings = _bootstrap_settings(given["bootstrap"], given["seed"], given["method"], merged)
    population = DEFAULT_POPULATION
    if "harness_errors" in given:
        population = _population(given["harness_errors"], given["pool"], given["strict_replay"])
    by = _columns(given.get("by"))
    where = storage(given["endpoint_url"], given["storage_option"])
    return Reading(where, given.get("partial", False), by, settings, population)


def _bootstrap_settings(replicates: int, seed: int, method: str, merged: bool = False) -> BootstrapSettings:
    if merged and method == "poisson-merged":
        return BootstrapSettings(B=replicates, seed=seed, method="poisson-merged")
    if method not in ("multinomial", "poisson"):
        raise PexecError("--method is multinomial or poisson" + (" or poisson-merged" if merged else ""))
    return BootstrapSettings(B=replicates, seed=seed, method=method)  # type: ignore[arg-type]


def _population(harness_errors: str, pools: list[str] | None, strict_replay: bool) -> Population:
    if harness_errors not in ("exclude", "fail"):
        raise PexecError(f"--harness-errors is exclude or fail, got {harness_errors!r}")
    named = pairs(pools, "--pool")
    pooled = tuple((name, tuple(b.strip() for b in value.split(",") if b.strip())) for name, value in named.items())
    return Population(harness_errors, pooled, strict_replay)  # type: ignore[arg-type]


def _columns(by: str | None) -> list[str] | None:
    """`--by model,method` -> ["model", "method"]; None (every label) when not given."""
    return [c.strip() for c in by.split(",") if c.strip()] if by else None


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


def check_policy(value: str) -> None:
    if value not in ("code", "strict"):
        raise PexecError("--policy is code or strict")
