"""Run a scoring job: plan shards, score them as Ray tasks (bounded in flight), commit with the manifest.

Local embedded Ray by default (`ray.init()`), a cluster when an address is given. `executor="inline"`
scores in this process (tests of the pure path and profiling); it writes exactly the same output.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from typing import Any, Literal

import pyarrow as pa

from pipeline.core.errors import PexecError, StorageError
from pipeline.envs import EnvError, EnvOptions, forget_unresolved, get_environment
from pipeline.replay.checker import CHECKS
from pipeline.scoring.code_version import code_version
from pipeline.scoring.id_check import RayIdCheck
from pipeline.scoring.shard import ScoredShard, ScoreSettings, ShardReport, score_shard
from pipeline.storage.ids import Duplicates, digest, duplicate_ids, shard_ids
from pipeline.storage.inputs import Shard, list_inputs, plan_shards
from pipeline.storage.lease import DEFAULT_STALE_AFTER, Lease
from pipeline.storage.run import (
    TABLES,
    part_sizes,
    read_shard_markers,
    remove_manifest,
    remove_stale_parts,
    write_manifest,
    write_plan,
)

DEFAULT_SHARD_BYTES = 64 * 2**20
POLL_S = 1.0  # the longest the driver waits before checking the lease and reporting progress
_RETRIES: dict[str, Any] = {"max_retries": 3, "retry_exceptions": [OSError]}  # of a task that reads or writes


@dataclass(frozen=True)
class ShardPlan:
    files: int
    shards: list[Shard]
    ignored: list[str]
    total_bytes: int
    reusable: int = 0  # shards whose committed output from an earlier run is still valid


class ScoringFailed(PexecError, RuntimeError):
    """A shard failed, or the run cannot be written; the message names it and the reason. No manifest is
    written."""


def plan(store: str, shard_bytes: int = DEFAULT_SHARD_BYTES, storage_options: dict | None = None) -> ShardPlan:
    files, ignored = list_inputs(store, storage_options)
    shards = plan_shards(files, shard_bytes, storage_options)
    return ShardPlan(len(files), shards, ignored, sum(f.size for f in files))


def run_scoring(
    store: str,
    run: str,
    *,
    env: str | None = None,
    options: EnvOptions | None = None,
    address: str | None = None,
    executor: Literal["ray", "inline"] = "ray",
    shard_bytes: int = DEFAULT_SHARD_BYTES,
    num_cpus: int | None = None,
    run_id: str | None = None,
    storage_options: dict | None = None,
    on_plan: Callable[[ShardPlan], None] | None = None,
    on_shard: Callable[[ShardReport], None] | None = None,
    force: bool = False,
    lease_stale_after: float = DEFAULT_STALE_AFTER,
    checks: tuple[str, ...] = CHECKS,
) -> dict[str, Any]:
    """Score every rollout under `store` into `run`; returns the manifest (also written as `_manifest.json`).

    `checks` selects which of S's schema fit, D and P apply (`pipeline.replay.checker.CHECKS`, all by default).
    Rerunning into the same `run` rescores only the shards whose input, code, settings (checks included) or
    environment versions changed since they were committed (`force=True` rescores all). One writer at a time: the run's
    lease (pipeline.storage.lease) is held from before the first write to the manifest; a second writer fails
    at once naming the holder, and a lease without a heartbeat for `lease_stale_after` seconds is taken over.
    """
    options = options or EnvOptions()
    started = datetime.now(UTC)
    forget_unresolved()
    if env is not None:
        get_environment(env, options)  # a bad spec fails here, before any scoring
    settings = ScoreSettings(
        run=run.rstrip("/"),
        run_id=run_id or run.rstrip("/").rsplit("/", 1)[-1],
        env=env,
        options=options,
        storage_options=storage_options,
        code_version=code_version(),
        checks=checks,
    )
    shard_plan = plan(store, shard_bytes, storage_options)
    lease = Lease(run, storage_options, lease_stale_after)
    with ExitStack() as held:
        with lease.taking():
            try:
                lease.acquire()
            except StorageError as exc:  # the first write to the run: a missing bucket or no permission fails here
                raise ScoringFailed(f"cannot write run {run}: {exc}") from exc
            held.enter_context(lease)
        settings = replace(settings, lease=lease.token)
        markers = {} if force else read_shard_markers(run, storage_options)
        sizes = part_sizes(run, storage_options) if markers else {}
        # Reusable as far as input, versions and parts go; whether the duplicate ids each was told about still
        # hold is known once the ids of every shard are (below).
        reused = {s.key: r for s in shard_plan.shards if (r := _reusable(s, markers.get(s.key), settings, sizes))}
        todo = [s for s in shard_plan.shards if s.key not in reused]
        if on_plan:
            on_plan(replace(shard_plan, reusable=len(reused)))
        remove_manifest(run, storage_options)
        # Before any shard: what the run covers, so that a reader of an unfinished run can state its coverage.
        write_plan(run, _plan_record(store, settings, shard_plan, started), storage_options)
        for report in reused.values():
            if on_shard:
                on_shard(report)

        def score(shards: list[Shard], duplicates: Duplicates, ids: RayIdCheck | None = None) -> list[ScoredShard]:
            if executor == "inline":
                return [_inline(shard, settings, duplicates, on_shard, lease.check) for shard in shards]
            if not shards:
                return []
            return _on_ray(shards, settings, duplicates, address, num_cpus, on_shard, lease.check, ids)

        if executor == "inline":
            with ThreadPoolExecutor(1) as pool:
                # Scoring returns the ids a shard holds; those of reused shards are read meanwhile.
                reread = pool.submit(_ids, [s for s in shard_plan.shards if s.key in reused], storage_options)
                scored = score(todo, {})
                ids = reread.result() | {s.report.shard: s.ids for s in scored}
            duplicates = duplicate_ids(shard_plan.shards, ids, storage_options)
            del ids
        else:  # on Ray the ids stay in the object store, checked in hash partitions (pipeline.scoring.id_check)
            _start_ray(address, num_cpus)
            check = RayIdCheck(shard_plan.shards)
            check.read([s for s in shard_plan.shards if s.key in reused], storage_options, **_RETRIES)
            scored = score(todo, {}, check)
            duplicates = check.duplicates(storage_options)
        reports = reused | {s.report.shard: s.report for s in scored}
        del scored
        # A shard told other than what the whole store shows (none were told anything before their ids were
        # known) is scored again: only shards holding a later copy of an id, whatever the order they ran in.
        again = [s for s in shard_plan.shards if reports[s.key].duplicates != digest(duplicates.get(s.key, {}))]
        reports |= {s.report.shard: s.report for s in score(again, duplicates)}
        ordered = sorted(reports.values(), key=lambda r: (r.source, r.start))
        lease.confirm()  # a writer that lost its lease must not delete or commit anything
        # Parts of an earlier plan of this run (another shard size, a removed input) would duplicate rows.
        remove_stale_parts(run, {s.key for s in shard_plan.shards}, storage_options)
        manifest = _manifest(store, settings, shard_plan, ordered, started, executor)
        lease.confirm()
        write_manifest(run, manifest, storage_options)
    return manifest


def _reusable(
    shard: Shard, marker: dict[str, Any] | None, settings: ScoreSettings, sizes: dict[str, dict[str, int]]
) -> ShardReport | None:
    """The committed report of `shard` if its output is still what scoring it now would write, and still on
    disk as it was committed (every part present with the size recorded in the marker), as far as its input,
    code, settings and environments go: the duplicate ids it was told about are checked once all ids are known."""
    if not marker or (marker["fingerprint"], marker["start"], marker["stop"]) != (
        shard.file.fingerprint,
        shard.start,
        shard.stop,
    ):
        return None
    if (marker["code_version"], marker["settings"]) != (settings.code_version, settings.identity()):
        return None
    if any(_version_now(n, settings) != v for n, v in marker["environments"].items()):
        return None
    parts = marker.get("parts") or {}
    if any(sizes.get(table, {}).get(shard.key) != parts.get(table) for table in TABLES):
        return None  # a part deleted, cut short or replaced since: scored again
    return ShardReport(**{**marker, "reused": True})


def _version_now(name: str, settings: ScoreSettings) -> str | None:
    """The environment's version, None when it does not resolve (as score_shard records it)."""
    try:
        return get_environment(name, settings.options).version
    except EnvError:
        return None


def _ids(shards: list[Shard], storage_options: dict | None) -> dict[str, pa.Table]:
    return {shard.key: shard_ids(shard, storage_options) for shard in shards}


def _inline(
    shard: Shard,
    settings: ScoreSettings,
    duplicates: Duplicates,
    on_shard: Callable[[ShardReport], None] | None,
    still_held: Callable[[], None],
) -> ScoredShard:
    still_held()
    try:
        scored = score_shard(shard, settings, duplicates.get(shard.key))
    except OSError as exc:  # a storage failure: reported as the Ray path reports a failed task
        raise ScoringFailed(_failed(shard, exc)) from exc
    if on_shard:
        on_shard(scored.report)
    return scored


def _on_ray(
    shards: list[Shard],
    settings: ScoreSettings,
    duplicates: Duplicates,
    address: str | None,
    num_cpus: int | None,
    on_shard: Callable[[ShardReport], None] | None,
    still_held: Callable[[], None],
    ids: RayIdCheck | None = None,
) -> list[ScoredShard]:
    import ray

    _start_ray(address, num_cpus)
    task = ray.remote(**_RETRIES)(score_shard)
    window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))  # every CPU busy and one task queued for it

    def submit(shard: Shard) -> Any:
        if ids is not None:  # the shard's ids kept in the object store for the partitioned check
            return ids.submit(score_shard, shard, settings, duplicates.get(shard.key), **_RETRIES)
        return task.remote(shard, settings, duplicates.get(shard.key))

    # Largest first: the small shards (the end of each file) fill in at the end instead of one large shard
    # running alone on one CPU while the others idle. Reports are sorted afterwards, so the order is not seen.
    largest_first = sorted(shards, key=lambda s: -(_span(s) or 0))
    out: list[ScoredShard] = []
    for _, scored in completed(largest_first, submit, window, still_held):
        out.append(scored)
        if on_shard:
            on_shard(scored.report)
    return out


def _start_ray(address: str | None, num_cpus: int | None) -> None:
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    if not ray.is_initialized():
        ray.init(
            address=address,
            num_cpus=num_cpus if address is None else None,
            include_dashboard=False,
            logging_level="WARNING",
        )


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
    while True:
        for shard in itertools.islice(todo, window - len(pending)):
            pending[submit(shard)] = shard
        if not pending:
            return
        done, _ = ray.wait(list(pending), num_returns=max(1, len(pending) // 16), timeout=poll_s)
        still_held()
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


def _plan_record(store: str, settings: ScoreSettings, shard_plan: ShardPlan, started: datetime) -> dict[str, Any]:
    return {
        "run_id": settings.run_id,
        "store": store,
        "code_version": settings.code_version,
        "settings": settings.identity(),
        "started_at": started.isoformat(),
        # rows: None where planning cannot count records (JSON Lines), bytes: where a shard is a range of
        # Parquet row groups. A committed marker counts for this plan when its fingerprint, range, code version
        # and settings match (pipeline.metrics.completeness).
        "bytes": shard_plan.total_bytes,
        "shards": [
            {
                "shard": s.key,
                "source": s.file.url,
                "fingerprint": s.file.fingerprint,
                "start": s.start,
                "stop": s.stop,
                "rows": s.rows,
                "bytes": _span(s),
            }
            for s in shard_plan.shards
        ],
    }


def _span(shard: Shard) -> int | None:
    """The input bytes a shard covers: its byte range, or its whole file; None for a range of row groups."""
    if shard.whole_file:
        return shard.file.size
    return shard.stop - shard.start if shard.file.fmt == "jsonl" and shard.stop is not None else None


def _manifest(
    store: str,
    settings: ScoreSettings,
    shard_plan: ShardPlan,
    reports: list[ShardReport],
    started: datetime,
    executor: str,
) -> dict[str, Any]:
    totals = {k: sum(getattr(r, k) for r in reports) for k in ("read", "scored", "rejected", "steps")}
    totals["shards"], totals["shards_reused"] = len(reports), sum(r.reused for r in reports)
    environments: dict[str, str | None] = {}  # None: did not resolve on any worker
    for r in reports:
        for name, version in r.environments.items():
            if version is not None or name not in environments:
                environments[name] = version
    return {
        "run_id": settings.run_id,
        "complete": True,
        "code_version": settings.code_version,
        "input": {
            "store": store,
            "files": sorted({(s.file.url, s.file.fingerprint, s.file.size) for s in shard_plan.shards}),
            "ignored": shard_plan.ignored,
        },
        "settings": {
            "env": settings.env,
            "options": asdict(settings.options),
            "checks": list(settings.checks),
            "executor": executor,
        },
        "environments": environments,
        "counts": totals,
        "reconciled": all(r.read == r.scored + r.rejected for r in reports),
        "shards": [r.to_dict() for r in reports],
        "started_at": started.isoformat(),
        "finished_at": datetime.now(UTC).isoformat(),
        "seconds": time.time() - started.timestamp(),
    }
