"""Score one shard: read its records, replay each rollout, write the shard's parts.

This is the unit of work a Ray task runs. Counts reconcile per shard: rows read = scored + rejected.
No record can stop a run: whatever one record provokes while it is parsed, replayed or converted for
writing is that record's reject, with the reason and its location. Only failures of the machine or the
settings — storage (OSError), a bad spec (SpecError) — fail the shard, and a retry or a fix resumes it.
"""

from __future__ import annotations

import gc
import re
import reprlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

from pipeline.core.arrow import pa
from pipeline.core.errors import InvalidRecord
from pipeline.core.model import Call, Reject, Rollout, RolloutResult
from pipeline.core.records import (
    MAX_REPEATED_CHARS,
    check_repeated,
    check_rollout,
    parse_rollout,
    record_id,
    repeated_chars,
    rollout_record,
)
from pipeline.core.run_folder import ShardMarker
from pipeline.core.run_schema import ROLLOUTS, STEPS
from pipeline.core.text import clipped
from pipeline.envs import EnvError, Environment, EnvOptions, SpecError, get_environment
from pipeline.ingest.base import ReadLimits
from pipeline.ingest.sharded import RawSource, read_raw_rollouts
from pipeline.replay.checker import CHECKS, replay
from pipeline.scoring._code_version import environment_version
from pipeline.scoring._held import HeldParts
from pipeline.scoring.memory import peak_mib, restart_peak
from pipeline.scoring.run_tables import rejects_table, rollouts_table, steps_table
from pipeline.scoring.settings import DEFAULT_SHARD_BYTES
from pipeline.scoring.shuffle import read_partition
from pipeline.storage.ids import digest, ids_table
from pipeline.storage.inputs import read_shard
from pipeline.storage.lease import require_holder
from pipeline.storage.run import PartFacts, write_part, write_shard_marker
from pipeline.storage.shards import RAW_LIMIT, Record, RecordError, Shard

# Not a record's fault: the shard fails (and is retried or resumed) instead of rejecting the record.
_FATAL = (OSError, SpecError)
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:+-]{0,99}")
_REASON_LIMIT = 1000  # characters of a reject reason (messages may quote the record's values)
_LOCATION_LIMIT = 1000  # characters of a reject location (an archive member's name may have 65,535)
# Allocations between two young-generation collections while a shard is scored (CPython's default: 700).
_SHARD_GC_THRESHOLD = 50_000
_BATCH = 250  # results converted to Arrow at a time (fewer Python objects alive: measured faster than 1000)
# Converted steps and rollouts (Arrow) a task holds, in shard sizes, before it spills them to the node's temporary
# folder. A shard's tables are smaller than its input (0.09-0.55 of it: the demo, the real BFCL and tau2 logs), so
# a shard or a partition stays under it and is written as one table; a run of 16 partitions passes it, and then
# holds about a partition's worth, not the run's.
HELD_PART_SHARDS = 1


@dataclass(frozen=True)
class TaskSettings:
    """What a scoring task needs of its run (run_scoring makes it from the run's ScoreSettings): where the run is,
    what it is called, how its environments are built and its records read, and the lease it is written under."""

    run: str
    run_id: str
    env: str | None = None  # None: each rollout's `benchmark` names its environment
    options: EnvOptions = field(default_factory=EnvOptions)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    code_version: str = ""
    checks: tuple[str, ...] = CHECKS  # which of S's schema fit, D and P apply (`--checks`)
    lease: str | None = None  # the driver's lease token: a shard is written only while it holds the run
    source: RawSource | None = field(default=None, repr=False)  # raw logs read by their format; None: a store
    shard_bytes: int = DEFAULT_SHARD_BYTES  # the run's shard size: what bounds the tables a task holds

    def identity(self) -> str:
        """What, besides the input and versions, decides a shard's output (never the storage credentials)."""
        parts = [self.run_id, self.env, asdict(self.options), list(self.checks)]
        if self.source is not None:
            parts.append(self.source.identity())
        return orjson.dumps(parts, option=orjson.OPT_SORT_KEYS).decode()


def read_records(shard: Shard, settings: TaskSettings) -> Iterator[tuple[str, Record]]:
    """(location, record or RecordError) for every rollout of a shard: a canonical store's records, a raw
    shard decoded by its format's adapter (here, inside the task), or a partition of a shuffle."""
    for location, part in read_rollouts(shard, settings):
        yield location, rollout_record(part) if isinstance(part, Rollout) else part


def read_rollouts(shard: Shard, settings: TaskSettings) -> Iterator[tuple[str, Rollout | Record]]:
    """`read_records`, where an adapter builds a rollout as the model's objects: that `Rollout`, unchecked
    (`check_rollout`). What a shard is scored from."""
    source = settings.source
    if source is None or source.fmt == "canonical":
        limits = source.options.limits if source is not None else ReadLimits()
        records = read_shard(
            shard, settings.storage_options, limits.line_bytes, limits.record_items, limits.row_group_bytes
        )
        if source is None or not source.options.labels:
            return records
        labels = source.options.labels
        return ((at, r if isinstance(r, RecordError) else _labelled(r, labels)) for at, r in records)
    if shard.file.fmt == "partition":
        return read_partition(source, settings.run, shard)
    return read_raw_rollouts(source, shard)


def _labelled(record: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    found = record.get("labels")
    if found is not None and not isinstance(found, dict):
        return record  # not a rollout: parse_rollout rejects it for what it is
    return {**record, "labels": {**(found or {}), **labels}}


@dataclass(frozen=True)
class ScoredShard:
    """What scoring a shard returns to the driver: its report (also committed as its marker) and the ids its
    records carry, which the driver checks for duplicates across the store (pipeline.storage.ids)."""

    report: ShardMarker
    ids: pa.Table  # pipeline.storage.ids.ids_table


def score_shard(
    shard: Shard, settings: TaskSettings, duplicates: dict[str, tuple[str, int]] | None = None
) -> ScoredShard:
    """Score one shard. `duplicates`: the shard's ids that other records carry too, each with where its first
    copy is and how many copies come before this shard (pipeline.storage.ids); later copies are rejected."""
    duplicates = duplicates or {}
    bound = HELD_PART_SHARDS * settings.shard_bytes
    with HeldParts({"steps": STEPS, "rollouts": ROLLOUTS}, bound) as parts:
        return _score(shard, settings, duplicates, parts)


def score_task(
    shard: Shard, settings: TaskSettings, duplicates: dict[str, tuple[str, int]] | None = None
) -> ScoredShard:
    """`score_shard` as a Ray task: the worker's peak memory restarts as the task begins, so the marker's peak is
    this task's own, not the largest of the tasks the worker ran before it."""
    restart_peak()
    return score_shard(shard, settings, duplicates)


def _score(
    shard: Shard, settings: TaskSettings, duplicates: dict[str, tuple[str, int]], parts: HeldParts
) -> ScoredShard:
    ids: list[tuple[str, str]] = []  # (location, rollout id) of the records carrying a valid id
    began = time.perf_counter()
    count = _Count()
    environments: dict[str, str | None] = {}  # every name a record asked for, with its version
    results: list[RolloutResult] = []  # the batch not yet converted to Arrow
    locations: list[str] = []  # of each result, should it fail to convert for writing
    rejects: list[Reject] = []
    unwritable: list[Reject] = []  # results that fail to convert: after the records' own rejects
    copies: dict[str, int] = {}  # duplicated id -> its copies in this shard so far
    # name -> its environment, resolved and recorded once per shard, not per rollout (the registry's look-up hashes
    # the options; the version walks the family): a name that fails is asked again, and rejected, each time
    ready: dict[str, Environment] = {}

    repeated = 0  # characters the batch's steps repeat (records.MAX_REPEATED_CHARS)

    def convert() -> None:
        # Results hold their whole rollouts: converted every batch, a worker's memory does not grow with the shard
        # (nor, as the converted tables are spilled past a bound, with a run of partitions).
        nonlocal repeated
        steps, rollouts = _tables(settings.run_id, results, locations, unwritable, shard)
        parts.add({"steps": steps, "rollouts": rollouts})
        count.scored += len(results)
        count.steps += sum(r.T for r in results)
        results.clear()
        locations.clear()
        repeated = 0

    with _fewer_collections():
        for location, record in read_rollouts(shard, settings):
            count.read += 1
            if isinstance(record, RecordError):
                rejects.append(_reject(shard, location, record.reason, record.raw))
                continue
            try:
                # a rollout the adapter built as the model's objects is only checked; a record is parsed
                rid = record.rollout_id if isinstance(record, Rollout) else record_id(record)
                if rid is not None:
                    ids.append((location, rid))
                if rid in duplicates:
                    first, before = duplicates[rid]
                    copies[rid] = copies.get(rid, 0) + 1
                    if before + copies[rid] > 1:
                        raise InvalidRecord(f"duplicate rollout_id {rid!r} (first at {first})")
                rollout = check_rollout(record) if isinstance(record, Rollout) else parse_rollout(record)
                steps_text = _steps_text(rollout)
                name = settings.env or rollout.benchmark
                env = ready.get(name)
                if env is None:
                    env = ready[name] = _environment(name, settings, environments)
                if repeated + steps_text > MAX_REPEATED_CHARS and results:
                    convert()  # before this one: a batch's steps hold at most the limit of repeated text
                results.append(replay(env, rollout, settings.checks))
                locations.append(location)
                repeated += steps_text
            except (InvalidRecord, EnvError) as exc:
                rejects.append(_reject(shard, location, str(exc), _raw(record)))
            except _FATAL:
                raise
            except Exception as exc:  # anything else this one record provoked is its reject
                rejects.append(_reject(shard, location, _unexpected(exc), _raw(record)))
            if len(results) >= _BATCH:
                convert()
        if results or not parts.batches:
            convert()
    rejects += unwritable
    if count.read != count.scored + len(rejects):
        raise RuntimeError(f"shard {shard.key}: counts do not reconcile: {count}, {len(rejects)} rejected")
    if settings.lease is not None:
        require_holder(settings.run, settings.lease, settings.storage_options)
    written: dict[str, PartFacts] = parts.write(settings.run, shard.key, settings.storage_options)
    rejected = rejects_table(settings.run_id, shard.key, rejects)
    written["rejects"] = write_part(settings.run, "rejects", shard.key, rejected, settings.storage_options)
    marker = ShardMarker(
        shard=shard.key,
        source=shard.file.url,
        start=shard.start,
        stop=shard.stop,
        fingerprint=shard.file.fingerprint,
        read=count.read,
        scored=count.scored,
        rejected=len(rejects),
        steps=count.steps,
        seconds=time.perf_counter() - began,
        peak_rss_mib=peak_mib(),
        environments=environments,
        code_version=settings.code_version,
        settings=settings.identity(),
        parts={name: w.size for name, w in written.items()},
        part_rows={name: w.rows for name, w in written.items()},
        part_digests={name: w.digest for name, w in written.items()},
        duplicates=digest(duplicates),
    )
    write_shard_marker(settings.run, marker, settings.storage_options)  # the shard's commit
    return ScoredShard(marker, ids_table(ids))


@dataclass
class _Count:
    """What a shard has read, scored and replayed so far."""

    read: int = 0
    scored: int = 0
    steps: int = 0


@contextmanager
def _fewer_collections() -> Iterator[None]:
    """Collect cyclic garbage less often while a shard is scored: most objects it allocates stay alive for a
    while (a batch of results, the environment's state) and every collection scans them again. The collector
    still runs, so garbage cycles cannot pile up, and the previous thresholds are back afterwards."""
    before = gc.get_threshold()
    gc.set_threshold(max(before[0], _SHARD_GC_THRESHOLD), *before[1:])
    try:
        yield
    finally:
        gc.set_threshold(*before)


def _environment(name: str, settings: TaskSettings, environments: dict[str, str | None]) -> Environment:
    """The environment of `name`, recorded under that name (what a rerun resolves again to decide reuse).

    A name from a record's `benchmark` must be a plain name: spec lookup takes paths, and data must not
    choose a folder to load (or a name the filesystem refuses)."""
    if settings.env is None and not _PLAIN_NAME.fullmatch(name):
        raise EnvError(f"benchmark {name[:100]!r} is not an environment name (letters, digits, _ . : + -)")
    try:
        env = get_environment(name, settings.options)
    except EnvError:
        environments.setdefault(name, None)
        raise
    environments[name] = environment_version(env)
    return env


def _tables(
    run_id: str, results: list[RolloutResult], locations: list[str], rejects: list[Reject], shard: Shard
) -> tuple[pa.Table, pa.Table]:
    """The shard's steps and rollouts tables. A result that cannot be converted (found by converting each
    one alone, only when the whole fails) moves from `results` to `rejects`."""
    try:
        return steps_table(run_id, results), rollouts_table(run_id, results)
    except _FATAL:
        raise
    except Exception:  # some result does not convert: find which, below
        pass
    kept, kept_locations = [], []
    for result, location in zip(results, locations, strict=True):
        try:
            steps_table(run_id, [result])
            rollouts_table(run_id, [result])
        except _FATAL:
            raise
        except Exception as exc:
            reason = f"its result cannot be written: {type(exc).__name__}: {exc}"
            rejects.append(_reject(shard, location, reason, _SHORT.repr(result.rollout.rollout_id)))
            continue
        kept.append(result)
        kept_locations.append(location)
    results[:], locations[:] = kept, kept_locations
    return steps_table(run_id, results), rollouts_table(run_id, results)


def _steps_text(rollout: Rollout) -> int:
    """Characters of the rollout's own text its steps will repeat, or InvalidRecord past MAX_REPEATED_CHARS."""
    own = repeated_chars(rollout)
    if own * len(rollout.events) <= MAX_REPEATED_CHARS:  # events bound the calls: counted only when it matters
        return own * len(rollout.events)
    calls = sum(1 for e in rollout.events if type(e) is Call)
    check_repeated(own, calls)
    return own * calls


def _reject(shard: Shard, location: str, reason: str, raw: str) -> Reject:
    where = clipped(_printable(location), _LOCATION_LIMIT)
    return Reject(shard.file.url, where, _printable(reason[:_REASON_LIMIT]), _printable(raw))


def _printable(text: str) -> str:
    # Lone surrogates (from Python-built records) cannot be written as UTF-8; keep them visible as escapes.
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _unexpected(exc: BaseException) -> str:
    if isinstance(exc, RecursionError) or "Recursion limit" in str(exc):
        return f"nested too deeply to score ({type(exc).__name__})"
    return f"could not be scored: {type(exc).__name__}: {exc}"


_SHORT = reprlib.Repr()  # bounded in depth and width (reprlib's defaults)


def _raw(record: Rollout | dict[str, Any]) -> str:
    if isinstance(record, Rollout):  # shown as the canonical record it stands for
        record = rollout_record(record)
    try:
        return orjson.dumps(record, default=str).decode()[:RAW_LIMIT]
    except TypeError:  # not JSON (too deep, a type orjson does not know): a bounded repr instead
        try:
            return _SHORT.repr(record)[:RAW_LIMIT]
        except ValueError:  # an integer too long to print
            return ""
