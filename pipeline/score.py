"""Score one shard: read its records, replay each rollout, write the shard's parts.

This is the unit of work a Ray task runs. Counts reconcile per shard: rows read = scored + rejected.
"""

from __future__ import annotations

import resource
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from pipeline.checker import CHECKS, replay
from pipeline.envs import EnvError, Environment, EnvOptions, get_environment
from pipeline.model import Reject, RolloutResult
from pipeline.output import rejects_table, rollouts_table, steps_table
from pipeline.records import InvalidRecord, parse_rollout, record_id
from pipeline.storage.ids import digest
from pipeline.storage.inputs import RecordError, Shard, read_shard
from pipeline.storage.run import write_part, write_shard_marker


@dataclass
class ShardReport:
    shard: str
    source: str
    start: int
    stop: int | None
    fingerprint: str
    read: int = 0
    scored: int = 0
    rejected: int = 0
    steps: int = 0
    seconds: float = 0.0
    peak_rss_mib: float = 0.0  # of the process that scored the shard
    # name -> version; None: the name did not resolve (its records were rejected), so a rerun rescores the
    # shard once it does (a simulator installed, a spec added)
    environments: dict[str, str | None] = field(default_factory=dict)
    code_version: str = ""
    settings: str = ""  # ScoreSettings.identity() of the run that scored it
    reused: bool = False  # carried over from an earlier run of the same job (input and versions unchanged)
    parts: dict[str, int] = field(default_factory=dict)  # table -> size in bytes of the part written
    duplicates: str = ""  # digest of the duplicate ids it was told about (pipeline.storage.ids)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class ScoreSettings:
    run: str
    run_id: str
    env: str | None = None  # None: each rollout's `benchmark` names its environment
    options: EnvOptions = field(default_factory=EnvOptions)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    code_version: str = ""
    checks: tuple[str, ...] = CHECKS  # which of S's schema fit, D and P apply (`--checks`)

    def identity(self) -> str:
        """What, besides the input and versions, decides a shard's output (never the storage credentials)."""
        parts = [self.run_id, self.env, asdict(self.options), list(self.checks)]
        return orjson.dumps(parts, option=orjson.OPT_SORT_KEYS).decode()


def score_shard(
    shard: Shard, settings: ScoreSettings, duplicates: dict[str, tuple[str, int]] | None = None
) -> ShardReport:
    """Score one shard. `duplicates`: the shard's ids that other records carry too, each with where its first
    copy is and how many copies come before this shard (pipeline.storage.ids); later copies are rejected."""
    duplicates = duplicates or {}
    began = time.perf_counter()
    report = ShardReport(
        shard.key,
        shard.file.url,
        shard.start,
        shard.stop,
        shard.file.fingerprint,
        code_version=settings.code_version,
        settings=settings.identity(),
        duplicates=digest(duplicates),
    )
    results: list[RolloutResult] = []
    rejects: list[Reject] = []
    copies: dict[str, int] = {}  # duplicated id -> its copies in this shard so far
    for location, record in read_shard(shard, settings.storage_options):
        report.read += 1
        reason = None
        if isinstance(record, RecordError):
            rejects.append(Reject(shard.file.url, location, record.reason, record.raw))
            continue
        try:
            if (rid := record_id(record)) in duplicates:
                first, before = duplicates[rid]
                copies[rid] = copies.get(rid, 0) + 1
                if before + copies[rid] > 1:
                    raise InvalidRecord(f"duplicate rollout_id {rid!r} (first at {first})")
            rollout = parse_rollout(record)
            env = _environment(settings.env or rollout.benchmark, settings, report)
            results.append(replay(env, rollout, settings.checks))
        except (InvalidRecord, EnvError) as exc:  # a bad spec (SpecError) fails the job instead
            reason = str(exc)
        if reason is not None:
            rejects.append(Reject(shard.file.url, location, reason, _raw(record)))
    report.scored = len(results)
    report.rejected = len(rejects)
    report.steps = sum(r.T for r in results)
    if report.read != report.scored + report.rejected:
        raise RuntimeError(f"shard {shard.key}: counts do not reconcile: {report}")
    tables = {
        "steps": steps_table(settings.run_id, results),
        "rollouts": rollouts_table(settings.run_id, results),
        "rejects": rejects_table(settings.run_id, shard.key, rejects),
    }
    report.parts = {
        name: write_part(settings.run, name, shard.key, t, settings.storage_options) for name, t in tables.items()
    }
    report.seconds = time.perf_counter() - began
    report.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    write_shard_marker(settings.run, shard.key, report.to_dict(), settings.storage_options)  # the shard's commit
    return report


def _environment(name: str, settings: ScoreSettings, report: ShardReport) -> Environment:
    """The environment of `name`, recorded under that name (what a rerun resolves again to decide reuse)."""
    try:
        env = get_environment(name, settings.options)
    except EnvError:
        report.environments.setdefault(name, None)
        raise
    report.environments[name] = env.version
    return env


def _raw(record: dict[str, Any]) -> str:
    try:
        return orjson.dumps(record, default=str).decode()[:2000]
    except TypeError:
        return repr(record)[:2000]
