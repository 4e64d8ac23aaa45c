"""Run a scoring job: plan shards, score them as Ray tasks (bounded in flight), commit with the manifest.

Local embedded Ray by default (`ray.init()`), a cluster when an address is given. `ScoreSettings(inline=True)`
scores in this process (tests of the pure path and profiling); it writes exactly the same output. `run_scoring`
reads as its steps: plan, take the lease, reuse, score and gather ids, score later copies, commit.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

import msgspec
from msgspec import structs

from pipeline.core import ray_waits
from pipeline.core.arrow import pa
from pipeline.core.errors import RunFolderError, ScoringFailed, StorageError, UnknownLayout
from pipeline.core.ray_start import start_ray
from pipeline.core.records import record_id
from pipeline.core.run_folder import (
    Counts,
    EnvironmentOptions,
    InputFileEntry,
    Manifest,
    Plan,
    PlannedShard,
    ReadSettings,
    Reuse,
    RunInput,
    RunSettings,
    ShardMarker,
    ShardReuse,
)
from pipeline.core.text import public_url
from pipeline.envs import EnvError, forget_unresolved, get_environment
from pipeline.ingest import IngestError
from pipeline.ingest.base import ReadLimits
from pipeline.ingest.sharded import RawSource, plan_raw
from pipeline.scoring._code_version import code_version, environment_version
from pipeline.scoring.id_check import RayIdCheck, partition_count
from pipeline.scoring.settings import DEFAULT_SCORING, DEFAULT_SHARD_BYTES, ScoreSettings
from pipeline.scoring.shard import ScoredShard, TaskSettings, read_records, score_shard, score_task
from pipeline.scoring.shuffle import shuffle_rounds, staging
from pipeline.scoring.sniff import refuse_other_formats
from pipeline.storage.fs import absolute, filesystem, remove_all, url_of
from pipeline.storage.ids import Duplicates, digest, duplicate_ids, ids_table, shard_ids
from pipeline.storage.inputs import (
    LineBatch,
    file_runs,
    list_inputs,
    plan_shards,
    split_by_bytes,
    stream_batches,
    supplied,
    with_batches,
)
from pipeline.storage.lease import Lease
from pipeline.storage.run import (
    TABLES,
    RunPrefix,
    check_part,
    part_rel,
    read_manifest,
    read_shard_markers,
    recorded_part,
    remove_manifest,
    remove_stale_parts,
    write_manifest,
    write_plan,
)
from pipeline.storage.shards import RecordError, Shard

POLL_S = 1.0  # the longest the driver waits before checking the lease and reporting progress
_RETRIES: dict[str, Any] = {"max_retries": 3, "retry_exceptions": [OSError]}  # of a task that reads or writes
# Ranges of a compressed file whose lines its streaming reader holds ahead of the tasks that take them (each about
# one shard size): with the 2 x CPUs in flight, what the object store holds of one file at most.
READ_AHEAD = 2


@dataclass(frozen=True)
class ShardPlan:
    files: int
    shards: list[Shard]
    ignored: list[str]
    total_bytes: int
    reusable: int = 0  # shards whose committed output from an earlier run is still valid
    # a shuffled format's input shards (read by round 1); `shards` are then the partitions scored
    inputs: list[Shard] | None = None


def plan(
    store: str,
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    storage_options: dict[str, Any] | None = None,
    source: RawSource | None = None,
) -> ShardPlan:
    """The shards of a canonical store, or of raw logs (`source`, its format's own plan). A store whose first
    records are another format's logs is refused here, before anything is scored."""
    if source is not None and source.fmt != "canonical":
        try:
            shards = plan_raw(source, shard_bytes)
        except IngestError as exc:
            raise ScoringFailed(str(exc)) from exc
        sizes = {s.file.url: s.file.size for s in shards}
        return ShardPlan(len(sizes), shards, [], sum(sizes.values()))
    files, ignored = list_inputs(store, storage_options)
    shards = plan_shards(files, shard_bytes, storage_options)
    refuse_other_formats(shards, storage_options)
    return ShardPlan(len(files), shards, ignored, sum(f.size for f in files))


def run_scoring(
    store: str | Sequence[str],
    run: str,
    scoring: ScoreSettings = DEFAULT_SCORING,
    *,
    run_id: str | None = None,
    on_plan: Callable[[ShardPlan], None] | None = None,
    on_shard: Callable[[ShardMarker], None] | None = None,
) -> Manifest:
    """Score every rollout under `store` into `run` as `scoring` says; returns its manifest (also written as
    `_manifest.json`). `run_id` names the run in its tables (default: the run folder's name).

    `store`: a canonical store (a folder, a file or a URL), or with a `format` raw logs (one or several files or
    folders), read where they lie by their format's adapter inside the tasks; a format whose rollouts span files
    is first shuffled by key (pipeline.scoring.shuffle).

    `scoring.checks` selects which of S's schema fit, D and P apply (`pipeline.replay.checker.CHECKS`, all by
    default). Rerunning into the same `run` rescores only the shards whose input, code, settings (checks included)
    or environment versions changed since they were committed (`force` rescores all). One writer at a time: the
    run's lease (pipeline.storage.lease) is held from before the first write to the manifest; a second writer fails
    at once naming the holder, and a lease without a heartbeat for `lease_stale_after` seconds is taken over.

    The steps, in order: plan the shards; take the run's lease (and shuffle, for a format that needs it); decide
    which committed shards are reused; score the others while the ids of every shard are gathered; score again the
    shards that hold a later copy of an id; commit the manifest.
    """
    started = datetime.now(UTC)
    job = _job(store, run, scoring, run_id)
    shard_plan = plan(job.store, scoring.shard_bytes, scoring.storage_options, job.source)
    _refuse_run_inside_input(run, [store] if isinstance(store, str) else store, shard_plan, scoring.storage_options)
    scoring = scoring.placed(shard_plan.total_bytes)
    lease = Lease(run, scoring.storage_options, scoring.lease_stale_after)
    with ExitStack() as held:
        _take(lease, run, held)
        settings = replace(job.settings, lease=lease.token)
        scorer = _Scorer(scoring, settings, on_shard, lease.check)
        if job.source is not None and job.source.shuffle is not None:
            shard_plan = _shuffle(job.source, settings.run, shard_plan, scoring.shard_bytes, scorer.tasks())
        reuse = _reuse(run, shard_plan, settings, scoring)
        _announce(run, job.store, settings, shard_plan, reuse, started, on_plan, on_shard)
        reports, duplicates = _score_and_gather_ids(scorer, shard_plan, reuse)
        reports, why = _score_later_copies(scorer, shard_plan, reuse, reports, duplicates)
        manifest = _commit(run, job, settings, shard_plan, reports, why, started, scoring.executor, lease)
    return manifest


def _refuse_run_inside_input(
    run: str, sources: Sequence[str], shard_plan: ShardPlan, storage_options: dict[str, Any] | None
) -> None:
    """A run folder inside its input would be read back as input by the next run: its parts taken for logs, each
    record a reject, more with every rerun. Refused before anything is written, whether the folder exists yet
    (inside a source named) or not (a planned file under it)."""
    fs, path = filesystem(absolute(run), storage_options)
    inside = url_of(fs, path).rstrip("/") + "/"
    named = []
    for source in sources:
        source_fs, source_path = filesystem(absolute(source), storage_options)
        if type(source_fs) is type(fs):
            named.append(url_of(source_fs, source_path).rstrip("/") + "/")
    if any(inside.startswith(s) for s in named) or any(s.file.url.startswith(inside) for s in shard_plan.shards):
        raise ScoringFailed(
            f"the run folder {public_url(run)} lies inside the input it scores: a rerun would read the run's own "
            "files as logs; give --out a folder outside the input"
        )


@dataclass(frozen=True)
class _Job:
    """What a scoring job reads and what its tasks are told."""

    store: str  # the input as named (several sources joined by spaces)
    source: RawSource | None  # raw logs read by their format; None: a canonical store
    settings: TaskSettings


def _job(store: str | Sequence[str], run: str, scoring: ScoreSettings, run_id: str | None) -> _Job:
    """The job's input and task settings; a bad spec or environment fails here, before anything is written."""
    sources = [store] if isinstance(store, str) else list(store)
    source = scoring.raw_input(sources)
    if source is None and len(sources) != 1:
        raise ScoringFailed("a store is one file or folder; several sources need --format")
    forget_unresolved()
    if scoring.env is not None:
        get_environment(scoring.env, scoring.env_options)
    settings = TaskSettings(
        run=absolute(run).rstrip("/"),  # the tasks write it, from working directories of their own
        run_id=run_id or run.rstrip("/").rsplit("/", 1)[-1],
        env=scoring.env,
        options=scoring.env_options.anchored(),  # spec folders found from the tasks' working directories
        storage_options=scoring.storage_options,
        code_version=code_version(),
        checks=scoring.checks,
        source=source,
        shard_bytes=scoring.shard_bytes,
    )
    return _Job(" ".join(sources), source, settings)


def _take(lease: Lease, run: str, held: ExitStack) -> None:
    """Hold the run's lease until `held` closes; the first write to the run, so a missing bucket or no permission
    fails here."""
    with lease.taking():
        try:
            lease.acquire()
        except StorageError as exc:
            raise ScoringFailed(f"cannot write run {run}: {exc}") from exc
        held.enter_context(lease)


@dataclass(frozen=True)
class _Reuse:
    """Which committed shards a rerun keeps, as far as input, versions and parts go (whether the duplicate ids each
    was told about still hold is known once the ids of every shard are)."""

    why: dict[str, str]  # shard key -> why it is scored again ("" when reused): the manifest's `reuse`
    kept: dict[str, ShardMarker]  # the reused shards' markers
    todo: list[Shard]  # the shards to score
    # Nothing to score and the committed run covered exactly these shards, unchanged: its id check over them still
    # holds (every shard was told what it shows), so neither the ids are read again nor Ray started.
    unchanged: bool


def _reuse(run: str, shard_plan: ShardPlan, settings: TaskSettings, scoring: ScoreSettings) -> _Reuse:
    folder = RunPrefix(run, scoring.storage_options)
    markers = {} if scoring.force else read_shard_markers(folder)
    committed = None if scoring.force else _committed(folder)
    why = {
        s.key: "forced" if scoring.force else _rescore_reason(s, markers.get(s.key), settings, folder)
        for s in shard_plan.shards
    }
    kept = {s.key: structs.replace(markers[s.key], reused=True) for s in shard_plan.shards if not why[s.key]}
    todo = [s for s in shard_plan.shards if s.key not in kept]
    return _Reuse(why, kept, todo, not todo and _same_shards(committed, kept))


def _announce(
    run: str,
    store: str,
    settings: TaskSettings,
    shard_plan: ShardPlan,
    reuse: _Reuse,
    started: datetime,
    on_plan: Callable[[ShardPlan], None] | None,
    on_shard: Callable[[ShardMarker], None] | None,
) -> None:
    """Mark the run incomplete and write its plan before any shard: a reader of an unfinished run can state its
    coverage. The caller hears of the plan and of every reused shard."""
    if on_plan:
        on_plan(replace(shard_plan, reusable=len(reuse.kept)))
    remove_manifest(run, settings.storage_options)
    write_plan(run, _plan_record(store, settings, shard_plan, started), settings.storage_options)
    for marker in reuse.kept.values():
        if on_shard:
            on_shard(marker)


@dataclass(frozen=True)
class _Scorer:
    """Where the shards are scored: in this process, or as Ray tasks (bounded in flight) on the Ray at
    `scoring.address` (a local one started when none is given)."""

    scoring: ScoreSettings
    settings: TaskSettings
    on_shard: Callable[[ShardMarker], None] | None
    still_held: Callable[[], None]  # raises when the run's lease was lost

    @property
    def inline(self) -> bool:
        return self.scoring.executor == "inline"

    def score(self, shards: list[Shard], duplicates: Duplicates, ids: RayIdCheck | None = None) -> list[ScoredShard]:
        if self.inline:
            return [
                _inline(s, batch, self.settings, duplicates, self.on_shard, self.still_held)
                for s, batch in _with_batches(shards, self.settings)
            ]
        if not shards:
            return []
        s = self.scoring
        return _on_ray(shards, self.settings, duplicates, s.address, s.num_cpus, self.on_shard, self.still_held, ids)

    def tasks(self) -> _Tasks:
        """Where the rounds of a shuffle run."""
        s = self.scoring
        return _Tasks(s.executor, s.address, s.num_cpus, self.still_held)


def _score_and_gather_ids(
    scorer: _Scorer, shard_plan: ShardPlan, reuse: _Reuse
) -> tuple[dict[str, ShardMarker], Duplicates]:
    """Score the shards to score, none told of any duplicate id yet, and find the ids that more than one record
    carries across the whole store: each shard returns its own ids, those of reused shards are read again. Inline
    they are checked in this process; on Ray they stay in the object store, checked in hash partitions
    (pipeline.scoring.id_check)."""
    if reuse.unchanged:
        return dict(reuse.kept), {}
    reused = [s for s in shard_plan.shards if s.key in reuse.kept]
    if scorer.inline:
        with ThreadPoolExecutor(1) as pool:
            reread = pool.submit(_ids, reused, scorer.settings)  # read while the others are scored
            scored = scorer.score(reuse.todo, {})
            ids = reread.result() | {s.report.shard: s.ids for s in scored}
        duplicates = duplicate_ids(shard_plan.shards, ids, scorer.settings.storage_options)
    else:
        _start_ray(scorer.scoring.address, scorer.scoring.num_cpus)
        check = RayIdCheck(shard_plan.shards, partition_count(shard_plan.total_bytes))
        check.read(_shard_ids, [s for s in reused if not split_by_bytes(s)], scorer.settings, **_RETRIES)
        _read_streamed_ids(check, [s for s in reused if split_by_bytes(s)], scorer.settings, scorer.still_held)
        scored = scorer.score(reuse.todo, {}, check)
        duplicates = check.duplicates(scorer.settings.storage_options)
    return reuse.kept | {s.report.shard: s.report for s in scored}, duplicates


def _score_later_copies(
    scorer: _Scorer,
    shard_plan: ShardPlan,
    reuse: _Reuse,
    reports: dict[str, ShardMarker],
    duplicates: Duplicates,
) -> tuple[dict[str, ShardMarker], dict[str, str]]:
    """Score again each shard told other than what the whole store shows (none were told anything before their
    ids were known): only the shards holding a later copy of an id, whatever the order they ran in. Returns every
    shard's report and why each was scored."""
    again = [
        s
        for s in ([] if reuse.unchanged else shard_plan.shards)
        if reports[s.key].duplicates != digest(duplicates.get(s.key, {}))
    ]
    reports = reports | {s.report.shard: s.report for s in scorer.score(again, duplicates)}
    why = reuse.why | {s.key: reuse.why[s.key] or "the duplicate ids it holds changed" for s in again}
    return reports, why


def _commit(
    run: str,
    job: _Job,
    settings: TaskSettings,
    shard_plan: ShardPlan,
    reports: dict[str, ShardMarker],
    why: dict[str, str],
    started: datetime,
    executor: str,
    lease: Lease,
) -> Manifest:
    """Check the run as a whole, remove what an earlier plan of it left, and write its manifest: the commit. A
    writer that lost its lease deletes and commits nothing."""
    ordered = sorted(reports.values(), key=lambda r: (r.source, r.start))
    if job.source is not None and not job.source.allow_no_calls:
        _check_calls(job.source, ordered)
    storage_options = settings.storage_options
    lease.confirm()
    # Parts of an earlier plan of this run (another shard size, a removed input) would duplicate rows.
    remove_stale_parts(run, {s.key for s in shard_plan.shards}, storage_options)
    reuse = _reuse_record(ordered, why, settings)
    manifest = _manifest(job.store, settings, shard_plan, ordered, started, executor, reuse)
    lease.confirm()
    write_manifest(run, manifest, storage_options)
    if job.source is not None and job.source.shuffle is not None:
        remove_all(staging(settings.run), storage_options)
    return manifest


def _committed(folder: RunPrefix) -> Manifest | None:
    """The manifest of the run being rescored, if it has a readable one (a damaged one only means nothing can be
    known of it: every shard is judged by its marker). One of a newer layout is refused."""
    try:
        return read_manifest(folder)
    except UnknownLayout:
        raise
    except RunFolderError:
        return None


def _same_shards(committed: Manifest | None, reused: Mapping[str, ShardMarker]) -> bool:
    """Whether a committed manifest lists exactly the shards `reused` holds (each reused: input, versions and
    settings unchanged). A manifest exists only after its id check and the rescoring that followed it."""
    return committed is not None and {r.shard for r in committed.shards} == set(reused)


def _check_calls(source: RawSource, reports: list[ShardMarker]) -> None:
    """Rollouts and not one tool call: most likely another format's logs (as `pexec ingest` refuses them)."""
    if sum(r.steps for r in reports) == 0 and sum(r.scored for r in reports) > 0:
        raise ScoringFailed(
            f"{source.fmt}: {sum(r.scored for r in reports)} rollout(s) and not one tool call: are these "
            f"{source.fmt} logs? (logs that truly have no calls: --option allow_no_calls=true)"
        )


@dataclass(frozen=True)
class _Tasks:
    """Where the rounds of a shuffle run: Ray tasks (bounded in flight), or inline."""

    executor: str
    address: str | None
    num_cpus: int | None
    still_held: Callable[[], None]

    def run(self, fn: Callable[..., Any], shards: list[Shard], *args: Any) -> list[Any]:
        if self.executor == "inline":
            out = []
            for shard in shards:
                self.still_held()
                try:
                    out.append(fn(shard, *args))
                except OSError as exc:
                    raise ScoringFailed(_failed(shard, exc)) from exc
            return out

        task = _remote(fn)
        return [r for _, r in completed(shards, lambda s: task.remote(s, *args), 2 * self.cpus(), self.still_held)]

    def cpus(self) -> int:
        """The CPUs the tasks run on (inline: one)."""
        if self.executor == "inline":
            return 1
        import ray

        _start_ray(self.address, self.num_cpus)
        return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _shuffle(source: RawSource, run: str, shard_plan: ShardPlan, shard_bytes: int, tasks: _Tasks) -> ShardPlan:
    """Round 1 (and 2 when the format regroups) of the shuffle: the plan's shards become its partitions, about
    one per `shard_bytes` of input, scored as shards of one or more consecutive partitions each."""
    inputs = shard_plan.shards
    remove_all(staging(run), source.options.storage_options)  # what an interrupted run left
    final = shuffle_rounds(source, run, inputs, shard_plan.total_bytes, shard_bytes, tasks.cpus(), tasks.run)
    return replace(shard_plan, shards=final, inputs=inputs)


def _rescore_reason(shard: Shard, marker: ShardMarker | None, settings: TaskSettings, folder: RunPrefix) -> str:
    """Why `shard` is scored again; "" when its committed output is still what scoring it now would write, and
    still on disk as it was committed (every part with the size, digest and rows its marker recorded), as far as its
    input, code, settings and environments go: the duplicate ids it was told about are checked once all ids are
    known. The code is versioned per environment: the scoring core for every shard, each environment (its data
    and its family's code) only for the shards that used it."""
    if shard.file.fmt == "partition":
        return "a partition of the shuffle: scored afresh every run"
    if not marker:
        return "not scored before"
    if (marker.fingerprint, marker.start, marker.stop) != (shard.file.fingerprint, shard.start, shard.stop):
        return "its input changed"
    if marker.code_version != settings.code_version:
        return f"scoring core changed ({marker.code_version} -> {settings.code_version})"
    if marker.settings != settings.identity():
        return "settings changed"
    for name, was in sorted(marker.environments.items()):
        if (now := _version_now(name, settings)) != was:
            return f"environment {name} changed ({was} -> {now})"
    return _part_changed(shard.key, marker, folder)


def _part_changed(key: str, marker: ShardMarker, folder: RunPrefix) -> str:
    """Why the shard's parts are not the ones its marker committed ("" when every one has its recorded size,
    digest and rows): each part is read back whole, so a part zeroed in place, cut short or replaced by another
    valid one is scored again. A marker without digests (an earlier layout) cannot vouch for its parts."""
    for table in TABLES:
        recorded = recorded_part(marker, table)
        if not recorded.digest:
            return "its marker records no part digests (run folder layout 1): scored again to record them"
        if problem := check_part(folder, part_rel(table, key), recorded, rows=True):
            return f"its {table} part changed since it was committed: {problem}"
    return ""


def _version_now(name: str, settings: TaskSettings) -> str | None:
    """The environment's version with its family's code version, None when it does not resolve (as score_shard
    records it)."""
    try:
        env = get_environment(name, settings.options)
    except EnvError:
        return None
    return environment_version(env)


def _reuse_record(reports: list[ShardMarker], why: dict[str, str], settings: TaskSettings) -> Reuse:
    """The manifest's `reuse`: per shard, whether its earlier output was reused and why (or why not)."""
    shards = []
    for r in reports:
        kept = (
            f"input, scoring core, settings and environments ({', '.join(sorted(r.environments)) or 'none'}) unchanged"
        )
        shards.append(ShardReuse(shard=r.shard, reused=r.reused, why=kept if r.reused else why.get(r.shard, "")))
    return Reuse(core=settings.code_version, shards_reused=sum(r.reused for r in reports), shards=tuple(shards))


def _shard_ids(shard: Shard, settings: TaskSettings) -> pa.Table:
    return _one_shard_ids(shard, settings)


def _batch_ids(shard: Shard, batch: LineBatch, settings: TaskSettings) -> pa.Table:
    with supplied(batch):
        return _one_shard_ids(shard, settings)


def _ids(shards: list[Shard], settings: TaskSettings) -> dict[str, pa.Table]:
    out = {}
    for shard, batch in _with_batches(shards, settings):
        with _lines_of(batch):
            out[shard.key] = _one_shard_ids(shard, settings)
    return out


def _one_shard_ids(shard: Shard, settings: TaskSettings) -> pa.Table:
    if settings.source is None:
        return shard_ids(shard, settings.storage_options)
    return ids_table(
        (location, rid)
        for location, record in read_records(shard, settings)
        if not isinstance(record, RecordError) and (rid := record_id(record)) is not None
    )


def _read_streamed_ids(
    check: RayIdCheck, shards: list[Shard], settings: TaskSettings, still_held: Callable[[], None]
) -> None:
    """The ids of reused ranges of compressed files, read from their files' streaming readers (`_streamed`) by
    tasks that hand them to the id check, at most 2 x CPUs in flight: the object store holds a bounded number of
    ranges' lines, never a whole file's."""
    if not shards:
        return
    import ray

    batches: dict[str, Any] = {}
    window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))

    def submit(shard: Shard) -> Any:
        return check.read(_batch_ids, [shard], batches.pop(shard.key), settings, **_RETRIES)[0]

    for _ in completed(_streamed(shards, settings, batches), submit, window, still_held):
        pass


def _line_limit(settings: TaskSettings) -> int:
    """The line limit the shards are read with (as pipeline.scoring.shard reads them)."""
    return (settings.source.options.limits if settings.source is not None else ReadLimits()).line_bytes


def _with_batches(shards: list[Shard], settings: TaskSettings) -> Iterator[tuple[Shard, LineBatch | None]]:
    """Each shard with its lines when it is a range of a compressed file (`with_batches`, in this process)."""
    by_file = sorted(shards, key=lambda s: (s.file.url, s.start))  # a file's ranges together: one pass each
    return with_batches(by_file, settings.storage_options, _line_limit(settings))


def _lines_of(batch: LineBatch | None) -> AbstractContextManager[None]:
    return nullcontext() if batch is None else supplied(batch)


def _streamed(shards: list[Shard], settings: TaskSettings, batches: dict[str, Any]) -> Iterator[Shard]:
    """The ranges of compressed files among `shards`, each yielded once the ObjectRef of its lines is in
    `batches` (`batch_refs`)."""
    by_file = sorted(shards, key=lambda s: (s.file.url, s.start))
    for shard, ref in batch_refs(by_file, settings.storage_options, _line_limit(settings)):
        if ref is not None:
            batches[shard.key] = ref
            yield shard


def batch_refs(
    shards: Sequence[Shard], storage_options: dict[str, Any] | None, max_line: int
) -> Iterator[tuple[Shard, Any]]:
    """Each shard in order, with the ObjectRef of its lines (a LineBatch) when it is a range of a compressed file,
    else None. Each run of consecutive ranges of one file is read by one streaming reader task, a file at a time:
    it decompresses the file once and puts each range's lines in the object store as it passes them. The reader
    takes no CPU slot (its work, decompressing and cutting lines, is a small part of scoring them): the tasks that
    take the ranges keep every CPU. It runs at most READ_AHEAD ranges ahead of the ranges taken from here, and a
    caller takes one only as it submits its task, so the lines held are bounded whatever the file's size."""
    import ray

    reader = ray.remote(_read_batches).options(
        num_cpus=0, num_returns="streaming", _generator_backpressure_num_objects=READ_AHEAD
    )
    for ranges in file_runs(shards):
        if not split_by_bytes(ranges[0]):
            yield ranges[0], None
            continue
        # a streaming task returns an ObjectRefGenerator (Ray's stubs say ObjectRef)
        refs = cast(Iterator[Any], reader.remote(ranges, storage_options, max_line))
        last: Any = None
        for shard in ranges:
            ref = next(refs, None)
            if ref is None:  # it failed: its error is the last ref it made, which no task may have met yet
                try:
                    ray.get([last] if last is not None else [])
                except Exception as exc:
                    cause = getattr(exc, "cause", None) or exc
                    raise ScoringFailed(f"the streaming reader of {shard.file.url} failed: {cause}") from exc
                raise ScoringFailed(f"the streaming reader of {shard.file.url} stopped before shard {shard.key}")
            last = ref
            yield shard, ref


def with_lines(fn: Callable[..., Any], shard: Shard, batch: LineBatch, *args: Any) -> Any:
    """`fn(shard, *args)` reading the range `shard` from `batch` (in a task: `batch` given as its ObjectRef)."""
    with supplied(batch):
        return fn(shard, *args)


def _read_batches(shards: list[Shard], storage_options: dict[str, Any] | None, max_line: int) -> Iterator[LineBatch]:
    yield from stream_batches(shards, storage_options, max_line)


def _score_batch(
    shard: Shard, batch: LineBatch, settings: TaskSettings, duplicates: dict[str, tuple[str, int]] | None
) -> ScoredShard:
    """Score a range of a compressed file from the lines its file's streaming reader handed on."""
    with supplied(batch):
        return score_task(shard, settings, duplicates)


def _inline(
    shard: Shard,
    batch: LineBatch | None,
    settings: TaskSettings,
    duplicates: Duplicates,
    on_shard: Callable[[ShardMarker], None] | None,
    still_held: Callable[[], None],
) -> ScoredShard:
    still_held()
    try:
        with _lines_of(batch):
            scored = score_shard(shard, settings, duplicates.get(shard.key))
    except OSError as exc:  # a storage failure: reported as the Ray path reports a failed task
        raise ScoringFailed(_failed(shard, exc)) from exc
    if on_shard:
        on_shard(scored.report)
    return scored


def _on_ray(
    shards: list[Shard],
    settings: TaskSettings,
    duplicates: Duplicates,
    address: str | None,
    num_cpus: int | None,
    on_shard: Callable[[ShardMarker], None] | None,
    still_held: Callable[[], None],
    ids: RayIdCheck | None = None,
) -> list[ScoredShard]:
    import ray

    _start_ray(address, num_cpus)
    task = _remote(score_task)
    window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))  # every CPU busy and one task queued for it

    batches: dict[str, Any] = {}  # the lines of a range of a compressed file, from its streaming reader

    def submit(shard: Shard) -> Any:
        told = duplicates.get(shard.key)
        if shard.key in batches:
            batch = batches.pop(shard.key)
            if ids is not None:
                return ids.submit(_score_batch, shard, batch, settings, told, **_RETRIES)
            return _remote(_score_batch).remote(shard, batch, settings, told)
        if ids is not None:  # the shard's ids kept in the object store for the partitioned check
            return ids.submit(score_task, shard, settings, told, **_RETRIES)
        return task.remote(shard, settings, told)

    # Ranges of compressed files first, as their readers hand them on (each a full shard size); then the others
    # largest first: the small shards (the end of each file) fill in at the end instead of one large shard
    # running alone on one CPU while the others idle. Reports are sorted afterwards, so the order is not seen.
    largest_first = sorted((s for s in shards if not split_by_bytes(s)), key=lambda s: -(_span(s) or 0))
    work = itertools.chain(_streamed([s for s in shards if split_by_bytes(s)], settings, batches), largest_first)
    out: list[ScoredShard] = []
    for _, scored in completed(work, submit, window, still_held):
        out.append(scored)
        if on_shard:
            on_shard(scored.report)
    return out


def _remote(fn: Callable[..., Any]) -> Any:
    """`fn` as a Ray task retried on storage errors (OSError: a failed read or write is worth a retry, a bug is
    not)."""
    import ray

    return ray.remote(**_RETRIES)(fn)


def _start_ray(address: str | None, num_cpus: int | None) -> None:
    start_ray(address, num_cpus)


def completed(
    shards: Iterable[Shard],
    submit: Callable[[Shard], Any],
    window: int,
    still_held: Callable[[], None],
    poll_s: float = POLL_S,
) -> Iterator[tuple[Shard, Any]]:
    """Each shard with its task's result as tasks finish, at most `window` tasks in flight (`submit` starts
    one and returns its ObjectRef). A failed task raises ScoringFailed naming its shard; a lost lease (`still_held`
    raises) propagates. Neither cancels the tasks in flight: in Ray 2.60 `ray.cancel` of a task that is just
    finishing can abort the driver (a failed internal check, exit code 1, forced or not). Those tasks run to
    their end and write nothing once their driver gave up or lost the run (`score_shard` checks the lease).

    Completion handling is O(1) per finished shard: one `ray.wait` costs O(in flight), so each waits for a
    sixteenth of the window at once (or `poll_s`, whichever comes first: the lease is checked and progress
    reported at least that often). Refilling by batches leaves no CPU idle: the window (2 × CPUs) holds a
    queued task for every busy CPU, far more than a batch. `pexec bench driver` measures it against the loop it
    replaced (one `ray.wait` over every pending task per finished shard).
    """
    import ray

    todo = iter(shards)
    pending: dict[Any, Shard] = {}
    watch = ray_waits.NodeWatch()
    while True:
        for shard in itertools.islice(todo, window - len(pending)):
            pending[submit(shard)] = shard
        if not pending:
            return
        done, _ = ray.wait(list(pending), num_returns=max(1, len(pending) // 16), timeout=poll_s)
        still_held()
        if not done:  # nothing finished this poll: is this machine's Ray node still there?
            watch.check()
        for ref in done:
            shard = pending.pop(ref)
            try:
                result = ray.get(ref)
            except Exception as exc:
                cause = getattr(exc, "cause", None) or exc
                raise ScoringFailed(_failed(shard, cause)) from exc
            yield shard, result


def _failed(shard: Shard, cause: BaseException) -> str:
    return f"shard {shard.key} ({shard.file.url} [{shard.start}:{shard.stop}]) failed: {cause}"


def _plan_record(store: str, settings: TaskSettings, shard_plan: ShardPlan, started: datetime) -> Plan:
    # A committed marker counts for this plan when its fingerprint, range, code version and settings match
    # (pipeline.metrics.completeness).
    return Plan(
        run_id=settings.run_id,
        store=store,
        code_version=settings.code_version,
        settings=settings.identity(),
        started_at=started.isoformat(),
        bytes=shard_plan.total_bytes,
        shards=tuple(
            PlannedShard(
                shard=s.key,
                source=s.file.url,
                fingerprint=s.file.fingerprint,
                start=s.start,
                stop=s.stop,
                rows=s.rows,
                bytes=_span(s),
            )
            for s in shard_plan.shards
        ),
    )


def _span(shard: Shard) -> int | None:
    """The input bytes a shard covers: its byte range, or its whole file; None for a range of row groups."""
    if shard.whole_file:
        return shard.file.size
    return shard.stop - shard.start if shard.file.fmt == "jsonl" and shard.stop is not None else None


def _manifest(
    store: str,
    settings: TaskSettings,
    shard_plan: ShardPlan,
    reports: list[ShardMarker],
    started: datetime,
    executor: str,
    reuse: Reuse,
) -> Manifest:
    environments: dict[str, str | None] = {}  # None: did not resolve on any worker
    for r in reports:
        for name, version in r.environments.items():
            if version is not None or name not in environments:
                environments[name] = version
    files = {(s.file.url, s.file.fingerprint, s.file.size) for s in shard_plan.inputs or shard_plan.shards}
    options = settings.options
    read = settings.source.identity() if settings.source is not None else None
    return Manifest(
        run_id=settings.run_id,
        complete=True,
        code_version=settings.code_version,
        input=RunInput(
            store=store,
            format=None if settings.source is None else settings.source.fmt,
            files=tuple(InputFileEntry(*f) for f in sorted(files)),
            ignored=tuple(shard_plan.ignored),
        ),
        settings=RunSettings(
            env=settings.env,
            options=EnvironmentOptions(spec_dirs=options.spec_dirs, spec=options.spec, policy=options.policy),
            checks=tuple(settings.checks),
            executor=executor,
            # how the raw logs were read: format, --option settings, labels, byte limits (None: a store)
            read=None if read is None else msgspec.convert(read, ReadSettings),
        ),
        environments=environments,
        counts=Counts(
            read=sum(r.read for r in reports),
            scored=sum(r.scored for r in reports),
            rejected=sum(r.rejected for r in reports),
            steps=sum(r.steps for r in reports),
            shards=len(reports),
            shards_reused=sum(r.reused for r in reports),
        ),
        reconciled=all(r.read == r.scored + r.rejected for r in reports),
        shards=tuple(reports),
        reuse=reuse,
        started_at=started.isoformat(),
        finished_at=datetime.now(UTC).isoformat(),
        seconds=time.time() - started.timestamp(),
    )
