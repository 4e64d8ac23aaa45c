"""Every error a user is meant to read, as one tree under `PexecError`, and the field check every settings file
uses.

The command line catches `PexecError` in one place and prints its message on one line; any other exception is a
bug and keeps its traceback. Subclasses that replace a former exception (`ValueError`, `OSError`, `duckdb.Error`)
keep it as a second base, so library callers that caught it still do. One error lives beside its code instead of
here: `pipeline.metrics.query.QueryError`, a `duckdb.Error` too, since importing DuckDB here would load it into
every process that imports the data model (a Ray worker's first import).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson


class PexecError(Exception):
    """A problem with the user's input, settings or storage, stated in one line."""


class StorageError(PexecError, OSError):
    """A local path or storage URL that cannot be read or written (missing folder, permission, network)."""


# --- storage ----------------------------------------------------------------------------------------------------------


class StoreExists(StorageError):
    """The output store already holds files and the caller said neither overwrite nor append."""


class StoreError(PexecError):
    """The store as a whole cannot be used (missing, empty, changed since it was listed)."""


class LeaseHeld(PexecError):
    """Another writer holds the run's lease."""


class LeaseLost(PexecError):
    """The lease was taken over while this writer held it: it must stop writing."""


# --- the run folder ---------------------------------------------------------------------------------------------------


class RunFolderError(PexecError):
    """A run folder JSON file that is not one this pexec can read: damaged, foreign or from a newer pexec."""


class UnknownLayout(RunFolderError):
    """A run folder file of a layout this pexec does not know (a newer pexec wrote it): never read as if it were
    this pexec's, even where its fields happen to fit."""


class PartDamaged(RunFolderError):
    """A part file whose bytes are not those its shard's marker recorded (changed, cut short, replaced, missing):
    never read."""


class RunNotFound(PexecError, FileNotFoundError):
    """No scored run (or no rollouts in it) where one was named."""


class RunIncomplete(PexecError):
    """A run that did not finish (or lost part files), read without asking for a partial read."""


# --- input ------------------------------------------------------------------------------------------------------------


class InvalidRecord(PexecError, ValueError):
    """The record is not a canonical rollout; the message is the reject reason."""


class IngestError(PexecError, ValueError):
    """The sources cannot be read in this format; the message names the file and the place."""


class SynthError(PexecError, ValueError):
    """A synthetic store asked for that synth cannot build."""


# --- settings ---------------------------------------------------------------------------------------------------------


class SettingError(PexecError, ValueError):
    """A setting whose value does not fit; the message starts with the setting's key (`shard_mb takes …`)."""

    def __init__(self, key: str, message: str) -> None:
        if not message.startswith(key):
            raise ValueError(f"a SettingError's message starts with its key {key!r}: {message!r}")
        super().__init__(message)
        self.key = key

    @property
    def option(self) -> str:
        """The command-line option of the setting: `--shard-mb` for `shard_mb`."""
        return "--" + self.key.replace("_", "-")

    def naming(self, name: str) -> str:
        """The message with `name` (an option, a table's key) in place of the key."""
        return name + str(self)[len(self.key) :]


class MetricsError(PexecError, ValueError):
    """Metrics asked for with settings or cohort columns that do not fit (the message says which)."""


class MetricsSettingError(MetricsError, SettingError):
    """A metrics setting whose value does not fit; the message starts with its key (pipeline.core.settings)."""


class EffectsError(PexecError, ValueError):
    """An effects.toml that cannot be used; the message names the file and the tool."""


# --- specs and environments -------------------------------------------------------------------------------------------


class ExprError(PexecError, ValueError):
    """A bad expression, raised at compile time."""

    def __init__(self, source: str, problem: str, column: int | None = None) -> None:
        where = f" (column {column})" if column is not None else ""
        super().__init__(f"{problem}{where} in expression: {source}")
        self.source, self.problem, self.column = source, problem, column

    def __reduce__(self) -> tuple[Any, ...]:  # keeps it picklable (Ray ships exceptions between processes)
        return type(self), (self.source, self.problem, self.column)


class SpecError(PexecError, ValueError):
    """A spec that cannot be used; the message names the file and the place."""


class EnvError(PexecError):
    """An environment cannot be built (bad spec, missing package, unknown name)."""


class WheelImportError(PexecError):
    pass


# --- scoring and reading ----------------------------------------------------------------------------------------------


class ScoringFailed(PexecError, RuntimeError):
    """A shard failed, or the run cannot be written; the message names it and the reason. No manifest is
    written."""


class RayNodeLost(ScoringFailed):
    """The Ray node of the driver's own machine died while the driver waited on it
    (pipeline.core.ray_waits)."""


class DraftError(PexecError, ValueError):
    """`pexec spec draft` has nothing to draft from (no rollout read, a format it cannot read in shards) or an
    output folder it will not overwrite; the message says which."""


def rejects_query(run: str, query: str = "SELECT reason, count(*) AS n FROM rejects GROUP BY reason") -> str:
    """The command that shows a run's rejected records (`query` over its `rejects` view)."""
    return f"pexec sql {run} '{query}'"


class EmptyRun(PexecError):
    """A run that holds no rollout (every record rejected, or none read): a failure of the command that scored or
    read it unless empty is explicitly fine. The message gives the counts and where the rejects are."""

    def __init__(self, run: str, read: int, rejected: int, opt_in: str = "--allow-empty") -> None:
        where = (
            f"; to see why: {rejects_query(run, 'SELECT reason, source, location FROM rejects')}" if rejected else ""
        )
        super().__init__(
            f"{run} holds no rollout: {read:,} record(s) read, {rejected:,} rejected{where} "
            f"({opt_in} accepts an empty run)"
        )


class QueryRefused(PexecError, ValueError):
    """A statement in a user query is not a read."""


class DiffError(PexecError, ValueError):
    """A --fail-on expression or diff settings that do not fit (the message says which)."""


class ReportError(PexecError, ValueError):
    """A report asked for with a comparison or depths that do not fit the run (the message says which)."""


# --- serving ----------------------------------------------------------------------------------------------------------


class ViewError(PexecError, ValueError):
    """A viewer request that names something the run does not have (the message says what)."""


class WebServerError(PexecError):
    """The service cannot start as asked (beyond loopback without a token, a token file that cannot be read)."""


class GuardRequestError(PexecError):
    """A request the guard cannot answer; `status` is the HTTP status that says why."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


class SessionFull(PexecError):
    """The session's budget is spent: close it (its verdicts so far stand) and open a new one."""


class GuardFull(SessionFull):
    """The guard's memory for sessions is spent: sessions must close (or expire) before another grows or opens."""


class McpProxyError(PexecError):
    """The proxy cannot start (an upstream that does not answer, a spec that is not found)."""


class PublishError(PexecError):
    """The run cannot be published to that store (not read from a trace store, the store unreachable)."""


# --- jobs -------------------------------------------------------------------------------------------------------------


class JobFileError(PexecError, ValueError):
    """A job file that cannot be run; the message names the file and the field."""


class PreflightError(PexecError):
    """A job that would fail; the message lists every problem found."""


class ClusterApiError(PexecError):
    """The Ray Jobs API at an address cannot be reached, or refused a request; or a job cannot be submitted."""


class AlreadyRunning(ClusterApiError):
    """The cluster already runs this job for this date (a retried CronJob pod, a second `pexec submit`)."""

    def __init__(self, job: str, address: str, submission: str, state: str) -> None:
        self.submission = submission
        super().__init__(
            f"job {job} is already {state} on {address} as {submission}: follow it with "
            f"`pexec logs {submission} --follow` (or submit --wait), or stop it with `pexec stop {submission}`"
        )


def check_fields(table: Any, allowed: set[str], where: str, error: type[PexecError]) -> None:
    """Raise `error` naming `where` when `table` is not a table or has fields outside `allowed`."""
    if not isinstance(table, dict):
        raise error(f"{where}: expected a table, got {table!r}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")


def read_json_file(path: Path, kind: type, where: str, error: type[PexecError]) -> Any:
    """The JSON value of a local data file, which must be a `kind` (list or dict); `error` says `where` it failed."""
    try:
        value = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise error(f"{where}: cannot read {path}: {exc}") from exc
    if not isinstance(value, kind):
        raise error(f"{where}: {path} must hold a JSON {'list' if kind is list else 'object'}")
    return value
